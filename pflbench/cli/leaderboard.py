"""``pflbench leaderboard``: comparison tables (Markdown, LaTeX, CSV, HTML) and plots from run folders."""

from __future__ import annotations

from typing import Any

import click

from pflbench.errors import ConfigError

# ---- leaderboard: options and output writing (issues 9 and 14) -------------------------------
FORMAT_CHOICES = ("md", "latex", "csv", "html", "all")


def _write_text(path: Any, text: str) -> None:
    """Write one output file; any OSError becomes ``Error: cannot write PATH: reason``."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as error:
        raise ConfigError(f"cannot write {path}: {error.strerror or error}") from None


def _extras(text: str) -> tuple[str, ...]:
    """``--extra "comm, time"`` → ``("comm", "time")`` (the report checks the names). Not
    ``sweeps.grid.split_values``: that module imports the data layer, and with it torch."""
    extras = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if text and not extras:
        raise ConfigError("--extra needs at least one value")
    return extras


@click.command("leaderboard")
@click.argument("dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option(
    "--metric",
    default="pers_acc",
    show_default=True,
    help="Final value from summary.json: pers_acc, pers_acc_last10, global_acc, pers_acc_worst10, ...",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMAT_CHOICES),
    default="md",
    show_default=True,
    help="Output format; all = md, latex, csv and html.",
)
@click.option(
    "--extra",
    default="",
    metavar="comm,time,worst10",
    help="Extra columns: comm (MB up + down), time (wall seconds), worst10 (worst-10% clients' accuracy).",
)
@click.option(
    "--output",
    type=click.Path(),
    help="File, or folder for leaderboard_<metric>.<ext> (needed by --format all). Default: print to stdout.",
)
@click.option(
    "--plots",
    type=click.Path(file_okay=False),
    help="Folder for accuracy-vs-round and accuracy-vs-communication plots (PNG, PDF and SVG).",
)
@click.option(
    "--interval",
    type=click.Choice(("std", "ci95")),
    default="std",
    show_default=True,
    help="The ± part of a cell: sample std over seeds, or the half-width of the t-based 95% CI of the mean.",
)
@click.option(
    "--test",
    "test",
    type=click.Choice(("ttest", "wilcoxon", "none")),
    default="ttest",
    show_default=True,
    help="Paired test (by seed) of each entry against its column's best; "
    "entries with p ≥ --level are underlined as not significantly worse.",
)
@click.option(
    "--level",
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    default=0.05,
    show_default=True,
    help="Significance level of --test.",
)
@click.option(
    "--show-n", is_flag=True, help="Write the number of seeds in every cell (default: only where it differs)."
)
@click.option(
    "--rename",
    multiple=True,
    metavar="OLD=NEW",
    help="Display name of an algorithm or a row (repeatable), e.g. --rename fedavg='FedAvg (ours)'.",
)
@click.option(
    "--latex-fit",
    type=click.Choice(("resize", "transpose", "none")),
    default="resize",
    show_default=True,
    help="LaTeX tables wider than the text: scale down (needs graphicx), "
    "transpose (algorithms as columns, then scaled down if still too wide), or leave as is.",
)
@click.option("--label", help="LaTeX \\label [default: tab:<metric>-<hash of the table>].")
@click.option(
    "--include-diverged",
    is_flag=True,
    help="Show runs whose status is not normal (e.g. diverged) on rows of their own, flagged "
    "[status], instead of leaving them out with a warning.",
)
def leaderboard_command(
    dirs: tuple[str, ...],
    metric: str,
    fmt: str,
    extra: str,
    output: str | None,
    plots: str | None,
    interval: str,
    test: str,
    level: float,
    show_n: bool,
    rename: tuple[str, ...],
    latex_fit: str,
    label: str | None,
    include_diverged: bool,
) -> None:
    """Tabulate the finished runs under DIRS: rows = algorithms, columns = (dataset, α),
    cells = mean ± std over seeds, best bold, not significantly worse than the best underlined,
    average rank and rank. Each run counts once (identified by its settings and seed, not its
    folder name); unfinished, failed, diverged or malformed run folders are skipped with a
    warning; runs that differ in other settings get separate rows."""
    from functools import partial
    from pathlib import Path

    from pflbench.report.latex import to_latex
    from pflbench.report.leaderboard import pivot, write_plots
    from pflbench.report.names import parse_renames
    from pflbench.report.render import FORMATS
    from pflbench.store.layout import check_writable, writing
    from pflbench.store.reader import load_runs

    if fmt == "all" and output is None:
        raise ConfigError("--format all writes one file per format; give --output FOLDER")
    renames = parse_renames(rename)
    if output is not None:  # unwritable targets are an error before any work or output
        into = fmt == "all" or Path(output).is_dir() or not Path(output).suffix
        check_writable(output, kind="folder" if into else "file")
    if plots:
        check_writable(plots)
    frame = load_runs(
        dirs, warn=lambda message: click.echo(f"warning: {message}", err=True), include_abnormal=include_diverged
    )
    if frame.empty:
        raise ConfigError(f"no finished runs under {', '.join(dirs)}")
    table = pivot(
        frame,
        metric,
        _extras(extra),
        interval=interval,
        test=test,
        level=level,
        show_n=show_n,
        renames=renames,
    )
    formats = {**FORMATS, "latex": (partial(to_latex, label=label, fit=latex_fit), ".tex")}
    if output is None:
        click.echo(formats[fmt][0](table), nl=False)
    else:
        target = Path(output)
        into_folder = fmt == "all" or target.is_dir() or not target.suffix
        for name in formats if fmt == "all" else [fmt]:
            render, suffix = formats[name]
            path = target / f"leaderboard_{metric}{suffix}" if into_folder else target
            _write_text(path, render(table))
            click.echo(f"wrote {path}")
    if plots:
        with writing(plots):
            written = write_plots(frame, metric, plots, renames)
        for path in written:
            click.echo(f"plot: {path}")
