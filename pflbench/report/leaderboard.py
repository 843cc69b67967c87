"""Leaderboards from results folders: run folders → one tidy frame → pivot table.

``load_runs`` (``pflbench.store.reader``) reads each run once into a tidy frame (run, algo,
dataset, partition, seed, round, metric, value, config_key, status); ``round`` is empty for the
final values of ``summary.json``. ``config_key`` is the run's settings without the grid axes
(algo, dataset, partition, seed): runs that differ in anything else are never averaged together —
they become separate rows labelled by the differing setting. Cells carry mean ± std (or a 95%
CI) over seeds, ranks, and a paired test against the column's best (``pflbench.report.stats``).
Renderers live in ``pflbench.report.render``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from pflbench.config.identity import OMITTED_AT_DEFAULT
from pflbench.errors import ConfigError
from pflbench.report import stats
from pflbench.report.names import display_name, quantity, setup_text
from pflbench.report.plots import plot_curves
from pflbench.store.reader import partition_sort_key

EXTRAS = {"comm": ("bytes_up_total", "bytes_down_total"), "time": ("wall_time_s",), "worst10": ("pers_acc_worst10",)}
__all__ = [
    "pivot",
    "cells",
    "row_ranks",
]


def _flat(key: str) -> dict[str, Any]:
    setting = json.loads(key)
    return {**setting["run"], **setting["algo_hparams"]}


def _varying(settings: list[dict[str, Any]]) -> list[str]:
    names = sorted(set().union(*settings))
    return [n for n in names if len({json.dumps(s.get(n), default=str) for s in settings}) > 1]


def _setting(settings: dict[str, Any], name: str) -> Any:
    """A run's value of ``name``; one its identity omits at the default is that default."""
    return settings.get(name, OMITTED_AT_DEFAULT.get(name))


def _value_text(value: Any) -> str:
    return "none" if value is None else str(value)


def _conflicts(runs: pd.DataFrame) -> set[str]:
    """Settings in which one algorithm's runs differ within a (dataset, partition) cell."""
    conflicts: set[str] = set()
    for _, cell in runs.groupby(["dataset", "partition"]):
        keys = cell["config_key"].unique()
        if len(keys) > 1:
            conflicts.update(_varying([_flat(k) for k in keys]))
    return conflicts


def row_labels(frame: pd.DataFrame, renames: Mapping[str, str] | None = None) -> dict[str, str]:
    """run → table row: the algorithm's display name, plus ``(name=value, ...)`` for the settings
    in which that algorithm's runs differ within one (dataset, α) cell, so that a cell never
    mixes them, plus ``[status]`` for runs that did not end normally (e.g. ``[diverged]``)."""
    labels: dict[str, str] = {}
    runs = frame.drop_duplicates("run")
    for algo, group in runs.groupby("algo"):
        conflicts = _conflicts(group)
        name = display_name(str(algo), renames)
        statuses = group["status"] if "status" in group else [None] * len(group)
        for run, key, status in zip(group["run"], group["config_key"], statuses):
            setting = _flat(key)
            detail = ", ".join(f"{n}={_value_text(_setting(setting, n))}" for n in sorted(conflicts))
            label = f"{name} ({detail})" if detail else name
            labels[run] = f"{label} [{status}]" if isinstance(status, str) else label
    if renames:  # a full row label can be renamed too
        labels = {run: renames.get(label, label) for run, label in labels.items()}
    return labels


def differing_settings(frame: pd.DataFrame) -> dict[str, list[str]]:
    """Run settings (not hyperparameters) that differ between runs of the table and are not
    already part of a row label: name → the distinct values."""
    runs = frame.drop_duplicates("run")
    labelled = set().union(*(_conflicts(group) for _, group in runs.groupby("algo")))
    settings = [json.loads(k)["run"] for k in runs["config_key"].unique()]
    names = [n for n in _varying(settings) if n not in labelled] if settings else []
    return {n: sorted({_value_text(_setting(s, n)) for s in settings}) for n in names}


def final_values(
    frame: pd.DataFrame, quantities: Iterable[str], renames: Mapping[str, str] | None = None
) -> pd.DataFrame:
    """One row per (run, quantity) in display units: run, row, dataset, partition, seed, quantity, value."""
    finals = frame[frame["round"].isna()]
    wide = finals.set_index(["run", "metric"])["value"].unstack()
    runs = finals.drop_duplicates("run").set_index("run")[["dataset", "partition", "seed", "config_key"]]
    labels = row_labels(frame, renames)
    keyed = runs.assign(row=runs.index.map(labels))
    mixed = keyed.groupby(["row", "dataset", "partition"])["config_key"].nunique()
    if (mixed > 1).any():  # labels that collide in their text; never average such runs
        raise ConfigError(f"runs with different settings share the cell {mixed[mixed > 1].index[0]}")
    seeds = keyed.groupby(["row", "dataset", "partition", "seed"]).size()
    if (seeds > 1).any():  # e.g. --rename gave two algorithms one name
        raise ConfigError(f"two runs of one seed share the cell {seeds[seeds > 1].index[0][:3]}")
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


