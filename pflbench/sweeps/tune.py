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
when the command stopped is run again (its run resumes from its checkpoint). A journal whose
last line a killed process left torn is repaired (the torn line is cut off, with a warning);
any other damage is refused, naming the file.

``--trials N`` buys N distinct settings (after rounding, see ``rounded_setting``): a proposal
that repeats a setting already tried or running is recorded as a duplicate and does not count;
a continued study re-seeds its sampler from ``--sampler-seed`` and the number of trials in the
journal, so it proposes new settings rather than the first ones again; a space with fewer
distinct settings than N ends at its size, with a line saying so.

Several ``pflbench tune`` on one ``--out`` at once share the study: each trial is claimed as a
run is (``OUT/tune/<study>.trial-N.claim``, ``store.layout``), a trial claimed by another live
process is left to it (and waited for before the choice), and a trial whose process is gone is
taken over (marked interrupted, its setting run again).

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

import codecs
import dataclasses
import datetime
import json
import math
import multiprocessing
import os
import time
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
from pflbench.store.layout import SUMMARY_FILE, Claim, RunClaimed, RunFinished, RunPaths, claim_owner, describe_owner
from pflbench.store.reader import read_json, read_rounds
from pflbench.store.writer import write_json
from pflbench.sweeps.grid import Grid, SweepRun, expand_grid, parse_value
from pflbench.sweeps.one import mark_redo, run_one
from pflbench.sweeps.parallel import die_with_parent
from pflbench.sweeps.record import write_error
from pflbench.util.hashing import settings_hash
from pflbench.util.seed_stats import mean, sample_std
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
    # the first trial runs the algorithm's default setting (when the space holds it), so that a
    # small budget never selects a setting worse on validation than the default it replaces
    default_trial: bool = False

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
    if settings.default_trial and settings.sampler == "grid":
        raise ConfigError("--default-trial goes with --sampler tpe: a grid visits every listed setting anyway")


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
    default: dict[str, Any] | None = None  # the default setting, the first trial (default_trial)

    def path(self, suffix: str) -> Path:
        return Path(self.base.out) / TUNE_DIR / f"{self.name}{suffix}"

    def describe(self) -> str:
        return self.cell.describe().replace(f" seed={self.cell.config.seed}", "")

    def is_default(self, run: SweepRun) -> bool:
        """Whether ``run`` is the default trial's run (``default_trial``)."""
        return self.default is not None and run.name == self.run_of(rounded_setting(self.space, self.default)).name

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


def default_setting(cell: SweepRun, space: dict[str, Dimension]) -> dict[str, Any] | None:
    """The cell's own (resolved) value of every tuned setting, or None when one lies outside its
    dimension (a user's ``--space`` that excludes the default): the point a study starts from."""
    algorithm = ALGORITHMS.get(cell.config.algo)
    hparams = hyperparameters_from(algorithm.hyperparameters, dict(cell.algo_options), cell.config.algo)
    run_fields = {f.name for f in dataclasses.fields(RunConfig)}
    setting = {}
    for name, dimension in space.items():
        value = getattr(cell.config if name in run_fields else hparams, name)
        if isinstance(dimension, Choice):
            if value not in dimension.values:
                return None
        elif value is None or isinstance(value, bool) or not dimension.low <= value <= dimension.high:
            return None
        setting[name] = value
    return setting


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
        identity: dict[str, Any] = {
            "run": cell.name,  # the trial cell's settings (its folder name holds their hash)
            "space": space_text(space),
            "objective": settings.objective,
            "sampler": [settings.sampler, settings.sampler_seed],
            "pruner": settings.pruner,
        }
        if settings.default_trial:  # only then: the names of studies without it stay as they were
            identity["default_trial"] = True
            plan.default = default_setting(cell, space)
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


def sampler_seed(seed: int, trials_so_far: int) -> int:
    """The sampler's seed for a study that holds ``trials_so_far`` trials: ``seed`` for a new
    study (a study run in one go repeats exactly), else one drawn from both, so that a continued
    study does not replay its first proposals (settings it has already tried)."""
    return seed if trials_so_far == 0 else int(settings_hash({"seed": seed, "trials": trials_so_far}, 8), 16)


