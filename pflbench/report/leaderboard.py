"""Leaderboards from results folders: run folders → one tidy frame → pivot table.

``load_runs`` (``pflbench.store.reader``) reads each run once into a tidy frame (run, algo,
dataset, partition, seed, round, metric, value, config_key, status); ``round`` is empty for the
final values of ``summary.json``. ``config_key`` is the run's settings without the grid axes
(algo, dataset, partition, seed): runs that differ in anything else are never averaged together —
they become separate rows labelled by the differing setting, unless ``select_by`` keeps one
setting per algorithm and column group (``pflbench.report.select``). Columns are grouped by
(dataset, partition), one sub-column per metric, plus rounds and MB to a target
(``pflbench.report.targets``). Cells carry mean ± std (or a 95% CI) over seeds, ranks, and a
paired test against the column's best (``pflbench.report.marks``). Renderers live in
``pflbench.report.render``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from pflbench.errors import ConfigError
from pflbench.plugin_sources import declared_method_family
from pflbench.report import stats
from pflbench.report.families import family_of, family_rank
from pflbench.report.marks import Cell, cells, max_seeds, row_ranks
from pflbench.report.names import display_name, flat_setting, quantity, setting_text, setup_text, varying_settings
from pflbench.report.plots import plot_curves
from pflbench.report.select import Selection, select_settings
from pflbench.report.targets import QUANTITIES, SIM_TIME, parse_target, per_round_metrics, shown, target_values
from pflbench.store.reader import partition_sort_key

# Names that sum or rename summary.json keys (``--extra comm,time,worst10`` of old, still valid).
ALIASES = {"comm": ("bytes_up_total", "bytes_down_total"), "time": ("wall_time_s",), "worst10": ("pers_acc_worst10",)}
EXTRAS = ALIASES
ORDERS = ("name", "rank")
__all__ = ["ALIASES", "Cell", "cells", "max_seeds", "pivot", "row_ranks"]


def _conflicts(runs: pd.DataFrame) -> set[str]:
    """Settings in which one algorithm's runs differ within a (dataset, partition) cell."""
    conflicts: set[str] = set()
    for _, cell in runs.groupby(["dataset", "partition"]):
        keys = cell["config_key"].unique()
        if len(keys) > 1:
            conflicts.update(varying_settings([flat_setting(k) for k in keys]))
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
            setting = flat_setting(key)
            detail = ", ".join(f"{n}={setting_text(setting, n)}" for n in sorted(conflicts))
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
    names = [n for n in varying_settings(settings) if n not in labelled] if settings else []
    return {n: sorted({setting_text(s, n) for s in settings}) for n in names}


def row_learning_rates(frame: pd.DataFrame, labels: Mapping[str, str]) -> dict[str, str]:
    """Table row → the learning rate(s) its runs used (``a/b`` for several), when the rows of the
    table did not all run at one learning rate (else empty): a leaderboard of algorithms run at
    their own default lrs (SCAFFOLD, FedDyn) is no comparison at one lr, and its notes say so."""
    runs = frame.drop_duplicates("run")
    rates: dict[str, set[str]] = {}
    for run, key in zip(runs["run"], runs["config_key"]):
        rates.setdefault(labels[run], set()).add(setting_text(flat_setting(key), "lr"))
    if len(set().union(*rates.values())) <= 1:
        return {}
    return {row: "/".join(sorted(values, key=lambda text: (len(text), text))) for row, values in rates.items()}


