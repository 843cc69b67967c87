"""``pflbench tune``: hyperparameter search on a validation metric, then the chosen setting over seeds.

One *study* per cell of the grid (algorithm × dataset × α × ``--set`` values): its trials are
ordinary runs (folders in ``OUT/runs``, named by their settings like any run, so a trial a sweep
already ran is read back instead of run again) on the first of ``--seeds``. Optuna proposes each
trial's setting from the space (``config.space``: ``--space``/``[space]``, else the algorithm's
``search_space`` hook) with its TPE or grid sampler, in the driver (ask and tell). A trial reports
the objective's per-round value at every evaluation round; the median pruner stops a trial whose
value falls below the median of earlier trials at the same round (its folder stays unfinished,
with its checkpoint). The study lives in ``OUT/tune/<study>.journal`` (Optuna's journal file), so
running the same command again continues it: finished trials count, a trial that was running
when the command stopped is run again (its run resumes from its checkpoint).

When the trials are done, the best trial's setting (by the objective, never by a test metric
unless asked for explicitly) runs over every seed of ``--seeds`` as a sweep does, and the study
record ``OUT/tune/<study>.json`` holds every trial (setting, state, objective, per-round values,
run folder), the selection and the chosen setting's test metrics per seed with mean and std.

``--jobs N`` runs N trials at once in worker processes (TPE then proposes with the "constant
liar" for trials in flight; the result depends on completion order, so only ``--jobs 1`` repeats
a study exactly). ``--ray`` runs them as Ray tasks in batches of ``--jobs``; Ray workers need not
share this file system, so trials on Ray report their per-round values after they finish and are
not pruned.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import os
import statistics
import typing
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pflbench.config.run_config import RunConfig, field_types, hyperparameters_from
from pflbench.config.space import Choice, Dimension, Range, grid_points, parse_dimension, space_text, typed
from pflbench.engine.observers import Observer
from pflbench.errors import ConfigError
from pflbench.registry import ALGORITHMS, load_plugin_file
from pflbench.runs.execute import RunDiverged
from pflbench.store.layout import SUMMARY_FILE
from pflbench.store.reader import read_json, read_rounds
from pflbench.store.writer import write_json
from pflbench.sweeps.grid import Grid, SweepRun, expand_grid, parse_value
from pflbench.sweeps.one import mark_redo, run_one
from pflbench.sweeps.parallel import die_with_parent
from pflbench.sweeps.record import write_error
from pflbench.util.hashing import settings_hash
from pflbench.util.threads import threads_per_job

TUNE_DIR = "tune"
VALIDATION_OBJECTIVES = ("val_pers_acc", "val_pers_acc_weighted", "val_pers_acc_worst10", "val_global_acc")
TEST_OBJECTIVES = ("pers_acc", "pers_acc_weighted", "pers_acc_worst10", "global_acc", "new_acc", "new_acc_weighted")
SAMPLERS, PRUNERS = ("tpe", "grid"), ("median", "none")
FINAL_METRICS = ("pers_acc", "pers_acc_weighted", "pers_acc_worst10", "global_acc", "new_acc")


def require_optuna() -> Any:
    try:
        import optuna
    except ModuleNotFoundError:
        raise ConfigError("pflbench tune needs Optuna: pip install 'pflbench[tune]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


@dataclass(frozen=True)
class TuneSettings:
    objective: str = "val_pers_acc"
    trials: int = 16
    sampler: str = "tpe"
    pruner: str = "median"
    sampler_seed: int = 0
    allow_test_selection: bool = False

    @property
    def round_metric(self) -> str:
        """The per-round value the objective summarises (``val_pers_acc_last10`` → ``val_pers_acc``)."""
        return self.objective.removesuffix("_last10")

    @property
    def selected_on(self) -> str:
        return "validation" if self.round_metric in VALIDATION_OBJECTIVES else "test"


def check_settings(settings: TuneSettings) -> None:
    """The objective must be a validation metric unless selecting on test is asked for."""
    allowed = VALIDATION_OBJECTIVES + (TEST_OBJECTIVES if settings.allow_test_selection else ())
    if settings.round_metric not in VALIDATION_OBJECTIVES + TEST_OBJECTIVES:
        valid = ", ".join(f"{m}[_last10]" for m in VALIDATION_OBJECTIVES)
        raise ConfigError(f"--objective {settings.objective!r} is not a metric to tune on; validation metrics: {valid}")
    if settings.round_metric not in allowed:
        raise ConfigError(
            f"--objective {settings.objective} is a test metric: tuning on it would report test "
            "accuracy chosen on test; use a validation metric (val_pers_acc, ...) or pass "
            "--allow-test-selection (the study record and table say 'selected on test')"
        )
    if settings.trials < 1:
        raise ConfigError(f"--trials must be ≥ 1, got {settings.trials}")
    if settings.sampler not in SAMPLERS:
        raise ConfigError(f"--sampler {settings.sampler!r} is not one of: {', '.join(SAMPLERS)}")
    if settings.pruner not in PRUNERS:
        raise ConfigError(f"--pruner {settings.pruner!r} is not one of: {', '.join(PRUNERS)}")


@dataclass
class StudyPlan:
    """One study: the trial cell (its settings, the trial seed), the space, the study's name."""

    base: RunConfig
    cell: SweepRun
    space: dict[str, Dimension]
    seeds: tuple[int, ...]
    settings: TuneSettings
    name: str = ""
    force: bool = False  # --force: trials run again even where their run folder is finished
    ran: set[str] = field(default_factory=set)  # run folders this invocation's trials wrote
    trials: list[dict[str, Any]] = field(default_factory=list)

    def path(self, suffix: str) -> Path:
        return Path(self.base.out) / TUNE_DIR / f"{self.name}{suffix}"

    def describe(self) -> str:
        return self.cell.describe().replace(f" seed={self.cell.config.seed}", "")

    def run_of(self, params: dict[str, Any], seed: int | None = None) -> SweepRun:
        """The run of ``params`` (the cell's --set values fixed) at ``seed`` (the trial seed)."""
        c = self.cell.config
        axes = {name: (value,) for name, value in {**self.cell.overrides, **params}.items()}
        grid = Grid((c.algo,), (c.dataset,), (c.alpha,), (c.seed if seed is None else seed,), axes)
        (run,) = expand_grid(self.base, grid)
        return run