def make_sampler(plan: StudyPlan, jobs: int, trials_so_far: int = 0) -> Any:
    optuna = require_optuna()
    settings = plan.settings
    seed = sampler_seed(settings.sampler_seed, trials_so_far)
    if settings.sampler == "grid":
        values = {n: list(d.values) for n, d in plan.space.items() if isinstance(d, Choice)}
        return _grid_sampler(optuna)(values, seed=seed)
    # random trials first (a third of the budget, 3 to 10), then TPE's model of the good ones
    startup = min(10, max(3, settings.trials // 3))
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup, constant_liar=jobs > 1)


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
    try:
        storage = JournalStorage(JournalFileBackend(str(path)))
        return optuna.create_study(
            study_name=plan.name,
            storage=storage,
            load_if_exists=True,
            direction="maximize",
            sampler=make_sampler(plan, jobs),
            pruner=make_pruner(plan),
        )
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError) as error:
        # lines that are JSON objects but not records Optuna can replay (``repair_journal`` has
        # already refused lines that are not JSON)
        raise ConfigError(
            f"study journal {path} cannot be read by Optuna ({type(error).__name__}: {error}); {MOVE_ASIDE}"
        ) from None


# ---- a damaged journal ------------------------------------------------------------------------

MOVE_ASIDE = "move it aside to start the study over (its trials' finished runs are read back, not run again)"


