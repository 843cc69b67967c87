"""``pflbench sweep`` and ``pflbench leaderboard``: grids of runs and the tables made from them."""

from __future__ import annotations

import dataclasses
from typing import Any

import click

from ..config import RunConfig
from ..errors import ConfigError
from .config_file import config_option
from .options import RunCommand, _flag, dataclass_options

SWEEP_SHARED = tuple(
    f.name for f in dataclasses.fields(RunConfig) if f.name not in ("algo", "dataset", "alpha", "seed")
)


def _sweep_axes(sets: tuple[str, ...], values: dict[str, Any], run_fields: set[str]) -> dict[str, tuple[Any, ...]]:
    """--set axes plus single-valued algorithm options (--mu 0.1). An option given both ways in
    the same place (both on the command line, or both in --config) is an error; between the two
    places the command line wins."""
    from click.core import ParameterSource

    from ..sweep import parse_sets

    axes: dict[str, tuple[Any, ...]] = dict(parse_sets(sets))
    context = click.get_current_context()
    given = (ParameterSource.COMMANDLINE, ParameterSource.DEFAULT_MAP)
    sets_source = context.get_parameter_source("sets")
    for name, value in values.items():
        source = context.get_parameter_source(name)
        if name in axes and source in given:
            if source is sets_source:
                where = "--config" if source is ParameterSource.DEFAULT_MAP else "the command line"
                raise ConfigError(f"{_flag(name)} and --set {name} are both given ({where}); use one")
            if source is ParameterSource.DEFAULT_MAP:
                continue  # the command line's --set wins over the file's single value
        if name not in run_fields and value is not None:
            axes[name] = (value,)
    return axes


SWEEP_CONTROLS = ("jobs", "quiet", "dry_run", "plugin", "ray", "cpus_per_run", "gpus_per_run", "config")


def sweep_plan(
    algos: str, datasets: str, alphas: str, seeds: str, sets: tuple[str, ...], **values: Any
) -> tuple[RunConfig, Any]:
    """(shared RunConfig, Grid) from the sweep command's values (inside its click context);
    the sweep's own controls (--jobs, --ray, ...) are not grid settings."""
    from ..sweep import Grid, split_values

    values = {k: v for k, v in values.items() if k not in SWEEP_CONTROLS}

    run_fields = {f.name for f in dataclasses.fields(RunConfig)}
    base = RunConfig(**{k: v for k, v in values.items() if k in run_fields})
    grid = Grid(
        split_values(algos, str, "--algos"),
        split_values(datasets, str, "--datasets"),
        split_values(alphas, float, "--alphas"),
        split_values(seeds, int, "--seeds"),
        _sweep_axes(sets, values, run_fields),
    )
    return base, grid


def _sweep_callback(
    algos: str,
    datasets: str,
    alphas: str,
    seeds: str,
    sets: tuple[str, ...],
    jobs: int,
    quiet: bool,
    dry_run: bool,
    plugin: tuple[str, ...],
    ray: bool,
    cpus_per_run: float,
    gpus_per_run: float,
    **values: Any,
) -> int:
    from pathlib import Path

    from ..config import hyperparameters_from
    from ..registry import ALGORITHMS
    from ..rundir import check_writable
    from ..sweep import check_grid, count_statuses, expand_grid, run_sweep, sweep_record_path
    from .options import refuse_inert_options

    base, grid = sweep_plan(algos, datasets, alphas, seeds, sets, **values)
    on_ray = ray or (base.ray_address is not None and base.executor != "ray")
    if on_ray and not dry_run:  # fail before expanding (and before any Ray start-up) on bad resources/no Ray
        from ..ray_support import require_ray
        from ..ray_sweep import check_resources

        check_resources(base, cpus_per_run, gpus_per_run)
        require_ray()
    runs = expand_grid(base, grid)  # every cell resolved like a run; LoRA grids share LoRA defaults
    refuse_inert_options(
        [
            (
                run.config,
                hyperparameters_from(
                    ALGORITHMS.get(run.config.algo).hyperparameters, dict(run.algo_options), run.config.algo
                ),
            )
            for run in runs
        ]
    )
    if dry_run:
        for run in runs:
            done = " (finished)" if (run.run_dir / "summary.json").is_file() else ""
            click.echo(f"{run.describe()}: {run.run_dir}{done}")
        click.echo(f"sweep: {len(runs)} runs (dry run, nothing was run)")
        return 0
    check_writable(base.out)
    check_writable(Path(base.out) / "runs")
    check_grid(runs)  # each distinct dataset/partition/model built once: bad options refuse the grid
    record = sweep_record_path(base.out, grid, base)

    def report(index: int, run: Any, summary: dict[str, Any] | None) -> None:
        if quiet:
            return
        if summary is not None:
            detail = f"done, pers_acc {summary['pers_acc']:.4f}, {summary['wall_time_s']:.1f}s"
        elif run.status == "skipped":
            detail = "skipped (already finished)"
        elif run.status == "claimed":
            detail = f"skipped ({run.error})"
        elif run.status == "diverged":
            detail = f"DIVERGED ({run.error})"
        else:
            detail = f"FAILED {run.error}"
        click.echo(f"[{index + 1}/{len(runs)}] {run.describe()}: {detail}")

    if not quiet:
        click.echo(
            f"sweep: {len(runs)} runs into {Path(base.out) / 'runs'}"
            + (f" as Ray tasks ({cpus_per_run:g} CPU, {gpus_per_run:g} GPU each)" if on_ray else "")
        )
    try:
        if on_ray:
            from ..ray_sweep import run_sweep_on_ray

            run_sweep_on_ray(runs, record, grid, base, plugin, report, cpus_per_run, gpus_per_run, disconnect=True)
        else:
            run_sweep(runs, record, grid, base, plugin, report, jobs=jobs)
    except KeyboardInterrupt:
        counts = count_statuses(runs)
        click.echo(
            f"sweep interrupted: {counts['done']} done, {counts['skipped']} skipped, "
            f"{counts['interrupted'] + counts['pending']} not finished; rerun the same command "
            f"to finish them. record: {record}",
            err=True,
        )
        raise
    counts = count_statuses(runs)
    click.echo(
        f"sweep: {counts['done']} done, {counts['skipped']} skipped (already finished), "
        f"{counts['claimed']} skipped (running elsewhere), {counts['diverged']} diverged, "
        f"{counts['failed']} failed; record: {record}"
    )
    for run in runs:
        if run.status == "failed":
            click.echo(f"  failed {run.name}: {run.error} (see {run.run_dir / 'error.json'})", err=True)
        elif run.status == "diverged":
            click.echo(f"  diverged {run.name}: {run.error}", err=True)
        elif run.status == "claimed":
            click.echo(f"  not run {run.name}: {run.error}")
    return 1 if counts["failed"] or counts["diverged"] else 0


