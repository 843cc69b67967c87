"""Sweeps: a grid over algorithms × datasets × α × seeds × ``--set`` axes, run one by one.

``expand_grid`` is a pure function (grid → list of runs, validated up front), ``check_grid``
builds each distinct dataset/partition/model once without training; ``run_sweep`` executes the
runs through ``runner.prepare/execute``. A run whose folder already holds ``summary.json`` is
skipped and an unfinished one resumes from its checkpoint, so rerunning a sweep resumes it; a
run claimed by another live process (a concurrent sweep) is skipped and reported; a run that
diverges keeps its partial results (status ``diverged``); a run that raises gets an
``error.json`` in its folder and the sweep goes on. Every algorithm sees the same partition and
client sequence for a given seed because both are drawn from the seed's own random streams.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import time
import traceback
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pflbench.config.run_config import (
    RunConfig,
    field_types,
    hyperparameters_from,
    resolve,
    run_identity,
    run_name,
    validate,
)
from pflbench.errors import ConfigError
from pflbench.registry import ALGORITHMS, DATASETS
from pflbench.runs.execute import RunDiverged, execute
from pflbench.runs.prepare import prepare, resolve_device
from pflbench.store.layout import RunClaimed, RunFinished, RunPaths, guard_run
from pflbench.store.writer import write_json

GRID_FIELDS = ("algo", "dataset", "alpha", "seed")
NOT_AXES = (*GRID_FIELDS, "out")
TRUE_WORDS, FALSE_WORDS = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


@dataclass
class Grid:
    """The swept values; ``axes`` maps a ``--set`` name (run option or hyperparameter) to its values."""

    algos: tuple[str, ...]
    datasets: tuple[str, ...]
    alphas: tuple[float, ...]
    seeds: tuple[int, ...]
    axes: dict[str, tuple[Any, ...]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "algos": list(self.algos),
            "datasets": list(self.datasets),
            "alphas": list(self.alphas),
            "seeds": list(self.seeds),
            "set": {k: list(v) for k, v in self.axes.items()},
        }


@dataclass
class SweepRun:
    """One cell of the grid: its config, algorithm options, the --set values it got, its folder name."""

    config: RunConfig
    algo_options: dict[str, Any]
    overrides: dict[str, Any]
    name: str
    status: str = "pending"
    error: str | None = None
    worker: str | None = None  # where a Ray sweep ran it: "hostname (node 1a2b3c4d)"

    @property
    def run_dir(self) -> Path:
        return Path(self.config.out) / "runs" / self.name

    def describe(self) -> str:
        extra = "".join(f" {k}={v}" for k, v in self.overrides.items())
        c = self.config
        return f"{c.algo} {c.dataset} α={c.alpha:g} seed={c.seed}{extra}"

    def to_json(self) -> dict[str, Any]:
        c = self.config
        return {
            "name": self.name,
            "algo": c.algo,
            "dataset": c.dataset,
            "alpha": c.alpha,
            "seed": c.seed,
            "set": self.overrides,
            "status": self.status,
            "error": self.error,
            **({"worker": self.worker} if self.worker else {}),
        }


def split_values(text: str, convert: Callable[[str], Any], flag: str) -> tuple[Any, ...]:
    """``"a,b,a"`` → ``(convert("a"), convert("b"))``: comma-separated, stripped, de-duplicated."""
    values: list[Any] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        try:
            value = convert(item)
        except ValueError as error:
            raise ConfigError(f"{flag}: {item!r} is not a valid {convert.__name__}") from error
        if value not in values:
            values.append(value)
    if not values:
        raise ConfigError(f"{flag} needs at least one value")
    return tuple(values)


def parse_sets(items: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """``("mu=0.01,0.1", "lr=0.05")`` → ``{"mu": ("0.01", "0.1"), "lr": ("0.05",)}``."""
    axes: dict[str, tuple[str, ...]] = {}
    for item in items:
        name, sep, values = item.partition("=")
        name = name.strip().lstrip("-").replace("-", "_")
        if not sep or not name:
            raise ConfigError(f"--set {item!r} is not NAME=VALUE[,VALUE...]")
        if name in axes:
            raise ConfigError(f"--set {name} is given twice")
        if name in NOT_AXES:
            hint = f"use --{name}s" if name in GRID_FIELDS else "it is shared by the whole sweep"
            raise ConfigError(f"--set {name}: {name} cannot be a --set axis ({hint})")
        axes[name] = split_values(values, str, f"--set {name}")
    return axes


def parse_value(value: Any, annotation: Any, name: str) -> Any:
    """A --set string converted to a dataclass field's type (``X | None``, bool, tuple[str, ...])."""
    if not isinstance(value, str):
        return value
    args = typing.get_args(annotation)
    if type(None) in args:
        if value.lower() in ("none", "null"):
            return None
        annotation = next(a for a in args if a is not type(None))
    if typing.get_origin(annotation) is tuple:
        return (value,)
    if annotation is bool:
        if value.lower() not in TRUE_WORDS + FALSE_WORDS:
            raise ConfigError(f"--set {name}: {value!r} is not a boolean (true/false)")
        return value.lower() in TRUE_WORDS
    try:
        return annotation(value)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"--set {name}: {value!r} is not a valid {annotation.__name__}") from error