def _bad_journal_line(line: bytes) -> str | None:
    """Why one complete journal line is not an Optuna journal record, or None."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return "not UTF-8 text"
    try:
        record = json.loads(text)
    except (ValueError, RecursionError):
        return "not JSON"
    if not isinstance(record, dict) or not isinstance(record.get("op_code"), int):
        return "not an Optuna journal record"
    return None


def _could_be_torn(tail: bytes) -> bool:
    """Whether ``tail`` (the bytes after the last newline) is the start of a record that a
    killed process left half-written: UTF-8 (a multi-byte character may be cut) opening a JSON
    object. Anything else there (random bytes) is damage, not a torn write."""
    try:
        text = codecs.getincrementaldecoder("utf-8")().decode(tail, final=False)
    except UnicodeDecodeError:
        return False
    return text.startswith("{")


def journal_damage(data: bytes) -> tuple[int, str | None]:
    """(length of the journal's whole, readable lines, why the line after them is damaged):
    (len, None) for a sound journal, (length before a torn tail, None) when only the tail is torn."""
    end, number = 0, 0
    while end < len(data):
        newline = data.find(b"\n", end)
        if newline < 0:
            return end, None if _could_be_torn(data[end:]) else f"line {number + 1} is not a journal record"
        number += 1
        reason = _bad_journal_line(data[end:newline])
        if reason is not None:
            return end, f"line {number} is {reason}"
        end = newline + 1
    return end, None


def repair_journal(path: Path) -> str | None:
    """Check the study journal at ``path`` before it is opened: a torn last line (a process
    killed while appending) is cut off and described in the returned warning line (Optuna
    would accept it until the next append glued a record onto it, and then refuse the whole
    journal); any other damage raises ``ConfigError`` naming the file. None when sound."""
    if not path.exists():
        return None
    if not path.is_file():
        raise ConfigError(f"study journal {path} is not a file; {MOVE_ASIDE}")
    try:
        good, damage = journal_damage(path.read_bytes())
    except OSError as error:
        raise ConfigError(f"cannot read study journal {path}: {error.strerror or error}") from None
    if damage is not None:
        raise ConfigError(f"study journal {path} is damaged: {damage}; {MOVE_ASIDE}")
    if good == path.stat().st_size:
        return None
    # a torn tail, or another process's append in progress: decide under the journal's own lock
    require_optuna()
    from optuna.storages.journal import JournalFileSymlinkLock

    lock = JournalFileSymlinkLock(str(path))
    lock.acquire()
    try:
        data = path.read_bytes()
        good, damage = journal_damage(data)
        if damage is not None:
            raise ConfigError(f"study journal {path} is damaged: {damage}; {MOVE_ASIDE}")
        if good == len(data):
            return None  # it was an append in progress
        with open(path, "r+b") as journal:
            journal.truncate(good)
            os.fsync(journal.fileno())
    finally:
        lock.release()
    return (
        f"study journal {path} ended in a torn line ({len(data) - good} bytes: a write cut short); "
        "removed it and continued"
    )


def check_journal(plan: StudyPlan) -> str | None:
    """``repair_journal`` on the plan's study journal, then a replay of it (a journal of JSON
    records Optuna cannot replay raises ``ConfigError`` too): the warning line, or None."""
    path = plan.path(".journal")
    warning = repair_journal(path)
    if path.is_file() and path.stat().st_size:
        open_study(plan)
    return warning


# ---- how many distinct settings a space holds ---------------------------------------------------


def _three_digit_values(low: float, high: float, at_most: int) -> int | None:
    """How many numbers of 3 significant digits lie in [low, high] (0 < low ≤ high); None when
    more than ``at_most``."""
    count = 0
    for exponent in range(math.floor(math.log10(low)) - 1, math.floor(math.log10(high)) + 2):
        for mantissa in range(100, 1000):
            if low <= float(f"{mantissa}e{exponent - 2}") <= high:
                count += 1
                if count > at_most:
                    return None
    return count


def _dimension_size(dimension: Dimension, at_most: int) -> int | None:
    if isinstance(dimension, Choice):
        return len(dict.fromkeys(dimension.values))
    if dimension.integer:
        return int(dimension.high) - int(dimension.low) + 1
    # the image of [low, high] under rounding (``rounded_setting``): the 3-digit numbers from
    # round(low) to round(high), the outer two clamped into the range
    low, high = (float(f"{v:.{SIGNIFICANT_DIGITS}g}") for v in (dimension.low, dimension.high))
    if low == high:
        return 1
    if low > 0:
        return _three_digit_values(low, high, at_most)
    if high < 0:
        return _three_digit_values(-high, -low, at_most)
    return None  # around 0: numbers of every magnitude


def distinct_settings(space: dict[str, Dimension], at_most: int) -> int | None:
    """How many distinct settings (after rounding) ``space`` holds; None when more than ``at_most``."""
    total = 1
    for dimension in space.values():
        size = _dimension_size(dimension, at_most)
        if size is None:
            return None
        total *= size
        if total > at_most:
            return None
    return total


# ---- one trial ----------------------------------------------------------------------------


class TrialPruned(Exception):
    """Raised from the round loop when the pruner stops the trial."""


def touch(path: Path | None) -> None:
    """The heartbeat of a trial's claim (``store.layout``: a claim from another host is stale
    once untouched for an hour)."""
    if path is not None:
        try:
            os.utime(path)
        except OSError:
            pass


class ReportToStudy(Observer):
    """Reports the objective's per-round value to the trial; raises ``TrialPruned`` when the
    pruner says so (``prune`` off: report only). Touches the trial's claim (``claim``) each round."""

    def __init__(self, trial: Any, metric: str, prune: bool, claim: Path | None = None) -> None:
        self.trial, self.metric, self.prune, self.claim = trial, metric, prune, claim
        self.last: float | None = None

    def on_round_end(self, record: dict[str, Any]) -> None:
        touch(self.claim)
        value = record.get(self.metric)
        if value is None:
            return
        self.last = float(value)
        self.trial.report(self.last, record["round"])
        if self.prune and self.trial.should_prune():
            raise TrialPruned(f"pruned at round {record['round']} ({self.metric} {value:.4f})")


CLAIM_POLL_S = 2.0  # how often a trial waits for a run, or a study for trials, that another process holds


