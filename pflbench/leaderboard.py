"""Leaderboards from results folders: run folders → one tidy frame → pivot table.

``load_runs`` reads only the files of each run folder into a tidy frame (run, algo, dataset,
alpha, seed, round, metric, value, config_key); ``round`` is empty for the final values of
``summary.json`` and set for the per-round values of ``rounds.jsonl``. ``config_key`` is the run's
settings without the grid axes (algo, dataset, alpha, seed): runs that differ in anything else
are never averaged together — they become separate rows labelled by the differing setting.
Renderers live in ``pflbench.tables``.
"""
from __future__ import annotations

import dataclasses
import json
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import pandas as pd

from .config import RunConfig
from .errors import ConfigError

GRID_AXES = ("algo", "dataset", "alpha", "seed")
COLUMNS = ("run", "algo", "dataset", "alpha", "seed", "round", "metric", "value", "config_key")
SUMMARY_NON_METRICS = {"alpha", "seed", "num_clients", "rounds", "evaluations"}
ROUND_NON_METRICS = {"round", "clients"}
EXTRAS = {"comm": ("bytes_up_total", "bytes_down_total"), "time": ("wall_time_s",),
          "worst10": ("pers_acc_worst10",)}


class RunFolderWarning(UserWarning):
    """A run folder that is unfinished, failed or unreadable, and was left out."""


@dataclass(frozen=True)
class Quantity:
    """How a table column is shown: label, scale to display units, and which way is better."""

    label: str
    scale: float
    higher_is_better: bool


def quantity(name: str) -> Quantity:
    """Accuracies in percent (higher is better, except spreads); bytes in MB, times in s (lower)."""
    if name == "comm":
        return Quantity("comm (MB)", 1 / 2**20, False)
    if name == "time":
        return Quantity("time (s)", 1.0, False)
    if name == "worst10":
        return Quantity("worst-10% (%)", 100.0, True)
    if "acc" in name:
        return Quantity(f"{name} (%)", 100.0, "std" not in name)
    if "bytes" in name:
        return Quantity(f"{name} (MB)", 1 / 2**20, False)
    return Quantity(name, 1.0, False)


def find_run_folders(paths: Iterable[str | Path]) -> list[Path]:
    """Run folders under each path: ``PATH/runs/*`` for an output folder, else ``PATH/*``."""
    folders = []
    for path in map(Path, paths):
        if not path.is_dir():
            raise ConfigError(f"{path} is not a folder")
        if (path / "config.json").is_file() or (path / "error.json").is_file():
            folders.append(path)
            continue
        parent = path / "runs" if (path / "runs").is_dir() else path
        folders.extend(sorted(p for p in parent.iterdir() if p.is_dir()))
    return folders


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"no {path.name}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path.name} is unreadable ({error})") from None


def _failure(folder: Path) -> str:
    """Why a folder has no summary.json: its error.json, or unfinished."""
    try:
        error = _read_json(folder / "error.json")
        return f"failed run ({error.get('error_type')}: {error.get('message')})"
    except (ValueError, AttributeError):
        return "unfinished run (no summary.json)"


def setting_of(config: dict[str, Any]) -> dict[str, Any]:
    """The run's settings minus the grid axes: RunConfig fields (``out`` excluded) and hyperparameters."""
    names = [f.name for f in dataclasses.fields(RunConfig) if f.name not in (*GRID_AXES, "out")]
    return {"run": {n: config.get(n) for n in names}, "algo_hparams": dict(config.get("algo_hparams") or {})}