def _typed_axes(axes: dict[str, tuple[Any, ...]], cls: type, names: Iterable[str]) -> dict[str, tuple[Any, ...]]:
    hints = field_types(cls)
    choices = {f.name: f.metadata.get("choices") for f in dataclasses.fields(cls)}
    typed = {}
    for name in names:
        typed[name] = tuple(parse_value(v, hints[name], name) for v in axes[name])
        allowed = choices[name]
        bad = [v for v in typed[name] if allowed and v not in allowed]
        if bad:
            raise ConfigError(f"--set {name}: {bad[0]!r} is not one of: {', '.join(allowed)}")
    return typed


def _check_axis_names(axes: dict[str, Any], algos: tuple[str, ...], run_fields: set[str]) -> None:
    """Every axis must be a run option or a hyperparameter of at least one algorithm of the grid."""
    hyperparameters = {a: {f.name for f in dataclasses.fields(ALGORITHMS.get(a).hyperparameters)} for a in algos}
    for name in axes:
        if name not in run_fields and not any(name in names for names in hyperparameters.values()):
            owned = sorted({f"{n} ({a})" for a, names in hyperparameters.items() for n in names})
            raise ConfigError(
                f"{name!r} is neither a run option nor a hyperparameter of "
                f"{', '.join(algos)}; hyperparameters: {', '.join(owned) or 'none'}"
            )


def _product(axes: dict[str, tuple[Any, ...]]) -> list[dict[str, Any]]:
    return [dict(zip(axes, values)) for values in itertools.product(*axes.values())]


