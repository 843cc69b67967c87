"""``pflbench sweep``: a grid of runs (algorithms × datasets × α × seeds × ``--set`` axes)."""

from __future__ import annotations

import dataclasses
from typing import Any

import click

from pflbench.cli.config_file import config_option
from pflbench.cli.controls import CommandOption, command_option_names, controls
from pflbench.cli.options import RunCommand, _flag, dataclass_options
from pflbench.config.run_config import RunConfig
from pflbench.errors import ConfigError

SWEEP_SHARED = tuple(
    f.name for f in dataclasses.fields(RunConfig) if f.name not in ("algo", "dataset", "alpha", "seed")
)


def _sweep_axes(sets: tuple[str, ...], values: dict[str, Any], run_fields: set[str]) -> dict[str, tuple[Any, ...]]:
    """--set axes plus single-valued algorithm options (--mu 0.1). An option given both ways in
    the same place (both on the command line, or both in --config) is an error; between the two
    places the command line wins."""
    from click.core import ParameterSource

    from pflbench.sweeps.grid import parse_sets

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


GRID = "Grid"  # the help section of the grid's axes


def grid_options(seeds_help: str = "Seeds, comma-separated.") -> list[click.Option]:
    """The grid's axes (``sweep``, ``tune``): algorithms × datasets × α × seeds × --set."""
    return [
        CommandOption(
            ["--algos"], section=GRID, default=RunConfig.algo, show_default=True, help="Algorithms, comma-separated."
        ),
        CommandOption(
            ["--datasets"],
            section=GRID,
            default=RunConfig.dataset,
            show_default=True,
            help="Datasets, comma-separated.",
        ),
        CommandOption(
            ["--alphas"],
            section=GRID,
            default=f"{RunConfig.alpha:g}",
            show_default=True,
            help="Dirichlet concentrations, comma-separated.",
        ),
        CommandOption(["--seeds"], section=GRID, default=str(RunConfig.seed), show_default=True, help=seeds_help),
        CommandOption(
            ["--set", "sets"],
            section=GRID,
            multiple=True,
            metavar="NAME=V1,V2",
            help="Another grid axis: a run option (lr=0.01,0.05) or an algorithm "
            "hyperparameter (mu=0.01,0.1; only for the algorithms that have it). Repeatable.",
        ),
    ]


def sweep_controls() -> list[click.Option]:
    """The controls of a grid's command (``sweep``, ``tune``)."""
    return controls(
        "ray",
        "cpus_per_run",
        "gpus_per_run",
        "jobs",
        "force",
        "quiet",
        "dry_run",
        "plugin",
        "help_all",
        force="Redo every run of the grid, finished ones too (each earlier result is replaced only when its new run "
        "completes).",
        quiet="Print only the final summary.",
    )


NAMES_SHOWN = 10  # runs named in the one line that lists stale runs