def row_hyperparameters(frame: pd.DataFrame, labels: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """Table row → the algorithm hyperparameters with one value over all of its runs, as text
    (``{"FedProx": {"mu": "0.1"}}``), those its label does not name already. Row labels and the
    ``--select-by`` note name only settings that differ; without this a table would never say at
    which μ FedProx ran."""
    runs = frame.drop_duplicates("run")
    in_labels = {algo: _conflicts(group) for algo, group in runs.groupby("algo")}
    hparams_of: dict[str, list[dict[str, Any]]] = {}
    for run, algo, key in zip(runs["run"], runs["algo"], runs["config_key"]):
        hparams_of.setdefault(labels[run], []).append({"algo": algo, **(json.loads(key).get("algo_hparams") or {})})
    result: dict[str, dict[str, str]] = {}
    for row, settings in sorted(hparams_of.items()):
        names = sorted(set().union(*settings) - {"algo"} - set().union(*(in_labels[s["algo"]] for s in settings)))
        texts = {name: {setting_text(s, name) for s in settings} for name in names}
        single = {name: next(iter(values)) for name, values in texts.items() if len(values) == 1}
        if single:
            result[row] = single
    return result


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
        metrics = ALIASES.get(name, (name,))
        absent = [m for m in metrics if m not in wide.columns]
        if absent:
            raise ConfigError(
                f"metric {absent[0]!r} is not in the runs' summary.json{_hint(absent[0])}; "
                f"available: {', '.join(available_metrics(wide.columns))}"
            )
        values = wide[list(metrics)].sum(axis=1, min_count=len(metrics)) * quantity(name).scale
        part = runs.assign(quantity=name, value=values.reindex(runs.index))
        parts.append(part.assign(row=[labels[r] for r in part.index]).reset_index())
    return pd.concat(parts, ignore_index=True)


def available_metrics(keys: Iterable[str]) -> list[str]:
    """The names a table takes: the runs' numeric summary.json keys and the aliases they allow."""
    keys = set(keys)
    return sorted(keys) + [alias for alias, parts in ALIASES.items() if set(parts) <= keys]


def _hint(metric: str) -> str:
    if metric.startswith("val_"):
        return " (validation metrics need runs with a validation split, --val-frac > 0)"
    if metric.startswith("new_acc"):
        return " (new-client metrics need runs with --new-clients > 0)"
    if metric.startswith("ood_acc"):
        return " (out-of-domain accuracy needs runs with --holdout-domain NAME)"
    return ""


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
    target: str | None = None,
    select_by: str | None = None,
    allow_test_selection: bool = False,
    precision: int = 2,
    order: str = "name",
    caption: str | None = None,
    families: bool = False,
) -> pd.DataFrame:
    """Rows = algorithms (split by differing settings, or one setting chosen per algorithm and
    column group with ``select_by``), columns = (dataset, partition, quantity, stat): quantities
    ``metric``, ``extras`` (any summary.json key or alias) and, with ``target``
    (``[METRIC=]VALUE`` or ``P%``), rounds and MB to it; stat ∈ {mean, std, n}: mean over seeds,
    ``std`` the ± part (sample std, or the half-width of the t-based 95% CI with
    ``interval="ci95"``), n = seeds. ``attrs`` keep the per-seed values for the paired ``test``
    (ttest | wilcoxon | none) at ``level``, and how to show the table: ``precision`` decimals,
    row ``order`` (``name``, ``rank``, a metric of the table: by average rank over its columns,
    or ``algo,algo,...``), ``caption``; ``families``: a Family column (the survey's method
    families, ``report.families``) and rows grouped by family in the survey's order."""
    if frame.empty:
        raise ConfigError("no finished runs to tabulate")
    if interval not in stats.INTERVALS or test not in stats.TESTS:
        raise ConfigError(f"interval must be one of {stats.INTERVALS}, test one of {stats.TESTS}")
    if not 0 < level < 1:
        raise ConfigError(f"the significance level must be in (0, 1), got {level}")
    if not 0 <= precision <= 10:
        raise ConfigError(f"the precision must be 0 to 10 decimals, got {precision}")
    selection = None
    if select_by is not None:
        frame, selection = select_settings(frame, select_by, allow_test_selection)
        if frame.empty:
            raise ConfigError(f"--select-by {select_by}: no setting is left to show (every one had a diverged run)")
    metrics = list(dict.fromkeys([metric, *extras]))
    values = final_values(frame, metrics, renames).dropna(subset=["value"])
    values = values[values["value"].map(math.isfinite)]
    labels = row_labels(frame, renames)
    target_attrs: dict[str, Any] = {}
    quantities = list(metrics)
    if target is not None:
        goal = parse_target(target, metric, per_round_metrics(frame))
        runs = frame.drop_duplicates("run").set_index("run")[["dataset", "partition", "seed"]]
        reach, limits = target_values(frame, goal, runs.assign(row=runs.index.map(labels)))
        values = pd.concat([values, reach], ignore_index=True)
        simulated = bool((reach["quantity"] == SIM_TIME).any())  # a run simulated time (engine.availability)
        quantities += [q for q in QUANTITIES if q != SIM_TIME or simulated]
        target_attrs = {
            "text": goal.describe(),
            "thresholds": {f"{d} {a}": shown(goal.metric, v) for (d, a), v in sorted(limits.items())},
            "relative": goal.relative,
        }
    records, per_seed, unreached = _cells_over_seeds(values, interval)
    rows = sorted(set(labels.values()))
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
    algos = frame.drop_duplicates("run").set_index("run")["algo"]
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
        unreached=unreached,
        target=target_attrs,
        precision=precision,
        order=order,
        caption=caption,
        selection=_selection_attrs(selection, frame, labels, renames),
        row_algos={label: str(algos[run]) for run, label in labels.items()},
        learning_rates=row_learning_rates(frame, labels),
        hyperparameters=row_hyperparameters(frame, labels),
        families=row_families(table.index, {label: str(algos[run]) for run, label in labels.items()})
        if families
        else {},
        curves=row_curves(frame, metric, labels),
    )
    return order_rows(table, order, renames)