def expand_grid(base: RunConfig, grid: Grid) -> list[SweepRun]:
    """Every combination, validated and resolved: dataset × α × seed × run axes, then each algorithm
    × its own hyperparameter axes (a hyperparameter only multiplies the algorithms that have it).

    Each cell is resolved like a single run (``config.resolve`` with its own hyperparameters).
    When any cell is a LoRA run, ``lora.RUN_DEFAULTS`` also fill the unset options of *every*
    other cell, so all runs share the model and the public hold-out (the same client data).
    ``--finetune-epochs`` applies to the algorithms with a global model (the others run without it).
    """
    from pflbench.models.lora import RUN_DEFAULTS

    for name in grid.datasets:
        DATASETS.get(name)
    run_fields = {f.name for f in dataclasses.fields(RunConfig)}
    _check_axis_names(grid.axes, grid.algos, run_fields)
    run_axes = _typed_axes(grid.axes, RunConfig, [n for n in grid.axes if n in run_fields])
    hyperparameter_classes = {algo: ALGORITHMS.get(algo).hyperparameters for algo in grid.algos}
    algo_axes = {
        algo: _product(_typed_axes(grid.axes, cls, [f.name for f in dataclasses.fields(cls) if f.name in grid.axes]))
        for algo, cls in hyperparameter_classes.items()
    }
    cells = []
    for dataset, alpha, seed, run_values in itertools.product(
        grid.datasets, grid.alphas, grid.seeds, _product(run_axes)
    ):
        for algo in grid.algos:
            for algo_values in algo_axes[algo]:
                config = dataclasses.replace(base, algo=algo, dataset=dataset, alpha=alpha, seed=seed, **run_values)
                if not ALGORITHMS.get(algo).has_global_model:  # --finetune-epochs: global models only
                    config = dataclasses.replace(config, finetune_epochs=0)
                hparams = hyperparameters_from(hyperparameter_classes[algo], algo_values, algo)
                cells.append((config, hparams, run_values, algo_values))
    any_lora = any(ALGORITHMS.get(c.algo).lora_rank(c, h) is not None for c, h, _, _ in cells)
    runs: dict[str, SweepRun] = {}
    for config, hparams, run_values, algo_values in cells:
        algorithm = ALGORITHMS.get(config.algo)
        config, _ = resolve(config, algorithm, hparams, RUN_DEFAULTS if any_lora else None)
        validate(config)
        algorithm.check_config(config, hparams)
        resolve_device(config.device)
        name = run_name(config, algorithm, hparams)
        runs.setdefault(name, SweepRun(config, algo_values, {**run_values, **algo_values}, name))
    return list(runs.values())


def sweep_record_path(out: str | Path, grid: Grid, base: RunConfig) -> Path:
    """``OUT/sweeps/<YYYYmmdd-HHMMSS>-<hash of grid and shared options>[-n].json`` (a new file)."""
    identity = json.dumps([grid.to_json(), dataclasses.asdict(base)], sort_keys=True, default=str)
    digest = hashlib.sha256(identity.encode()).hexdigest()[:8]
    stem = Path(out) / "sweeps" / f"{time.strftime('%Y%m%d-%H%M%S')}-{digest}"
    path, attempt = stem.with_suffix(".json"), 1
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:  # reserve the name: two sweeps of the same grid within one second get two files
        try:
            with open(path, "x"):
                return path
        except FileExistsError:
            attempt += 1
            path = stem.with_name(f"{stem.name}-{attempt}.json")


def _write_record(path: Path, grid: Grid, base: RunConfig, runs: list[SweepRun]) -> None:
    shared = {k: v for k, v in dataclasses.asdict(base).items() if k not in GRID_FIELDS}
    write_json(
        path,
        {"grid": grid.to_json(), "shared": shared, "counts": count_statuses(runs), "runs": [r.to_json() for r in runs]},
    )


def count_statuses(runs: list[SweepRun]) -> dict[str, int]:
    counts = {s: 0 for s in ("done", "skipped", "claimed", "diverged", "failed", "interrupted", "pending")}
    for run in runs:
        counts[run.status] += 1
    return counts


def write_error(run: SweepRun, error: BaseException) -> None:
    """``error.json`` in the run folder: type, message, traceback and the run's settings."""
    run.run_dir.mkdir(parents=True, exist_ok=True)
    write_json(
        run.run_dir / "error.json",
        {
            "error_type": type(error).__name__,
            "message": str(error),
            "traceback": "".join(traceback.format_exception(error)),
            "config": {**dataclasses.asdict(run.config), "algo_options": run.algo_options},
        },
    )