def sweep_plan(
    algos: str, datasets: str, alphas: str, seeds: str, sets: tuple[str, ...], **values: Any
) -> tuple[RunConfig, Any]:
    """(shared RunConfig, Grid) from the sweep command's values (inside its click context);
    the sweep's own controls (--jobs, --ray, ...) are not grid settings."""
    from pflbench.sweeps.grid import Grid, split_values

    values = {k: v for k, v in values.items() if k not in command_option_names(click.get_current_context().command)}

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
    force: bool,
    **values: Any,
) -> int:
    from pathlib import Path

    from pflbench.cli.options import refuse_inert_options
    from pflbench.config.run_config import hyperparameters_from
    from pflbench.registry import ALGORITHMS
    from pflbench.store.layout import ERROR_FILE, RUNS_DIR, check_writable
    from pflbench.sweeps.grid import check_grid, expand_grid
    from pflbench.sweeps.local import run_sweep
    from pflbench.sweeps.one import mark_redo
    from pflbench.sweeps.record import count_statuses, sweep_record_path

    base, grid = sweep_plan(algos, datasets, alphas, seeds, sets, **values)
    on_ray = ray or (base.ray_address is not None and base.executor != "ray")
    refuse_resources_without_ray(on_ray)
    if on_ray and not dry_run:  # fail before expanding (and before any Ray start-up) on bad resources/no Ray
        from pflbench.sweeps.on_ray import check_resources
        from pflbench.util.ray_cluster import require_ray

        check_resources(base, cpus_per_run, gpus_per_run)
        require_ray()
    # every cell resolved like a run (LoRA grids share LoRA defaults), with its share of the
    # threads when --jobs N runs N at once (a Ray task's threads are its own --threads)
    runs = expand_grid(base, grid, 1 if on_ray else jobs)
    refuse_inert_options(
        [
            (
                run.config,
                hyperparameters_from(
                    ALGORITHMS.get(run.config.algo).hyperparameters, dict(run.algo_options), run.config.algo
                ),
            )
            for run in runs
        ],
        swept=set(grid.axes),
    )
    states = mark_redo(runs, force)  # finished runs: current, stale (code changed) or unrecorded
    if dry_run:
        state_of = {run.name: state for state, runs_in in states.items() for run in runs_in}
        notes = FORCED_NOTES if force else DRY_RUN_NOTES
        for run in runs:
            click.echo(f"{run.describe()}: {run.run_dir}{notes[state_of[run.name]]}")
        click.echo(f"sweep: {len(runs)} runs (dry run, nothing was run)")
        return 0
    check_writable(base.out)
    check_writable(Path(base.out) / RUNS_DIR)
    check_grid(runs)  # each distinct dataset/partition/model built once: bad options refuse the grid
    record = sweep_record_path(base.out, grid, base)

    def report(index: int, run: Any, summary: dict[str, Any] | None) -> None:
        if quiet:
            return
        if summary is not None:
            again = {"stale": " (re-run: stale)", "forced": " (redone: --force)"}.get(run.redo or "", "")
            detail = f"done{again}, pers_acc {summary['pers_acc']:.4f}, {summary['wall_time_s']:.1f}s"
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
            f"sweep: {len(runs)} runs into {Path(base.out) / RUNS_DIR}"
            + (f" as Ray tasks ({cpus_per_run:g} CPU, {gpus_per_run:g} GPU each)" if on_ray else "")
        )
    for line in redo_lines(states, force):
        click.echo(line)
    try:
        if on_ray:
            from pflbench.sweeps.on_ray import run_sweep_on_ray

            run_sweep_on_ray(
                runs, record, grid, base, plugin, report, cpus_per_run, gpus_per_run, disconnect=True, force=force
            )
        else:
            run_sweep(runs, record, grid, base, plugin, report, jobs=jobs, force=force)
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
    redone = sum(1 for run in runs if run.status == "done" and run.redo)
    click.echo(
        f"sweep: {counts['done']} done{f' ({redone} of them finished before: stale or --force)' if redone else ''}, "
        f"{counts['skipped']} skipped (already finished), "
        f"{counts['claimed']} skipped (running elsewhere), {counts['diverged']} diverged, "
        f"{counts['failed']} failed; record: {record}"
    )
    for run in runs:
        if run.status == "failed":
            click.echo(f"  failed {run.name}: {run.error} (see {run.run_dir / ERROR_FILE})", err=True)
        elif run.status == "diverged":
            click.echo(f"  diverged {run.name}: {run.error}", err=True)
        elif run.status == "claimed":
            click.echo(f"  not run {run.name}: {run.error}")
    return 1 if counts["failed"] or counts["diverged"] else 0


def refuse_resources_without_ray(on_ray: bool) -> None:
    """--cpus-per-run/--gpus-per-run given (command line or --config) without Ray: inert, refused."""
    from pflbench.cli.options import explicit_options

    resources = [] if on_ray else sorted(explicit_options(("cpus_per_run", "gpus_per_run")))
    if resources:
        raise ConfigError(
            f"--{resources[0].replace('_', '-')} would be ignored: only Ray tasks declare resources "
            "(--ray or --ray-address); a local sweep runs --jobs processes of --threads threads; leave it out"
        )


DRY_RUN_NOTES = {
    "unfinished": "",
    "current": " (finished)",
    "stale": " (finished, stale: its code changed; will be re-run)",
    "unrecorded": " (finished, recorded before code records: kept)",
}
FORCED_NOTES = {
    state: " (finished; --force: will be redone)" if state != "unfinished" else "" for state in DRY_RUN_NOTES
}


def _named(runs: list[Any]) -> str:
    names = ", ".join(run.name for run in runs[:NAMES_SHOWN])
    return names + (f", … ({len(runs) - NAMES_SHOWN} more)" if len(runs) > NAMES_SHOWN else "")


def redo_lines(states: dict[str, list[Any]], force: bool) -> list[str]:
    """One line each: the finished runs redone (--force), re-run (stale) or kept (unrecorded)."""
    finished = [run for state in ("current", "stale", "unrecorded") for run in states[state]]
    if force:
        replaced = "each result is replaced once its new run completes"
        return [f"sweep --force: redoing {len(finished)} finished runs too ({replaced})"] if finished else []
    lines = []
    if states["stale"]:
        stale = states["stale"]
        lines.append(
            f"sweep: {len(stale)} finished runs are stale (code changed since they ran), re-running: {_named(stale)}"
        )
    if states["unrecorded"]:
        kept = states["unrecorded"]
        lines.append(
            f"sweep: {len(kept)} finished runs were recorded before pflbench recorded code; kept as finished "
            f"(--force redoes them): {_named(kept)}"
        )
    return lines


sweep_command = RunCommand(
    "sweep",
    callback=_sweep_callback,
    help="Run a grid of experiments: algorithms × datasets × α × seeds × --set axes.\n\n"
    "Every other option is shared by all runs. Runs already finished in --out are skipped, "
    "unless their code changed since they ran (stale: a plugin file, a built-in plugin module or "
    "pflbench's version; they are re-run and their results replaced), and unfinished ones continue "
    "from their checkpoint, so rerunning the command resumes the sweep; --force redoes every run; "
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
        *grid_options(),
        *dataclass_options(RunConfig, SWEEP_SHARED),
        *sweep_controls(),
    ],
)