def run_trial(
    plan: StudyPlan, trial_id: int, run: SweepRun, plugins: tuple[str, ...], claim: Path | None = None
) -> tuple[str, float | None, str]:
    """Run (or read back) one trial's run; returns (state, objective value, message). In a
    worker process it reopens the study from its journal to report per-round values. A run
    that another process is running (a sweep) is waited for, then read back."""
    study = open_study(plan)
    optuna = require_optuna()
    trial = optuna.trial.Trial(study, trial_id)
    while True:
        mark_redo([run], plan.force)  # a finished run of older code (stale) or --force: run again
        summary = read_json(run.run_dir / SUMMARY_FILE) if (run.run_dir / SUMMARY_FILE).is_file() else None
        if run.redo is None and isinstance(summary, dict) and summary.get("status") in ("completed", "diverged"):
            return _read_back(plan, trial, run, summary)  # already run (a sweep, another study)
        # the default trial is never pruned: it is the baseline a choice must beat, so it runs in full
        reporter = ReportToStudy(trial, plan.settings.round_metric, prune=not plan.is_default(run), claim=claim)
        try:
            summary = run_one(run, plugins, observers=[reporter])
        except TrialPruned as pruned:
            return "pruned", reporter.last, str(pruned)
        except RunDiverged as diverged:  # told as pruned at its last value: TPE learns to avoid it
            return "diverged", reporter.last, f"diverged: {diverged}"
        except RunFinished:  # finished by another process meanwhile: read back
            continue
        except RunClaimed:  # another process is running it now: wait for it, then read it back
            while claim_owner(RunPaths(run.run_dir)) is not None:
                touch(claim)
                time.sleep(CLAIM_POLL_S)
            continue
        except Exception as error:  # one broken trial must not stop the study
            write_error(run, error)
            return "failed", None, f"{type(error).__name__}: {error}"
        return _outcome(summary, plan.settings.objective, "done")


def _read_back(plan: StudyPlan, trial: Any, run: SweepRun, summary: dict[str, Any]) -> tuple[str, float | None, str]:
    """A finished run's per-round values reported to ``trial``, and its outcome."""
    last = None
    for record in read_rounds(run.run_dir):
        if record.get(plan.settings.round_metric) is not None:
            last = float(record[plan.settings.round_metric])
            trial.report(last, record["round"])
    if summary.get("status") == "diverged":
        return "diverged", last, "read back (diverged)"
    return _outcome(summary, plan.settings.objective, "read back (already finished)")


def _outcome(summary: dict[str, Any], objective: str, message: str) -> tuple[str, float | None, str]:
    value = summary.get(objective)
    if value is None or not math.isfinite(value):
        return "failed", None, f"the run has no {objective}"
    return "complete", float(value), message


def _trial_in_worker(
    plan: StudyPlan, trial_id: int, run: SweepRun, plugins: tuple[str, ...], claim: Path | None
) -> tuple[str, float | None, str]:
    for path in plugins:
        load_plugin_file(path)
    return run_trial(plan, trial_id, run, plugins, claim)


# ---- the study ----------------------------------------------------------------------------

MAX_REPEATS = 50  # proposals in a row that repeat a tried setting before the space counts as exhausted
ASK_GRACE_S = 10.0  # a running trial with no claim file younger than this is being claimed: left alone
Outcome = tuple[str, float | None, str]


def _age_s(trial: Any) -> float:
    started = trial.datetime_start
    return math.inf if started is None else (datetime.datetime.now() - started).total_seconds()


def setting_key(setting: dict[str, Any]) -> str:
    return json.dumps(setting, sort_keys=True, default=str)