sweep = RunCommand(
    "sweep",
    callback=_sweep_callback,
    help="Run a grid of experiments: algorithms × datasets × α × seeds × --set axes.\n\n"
    "Every other option is shared by all runs. Runs already finished in --out are skipped and "
    "unfinished ones continue from their checkpoint, so rerunning the command resumes the sweep; "
    "runs another live process is running are skipped; a diverged run keeps its partial "
    "results (status diverged, exit code 1); a failed run gets error.json in its folder and "
    "the sweep goes on (exit code 1 at the end). The sweep's grid and each run's status go to "
    "OUT/sweeps/<time>-<hash>.json.\n\n"
    "A whole grid can live in a TOML/YAML file (--config FILE: algos, datasets, alphas, seeds, "
    "a [set] table and any shared option); the command line overrides it.\n\n"
    "\b\nExample:\n  pflbench sweep --algos fedavg,fedprox --alphas 0.1,1 --seeds 0,1,2 --set mu=0.01,0.1\n"
    "  pflbench sweep --config examples/paper_digits.toml",
    params=[
        config_option(),
        click.Option(["--algos"], default=RunConfig.algo, show_default=True, help="Algorithms, comma-separated."),
        click.Option(["--datasets"], default=RunConfig.dataset, show_default=True, help="Datasets, comma-separated."),
        click.Option(
            ["--alphas"],
            default=f"{RunConfig.alpha:g}",
            show_default=True,
            help="Dirichlet concentrations, comma-separated.",
        ),
        click.Option(["--seeds"], default=str(RunConfig.seed), show_default=True, help="Seeds, comma-separated."),
        click.Option(
            ["--set", "sets"],
            multiple=True,
            metavar="NAME=V1,V2",
            help="Another grid axis: a run option (lr=0.01,0.05) or an algorithm "
            "hyperparameter (mu=0.01,0.1; only for the algorithms that have it). Repeatable.",
        ),
        *dataclass_options(RunConfig, SWEEP_SHARED),
        click.Option(
            ["--ray"],
            is_flag=True,
            help="Run whole runs in parallel as Ray tasks (a local Ray instance with this "
            "machine's CPUs, or the cluster of --ray-address, which implies --ray); "
            "results are written here as by a local sweep. pip install 'pflbench[ray]'.",
        ),
        click.Option(
            ["--cpus-per-run"],
            type=float,
            default=1.0,
            show_default=True,
            help="CPUs each run task declares to Ray (and its torch threads).",
        ),
        click.Option(
            ["--gpus-per-run"],
            type=float,
            default=0.0,
            show_default=True,
            help="GPUs each run task declares to Ray (fractions share a GPU).",
        ),
        click.Option(
            ["--jobs", "-j"],
            type=click.IntRange(min=1),
            default=1,
            show_default=True,
            help="Runs at once, each in its own process with max(1, threads // jobs) "
            "threads (--threads 0: every usable core). Same metrics as --jobs 1 "
            "at equal threads per run.",
        ),
        click.Option(["--quiet", "-q"], is_flag=True, help="Print only the final summary."),
        click.Option(
            ["--dry-run"], is_flag=True, help="List the grid's runs (and which are finished) without running anything."
        ),
        click.Option(
            ["--plugin"],
            multiple=True,
            type=str,
            help="Python file that registers an algorithm/dataset/model (repeatable).",
        ),
    ],
)

# ---- leaderboard: options and output writing (issues 9 and 14) -------------------------------
FORMAT_CHOICES = ("md", "latex", "csv", "html", "all")


def _write_text(path: Any, text: str) -> None:
    """Write one output file; any OSError becomes ``Error: cannot write PATH: reason``."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as error:
        raise ConfigError(f"cannot write {path}: {error.strerror or error}") from None


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

    from ..latex import to_latex
    from ..leaderboard import load_runs, pivot, write_plots
    from ..names import parse_renames
    from ..rundir import check_writable, writing
    from ..sweep import split_values
    from ..tables import FORMATS

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
        split_values(extra, str, "--extra") if extra else (),
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