def parse_space(items: tuple[str, ...]) -> dict[str, str]:
    """``("lr=log:0.001:0.3", "mu=0.01,0.1")`` → ``{"lr": "log:0.001:0.3", "mu": "0.01,0.1"}``."""
    space: dict[str, str] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip().lstrip("-").replace("-", "_")
        if not sep or not name:
            raise ConfigError(f"--space {item!r} is not NAME=V1,V2 | NAME=LOW:HIGH | NAME=log:LOW:HIGH")
        if name in space:
            raise ConfigError(f"--space {name} is given twice")
        space[name] = text
    return space


def _setting_type(cls: type, name: str) -> tuple[Any, tuple[Any, ...] | None]:
    """(annotation, choices) of dataclass field ``name`` of ``cls``."""
    annotation = field_types(cls)[name]
    choices = next(f.metadata.get("choices") for f in dataclasses.fields(cls) if f.name == name)
    return annotation, choices


def _typed_dimension(name: str, text: str, owner: type) -> Dimension:
    annotation, choices = _setting_type(owner, name)
    dimension = parse_dimension(name, text)
    if isinstance(dimension, Choice):
        values = tuple(parse_value(v, annotation, name) for v in dimension.values)
        bad = [v for v in values if choices and v not in choices]
        if bad:
            raise ConfigError(f"--space {name}: {bad[0]!r} is not one of: {', '.join(choices)}")
        return Choice(values)
    kind = annotation
    if isinstance(kind, type(int | None)) or typing.get_origin(kind) is typing.Union:
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
    return typed(dimension, kind, name)