class StudyDriver:
    """Asks the study for trials of new settings, claims them, tells their outcomes.

    The study may be shared with other ``pflbench tune`` processes (one journal): the trials
    are re-read from it before each decision. A trial counts toward the budget when it is
    finished (not interrupted, not a duplicate) or running under a live claim, once per setting.
    """

    def __init__(self, plan: StudyPlan, study: Any, report: Callable[[str], None]) -> None:
        self.plan, self.study, self.report = plan, study, report
        self.states = require_optuna().trial.TrialState
        self.dists = distributions(plan.space)
        self.runs: dict[int, SweepRun] = {}
        self.claims: dict[int, Claim] = {}  # the trials this process runs
        self.repeats = 0  # proposals in a row that repeated a setting
        self.exhausted = False  # said that MAX_REPEATS proposals in a row repeated a setting
        self.waiting_on: tuple[int, ...] = ()

    def claim_of(self, number: int) -> Claim:
        return Claim(RunPaths(self.plan.path(f".trial-{number}")))

    def _interrupted(self) -> set[int]:
        return {int(k.split("_")[1]) for k in self.study.user_attrs if k.startswith("interrupted_")}

    def _key(self, trial: Any) -> str | None:
        """The trial's setting (its rounded params), None before its params are all drawn."""
        if set(trial.params) != set(self.plan.space):
            return None
        return setting_key(rounded_setting(self.plan.space, dict(trial.params)))

    def tally(self) -> tuple[dict[str, int], list[int]]:
        """(the settings that count, each with its first trial; the trials other processes are
        running). Takes over the running trials whose process is gone."""
        while True:
            taken: dict[str, int] = {}
            others: list[int] = []
            interrupted = self._interrupted()
            took_over = False
            for trial in self.study.get_trials(deepcopy=False):
                if trial.number in interrupted or "duplicate_of" in trial.user_attrs:
                    continue
                if trial.state == self.states.RUNNING and trial.number not in self.claims:
                    if self._take_over(trial):
                        took_over = True
                        break
                    others.append(trial.number)
                elif not trial.state.is_finished() and trial.state != self.states.RUNNING:
                    continue  # waiting (enqueued): whoever asks next runs it
                key = self._key(trial)
                if key is not None:
                    taken.setdefault(key, trial.number)
            if not took_over:
                return taken, others

    def _take_over(self, trial: Any) -> bool:
        """Mark a running trial whose claim no live process holds as interrupted and queue its
        setting again; False when another live process holds it (or claims it meanwhile)."""
        claim = self.claim_of(trial.number)
        if claim_owner(claim.paths) is not None:
            return False
        if not claim.paths.claim.exists() and _age_s(trial) < ASK_GRACE_S:
            return False  # just asked by another process, which is about to claim it
        try:
            claim.acquire()  # takes over a dead process's claim; fails if a live one claimed it meanwhile
        except RunClaimed:
            return False
        try:
            fresh = self.study._storage.get_trial(trial._trial_id)
            if fresh.state != self.states.RUNNING:
                return True  # finished meanwhile: tally again
            self._interrupt(fresh)
            self.report(f"  trial {trial.number}: interrupted (its process is gone); its setting runs again")
        finally:
            claim.release()
        return True

    def _interrupt(self, trial: Any) -> None:
        """A running trial that will not finish: marked interrupted, its setting queued again
        (whoever asks next runs it; its run resumes from its checkpoint)."""
        self.study.tell(trial.number, state=self.states.FAIL, skip_if_finished=True)
        self.study.set_user_attr(f"interrupted_{trial.number}", True)
        self.study.enqueue_trial(dict(trial.params))

    def ask(self) -> tuple[Any, SweepRun] | None:
        """A claimed trial of a setting not tried yet, or None (a duplicate, told as such; or a
        trial another process took over in the instant before it was claimed)."""
        trial = self.study.ask(self.dists)
        claim = self.claim_of(trial.number)
        try:
            claim.acquire()
        except RunClaimed:
            return None
        if self.study._storage.get_trial(trial._trial_id).state != self.states.RUNNING:
            claim.release()  # taken over as stale before the claim: its setting is queued again
            return None
        self.claims[trial.number] = claim
        setting = rounded_setting(self.plan.space, dict(trial.params))
        run = self.plan.run_of(setting)
        trial.set_user_attr("setting", setting)
        trial.set_user_attr("run", run.name)
        taken, _ = self.tally()  # trials in number order: the first trial of a setting is the one that counts
        first = taken.get(setting_key(setting), trial.number)
        if first != trial.number:
            # the setting was tried (or is running) already: recorded, not counted, left out of
            # TPE's model (a failed trial) so that it proposes elsewhere
            trial.set_user_attr("duplicate_of", first)
            self.study.tell(trial, state=self.states.FAIL)
            self.claims.pop(trial.number).release()
            self.repeats += 1
            return None
        self.repeats = 0
        self.runs[trial.number] = run
        return trial, run

    def tell(self, trial: Any, outcome: Outcome) -> None:
        state, value, message = outcome
        if not message.startswith("read back"):
            self.plan.ran.add(self.runs[trial.number].name)
        states = self.states
        if state == "complete":
            self.study.tell(trial, value, skip_if_finished=True)
        else:
            # a failed trial is left out of TPE's model, a pruned one counts with its last value:
            # a diverged trial (e.g. lr too large) counts, so the sampler moves away from it
            if state == "diverged":
                trial.set_user_attr("diverged", True)
            failed = state not in ("pruned", "diverged")
            self.study.tell(trial, state=states.FAIL if failed else states.PRUNED, skip_if_finished=True)
        self.claims.pop(trial.number).release()
        shown = f"{value:.4f}" if value is not None else "—"
        params = " ".join(f"{k}={_short(v)}" for k, v in trial.user_attrs.get("setting", trial.params).items())
        self.report(f"  trial {trial.number}: {params} → {self.plan.settings.objective} {shown} ({state}; {message})")
        write_record(self.plan, self.study)

    def touch_claims(self) -> None:
        for claim in self.claims.values():
            claim.touch()

    def interrupt_own(self) -> None:
        """This process stops (an exception, Ctrl-C) with trials running: mark them interrupted
        and let go of their claims, so that the next command runs them at once."""
        for number, claim in list(self.claims.items()):
            try:
                trial = self.study.get_trials(deepcopy=False)[number]
                if trial.state == self.states.RUNNING:
                    self._interrupt(trial)
            except Exception:  # the journal cannot be written: a dead claim is taken over later
                continue
            finally:
                claim.release()
        self.claims.clear()

    def drive(self, budget: int, trials: TrialRunner) -> None:
        """Ask and run trials until ``budget`` settings count, the space runs out of new
        settings, and no other process still runs a trial of the study."""
        try:
            while True:
                taken, others = self.tally()
                if len(taken) < budget and self.repeats < MAX_REPEATS and trials.has_room():
                    asked = self.ask()
                    if asked is not None:
                        trials.launch(*asked)
                    continue
                if trials.busy():
                    trials.collect()
                    self.touch_claims()
                    continue
                if self.repeats >= MAX_REPEATS and not self.exhausted:
                    self.exhausted = True
                    self.report(
                        f"{self.plan.describe()}: {MAX_REPEATS} proposals in a row repeated settings already "
                        f"tried: the space holds only {len(taken)} distinct settings (after rounding), "
                        f"not the {budget} asked for; stopping at {len(taken)}"
                    )
                if not others:
                    return
                if tuple(others) != self.waiting_on:
                    self.waiting_on = tuple(others)
                    owners = (claim_owner(self.claim_of(n).paths) for n in others)
                    running = ", ".join(
                        f"{n} ({describe_owner(owner) if owner else 'being claimed'})"
                        for n, owner in zip(others, owners)
                    )
                    self.report(f"{self.plan.describe()}: waiting for trials another process is running: {running}")
                time.sleep(CLAIM_POLL_S)
        finally:
            self.interrupt_own()


