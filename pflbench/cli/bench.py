"""``pflbench sweep`` and ``pflbench leaderboard``: grids of runs and the tables made from them."""
from __future__ import annotations

import dataclasses
from typing import Any

import click

from .options import RunCommand, _flag, dataclass_options
from ..config import RunConfig
from ..errors import ConfigError

SWEEP_SHARED = tuple(f.name for f in dataclasses.fields(RunConfig) if f.name not in ("algo", "dataset", "alpha", "seed"))


def _sweep_axes(sets: tuple[str, ...], values: dict[str, Any], run_fields: set[str]) -> dict[str, tuple[Any, ...]]:
    """--set axes plus single-valued algorithm options (--mu 0.1); an option given both ways is an error."""
    from click.core import ParameterSource

    from ..sweep import parse_sets

    axes: dict[str, tuple[Any, ...]] = dict(parse_sets(sets))
    context = click.get_current_context()
    for name, value in values.items():
        explicit = context.get_parameter_source(name) is ParameterSource.COMMANDLINE
        if name in axes and explicit:
            raise ConfigError(f"{_flag(name)} and --set {name} are both given; use one")
        if name not in run_fields and value is not None:
            axes[name] = (value,)
    return axes


def _sweep_callback(algos: str, datasets: str, alphas: str, seeds: str, sets: tuple[str, ...],
                    jobs: int, quiet: bool, plugin: tuple[str, ...], **values: Any) -> int:
    from pathlib import Path

    from ..sweep import Grid, count_statuses, expand_grid, run_sweep, split_values, sweep_record_path

    run_fields = {f.name for f in dataclasses.fields(RunConfig)}
    base = RunConfig(**{k: v for k, v in values.items() if k in run_fields})
    grid = Grid(split_values(algos, str, "--algos"), split_values(datasets, str, "--datasets"),
                split_values(alphas, float, "--alphas"), split_values(seeds, int, "--seeds"),
                _sweep_axes(sets, values, run_fields))
    runs = expand_grid(base, grid)  # every cell resolved like a run; LoRA grids share LoRA defaults
    record = sweep_record_path(base.out, grid, base)

    def report(index: int, run: Any, summary: dict[str, Any] | None) -> None:
        if quiet:
            return
        if summary is not None:
            detail = f"done, pers_acc {summary['pers_acc']:.4f}, {summary['wall_time_s']:.1f}s"
        else:
            detail = "skipped (already finished)" if run.status == "skipped" else f"FAILED {run.error}"
        click.echo(f"[{index + 1}/{len(runs)}] {run.describe()}: {detail}")

    if not quiet:
        click.echo(f"sweep: {len(runs)} runs into {Path(base.out) / 'runs'}")
    try:
        run_sweep(runs, record, grid, base, plugin, report, jobs=jobs)
    except KeyboardInterrupt:
        counts = count_statuses(runs)
        click.echo(f"sweep interrupted: {counts['done']} done, {counts['skipped']} skipped, "
                   f"{counts['interrupted'] + counts['pending']} not finished; rerun the same command "
                   f"to finish them. record: {record}", err=True)
        raise
    counts = count_statuses(runs)
    click.echo(f"sweep: {counts['done']} done, {counts['skipped']} skipped (already finished), "
               f"{counts['failed']} failed; record: {record}")
    for run in runs:
        if run.status == "failed":
            click.echo(f"  failed {run.name}: {run.error} (see {run.run_dir / 'error.json'})", err=True)
    return 1 if counts["failed"] else 0