def study_space(cell: SweepRun, user: dict[str, str]) -> dict[str, Dimension]:
    """The space of ``cell``'s study: the user's dimensions that the algorithm or the run has
    (every name must belong to one of them), else the algorithm's ``search_space``."""
    algorithm = ALGORITHMS.get(cell.config.algo)
    hparams = hyperparameters_from(algorithm.hyperparameters, dict(cell.algo_options), cell.config.algo)
    own = {f.name for f in dataclasses.fields(algorithm.hyperparameters)}
    if user:
        run_fields = {f.name for f in dataclasses.fields(RunConfig)}
        space = {
            name: _typed_dimension(name, text, RunConfig if name in run_fields else algorithm.hyperparameters)
            for name, text in user.items()
            if name in run_fields or name in own
        }
    else:
        space = dict(algorithm.search_space(cell.config, hparams))
    fixed = sorted(set(space) & set(cell.overrides))
    if fixed:
        raise ConfigError(f"{fixed[0]} is both tuned (--space) and set (--set/--{fixed[0]}); give it one way")
    if not space:
        raise ConfigError(f"{cell.config.algo}: nothing to tune (its default space is empty); give --space NAME=...")
    return space


def plan_studies(base: RunConfig, grid: Grid, user_space: dict[str, str], settings: TuneSettings) -> list[StudyPlan]:
    """A study per cell of ``grid`` (the trial seed is the first of ``grid.seeds``), checked."""
    check_settings(settings)
    run_fields = {f.name for f in dataclasses.fields(RunConfig)}
    hyperparameters = {a: {f.name for f in dataclasses.fields(ALGORITHMS.get(a).hyperparameters)} for a in grid.algos}
    for name in user_space:
        if name in ("algo", "dataset", "alpha", "seed", "out"):
            raise ConfigError(f"--space {name}: {name} cannot be tuned (it names the study or its folder)")
        if name not in run_fields and not any(name in names for names in hyperparameters.values()):
            raise ConfigError(
                f"--space {name}: {name!r} is neither a run option nor a hyperparameter of {', '.join(grid.algos)}"
            )
    cells = expand_grid(base, dataclasses.replace(grid, seeds=grid.seeds[:1]))
    plans = []
    for cell in cells:
        space = study_space(cell, user_space)
        if settings.sampler == "grid":
            grid_points(space)  # every dimension a list of values
        if settings.selected_on == "validation" and not getattr(cell.config, "val_frac", 0):
            raise ConfigError(
                f"--objective {settings.objective} needs a validation split; --val-frac is 0 for "
                f"{cell.describe()} (give --val-frac, e.g. 0.1)"
            )
        plan = StudyPlan(base, cell, space, grid.seeds, settings)
        identity = {
            "run": cell.name,  # the trial cell's settings (its folder name holds their hash)
            "space": space_text(space),
            "objective": settings.objective,
            "sampler": [settings.sampler, settings.sampler_seed],
            "pruner": settings.pruner,
        }
        plan.name = f"{cell.name}__tune-{settings_hash(identity, 8)}"
        plans.append(plan)
    return plans


# ---- Optuna objects ---------------------------------------------------------------------


def distributions(space: dict[str, Dimension]) -> dict[str, Any]:
    optuna = require_optuna()
    result: dict[str, Any] = {}
    for name, dimension in space.items():
        if isinstance(dimension, Choice):
            result[name] = optuna.distributions.CategoricalDistribution(list(dimension.values))
        elif dimension.integer:
            result[name] = optuna.distributions.IntDistribution(
                int(dimension.low), int(dimension.high), log=dimension.log
            )
        else:
            result[name] = optuna.distributions.FloatDistribution(dimension.low, dimension.high, log=dimension.log)
    return result


