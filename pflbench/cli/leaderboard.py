"""``pflbench leaderboard``: comparison tables (Markdown, LaTeX, CSV, HTML) and plots from run folders."""

from __future__ import annotations

from typing import Any

import click

from pflbench.errors import ConfigError

# ---- leaderboard: options and output writing (issues 9 and 14) -------------------------------
FORMAT_CHOICES = ("md", "latex", "csv", "html", "all")


SHOWN_UNFINISHED = 3


def _write_text(path: Any, text: str) -> None:
    """Write one output file; any OSError becomes ``Error: cannot write PATH: reason``."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as error:
        raise ConfigError(f"cannot write {path}: {error.strerror or error}") from None


def _names(text: str, option: str) -> tuple[str, ...]:
    """``"comm, time"`` → ``("comm", "time")`` (the report checks the names). Not
    ``sweeps.grid.split_values``: that module imports the data layer, and with it torch."""
    names = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if text and not names:
        raise ConfigError(f"{option} needs at least one value")
    return names


def _quantities(metric: str | None, metrics: str | None, extra: str) -> tuple[str, tuple[str, ...]]:
    """(main metric, further metrics) from --metric / --metrics and the old --extra."""
    if metric is not None and metrics is not None:
        raise ConfigError("give --metric or --metrics, not both (--metrics: the first is the main metric)")
    # an empty name is not the default: it reaches the report, which names the runs' metrics
    main = "pers_acc" if metric is None else metric.strip()
    listed = _names(metrics, "--metrics") if metrics is not None else (main,)
    if not listed:
        raise ConfigError("--metrics needs at least one metric name (e.g. pers_acc,global_acc)")
    return listed[0], tuple(dict.fromkeys(listed[1:] + _names(extra, "--extra")))


# Options whose value is one comma-separated text; a config file may give them as a list.
COMMA_OPTIONS = ("metrics", "extra", "order")


class LeaderboardCommand(click.Command):
    """``--config FILE``: a TOML/YAML table of this command's options (keys = option names);
    options on the command line override it."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        from pathlib import Path

        from pflbench.cli.config_file import config_path_from, default_map, read_config_file

        path = config_path_from(args)
        if path is not None and not any(a in ctx.help_option_names for a in args):
            table = read_config_file(path)
            for name in COMMA_OPTIONS:
                if isinstance(table.get(name), (list, tuple)):
                    table[name] = ",".join(str(v) for v in table[name])
            values = default_map(table, self.get_params(ctx), Path(path), ignore=("config", "help", "dirs"))
            ctx.default_map = {**(ctx.default_map or {}), **values}
        return super().parse_args(ctx, args)