sweep = RunCommand(
    "sweep", callback=_sweep_callback,
    help="Run a grid of experiments: algorithms × datasets × α × seeds × --set axes.\n\n"
         "Every other option is shared by all runs. Runs already finished in --out are skipped, so "
         "rerunning the command resumes the sweep; a failed run gets error.json in its folder and "
         "the sweep goes on (exit code 1 at the end). The sweep's grid and each run's status go to "
         "OUT/sweeps/<time>-<hash>.json.\n\n"
         "\b\nExample:\n  pflbench sweep --algos fedavg,fedprox --alphas 0.1,1 --seeds 0,1,2 --set mu=0.01,0.1",
    params=[click.Option(["--algos"], default=RunConfig.algo, show_default=True,
                         help="Algorithms, comma-separated."),
            click.Option(["--datasets"], default=RunConfig.dataset, show_default=True,
                         help="Datasets, comma-separated."),
            click.Option(["--alphas"], default=f"{RunConfig.alpha:g}", show_default=True,
                         help="Dirichlet concentrations, comma-separated."),
            click.Option(["--seeds"], default=str(RunConfig.seed), show_default=True,
                         help="Seeds, comma-separated."),
            click.Option(["--set", "sets"], multiple=True, metavar="NAME=V1,V2",
                         help="Another grid axis: a run option (lr=0.01,0.05) or an algorithm "
                              "hyperparameter (mu=0.01,0.1; only for the algorithms that have it). Repeatable."),
            *dataclass_options(RunConfig, SWEEP_SHARED),
            click.Option(["--jobs", "-j"], type=click.IntRange(min=1), default=1, show_default=True,
                         help="Runs at once, each in its own process with max(1, threads // jobs) "
                              "threads (--threads 0: every usable core). Same metrics as --jobs 1 "
                              "at equal threads per run."),
            click.Option(["--quiet", "-q"], is_flag=True, help="Print only the final summary."),
            click.Option(["--plugin"], multiple=True, type=str,
                         help="Python file that registers an algorithm/dataset/model (repeatable).")])

FORMAT_CHOICES = ("md", "latex", "csv", "html", "all")


@click.command("leaderboard")
@click.argument("dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--metric", default="pers_acc", show_default=True,
              help="Final value from summary.json: pers_acc, pers_acc_last10, global_acc, pers_acc_worst10, ...")
@click.option("--format", "fmt", type=click.Choice(FORMAT_CHOICES), default="md", show_default=True,
              help="Output format; all = md, latex, csv and html.")
@click.option("--extra", default="", metavar="comm,time,worst10",
              help="Extra columns: comm (MB up + down), time (wall seconds), worst10 (worst-10% clients' accuracy).")
@click.option("--output", type=click.Path(), help="File, or folder for leaderboard_<metric>.<ext> "
              "(needed by --format all). Default: print to stdout.")
@click.option("--plots", type=click.Path(file_okay=False),
              help="Folder for accuracy-vs-round and accuracy-vs-communication plots (PNG and PDF).")
def leaderboard_command(dirs: tuple[str, ...], metric: str, fmt: str, extra: str, output: str | None,
                        plots: str | None) -> None:
    """Tabulate the finished runs under DIRS: rows = algorithms, columns = (dataset, α),
    cells = mean ± std over seeds. Unfinished, failed or unreadable run folders are skipped with
    a warning; runs that differ in other settings get separate rows."""
    from pathlib import Path

    from ..leaderboard import load_runs, pivot, write_plots
    from ..sweep import split_values
    from ..tables import FORMATS

    if fmt == "all" and output is None:
        raise ConfigError("--format all writes one file per format; give --output FOLDER")
    frame = load_runs(dirs, warn=lambda message: click.echo(f"warning: {message}", err=True))
    if frame.empty:
        raise ConfigError(f"no finished runs under {', '.join(dirs)}")
    table = pivot(frame, metric, split_values(extra, str, "--extra") if extra else ())
    if output is None:
        click.echo(FORMATS[fmt][0](table), nl=False)
    else:
        target = Path(output)
        into_folder = fmt == "all" or target.is_dir() or not target.suffix
        for name in (FORMATS if fmt == "all" else [fmt]):
            render, suffix = FORMATS[name]
            path = target / f"leaderboard_{metric}{suffix}" if into_folder else target
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(render(table))
            click.echo(f"wrote {path}")
    if plots:
        for path in write_plots(frame, metric, plots):
            click.echo(f"plot: {path}")