def make_sampler(plan: StudyPlan, jobs: int) -> Any:
    optuna = require_optuna()
    settings = plan.settings
    if settings.sampler == "grid":
        values = {n: list(d.values) for n, d in plan.space.items() if isinstance(d, Choice)}
        return _grid_sampler(optuna)(values, seed=settings.sampler_seed)
    # random trials first (a third of the budget, 3 to 10), then TPE's model of the good ones
    startup = min(10, max(3, settings.trials // 3))
    return optuna.samplers.TPESampler(seed=settings.sampler_seed, n_startup_trials=startup, constant_liar=jobs > 1)


def _grid_sampler(optuna: Any) -> type:
    """Optuna's grid sampler, without its ``study.stop()`` once the grid is covered: that call
    works only inside ``study.optimize``; here the driver asks and tells, and counts the trials."""

    class GridSampler(optuna.samplers.GridSampler):  # type: ignore[misc, name-defined]
        def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
            return None

    return GridSampler


def make_pruner(plan: StudyPlan) -> Any:
    optuna = require_optuna()
    if plan.settings.pruner == "none":
        return optuna.pruners.NopPruner()
    # compared once a few trials finished, and not in the first quarter of the rounds (early
    # accuracies of a good lr and a bad one are often alike)
    startup = max(2, min(5, plan.settings.trials // 4))
    warmup = max(1, plan.cell.config.rounds // 4)
    return optuna.pruners.MedianPruner(n_startup_trials=startup, n_warmup_steps=warmup)


def open_study(plan: StudyPlan, jobs: int = 1) -> Any:
    optuna = require_optuna()
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    path = plan.path(".journal")
    path.parent.mkdir(parents=True, exist_ok=True)
    storage = JournalStorage(JournalFileBackend(str(path)))
    return optuna.create_study(
        study_name=plan.name,
        storage=storage,
        load_if_exists=True,
        direction="maximize",
        sampler=make_sampler(plan, jobs),
        pruner=make_pruner(plan),
    )


# ---- one trial ----------------------------------------------------------------------------


class TrialPruned(Exception):
    """Raised from the round loop when the pruner stops the trial."""


class ReportToStudy(Observer):
    """Reports the objective's per-round value to the trial; raises ``TrialPruned`` when the
    pruner says so (``prune`` off: report only)."""

    def __init__(self, trial: Any, metric: str, prune: bool) -> None:
        self.trial, self.metric, self.prune = trial, metric, prune
        self.last: float | None = None

    def on_round_end(self, record: dict[str, Any]) -> None:
        value = record.get(self.metric)
        if value is None:
            return
        self.last = float(value)
        self.trial.report(self.last, record["round"])
        if self.prune and self.trial.should_prune():
            raise TrialPruned(f"pruned at round {record['round']} ({self.metric} {value:.4f})")


def run_trial(plan: StudyPlan, trial_id: int, run: SweepRun, plugins: tuple[str, ...]) -> tuple[str, float | None, str]:
    """Run (or read back) one trial's run; returns (state, objective value, message). In a
    worker process it reopens the study from its journal to report per-round values."""
    study = open_study(plan)
    optuna = require_optuna()
    trial = optuna.trial.Trial(study, trial_id)
    metric = plan.settings.round_metric
    mark_redo([run], plan.force)  # a finished run of older code (stale) or --force: run again
    summary = read_json(run.run_dir / SUMMARY_FILE) if (run.run_dir / SUMMARY_FILE).is_file() else None
    if run.redo is None and isinstance(summary, dict) and summary.get("status") == "completed":
        for record in read_rounds(run.run_dir):  # already run (a sweep, another study): read back
            if record.get(metric) is not None:
                trial.report(float(record[metric]), record["round"])
        return _outcome(summary, plan.settings.objective, "read back (already finished)")
    reporter = ReportToStudy(trial, metric, prune=True)
    try:
        summary = run_one(run, plugins, observers=[reporter])
    except TrialPruned as pruned:
        return "pruned", reporter.last, str(pruned)
    except RunDiverged as diverged:  # told as pruned at its last value: TPE learns to avoid it
        return "diverged", reporter.last, f"diverged: {diverged}"
    except Exception as error:  # one broken trial must not stop the study
        write_error(run, error)
        return "failed", None, f"{type(error).__name__}: {error}"
    return _outcome(summary, plan.settings.objective, "done")


def _outcome(summary: dict[str, Any], objective: str, message: str) -> tuple[str, float | None, str]:
    value = summary.get(objective)
    if value is None or not math.isfinite(value):
        return "failed", None, f"the run has no {objective}"
    return "complete", float(value), message


def _trial_in_worker(
    plan: StudyPlan, trial_id: int, run: SweepRun, plugins: tuple[str, ...]
) -> tuple[str, float | None, str]:
    for path in plugins:
        load_plugin_file(path)
    return run_trial(plan, trial_id, run, plugins)


# ---- the study ----------------------------------------------------------------------------


def run_study(
    plan: StudyPlan,
    plugins: tuple[str, ...] = (),
    jobs: int = 1,
    report: Callable[[str], None] = lambda line: None,
    ray: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run the study's remaining trials, then the best setting over the seeds; returns the record."""
    optuna = require_optuna()
    if ray is None and jobs > 1:  # each trial's share of the threads, before its run is named
        plan.base = dataclasses.replace(plan.base, threads=threads_per_job(plan.base.threads, jobs))
    if plan.force:  # --force redoes everything: the study starts over, its trials run again
        for suffix in (".journal", ".json"):
            plan.path(suffix).unlink(missing_ok=True)
    study = open_study(plan, jobs)
    states = optuna.trial.TrialState
    for stale in study.get_trials(deepcopy=False, states=(states.RUNNING,)):  # the command stopped meanwhile
        study.tell(stale.number, state=states.FAIL, skip_if_finished=True)
        study.set_user_attr(f"interrupted_{stale.number}", True)
        study.enqueue_trial(stale.params)
    interrupted = {int(k.split("_")[1]) for k in study.user_attrs if k.startswith("interrupted_")}
    counted = [t for t in study.get_trials(deepcopy=False) if t.state.is_finished() and t.number not in interrupted]
    budget = plan.settings.trials
    if plan.settings.sampler == "grid":
        budget = min(budget, grid_points(plan.space))
    todo = max(0, budget - len(counted))
    if counted:
        report(f"{plan.describe()}: {len(counted)} trials already in {plan.path('.journal')}, {todo} to go")
    dists = distributions(plan.space)
    runs: dict[int, SweepRun] = {}

    def ask() -> tuple[Any, SweepRun]:
        trial = study.ask(dists)
        setting = rounded_setting(plan.space, dict(trial.params))
        run = plan.run_of(setting)
        trial.set_user_attr("setting", setting)
        trial.set_user_attr("run", run.name)
        runs[trial.number] = run
        return trial, run

    def tell(trial: Any, outcome: tuple[str, float | None, str]) -> None:
        state, value, message = outcome
        if not message.startswith("read back"):
            plan.ran.add(runs[trial.number].name)
        if state == "complete":
            study.tell(trial, value)
        else:
            # a failed trial is left out of TPE's model, a pruned one counts with its last value:
            # a diverged trial (e.g. lr too large) counts, so the sampler moves away from it
            if state == "diverged":
                trial.set_user_attr("diverged", True)
            study.tell(trial, state=states.PRUNED if state in ("pruned", "diverged") else states.FAIL)
        shown = f"{value:.4f}" if value is not None else "—"
        params = " ".join(f"{k}={_short(v)}" for k, v in trial.user_attrs.get("setting", trial.params).items())
        report(f"  trial {trial.number}: {params} → {plan.settings.objective} {shown} ({state}; {message})")
        write_record(plan, study)

    if ray is not None:
        _trials_on_ray(plan, todo, jobs, plugins, ask, tell, ray)
    elif jobs <= 1:
        for _ in range(todo):
            trial, run = ask()
            tell(trial, run_trial(plan, trial._trial_id, run, plugins))
    else:
        _trials_in_pool(plan, todo, jobs, plugins, ask, tell)
    return write_record(plan, study)


def _trials_in_pool(
    plan: StudyPlan,
    todo: int,
    jobs: int,
    plugins: tuple[str, ...],
    ask: Callable[[], tuple[Any, SweepRun]],
    tell: Callable[[Any, tuple[str, float | None, str]], None],
) -> None:
    """``todo`` trials, ``jobs`` at a time in spawned worker processes (threads shared out)."""
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(jobs, mp_context=context, initializer=die_with_parent, initargs=(os.getpid(),))
    in_flight: dict[Future, Any] = {}
    asked = 0
    try:
        while asked < todo or in_flight:
            while asked < todo and len(in_flight) < jobs:
                trial, run = ask()
                in_flight[pool.submit(_trial_in_worker, plan, trial._trial_id, run, plugins)] = trial
                asked += 1
            done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
            for future in done:
                trial = in_flight.pop(future)
                try:
                    outcome = future.result()
                except Exception as error:  # the worker died
                    outcome = ("failed", None, f"worker failed: {type(error).__name__}: {error}")
                tell(trial, outcome)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _trials_on_ray(
    plan: StudyPlan,
    todo: int,
    jobs: int,
    plugins: tuple[str, ...],
    ask: Callable[[], tuple[Any, SweepRun]],
    tell: Callable[[Any, tuple[str, float | None, str]], None],
    ray: dict[str, Any],
) -> None:
    """``todo`` trials as Ray tasks (``sweeps.on_ray``), ``jobs`` per batch; the per-round values
    are reported from rounds.jsonl once a batch is in (no pruning: workers do not share the study)."""
    from pflbench.sweeps.on_ray import run_sweep_on_ray
    from pflbench.sweeps.record import sweep_record_path

    optuna = require_optuna()
    remaining = todo
    while remaining > 0:
        batch = [ask() for _ in range(min(jobs, remaining))]
        remaining -= len(batch)
        runs = [run for _, run in batch]
        grid = Grid((plan.cell.config.algo,), (plan.cell.config.dataset,), (plan.cell.config.alpha,), plan.seeds[:1])
        record = sweep_record_path(plan.base.out, grid, plan.base)
        run_sweep_on_ray(
            runs, record, grid, plan.base, plugins, None, ray["cpus"], ray["gpus"], disconnect=False, force=plan.force
        )
        study = open_study(plan)
        for trial, run in batch:
            summary = read_json(run.run_dir / SUMMARY_FILE) if (run.run_dir / SUMMARY_FILE).is_file() else None
            if not isinstance(summary, dict):
                tell(trial, ("failed", None, run.error or "no summary"))
                continue
            live = optuna.trial.Trial(study, trial._trial_id)
            last = None
            for round_record in read_rounds(run.run_dir):
                if round_record.get(plan.settings.round_metric) is not None:
                    last = float(round_record[plan.settings.round_metric])
                    live.report(last, round_record["round"])
            if summary.get("status") == "diverged":
                tell(trial, ("diverged", last, "diverged on Ray"))
            else:
                tell(trial, _outcome(summary, plan.settings.objective, "done on Ray"))


SIGNIFICANT_DIGITS = 3


def rounded_setting(space: dict[str, Dimension], params: dict[str, Any]) -> dict[str, Any]:
    """The setting a trial runs: a value drawn from a float range rounded to 3 significant digits
    (``lr=0.0871``, not ``0.08713945...``: readable in folder names, tables and papers, and two
    proposals that differ in the 5th digit are one run); choices and integers as proposed."""
    setting = {}
    for name, value in params.items():
        dimension = space[name]
        if isinstance(dimension, Range) and not dimension.integer:
            value = min(max(float(f"{value:.{SIGNIFICANT_DIGITS}g}"), dimension.low), dimension.high)
        setting[name] = value
    return setting


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def trial_records(study: Any) -> list[dict[str, Any]]:
    interrupted = {int(k.split("_")[1]) for k in study.user_attrs if k.startswith("interrupted_")}
    records = []
    for trial in study.get_trials(deepcopy=False):
        records.append(
            {
                "number": trial.number,
                "state": "interrupted"
                if trial.number in interrupted
                else "diverged"
                if trial.user_attrs.get("diverged")
                else trial.state.name.lower(),
                "params": dict(trial.user_attrs.get("setting", trial.params)),
                "value": trial.value,
                "run": trial.user_attrs.get("run"),
                "per_round": {str(step): value for step, value in sorted(trial.intermediate_values.items())},
            }
        )
    return records


def best_trial(study: Any) -> Any | None:
    optuna = require_optuna()
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    return max(complete, key=lambda t: (t.value, -t.number)) if complete else None  # ties: the earlier trial


def write_record(plan: StudyPlan, study: Any, final: dict[str, Any] | None = None) -> dict[str, Any]:
    path = plan.path(".json")
    previous = read_json(path) if path.is_file() else None
    best = best_trial(study)
    record = {
        "study": plan.name,
        "cell": plan.describe(),
        "algo": plan.cell.config.algo,
        "dataset": plan.cell.config.dataset,
        "partition": plan.cell.partition,
        "set": plan.cell.overrides,
        "objective": plan.settings.objective,
        "selected_on": plan.settings.selected_on,
        "space": space_text(plan.space),
        "sampler": plan.settings.sampler,
        "sampler_seed": plan.settings.sampler_seed,
        "pruner": plan.settings.pruner,
        "trial_seed": plan.cell.config.seed,
        "trials_asked": plan.settings.trials,
        "trials": trial_records(study),
        "best": None
        if best is None
        else {"number": best.number, "params": dict(best.user_attrs.get("setting", best.params)), "value": best.value},
        "final": final if final is not None else (previous or {}).get("final"),
    }
    write_json(path, record)
    return record


# ---- the chosen setting over seeds -----------------------------------------------------------


def final_runs(plan: StudyPlan, study_record: dict[str, Any]) -> list[SweepRun]:
    """The best setting's runs over every seed of ``--seeds`` (the trial seed's run exists)."""
    best = study_record["best"]
    if best is None:
        raise ConfigError(f"{plan.describe()}: no trial completed, nothing to select (see {plan.path('.json')})")
    return [plan.run_of(best["params"], seed) for seed in plan.seeds]


def final_record(plan: StudyPlan, runs: list[SweepRun]) -> dict[str, Any]:
    """Per seed, the chosen setting's test metrics and the objective; mean and std over seeds."""
    per_seed = []
    for run in runs:
        summary = read_json(run.run_dir / SUMMARY_FILE) if (run.run_dir / SUMMARY_FILE).is_file() else None
        if not isinstance(summary, dict) or summary.get("status") != "completed":
            per_seed.append({"seed": run.config.seed, "run": run.name, "status": run.status})
            continue
        metrics = {m: summary.get(m) for m in (*FINAL_METRICS, plan.settings.objective)}
        per_seed.append({"seed": run.config.seed, "run": run.name, "status": "completed", **metrics})
    aggregate = {}
    for metric in (*FINAL_METRICS, plan.settings.objective):
        values = [s[metric] for s in per_seed if s.get(metric) is not None]
        if values:
            aggregate[metric] = {
                "mean": statistics.fmean(values),
                "std": statistics.pstdev(values) if len(values) > 1 else 0.0,
                "n": len(values),
            }
    return {"seeds": per_seed, "metrics": aggregate}


def finish_study(plan: StudyPlan, runs: list[SweepRun]) -> dict[str, Any]:
    """The study record with the chosen setting's final runs."""
    return write_record(plan, open_study(plan), final_record(plan, runs))
