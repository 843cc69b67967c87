"""A sweep's grid: algorithms × datasets × α × seeds × ``--set`` axes, expanded into runs and checked before any run starts."""

from __future__ import annotations

import dataclasses
import itertools
import json
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pflbench.config import lora
from pflbench.config.identity import partition_identity, partition_settings
from pflbench.config.run_config import RunConfig, field_types, hyperparameters_from
from pflbench.data.dataset import load_dataset
from pflbench.errors import ConfigError
from pflbench.registry import ALGORITHMS, DATASETS
from pflbench.runs.prepare import RunPlan, plan_run, preflight
from pflbench.store.layout import run_folder
from pflbench.store.reader import partition_of
from pflbench.util.threads import threads_per_job

GRID_FIELDS = ("algo", "dataset", "alpha", "seed")


NOT_AXES = (*GRID_FIELDS, "out")


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
    """One cell of the grid: its config, algorithm options, the --set values it got, its folder
    name, and its plan (``runs.prepare.RunPlan``, made when the grid was expanded: the grid's
    preflight and the run's preparation take it, and its identity, rather than planning again).
    A worker process (``--jobs``) gets the cell without its plan and plans it once there: the
    plan holds the algorithm's classes, which a ``--plugin`` file registers in the worker only
    once the worker has loaded it."""

    config: RunConfig
    algo_options: dict[str, Any]
    overrides: dict[str, Any]
    name: str
    status: str = "pending"
    error: str | None = None
    worker: str | None = None  # where a Ray sweep ran it: "hostname (node 1a2b3c4d)"
    code: str | None = None  # the code identity it would record now (``config.provenance``), once asked
    redo: str | None = None  # a finished run run again: "stale" (its code changed) or "forced" (--force)
    plan: RunPlan | None = field(default=None, repr=False, compare=False)
    applied: dict[str, Any] | None = field(default=None, repr=False, compare=False)  # the plan's, in a worker

    def __getstate__(self) -> dict[str, Any]:
        # to a worker: the plan's filled-in values travel (config.json records them), not the plan
        return {**self.__dict__, "plan": None, "applied": self.plan.applied if self.plan else self.applied}

    def planned(self) -> RunPlan:
        """The cell's plan (planned here only in a worker process, which got the cell without it)."""
        if self.plan is None:
            plan = plan_run(self.config, self.algo_options)
            self.plan = plan if self.applied is None else dataclasses.replace(plan, applied=self.applied)
        return self.plan

    @property
    def run_dir(self) -> Path:
        return run_folder(self.config.out, self.name)

    @property
    def partition(self) -> str:
        """The partition named by the settings its partitioner reads (as leaderboards show it)."""
        return partition_of({"identity": partition_identity(self.config.partition_spec)})

    def describe(self) -> str:
        extra = "".join(f" {k}={v}" for k, v in self.overrides.items())
        c = self.config
        return f"{c.algo} {c.dataset} {self.partition} seed={c.seed}{extra}"

    def to_json(self) -> dict[str, Any]:
        c = self.config
        return {
            "name": self.name,
            "algo": c.algo,
            "dataset": c.dataset,
            "partition": self.partition,
            "seed": c.seed,
            "set": self.overrides,
            "status": self.status,
            "error": self.error,
            **({"redo": self.redo} if self.redo else {}),
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


def expand_grid(base: RunConfig, grid: Grid, jobs: int = 1) -> list[SweepRun]:
    """Every combination, validated and resolved: dataset × α × seed × run axes, then each algorithm
    × its own hyperparameter axes (a hyperparameter only multiplies the algorithms that have it).

    Each cell is resolved like a single run (``config.resolve`` with its own hyperparameters).
    When any cell is a LoRA run, ``config.lora.RUN_DEFAULTS`` also fill the unset options of *every*
    other cell, so all runs share the model and the public hold-out (the same client data).
    ``--finetune-epochs`` applies to the algorithms with a global model (the others run without it).
    ``jobs`` runs at once (``--jobs``) share each cell's threads: each gets ``threads // jobs``
    (``util.threads.threads_per_job``) before it is named, since the count that shapes the
    numbers is part of the run identity (``config.identity.cpu_threads``).
    """
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
                config = dataclasses.replace(config, threads=threads_per_job(config.threads, jobs))
                if not ALGORITHMS.get(algo).has_global_model:  # --finetune-epochs: global models only
                    config = dataclasses.replace(config, finetune_epochs=0)
                hparams = hyperparameters_from(hyperparameter_classes[algo], algo_values, algo)
                cells.append((config, hparams, run_values, algo_values))
    if len(set(grid.alphas)) > 1 and not any("alpha" in partition_settings(c) for c, _, _, _ in cells):
        values = ",".join(f"{a:g}" for a in grid.alphas)
        raise ConfigError(f"--alphas {values} would be ignored: no partitioner of the grid reads α; sweep one α")
    any_lora = any(lora.is_lora_run(ALGORITHMS.get(c.algo), c, h) for c, h, _, _ in cells)
    runs: dict[str, SweepRun] = {}
    datasets: dict[str, Any] = {}

    def dataset_of(config: RunConfig) -> Callable[[], Any]:  # loaded only when K depends on the data
        key = json.dumps([config.dataset, config.dataset_options()], sort_keys=True, default=str)
        return lambda: (
            datasets.get(key) or datasets.setdefault(key, load_dataset(config.dataset, config.dataset_options()))
        )

    for config, _, run_values, algo_values in cells:
        plan = plan_run(config, algo_values, lora.RUN_DEFAULTS if any_lora else None)  # as a single run
        plan = plan.fitted(dataset_of(plan.config))  # the run's name holds K
        name = plan.identity.name
        overrides = {**run_values, **algo_values}
        runs.setdefault(name, SweepRun(plan.config, algo_values, overrides, name, plan=plan))
    return list(runs.values())


def check_grid(runs: list[SweepRun]) -> None:
    """The grid's preflight (``runs.prepare.preflight``): each distinct dataset, partition and
    model built once without training, so bad options refuse the grid before any folder exists."""
    preflight([run.planned() for run in runs])


TRUE_WORDS, FALSE_WORDS = ("true", "1", "yes", "on"), ("false", "0", "no", "off")