class TrialRunner:
    """Runs the driver's trials: one at a time in this process (the base class), in worker
    processes, or as Ray tasks."""

    def __init__(self, driver: StudyDriver, plugins: tuple[str, ...]) -> None:
        self.driver, self.plugins = driver, plugins

    def has_room(self) -> bool:
        return True

    def busy(self) -> bool:
        return False

    def launch(self, trial: Any, run: SweepRun) -> None:
        claim = self.driver.claims[trial.number].paths.claim
        self.driver.tell(trial, run_trial(self.driver.plan, trial._trial_id, run, self.plugins, claim))

    def collect(self) -> None:
        return None

    def close(self) -> None:
        return None


def run_study(
    plan: StudyPlan,
    plugins: tuple[str, ...] = (),
    jobs: int = 1,
    report: Callable[[str], None] = lambda line: None,
    ray: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run the study's remaining trials; returns the study record."""
    if ray is None and jobs > 1:  # each trial's share of the threads, before its run is named
        plan.base = dataclasses.replace(plan.base, threads=threads_per_job(plan.base.threads, jobs))
    if plan.force:  # --force redoes everything: the study starts over, its trials run again
        for suffix in (".journal", ".json"):
            plan.path(suffix).unlink(missing_ok=True)
    warning = repair_journal(plan.path(".journal"))
    if warning:
        report(f"warning: {warning}")
    study = open_study(plan, jobs)
    so_far = len(study.get_trials(deepcopy=False))
    if plan.settings.default_trial and not so_far:
        if plan.default is None:
            report(f"{plan.describe()}: its default setting lies outside the space; no default trial")
        else:  # two processes starting the study at once both enqueue it: the second is a duplicate
            study.enqueue_trial(plan.default)
    if so_far:  # a continued study: its sampler must not replay the proposals it made before
        study.sampler = make_sampler(plan, jobs, so_far)
    budget = plan.settings.trials
    size = distinct_settings(plan.space, budget)
    if size is not None and size < budget:
        report(
            f"{plan.describe()}: the space holds {size} distinct settings (floats rounded to "
            f"{SIGNIFICANT_DIGITS} significant digits): {size} trials, not {budget}"
        )
        budget = size
    driver = StudyDriver(plan, study, report)
    taken, _ = driver.tally()
    if taken:
        report(
            f"{plan.describe()}: {len(taken)} trials already in {plan.path('.journal')}, {max(0, budget - len(taken))} to go"
        )
    trials: TrialRunner
    if ray is not None:
        trials = RayTrials(driver, plugins, jobs, ray)
    elif jobs > 1:
        trials = PoolTrials(driver, plugins, jobs)
    else:
        trials = TrialRunner(driver, plugins)
    try:
        driver.drive(budget, trials)
    finally:
        trials.close()
    return write_record(plan, study)


class PoolTrials(TrialRunner):
    """``jobs`` trials at a time in spawned worker processes (threads shared out); the driver's
    process holds their claims."""

    COLLECT_S = 30.0  # the driver wakes at least this often to touch its trials' claims

    def __init__(self, driver: StudyDriver, plugins: tuple[str, ...], jobs: int) -> None:
        super().__init__(driver, plugins)
        context = multiprocessing.get_context("spawn")
        self.jobs = jobs
        self.pool = ProcessPoolExecutor(jobs, mp_context=context, initializer=die_with_parent, initargs=(os.getpid(),))
        self.in_flight: dict[Future, Any] = {}

    def has_room(self) -> bool:
        return len(self.in_flight) < self.jobs

    def busy(self) -> bool:
        return bool(self.in_flight)

    def launch(self, trial: Any, run: SweepRun) -> None:
        claim = self.driver.claims[trial.number].paths.claim
        future = self.pool.submit(_trial_in_worker, self.driver.plan, trial._trial_id, run, self.plugins, claim)
        self.in_flight[future] = trial

    def collect(self) -> None:
        done, _ = wait(self.in_flight, timeout=self.COLLECT_S, return_when=FIRST_COMPLETED)
        for future in done:
            trial = self.in_flight.pop(future)
            try:
                outcome = future.result()
            except Exception as error:  # the worker died
                outcome = ("failed", None, f"worker failed: {type(error).__name__}: {error}")
            self.driver.tell(trial, outcome)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


class RayTrials(TrialRunner):
    """Trials as Ray tasks (``sweeps.on_ray``), ``jobs`` per batch; the per-round values are
    reported from rounds.jsonl once a batch is in (no pruning: workers do not share the study)."""

    def __init__(self, driver: StudyDriver, plugins: tuple[str, ...], jobs: int, ray: dict[str, Any]) -> None:
        super().__init__(driver, plugins)
        self.jobs, self.ray = jobs, ray
        self.batch: list[tuple[Any, SweepRun]] = []

    def has_room(self) -> bool:
        return len(self.batch) < self.jobs

    def busy(self) -> bool:
        return bool(self.batch)

    def launch(self, trial: Any, run: SweepRun) -> None:
        self.batch.append((trial, run))

    def collect(self) -> None:
        from pflbench.sweeps.on_ray import run_sweep_on_ray
        from pflbench.sweeps.record import sweep_record_path

        optuna = require_optuna()
        plan, batch, self.batch = self.driver.plan, self.batch, []
        c = plan.cell.config
        grid = Grid((c.algo,), (c.dataset,), (c.alpha,), plan.seeds[:1])
        record = sweep_record_path(plan.base.out, grid, plan.base)
        runs = [run for _, run in batch]
        cpus, gpus = self.ray["cpus"], self.ray["gpus"]
        run_sweep_on_ray(
            runs, record, grid, plan.base, self.plugins, None, cpus, gpus, disconnect=False, force=plan.force
        )
        for trial, run in batch:
            summary = read_json(run.run_dir / SUMMARY_FILE) if (run.run_dir / SUMMARY_FILE).is_file() else None
            if not isinstance(summary, dict):
                self.driver.tell(trial, ("failed", None, run.error or "no summary"))
                continue
            state, value, message = _read_back(
                plan, optuna.trial.Trial(self.driver.study, trial._trial_id), run, summary
            )
            if run.status != "skipped":  # run now, not found finished
                message = {"complete": "done on Ray", "diverged": "diverged on Ray"}.get(state, message)
            self.driver.tell(trial, (state, value, message))


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
        if trial.number in interrupted:
            state = "interrupted"
        elif "duplicate_of" in trial.user_attrs:  # a proposal of a setting tried already: not run
            state = "duplicate"
        elif trial.user_attrs.get("diverged"):
            state = "diverged"
        else:
            state = trial.state.name.lower()
        record = {
            "number": trial.number,
            "state": state,
            "params": dict(trial.user_attrs.get("setting", trial.params)),
            "value": trial.value,
            "run": trial.user_attrs.get("run"),
            "per_round": {str(step): value for step, value in sorted(trial.intermediate_values.items())},
        }
        if state == "duplicate":
            record["duplicate_of"] = trial.user_attrs["duplicate_of"]
        records.append(record)
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
        **({"default_trial": plan.default} if plan.settings.default_trial else {}),
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
                "mean": mean(values),
                "std": sample_std(values),  # the leaderboard's std (n − 1); None for one seed
                "n": len(values),
            }
    return {"seeds": per_seed, "metrics": aggregate}


def claimed_elsewhere(runs: list[SweepRun], report: Callable[[str], None]) -> list[SweepRun]:
    """The runs a sweep left to another live process (status ``claimed``: another ``pflbench
    tune`` on this ``--out`` runs the same chosen setting), once that process has let go of
    them: to be swept again (finished: read back; its process died: resumed)."""
    claimed = [run for run in runs if run.status == "claimed"]
    for run in claimed:
        owner = claim_owner(RunPaths(run.run_dir))
        if owner is not None:
            report(f"tune: waiting for {run.name}: another process is running it ({describe_owner(owner)})")
        while claim_owner(RunPaths(run.run_dir)) is not None:
            time.sleep(CLAIM_POLL_S)
    return claimed


def finish_study(plan: StudyPlan, runs: list[SweepRun]) -> dict[str, Any]:
    """The study record with the chosen setting's final runs."""
    return write_record(plan, open_study(plan), final_record(plan, runs))
