"""``pflbench tune``: hyperparameter search on validation metrics (``sweeps.tune``), then the
chosen setting over ``--seeds``."""

from __future__ import annotations

from typing import Any

import click

from pflbench.cli.config_file import config_option
from pflbench.cli.controls import CommandOption
from pflbench.cli.options import RunCommand, dataclass_options
from pflbench.cli.sweep import SWEEP_SHARED, grid_options, refuse_resources_without_ray, sweep_controls, sweep_plan
from pflbench.config.run_config import RunConfig


def _tune_callback(
    space: tuple[str, ...],
    objective: str,
    trials: int,
    sampler: str,
    pruner: str,
    sampler_seed: int,
    allow_test_selection: bool,
    default_trial: bool,
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
    import importlib.util
    from pathlib import Path

    from pflbench.cli.options import refuse_inert_options
    from pflbench.errors import ConfigError

    if not dry_run and importlib.util.find_spec("optuna") is None:  # said at once, before torch is imported
        raise ConfigError("pflbench tune needs Optuna: pip install 'pflbench[tune]'")
    from pflbench.store.layout import RUNS_DIR, check_writable
    from pflbench.sweeps.grid import Grid, check_grid
    from pflbench.sweeps.local import run_sweep
    from pflbench.sweeps.record import sweep_record_path
    from pflbench.sweeps.tune import (
        TuneSettings,
        check_journal,
        claimed_elsewhere,
        final_runs,
        finish_study,
        parse_space,
        plan_studies,
        require_optuna,
        run_study,
        space_text,
    )

    settings = TuneSettings(objective, trials, sampler, pruner, sampler_seed, allow_test_selection, default_trial)
    base, grid = sweep_plan(
        values.pop("algos"),
        values.pop("datasets"),
        values.pop("alphas"),
        values.pop("seeds"),
        values.pop("sets"),
        **values,
    )
    plans = plan_studies(base, grid, parse_space(space), settings)
    on_ray = ray or (base.ray_address is not None and base.executor != "ray")
    refuse_resources_without_ray(on_ray)
    # an option no trial and no final run would read is refused, as by run and sweep
    refuse_inert_options([run_settings(run) for plan in plans for run in trial_runs(plan)], swept=set(grid.axes))
    for plan in plans:
        plan.force = force
    echo = (lambda line: None) if quiet else click.echo
    if dry_run:
        for plan in plans:
            dims = " ".join(f"{k}={v}" for k, v in space_text(plan.space).items())
            click.echo(
                f"{plan.describe()}: {dims}; {trials} trials on seed {plan.cell.config.seed} → {plan.path('.json')}"
            )
        click.echo(f"tune: {len(plans)} studies (dry run, nothing was run)")
        return 0
    require_optuna()
    if on_ray:
        from pflbench.sweeps.on_ray import check_resources
        from pflbench.util.ray_cluster import require_ray

        check_resources(base, cpus_per_run, gpus_per_run)
        require_ray()
    check_writable(base.out)
    check_writable(Path(base.out) / RUNS_DIR)
    if not force:  # a damaged journal refuses before anything runs (--force starts each study over)
        for plan in plans:
            warning = check_journal(plan)
            if warning:
                click.echo(f"warning: {warning}", err=True)
    check_grid([plan.cell for plan in plans])  # bad options refuse before any trial runs
    if settings.selected_on == "test":
        click.echo(
            f"warning: tuning on the test metric {objective} (--allow-test-selection): the chosen "
            "setting's test metrics are not an unbiased estimate",
            err=True,
        )
    ray_settings = {"cpus": cpus_per_run, "gpus": gpus_per_run} if on_ray else None
    finals = []
    for index, plan in enumerate(plans):
        echo(
            f"[study {index + 1}/{len(plans)}] {plan.describe()}: {trials} trials of "
            + " ".join(f"{k}={v}" for k, v in space_text(plan.space).items())
            + f", objective {objective}"
        )
        record = run_study(plan, plugin, jobs, echo, ray_settings)
        finals.append((plan, final_runs(plan, record)))
    # under --force a trial this command just ran is not run once more as its seed's final run
    runs = [run for plan, plan_runs in finals for run in plan_runs if not (force and run.name in plan.ran)]
    seeds_grid = Grid(grid.algos, grid.datasets, grid.alphas, grid.seeds, grid.axes)
    echo(f"tune: the chosen settings over seeds {','.join(map(str, grid.seeds))}: {len(runs)} runs")
    record_path = sweep_record_path(base.out, seeds_grid, base)
    while runs:  # a run another tune on this --out is running is waited for, then read back
        if on_ray:
            from pflbench.sweeps.on_ray import run_sweep_on_ray

            run_sweep_on_ray(
                runs,
                record_path,
                seeds_grid,
                base,
                plugin,
                None,
                cpus_per_run,
                gpus_per_run,
                disconnect=True,
                force=force,
            )
        else:
            run_sweep(runs, record_path, seeds_grid, base, plugin, None, jobs=jobs, force=force)
        runs = claimed_elsewhere(runs, echo)
    failed = 0
    for plan, plan_runs in finals:
        record = finish_study(plan, plan_runs)
        best, final = record["best"], record["final"]
        chosen = " ".join(f"{k}={_short(v)}" for k, v in best["params"].items())
        shown = []
        for metric in ("pers_acc", "global_acc"):
            stats = final["metrics"].get(metric)
            if stats:
                spread = f" ± {stats['std']:.4f}" if stats["std"] is not None else ""  # sample std, as the leaderboard
                shown.append(f"{metric} {stats['mean']:.4f}{spread} (n={stats['n']})")
        failed += sum(1 for s in final["seeds"] if s.get("status") != "completed")
        click.echo(
            f"{plan.describe()}: chose {chosen} ({objective} {best['value']:.4f}, selected on "
            f"{record['selected_on']}); test " + ", ".join(shown) + f"; record: {plan.path('.json')}"
        )
    return 1 if failed else 0


def trial_runs(plan: Any) -> list[Any]:
    """Runs that stand for ``plan``'s trials: its cell, and the cell with each value of each
    choice (each end of each range) of its space, so that an option one trial reads is kept."""
    from pflbench.config.space import Choice
    from pflbench.errors import ConfigError

    runs = [plan.cell]
    for name, dimension in plan.space.items():
        if isinstance(dimension, Choice):
            values = dimension.values
        else:
            ends = (dimension.low, dimension.high)
            values = tuple(round(v) for v in ends) if dimension.integer else ends
        for value in values:
            try:
                runs.append(plan.run_of({name: value}))
            except ConfigError:  # an end no trial may draw (a bound a setting excludes): it stands for none
                continue
    return runs


def run_settings(run: Any) -> tuple[Any, Any]:
    """(config, hyperparameters) of a planned run."""
    from pflbench.config.run_config import hyperparameters_from
    from pflbench.registry import ALGORITHMS

    algo = run.config.algo
    return run.config, hyperparameters_from(ALGORITHMS.get(algo).hyperparameters, dict(run.algo_options), algo)


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


TUNING = "Tuning"  # the help section of the study's own options

tune_command = RunCommand(
    "tune",
    callback=_tune_callback,
    help="Tune hyperparameters on a validation metric, then run the chosen setting over --seeds.\n\n"
    "One study per cell of the grid (algorithms × datasets × α × --set values). Its trials are "
    "ordinary runs on the first seed of --seeds, proposed by Optuna (TPE or grid) from --space "
    "(default: each algorithm's own space, e.g. lr around its default and FedProx's μ grid) and "
    "pruned on the per-round objective (median pruner). The study is kept in "
    "OUT/tune/<study>.journal, so rerunning the command continues it; OUT/tune/<study>.json "
    "records every trial, the selection and the chosen setting's test metrics per seed. "
    "pip install 'pflbench[tune]'.\n\n"
    "\b\nExample:\n  pflbench tune --algos fedavg,fedprox --alphas 0.1 --trials 8 --seeds 0,1,2\n"
    "  pflbench tune --algos fedprox --space lr=log:0.005:0.5 --space mu=0.001,0.01,0.1,1 --sampler grid",
    params=[
        config_option(),
        *grid_options(seeds_help="Seeds, comma-separated: the trials run on the first, the chosen setting on all."),
        CommandOption(
            section=TUNING,
            param_decls=["--space"],
            multiple=True,
            metavar="NAME=SPEC",
            help="A tuned setting (run option or hyperparameter): V1,V2,... (choices), LOW:HIGH "
            "(uniform) or log:LOW:HIGH (log-uniform); integer settings take whole numbers. "
            "Repeatable; replaces the algorithms' default spaces.",
        ),
        CommandOption(
            section=TUNING,
            param_decls=["--objective"],
            default="val_pers_acc",
            show_default=True,
            help="Metric to maximise: val_pers_acc, val_pers_acc_weighted, val_pers_acc_worst10, "
            "val_global_acc (final value; add _last10 for the mean of the last 10% of evaluations).",
        ),
        CommandOption(
            section=TUNING, param_decls=["--trials"], type=int, default=16, show_default=True, help="Trials per study."
        ),
        CommandOption(
            section=TUNING,
            param_decls=["--sampler"],
            type=click.Choice(["tpe", "grid"]),
            default="tpe",
            show_default=True,
            help="tpe: random trials first, then Optuna's TPE; grid: every combination of the listed values.",
        ),
        CommandOption(
            section=TUNING,
            param_decls=["--pruner"],
            type=click.Choice(["median", "none"]),
            default="median",
            show_default=True,
            help="median: stop a trial whose objective falls below the median of earlier trials at the same round.",
        ),
        CommandOption(
            section=TUNING,
            param_decls=["--sampler-seed"],
            type=int,
            default=0,
            show_default=True,
            help="Seed of the sampler.",
        ),
        CommandOption(
            section=TUNING,
            param_decls=["--allow-test-selection"],
            is_flag=True,
            help="Allow a test metric as --objective (the record says 'selected on test').",
        ),
        CommandOption(
            section=TUNING,
            param_decls=["--default-trial"],
            is_flag=True,
            help="Run the algorithm's default setting as the first trial (tpe), so the choice is never "
            "worse on validation than the default (as `pflbench reference` does).",
        ),
        *dataclass_options(RunConfig, SWEEP_SHARED),
        *sweep_controls(),
    ],
)