@click.command("leaderboard", cls=LeaderboardCommand)
@click.argument("dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option(
    "--metric",
    default=None,
    help="Final value from summary.json: pers_acc (default), pers_acc_last10, global_acc, pers_acc_worst10, ...",
)
@click.option(
    "--metrics",
    metavar="M1,M2,...",
    help="Several metrics in one table, one sub-column each per (dataset, partition); the first is the "
    "main metric (ranks, file name). Any numeric summary.json key (pers_acc, global_acc, val_pers_acc, "
    "new_acc, pers_acc_std, pers_acc_worst10, *_last10, bytes_up_total, round_time_s_mean, wall_time_s, "
    "peak_mem_mb, ...) or comm (MB up + down), time, worst10.",
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
    help="Deprecated, use --metrics: metrics added after the main one, e.g. comm (MB up + down), "
    "time (wall seconds), worst10 (worst-10% clients' accuracy).",
)
@click.option(
    "--target",
    metavar="[METRIC=]VALUE",
    help="Add rounds-to-target and MB-to-target columns: the first evaluation round at which METRIC "
    "(a per-round metric; default: the main one) reaches VALUE, and the MB sent up + down by then. "
    "VALUE 0.8: absolute (accuracies as fractions); 90%: 90 percent of the best final mean in each "
    "(dataset, partition).",
)
@click.option(
    "--select-by",
    metavar="METRIC",
    help="Where an algorithm's runs in a (dataset, partition) differ in settings (e.g. a sweep over lr), "
    "show only the setting with the best mean of this validation metric (val_pers_acc, ...): one row per "
    "algorithm, its test metrics; the notes say which setting was chosen.",
)
@click.option(
    "--allow-test-selection",
    is_flag=True,
    help="Let --select-by use a test metric (pers_acc, global_acc, ...); the table is marked 'selected on test'.",
)
@click.option(
    "--order",
    default="name",
    show_default=True,
    metavar="name|rank|METRIC|ALGO,...",
    help="Row order: by name, by rank of the main metric, by average rank over one metric's columns, "
    "or algorithms in a given order (the rest follow by name).",
)
@click.option(
    "--precision",
    type=click.IntRange(0, 10),
    default=2,
    show_default=True,
    help="Decimals shown; values equal at this precision tie (same rank, no single bold).",
)
@click.option(
    "--families",
    is_flag=True,
    help="Add a Family column (the pFL survey's method families, as `pflbench list` groups them) and group "
    "the rows by family, in the survey's order (--order applies within each family).",
)
@click.option("--caption", help="Caption: the table's title (LaTeX \\caption, HTML caption, Markdown 'Table:' line).")
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
    "entries with p ≥ --level are underlined as not significantly worse (only with ≥ 3 shared seeds).",
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
@click.option(
    "--plugin",
    multiple=True,
    help="Python file that registers an algorithm/dataset/model (repeatable): plugin algorithms get "
    "their display names. It is imported (and with it torch, as a plugin usually is).",
)
@click.option(
    "--reference",
    type=click.Path(file_okay=False),
    metavar="FOLDER",
    help="A reference scenario folder (results/reference/<scenario>): its default and tuned rows beside "
    "the runs of DIRS, which must share its scenario (data, partition, model, rounds; protocol and data "
    "content for runs of `pflbench reference`); the scenario's target unless --target is given.",
)
@click.option(
    "--config",
    type=click.Path(dir_okay=False),
    expose_value=False,
    help="TOML or YAML file of these options (keys = option names); options given on the command line override it.",
)
def leaderboard_command(
    dirs: tuple[str, ...],
    metric: str | None,
    metrics: str | None,
    fmt: str,
    extra: str,
    target: str | None,
    select_by: str | None,
    allow_test_selection: bool,
    order: str,
    precision: int,
    families: bool,
    caption: str | None,
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
    plugin: tuple[str, ...],
    reference: str | None,
) -> None:
    """Tabulate the finished runs under DIRS: rows = algorithms, columns = (dataset, α) with one
    sub-column per metric (--metrics), cells = mean ± std over seeds, the best bold (a tie for best:
    italic, none bold), not significantly worse than the best underlined (with ≥ 3 paired seeds),
    average rank and rank. Each run counts once (identified by its settings and seed, not its
    folder name); unfinished, failed, diverged or malformed run folders are skipped with a
    warning; runs that differ in other settings get separate rows, or, with --select-by, one row
    per algorithm: the setting with the best validation metric."""
    from functools import partial
    from pathlib import Path

    from pflbench.registry import load_plugin_file
    from pflbench.report.latex import to_latex
    from pflbench.report.leaderboard import pivot, write_plots
    from pflbench.report.names import parse_renames
    from pflbench.report.render import FORMATS
    from pflbench.report.select import check_metric, select_settings
    from pflbench.store.layout import check_writable, writing
    from pflbench.store.reader import UNFINISHED_REASON, load_runs

    if fmt == "all" and output is None:
        raise ConfigError("--format all writes one file per format; give --output FOLDER")
    main, extras = _quantities(metric, metrics, extra)
    if select_by is None and allow_test_selection:
        raise ConfigError("--allow-test-selection would be ignored: it only applies to --select-by; leave it out")
    if select_by is not None:
        check_metric(select_by, allow_test_selection)
        if include_diverged:
            raise ConfigError(
                "--include-diverged cannot be combined with --select-by: a setting with a diverged run is "
                "never selected (the notes name such settings)"
            )
    for plugin_file in plugin:  # a broken plugin is one error before anything is read or written
        load_plugin_file(plugin_file)
    renames = parse_renames(rename)
    if output is not None:  # unwritable targets are an error before any work or output
        into = fmt == "all" or Path(output).is_dir() or not Path(output).suffix
        check_writable(output, kind="folder" if into else "file")
    if plots:
        check_writable(plots)
    # --select-by reads diverged runs too: a setting with one is never selected (and is named)
    unfinished: list[str] = []
    skipped: list[str] = []  # malformed, duplicate or diverged folders (warnings)

    def warn(message: str) -> None:
        if message.endswith(f": {UNFINISHED_REASON}"):  # many, e.g. the pruned trials of pflbench tune: one line
            unfinished.append(message.removeprefix("skipped ").removesuffix(f": {UNFINISHED_REASON}"))
        else:
            skipped.append(message)  # said once the runs are read: the error, if none is left

    if reference is not None:  # the reference's rows beside DIRS' runs, checked to share its scenario
        from pflbench.config.reference import read_scenario
        from pflbench.report.reference import comparison_frame, setting_renames

        if select_by is not None:
            raise ConfigError("--select-by cannot be combined with --reference: its rows are already default and tuned")
        frame = comparison_frame(dirs, reference, warn=warn)
        renames = {**renames, **setting_renames(frame, renames)}
        target = target if target is not None else read_scenario(reference).protocol.target
    else:
        from pflbench.report.recorded import check_recorded_types

        include = include_diverged or select_by is not None
        frame = load_runs(dirs, warn=warn, include_abnormal=include, check=check_recorded_types)
    if frame.empty and skipped:  # nothing left to show: one error line saying why each folder was skipped
        shown = "; ".join(skipped[:SHOWN_UNFINISHED]) + ("; ..." if len(skipped) > SHOWN_UNFINISHED else "")
        raise ConfigError(f"no finished runs under {', '.join(dirs)}: {shown}")
    for message in skipped:
        click.echo(f"warning: {message}", err=True)
    if unfinished:
        shown = ", ".join(unfinished[:SHOWN_UNFINISHED]) + (", ..." if len(unfinished) > SHOWN_UNFINISHED else "")
        click.echo(
            f"warning: skipped {len(unfinished)} unfinished run{'s' * (len(unfinished) > 1)} (no summary.json: "
            f"running, interrupted or a pruned tune trial): {shown}",
            err=True,
        )
    if frame.empty:
        raise ConfigError(f"no finished runs under {', '.join(dirs)}")
    table = pivot(
        frame,
        main,
        extras,
        interval=interval,
        test=test,
        level=level,
        show_n=show_n,
        renames=renames,
        target=target,
        select_by=select_by,
        allow_test_selection=allow_test_selection,
        precision=precision,
        order=order,
        caption=caption,
        families=families,
    )
    if select_by is not None:  # the plots show the selected settings' runs
        frame = select_settings(frame, select_by, allow_test_selection)[0]
    formats = {**FORMATS, "latex": (partial(to_latex, label=label, fit=latex_fit), ".tex")}
    if output is None:
        click.echo(formats[fmt][0](table), nl=False)
    else:
        destination = Path(output)
        into_folder = fmt == "all" or destination.is_dir() or not destination.suffix
        for name in formats if fmt == "all" else [fmt]:
            render, suffix = formats[name]
            path = destination / f"leaderboard_{main}{suffix}" if into_folder else destination
            _write_text(path, render(table))
            click.echo(f"wrote {path}")
    if plots:
        with writing(plots):
            written = write_plots(frame, main, plots, renames)
        for path in written:
            click.echo(f"plot: {path}")