def row_curves(frame: pd.DataFrame, metric: str, labels: Mapping[str, str]) -> dict[str, dict[str, list[list[float]]]]:
    """Table row → "dataset partition" → [[round, mean over the row's runs], ...] of ``metric``
    per evaluated round (without ``_last10``; {} for a metric that is not recorded per round), in
    stored units: the HTML leaderboard draws a row's curve when it is clicked."""
    name = metric.removesuffix("_last10")
    rounds = frame[frame["round"].notna() & (frame["metric"] == name)]
    rounds = rounds.assign(row=rounds["run"].map(labels)).dropna(subset=["row", "value"])
    curves: dict[str, dict[str, list[list[float]]]] = {}
    means = rounds.groupby(["row", "dataset", "partition", "round"])["value"].mean()
    for (row, dataset, partition, round_index), value in means.items():
        if math.isfinite(value):
            curves.setdefault(row, {}).setdefault(f"{dataset} {partition}", []).append([float(round_index), value])
    return curves


def row_families(rows: Iterable[str], row_algos: Mapping[str, str]) -> dict[str, str]:
    """Table row → its algorithm's method family key (``other`` when it names none)."""
    return {row: family_of(declared_method_family(row_algos.get(row, row))) for row in rows}


def _cells_over_seeds(values: pd.DataFrame, interval: str) -> tuple[dict, dict, dict]:
    """From one row per (run, quantity): (row, dataset, partition, quantity, stat) → mean, ± part
    and n over seeds; the per-seed values; and ``row|dataset|partition|quantity`` → (k, n) where
    only k of n seeds have a value (NaN in ``values``: a target never reached), whose cell
    then has no mean."""
    per_seed: dict[tuple[str, str, str, str], dict[int, float]] = {}
    seeds_of: dict[tuple[str, str, str, str], set[int]] = {}
    for row in values.itertuples(index=False):
        key = (row.row, row.dataset, row.partition, row.quantity)
        seeds_of.setdefault(key, set()).add(int(row.seed))
        if math.isfinite(row.value):
            per_seed.setdefault(key, {})[int(row.seed)] = row.value
    records: dict[tuple[str, str, str, str, str], float | None] = {}
    unreached: dict[str, tuple[int, int]] = {}
    for key, seeds in seeds_of.items():
        by_seed = per_seed.get(key, {})
        complete = len(by_seed) == len(seeds)
        if not complete:
            unreached["|".join(key)] = (len(by_seed), len(seeds))
        listed = list(by_seed.values())
        records[(*key, "mean")] = stats.mean(listed) if complete else None
        records[(*key, "std")] = stats.spread(listed, interval) if complete else None
        records[(*key, "n")] = len(seeds)
    return records, per_seed, unreached


def _selection_attrs(
    selection: Selection | None,
    frame: pd.DataFrame,
    labels: Mapping[str, str],
    renames: Mapping[str, str] | None,
) -> dict[str, Any]:
    """What ``select_by`` chose, by table row: [row, dataset, partition, setting text, mean]."""
    if selection is None:
        return {}
    runs = frame.drop_duplicates("run")
    row_of = {(a, d, p): labels[r] for r, a, d, p in zip(runs["run"], runs["algo"], runs["dataset"], runs["partition"])}
    return {
        "metric": selection.metric,
        "on_test": selection.on_test,
        "chosen": [
            [row_of[c.algo, c.dataset, c.partition], c.dataset, c.partition, c.setting, c.value, list(c.seeds)]
            for c in selection.choices
            if c.candidates > 1
        ],
        "unselectable": [f"{display_name(a, renames)} {d} {p}: {text}" for a, d, p, text in selection.unselectable],
    }


def order_rows(table: pd.DataFrame, order: str, renames: Mapping[str, str] | None = None) -> pd.DataFrame:
    """Rows by ``name`` (as sorted), by overall ``rank`` of the main metric, by the average rank
    over one metric's columns, or in the order of a comma-separated list of algorithms (registered
    or display names, or whole row labels); rows the list does not name follow, by name."""
    rows = list(table.index)
    order = order.strip()
    if order == "name":
        ordered = rows
    elif order == "rank" or order in table.attrs["quantities"]:
        averages = row_ranks(table, metric=None if order == "rank" else order)
        ordered = sorted(rows, key=lambda r: (averages[r][0] is None, averages[r][0] or 0.0))
    else:
        algos = table.attrs.get("row_algos", {})
        ordered = []
        for name in (part.strip() for part in order.split(",") if part.strip()):
            named = [
                r
                for r in rows
                if name in (r, algos.get(r), display_name(algos.get(r, r), renames)) and r not in ordered
            ]
            if not named:
                raise ConfigError(
                    f"--order {name!r} names no row; give name, rank, a metric of the table "
                    f"({', '.join(table.attrs['quantities'])}) or algorithms of: {', '.join(rows)}"
                )
            ordered += named
        ordered += [r for r in rows if r not in ordered]
    families = table.attrs.get("families") or {}
    if families:  # grouped by family (survey order), the given order within each family
        ordered = sorted(ordered, key=lambda r: family_rank(families.get(r, "")))
    attrs = dict(table.attrs)
    table = table.loc[ordered]
    table.attrs = attrs
    return table


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