def pivot(
    frame: pd.DataFrame,
    metric: str = "pers_acc",
    extras: Iterable[str] = (),
    *,
    interval: str = "std",
    test: str = "ttest",
    level: float = 0.05,
    show_n: bool = False,
    renames: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """Rows = algorithms (split by differing settings), columns = (dataset, partition, quantity, stat)
    with stat ∈ {mean, std, n}: mean over seeds, ``std`` the ± part (sample std, or the half-width
    of the t-based 95% CI with ``interval="ci95"``), n = seeds with a value. ``attrs`` keep the
    per-seed values for the paired ``test`` (ttest | wilcoxon | none) at ``level``."""
    if frame.empty:
        raise ConfigError("no finished runs to tabulate")
    unknown = [e for e in extras if e not in EXTRAS]
    if unknown:
        raise ConfigError(f"--extra {unknown[0]!r} is not one of: {', '.join(EXTRAS)}")
    if interval not in stats.INTERVALS or test not in stats.TESTS:
        raise ConfigError(f"interval must be one of {stats.INTERVALS}, test one of {stats.TESTS}")
    if not 0 < level < 1:
        raise ConfigError(f"the significance level must be in (0, 1), got {level}")
    quantities = list(dict.fromkeys([metric, *extras]))
    values = final_values(frame, quantities, renames).dropna(subset=["value"])
    values = values[values["value"].map(math.isfinite)]
    per_seed: dict[tuple[str, str, str, str], dict[int, float]] = {}
    for row in values.itertuples(index=False):
        per_seed.setdefault((row.row, row.dataset, row.partition, row.quantity), {})[int(row.seed)] = row.value
    records = {
        (row, d, a, q, stat): value
        for (row, d, a, q), by_seed in per_seed.items()
        for stat, value in (
            ("mean", stats.mean(list(by_seed.values()))),
            ("std", stats.spread(list(by_seed.values()), interval)),
            ("n", len(by_seed)),
        )
    }
    rows = sorted(set(row_labels(frame, renames).values()))
    panels = sorted(
        set(zip(frame["dataset"], frame["partition"])), key=lambda panel: (panel[0], partition_sort_key(panel[1]))
    )
    columns = pd.MultiIndex.from_tuples(
        [(d, a, q, s) for d, a in panels for q in quantities for s in ("mean", "std", "n")],
        names=["dataset", "partition", "quantity", "stat"],
    )
    table = pd.DataFrame(
        [[records.get((row, *column)) for column in columns] for row in rows],
        index=pd.Index(rows, name="algorithm"),
        columns=columns,
        dtype="float64",
    )
    table.attrs.update(
        metric=metric,
        quantities=quantities,
        differing=differing_settings(frame),
        interval=interval,
        test=test,
        level=level,
        show_n=show_n,
        setup=setup_text(frame),
        per_seed={"|".join(map(str, k)): v for k, v in per_seed.items()},
    )
    return table


@dataclass(frozen=True)
class Cell:
    """One table cell in display units: mean, ± part (std or CI half-width), seeds, rank in its
    column (1 best, ties share the mean rank), ``best`` (bold), ``tied`` (not significantly worse
    than the best: True/False, None when not tested), the paired test's p and pairs."""

    mean: float | None
    std: float | None
    n: int
    rank: float | None
    fewer_seeds: bool
    best: bool = False
    tied: bool | None = None
    p: float | None = None
    pairs: int = 0


def _finite(value: Any) -> float | None:
    return None if value is None or pd.isna(value) or not math.isfinite(value) else float(value)


def _seeds(table: pd.DataFrame, row: str, column: tuple[str, float, str]) -> dict[int, float]:
    return table.attrs.get("per_seed", {}).get("|".join(map(str, (row, *column))), {})


def cells(table: pd.DataFrame, decimals: int = 2) -> dict[tuple[str, tuple[str, float, str]], Cell]:
    """(row, (dataset, partition, quantity)) → Cell. Ranks use the mean as shown (``decimals``); bold
    only in columns with at least two values. Each other value is tested against the column's best
    (highest unrounded mean among the bold ones), paired by seed; it is ``tied`` when it is not
    worse on the paired seeds or p ≥ level. Cells with fewer seeds than the most are flagged."""
    columns = list(dict.fromkeys(c[:3] for c in table.columns))
    most = max_seeds(table)
    test, level = table.attrs.get("test", "ttest"), table.attrs.get("level", 0.05)
    result = {}
    for column in columns:
        better = quantity(column[2]).higher_is_better
        means = {row: _finite(table.loc[row, (*column, "mean")]) for row in table.index}
        shown = {row: round(m, decimals) for row, m in means.items() if m is not None}
        ranked = list(shown)
        ranks = dict(zip(ranked, stats.average_ranks([shown[r] for r in ranked], better)))
        leaders = [r for r in ranked if ranks[r] == min(ranks.values())] if len(shown) >= 2 else []
        reference = max(leaders, key=lambda r: means[r] if better else -means[r]) if leaders else None
        for row in table.index:
            n = _finite(table.loc[row, (*column, "n")])
            n = int(n) if n is not None else 0
            tied, p, pairs = None, None, 0
            if reference is not None and row in shown and row not in leaders:
                best_seeds, seeds = _seeds(table, reference, column), _seeds(table, row, column)
                p, pairs = stats.paired_p_value(best_seeds, seeds, test)
                if p is not None:
                    common = sorted(set(best_seeds) & set(seeds))
                    gap = sum(best_seeds[s] - seeds[s] for s in common) * (1 if better else -1)
                    tied = gap <= 0 or p >= level
            result[row, column] = Cell(
                means[row],
                _finite(table.loc[row, (*column, "std")]),
                n,
                ranks.get(row),
                0 < n < most,
                row in leaders,
                tied,
                p,
                pairs,
            )
    return result


def row_ranks(table: pd.DataFrame, decimals: int = 2) -> dict[str, tuple[float | None, float | None]]:
    """row → (average rank over the main metric's columns, overall rank by that average)."""
    metric = table.attrs.get("metric")
    table_cells = cells(table, decimals)
    averages: dict[str, float | None] = {}
    for row in table.index:
        ranks = [
            c.rank for (r, column), c in table_cells.items() if r == row and column[2] == metric and c.rank is not None
        ]
        averages[row] = sum(ranks) / len(ranks) if ranks else None
    ranked = [r for r in table.index if averages[r] is not None]
    overall = dict(zip(ranked, stats.average_ranks([round(averages[r], decimals) for r in ranked], False)))
    return {row: (averages[row], overall.get(row)) for row in table.index}


def max_seeds(table: pd.DataFrame) -> int:
    """The most seeds any cell of the table has."""
    counts = table.xs("n", axis=1, level="stat").fillna(0)
    return int(counts.to_numpy().max()) if counts.size else 0


def curve_bands(
    frame: pd.DataFrame, metric: str = "pers_acc", x: str = "round", renames: Mapping[str, str] | None = None
) -> pd.DataFrame:
    """Per (row, dataset, partition, round): mean x, and mean/std/n over seeds of ``metric`` (display
    units). ``x`` is ``round`` or ``comm`` (cumulative MB sent up + down by that round)."""
    rounds = frame[frame["round"].notna()]
    wide = rounds.set_index(["run", "round", "metric"])["value"].unstack()
    if metric not in wide.columns:
        raise ConfigError(f"metric {metric!r} is not in the runs' rounds.jsonl")
    data = pd.DataFrame({"y": wide[metric] * quantity(metric).scale}, index=wide.index)
    if x == "comm":
        if not {"bytes_up_cum", "bytes_down_cum"} <= set(wide.columns):
            raise ConfigError("the runs' rounds.jsonl have no bytes_up_cum/bytes_down_cum")
        data["x"] = (wide["bytes_up_cum"] + wide["bytes_down_cum"]) / 2**20
    else:
        data["x"] = wide.index.get_level_values("round").astype(float)
    runs = rounds.drop_duplicates("run").set_index("run")[["dataset", "partition"]]
    labels = row_labels(frame, renames)
    data = data.dropna().reset_index().join(runs, on="run")
    data["row"] = data["run"].map(labels)
    return (
        data.groupby(["row", "dataset", "partition", "round"])
        .agg(x=("x", "mean"), mean=("y", "mean"), std=("y", "std"), n=("y", "count"))
        .reset_index()
    )


PLOT_SUFFIXES = (".png", ".pdf", ".svg")


def write_plots(
    frame: pd.DataFrame, metric: str, folder: str | Path, renames: Mapping[str, str] | None = None
) -> list[Path]:
    """``accuracy_vs_round`` and ``accuracy_vs_comm`` (PNG, PDF and SVG) of ``metric`` per round,
    or of its per-round counterpart (``x_last10`` → ``x``; else ``pers_acc``)."""

    per_round = set(frame.loc[frame["round"].notna(), "metric"])
    curve_metric = next((m for m in (metric, metric.removesuffix("_last10")) if m in per_round), "pers_acc")
    label = quantity(curve_metric).label
    written = []
    for x, x_label in (("round", "Round"), ("comm", "Communication, up + down (MB)")):
        stem = Path(folder) / f"accuracy_vs_{x}"
        written += plot_curves(
            curve_bands(frame, curve_metric, x, renames),
            [stem.with_suffix(s) for s in PLOT_SUFFIXES],
            x_label,
            label,
            title=f"{label}: mean ± std over seeds",
            integer_x=x == "round",
        )
    return written