def check_grid(runs: list[SweepRun]) -> None:
    """Build each distinct dataset, partition and (configured) model of the grid once, without
    training, so a bad dataset/model option or an impossible partition refuses the whole grid
    before any folder is created."""
    from pflbench.data.dataset import load_dataset
    from pflbench.data.partition import make_partition
    from pflbench.data.presets import fit_num_clients
    from pflbench.runs.prepare import check_model

    datasets: dict[str, Any] = {}
    seen: set[str] = set()
    for run in runs:
        config = run.config
        data_key = json.dumps([config.dataset, config.dataset_options()], sort_keys=True, default=str)
        if data_key not in datasets:
            datasets[data_key] = load_dataset(config.dataset, config.dataset_options())
        dataset = datasets[data_key]
        explicit = {"num_clients"} if config.num_clients != RunConfig.num_clients else set()
        config = fit_num_clients(config, dataset, explicit)
        algorithm = ALGORITHMS.get(config.algo)
        hparams = hyperparameters_from(algorithm.hyperparameters, dict(run.algo_options), config.algo)
        identity = run_identity(config, algorithm, hparams)
        partition_key = json.dumps(
            [data_key, config.partition_spec.identity(), config.seed, config.partition_file],
            sort_keys=True,
            default=str,
        )
        if partition_key not in seen:
            seen.add(partition_key)
            make_partition(config, dataset)
        model_key = json.dumps(
            [
                data_key,
                {
                    k: v
                    for k, v in identity.items()
                    if k in ("algo", "model", "model_options", "head_layers", "algo_hparams") or k.startswith("lora")
                },
            ],
            sort_keys=True,
            default=str,
        )
        if model_key not in seen:
            seen.add(model_key)
            check_model(config, algorithm, hparams, dataset)


def run_one(run: SweepRun, plugins: tuple[str, ...]) -> dict[str, Any]:
    """Run (or resume from its checkpoint) one cell of the grid."""
    (run.run_dir / "error.json").unlink(missing_ok=True)
    guard = lambda run_dir: guard_run(RunPaths(run_dir), force=False)  # noqa: E731
    return execute(prepare(run.config, run.algo_options, guard=guard), plugins=plugins, resume=True)


def run_sweep(
    runs: list[SweepRun],
    record: Path,
    grid: Grid,
    base: RunConfig,
    plugins: tuple[str, ...] = (),
    report: Callable[[int, SweepRun, dict[str, Any] | None], None] | None = None,
    jobs: int = 1,
) -> None:
    """Run (or skip) each run, rewriting the sweep record ``record`` after each.

    ``jobs`` > 1 runs that many at once in worker processes (``sweep_parallel``), each with
    ``max(1, threads // jobs)`` threads; ``report`` then comes in completion order. A
    KeyboardInterrupt marks the current run(s) ``interrupted`` (their folders lack summary.json,
    so the next sweep redoes them), writes the record and propagates.
    """
    record.parent.mkdir(parents=True, exist_ok=True)
    _write_record(record, grid, base, runs)

    def finished(index: int, run: SweepRun, summary: dict[str, Any] | None) -> None:
        _write_record(record, grid, base, runs)
        if report is not None:
            report(index, run, summary)

    todo = []
    for index, run in enumerate(runs):
        if (run.run_dir / "summary.json").is_file():
            run.status = "skipped"
            finished(index, run, None)
        elif jobs > 1:
            todo.append((index, run))
        else:
            finished(index, run, _run_here(run, plugins, lambda: _write_record(record, grid, base, runs)))
    if todo:
        from pflbench.sweeps.parallel import run_parallel

        try:
            run_parallel(todo, jobs, plugins, finished)
        except KeyboardInterrupt:
            _write_record(record, grid, base, runs)
            raise


def _run_here(run: SweepRun, plugins: tuple[str, ...], write_record: Callable[[], None]) -> dict[str, Any] | None:
    """One run in this process: its summary, or None with ``run.status`` failed (error.json)."""
    try:
        summary = run_one(run, plugins)
        run.status = "done"
        return summary
    except KeyboardInterrupt:
        run.status = "interrupted"
        write_record()
        raise
    except Exception as error:  # one broken run must not stop the sweep
        run.status, run.error = outcome_of(run, error)
        return None


def outcome_of(run: SweepRun, error: Exception) -> tuple[str, str | None]:
    """(status, error) of a run that raised: finished or claimed by a concurrent sweep, diverged,
    or failed (error.json written)."""
    if isinstance(error, RunFinished):  # finished by a concurrent sweep meanwhile
        return "skipped", None
    if isinstance(error, RunClaimed):  # a concurrent sweep is running it now
        return "claimed", str(error)
    if isinstance(error, RunDiverged):
        return "diverged", str(error)
    write_error(run, error)
    return "failed", f"{type(error).__name__}: {error}"