def _is_number(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def read_run(folder: Path) -> list[tuple[Any, ...]]:
    """The tidy rows of one finished run folder; ValueError if it is unfinished or unreadable."""
    if not (folder / "summary.json").is_file():
        raise ValueError(_failure(folder))
    config, summary = _read_json(folder / "config.json"), _read_json(folder / "summary.json")
    if not isinstance(config, dict) or not isinstance(summary, dict):
        raise ValueError("config.json or summary.json is not a JSON object")
    missing = [k for k in GRID_AXES if k not in config]
    if missing:
        raise ValueError(f"config.json lacks {', '.join(missing)}")
    try:
        lines = (folder / "rounds.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines if line.strip()]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"rounds.jsonl is unreadable ({error})") from None
    key = json.dumps(setting_of(config), sort_keys=True, default=str)
    head = (folder.name, str(config["algo"]), str(config["dataset"]), float(config["alpha"]), int(config["seed"]))
    rows = [(*head, None, k, v, key) for k, v in summary.items()
            if k not in SUMMARY_NON_METRICS and _is_number(v)]
    for record in records:
        if not isinstance(record, dict) or not isinstance(record.get("round"), int):
            raise ValueError("rounds.jsonl has a record without a round number")
        rows += [(*head, record["round"], k, v, key) for k, v in record.items()
                 if k not in ROUND_NON_METRICS and _is_number(v)]
    return rows


def _warn(message: str) -> None:
    warnings.warn(message, RunFolderWarning, stacklevel=3)


def load_runs(paths: str | Path | Iterable[str | Path], warn: Callable[[str], None] = _warn) -> pd.DataFrame:
    """Every finished run folder under ``paths`` as one tidy frame; the others are skipped with a warning."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    rows: list[tuple[Any, ...]] = []
    seen: dict[str, Path] = {}
    for folder in find_run_folders(paths):
        if folder.name in seen:
            warn(f"skipped {folder}: same run as {seen[folder.name]}")
            continue
        try:
            rows += read_run(folder)
        except (ValueError, TypeError, KeyError) as error:
            warn(f"skipped {folder}: {error}")
            continue
        seen[folder.name] = folder
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    return frame.astype({"round": "Int64", "value": "float64", "alpha": "float64", "seed": "int64"})


def _flat(key: str) -> dict[str, Any]:
    setting = json.loads(key)
    return {**setting["run"], **setting["algo_hparams"]}


def _varying(settings: list[dict[str, Any]]) -> list[str]:
    names = sorted(set().union(*settings))
    return [n for n in names if len({json.dumps(s.get(n), default=str) for s in settings}) > 1]


def _value_text(value: Any) -> str:
    return "none" if value is None else str(value)


def _conflicts(runs: pd.DataFrame) -> set[str]:
    """Settings in which one algorithm's runs differ within a (dataset, α) cell."""
    conflicts: set[str] = set()
    for _, cell in runs.groupby(["dataset", "alpha"]):
        keys = cell["config_key"].unique()
        if len(keys) > 1:
            conflicts.update(_varying([_flat(k) for k in keys]))
    return conflicts


def row_labels(frame: pd.DataFrame) -> dict[str, str]:
    """run → table row: the algorithm, plus ``(name=value, ...)`` for the settings in which that
    algorithm's runs differ within one (dataset, α) cell, so that a cell never mixes them."""
    labels: dict[str, str] = {}
    for algo, group in frame.drop_duplicates("run").groupby("algo"):
        conflicts = _conflicts(group)
        for run, key in zip(group["run"], group["config_key"]):
            setting = _flat(key)
            detail = ", ".join(f"{n}={_value_text(setting.get(n))}" for n in sorted(conflicts))
            labels[run] = f"{algo} ({detail})" if detail else str(algo)
    return labels


def differing_settings(frame: pd.DataFrame) -> dict[str, list[str]]:
    """Run settings (not hyperparameters) that differ between runs of the table and are not
    already part of a row label: name → the distinct values."""
    runs = frame.drop_duplicates("run")
    labelled = set().union(*(_conflicts(group) for _, group in runs.groupby("algo")))
    settings = [json.loads(k)["run"] for k in runs["config_key"].unique()]
    names = [n for n in _varying(settings) if n not in labelled] if settings else []
    return {n: sorted({_value_text(s.get(n)) for s in settings}) for n in names}


def final_values(frame: pd.DataFrame, quantities: Iterable[str]) -> pd.DataFrame:
    """One row per (run, quantity) in display units: run, row, dataset, alpha, seed, quantity, value."""
    finals = frame[frame["round"].isna()]
    wide = finals.set_index(["run", "metric"])["value"].unstack()
    runs = finals.drop_duplicates("run").set_index("run")[["dataset", "alpha", "seed", "config_key"]]
    labels = row_labels(frame)
    mixed = runs.assign(row=runs.index.map(labels)).groupby(["row", "dataset", "alpha"])["config_key"].nunique()
    if (mixed > 1).any():  # labels that collide in their text; never average such runs
        raise ConfigError(f"runs with different settings share the cell {mixed[mixed > 1].index[0]}")
    runs = runs.drop(columns="config_key")
    parts = []
    for name in quantities:
        metrics = EXTRAS.get(name, (name,))
        absent = [m for m in metrics if m not in wide.columns]
        if absent:
            available = ", ".join(sorted(m for m in wide.columns))
            raise ConfigError(f"metric {absent[0]!r} is not in the runs' summary.json; available: {available}")
        values = wide[list(metrics)].sum(axis=1, min_count=len(metrics)) * quantity(name).scale
        part = runs.assign(quantity=name, value=values.reindex(runs.index))
        parts.append(part.assign(row=[labels[r] for r in part.index]).reset_index())
    return pd.concat(parts, ignore_index=True)


def pivot(frame: pd.DataFrame, metric: str = "pers_acc", extras: Iterable[str] = ()) -> pd.DataFrame:
    """Rows = algorithms (split by differing settings), columns = (dataset, alpha, quantity, stat)
    with stat ∈ {mean, std, n}: mean and sample std over seeds, n = seeds with a value."""
    if frame.empty:
        raise ConfigError("no finished runs to tabulate")
    unknown = [e for e in extras if e not in EXTRAS]
    if unknown:
        raise ConfigError(f"--extra {unknown[0]!r} is not one of: {', '.join(EXTRAS)}")
    quantities = list(dict.fromkeys([metric, *extras]))
    values = final_values(frame, quantities)
    stats = (values.groupby(["row", "dataset", "alpha", "quantity"])["value"]
             .agg(mean="mean", std="std", n="count").unstack(["dataset", "alpha", "quantity"]))
    stats = stats.reorder_levels([1, 2, 3, 0], axis=1)
    panels = sorted({(d, a) for d, a, _, _ in stats.columns})
    columns = pd.MultiIndex.from_tuples([(d, a, q, s) for d, a in panels for q in quantities
                                         for s in ("mean", "std", "n")],
                                        names=["dataset", "alpha", "quantity", "stat"])
    table = stats.reindex(columns=columns).sort_index()
    table.index.name = "algorithm"
    table.attrs.update(metric=metric, quantities=quantities, differing=differing_settings(frame))
    return table


@dataclass(frozen=True)
class Cell:
    """One table cell: mean/std in display units, seeds, rank (1 best, 2 second) and seed flag."""

    mean: float | None
    std: float | None
    n: int
    rank: int | None
    fewer_seeds: bool


def _finite(value: Any) -> float | None:
    return None if value is None or pd.isna(value) or not math.isfinite(value) else float(value)


def cells(table: pd.DataFrame, decimals: int = 2) -> dict[tuple[str, tuple[str, float, str]], Cell]:
    """(row, (dataset, alpha, quantity)) → Cell; ranks by the mean as shown (``decimals``), only in
    columns with at least two values; cells with fewer seeds than the most in the table are flagged."""
    columns = list(dict.fromkeys(c[:3] for c in table.columns))
    counts = table.xs("n", axis=1, level="stat").fillna(0).astype(int)
    most = max_seeds(table)
    result = {}
    for column in columns:
        means = {row: _finite(table.loc[row, (*column, "mean")]) for row in table.index}
        shown = {row: round(m, decimals) for row, m in means.items() if m is not None}
        order = sorted(set(shown.values()), reverse=quantity(column[2]).higher_is_better)
        for row in table.index:
            n = int(counts.loc[row, column])
            rank = order.index(shown[row]) + 1 if row in shown and len(shown) >= 2 else None
            result[row, column] = Cell(means[row], _finite(table.loc[row, (*column, "std")]), n,
                                       rank if rank in (1, 2) else None, 0 < n < most)
    return result


def max_seeds(table: pd.DataFrame) -> int:
    """The most seeds any cell of the table has."""
    counts = table.xs("n", axis=1, level="stat").fillna(0)
    return int(counts.to_numpy().max()) if counts.size else 0


def curve_bands(frame: pd.DataFrame, metric: str = "pers_acc", x: str = "round") -> pd.DataFrame:
    """Per (row, dataset, alpha, round): mean x, and mean/std/n over seeds of ``metric`` (display
    units). ``x`` is ``round`` or ``comm`` (cumulative MB sent up + down by that round)."""
    rounds = frame[frame["round"].notna()]
    wide = rounds.set_index(["run", "round", "metric"])["value"].unstack()
    if metric not in wide.columns:
        raise ConfigError(f"metric {metric!r} is not in the runs' rounds.jsonl")
    data = pd.DataFrame({"y": wide[metric] * quantity(metric).scale}, index=wide.index)
    data["x"] = (wide["bytes_up_cum"] + wide["bytes_down_cum"]) / 2**20 if x == "comm" else \
        wide.index.get_level_values("round").astype(float)
    runs = rounds.drop_duplicates("run").set_index("run")[["dataset", "alpha"]]
    labels = row_labels(frame)
    data = data.dropna().reset_index().join(runs, on="run")
    data["row"] = data["run"].map(labels)
    return (data.groupby(["row", "dataset", "alpha", "round"])
            .agg(x=("x", "mean"), mean=("y", "mean"), std=("y", "std"), n=("y", "count")).reset_index())


def write_plots(frame: pd.DataFrame, metric: str, folder: str | Path) -> list[Path]:
    """``accuracy_vs_round`` and ``accuracy_vs_comm`` (PNG and PDF) of ``metric`` per round, or of
    its per-round counterpart (``x_last10`` → ``x``; else ``pers_acc``)."""
    from .plots import plot_curves

    per_round = set(frame.loc[frame["round"].notna(), "metric"])
    curve_metric = next((m for m in (metric, metric.removesuffix("_last10")) if m in per_round), "pers_acc")
    label = quantity(curve_metric).label
    written = []
    for x, x_label in (("round", "round"), ("comm", "communication, up + down (MB)")):
        stem = Path(folder) / f"accuracy_vs_{x}"
        written += plot_curves(curve_bands(frame, curve_metric, x), [stem.with_suffix(".png"), stem.with_suffix(".pdf")],
                               x_label, label, title=f"{label}: mean ± std over seeds")
    return written
