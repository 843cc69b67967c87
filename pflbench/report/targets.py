"""Rounds-, MB- and simulated-time-to-target: how fast each run first reaches a metric's target value.

``--target [METRIC=]VALUE``: ``0.8`` is absolute, in the units runs store (accuracies as fractions,
so 0.8 = 80%); ``90%`` is relative: 90% of the best final value of the metric in each column group
(dataset, partition), the best being the best row's mean over seeds. METRIC is a per-round metric
of ``rounds.jsonl`` (default: the table's main metric, without ``_last10``). A run reaches the
target at the first evaluation round whose value is ≥ the target (≤ for lower-is-better metrics);
its MB to target are the bytes sent up + down by the end of that round (``bytes_up_cum`` +
``bytes_down_cum``), in MB (2^20 bytes); a run with the system model (``engine.availability``:
dropout, stragglers, a deadline) also has its simulated time to target, the simulated seconds by
the end of that round (``sim_time_cum``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from pflbench.errors import ConfigError
from pflbench.report.names import LAST, quantity

ROUNDS, MB, SIM_TIME = "rounds_to_target", "mb_to_target", "sim_time_to_target"
QUANTITIES = (ROUNDS, MB, SIM_TIME)  # SIM_TIME only for runs that simulate time


@dataclass(frozen=True)
class Target:
    """``value``: the threshold in stored units (``relative`` False) or the share of the best
    final mean (``relative`` True, 0.9 for ``90%``)."""

    metric: str
    value: float
    relative: bool
    higher_is_better: bool

    def describe(self) -> str:
        """``Personalized accuracy ≥ 80%`` or ``Personalized accuracy ≥ 90% of the column group's best final mean``."""
        unit = quantity(self.metric)
        sign = "≥" if self.higher_is_better else "≤"
        name = unit.label.removesuffix(" (%)")
        if self.relative:
            return f"{name} {sign} {self.value * 100:g}% of the column group's best final mean"
        return f"{name} {sign} {shown(self.metric, self.value)}"


def shown(metric: str, value: float) -> str:
    """A threshold in display units: ``80%`` for an accuracy, else the number and its unit."""
    unit = quantity(metric)
    if unit.scale == 100.0:
        return f"{value * 100:.4g}%"
    return f"{value * unit.scale:.4g}"


def parse_target(text: str, main_metric: str, per_round: Sequence[str]) -> Target:
    """``--target [METRIC=]VALUE`` with VALUE a number (absolute) or ``P%`` (relative)."""
    metric, sep, value_text = text.rpartition("=")
    metric = metric.strip() if sep else main_metric.removesuffix(LAST)
    value_text = value_text.strip()
    if metric not in per_round:
        valid = ", ".join(sorted(per_round))
        raise ConfigError(
            f"--target {text!r}: {metric!r} is not a per-round metric of the runs' rounds.jsonl "
            f"(give one as METRIC=VALUE); valid: {valid}"
        )
    higher = quantity(metric).higher_is_better
    if higher is None:
        raise ConfigError(f"--target {text!r}: it is not known whether higher or lower {metric} is better")
    relative = value_text.endswith("%")
    try:
        value = float(value_text.removesuffix("%"))
    except ValueError:
        raise ConfigError(f"--target {text!r} is not [METRIC=]VALUE or [METRIC=]P% (e.g. 0.8 or 90%)") from None
    if not math.isfinite(value) or (relative and value <= 0):
        raise ConfigError(f"--target {text!r}: the value must be a finite number (a share: > 0%)")
    if relative:
        return Target(metric, value / 100, True, higher)
    if quantity(metric).scale == 100.0 and not 0 <= value <= 1:
        raise ConfigError(
            f"--target {text!r}: accuracies are fractions (0.8 = 80%); for a share of the best write e.g. 90%"
        )
    return Target(metric, value, False, higher)


def first_reach(
    rounds: Sequence[int], values: Sequence[float | None], threshold: float, higher_is_better: bool
) -> int | None:
    """The first round (in ``rounds`` order) whose value reaches ``threshold`` (≥, or ≤ when lower
    is better, within float rounding: 1e-12 relative); None when none does. Rounds without a
    value (not evaluated) never count."""
    slack = 1e-12 * max(1.0, abs(threshold))  # 0.9 × a mean of accuracies must not miss by one ulp
    for number, value in zip(rounds, values, strict=True):
        if value is None or not math.isfinite(value):
            continue
        if (value >= threshold - slack) if higher_is_better else (value <= threshold + slack):
            return number
    return None


def per_round_metrics(frame: pd.DataFrame) -> list[str]:
    """Metrics that ``rounds.jsonl`` records (at least once) in ``frame``."""
    return sorted(set(frame.loc[frame["round"].notna(), "metric"]))


def run_curves(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per run and round: the metric (NaN where not evaluated), cumulative MB up + down and
    cumulative simulated seconds (NaN without the system model)."""
    rounds = frame[frame["round"].notna()]
    wide = rounds.set_index(["run", "round", "metric"])["value"].unstack()
    data = pd.DataFrame({"value": wide[metric] if metric in wide else math.nan}, index=wide.index)
    if {"bytes_up_cum", "bytes_down_cum"} <= set(wide.columns):
        data["mb"] = (wide["bytes_up_cum"] + wide["bytes_down_cum"]) / 2**20
    else:
        data["mb"] = math.nan
    data["sim_time"] = wide["sim_time_cum"] if "sim_time_cum" in wide else math.nan
    return data.sort_index()


def thresholds(target: Target, finals: Mapping[tuple[str, str, str], float]) -> dict[tuple[str, str], float]:
    """(dataset, partition) → threshold in stored units. ``finals``: (row, dataset, partition) →
    mean over seeds of the metric's final value; a relative target takes the best row's."""
    groups: dict[tuple[str, str], list[float]] = {}
    for (_, dataset, partition), value in finals.items():
        if math.isfinite(value):
            groups.setdefault((dataset, partition), []).append(value)
    if not target.relative:
        return {group: target.value for group in groups}
    pick = max if target.higher_is_better else min
    return {group: target.value * pick(values) for group, values in groups.items()}


def target_values(
    frame: pd.DataFrame, target: Target, runs: pd.DataFrame
) -> tuple[pd.DataFrame, dict[tuple[str, str], float]]:
    """One row per (run, quantity) for the target quantities (simulated time only for runs
    that simulate it): run, row, dataset, partition,
    seed, quantity, value (NaN: never reached), plus the thresholds per column group.
    ``runs``: run → row, dataset, partition, seed (indexed by run)."""
    curves = run_curves(frame, target.metric)
    finals: dict[str, float] = {}
    reached: dict[str, tuple[float, float, float]] = {}
    simulated = set()
    evaluated = set()
    for run, curve in curves.groupby(level="run"):
        present = curve["value"].dropna()
        if present.empty:
            continue
        evaluated.add(run)
        finals[run] = float(present.iloc[-1])
    keyed = runs.loc[runs.index.isin(evaluated)]
    means = keyed.assign(final=keyed.index.map(finals)).groupby(["row", "dataset", "partition"])["final"].mean()
    limits = thresholds(target, {key: float(value) for key, value in means.items()})
    for run, curve in curves.groupby(level="run"):
        if run not in evaluated:
            continue
        limit = limits[runs.loc[run, "dataset"], runs.loc[run, "partition"]]
        numbers = [int(r) for r in curve.index.get_level_values("round")]
        values = [None if pd.isna(v) else float(v) for v in curve["value"]]
        first = first_reach(numbers, values, limit, target.higher_is_better)
        mb = curve["mb"].iloc[numbers.index(first)] if first is not None else math.nan
        seconds = curve["sim_time"].iloc[numbers.index(first)] if first is not None else math.nan
        if curve["sim_time"].notna().any():
            simulated.add(run)
        reached[run] = (math.nan if first is None else float(first), float(mb), float(seconds))
    rows = [
        {**runs.loc[run].to_dict(), "run": run, "quantity": name, "value": value}
        for run, (first, mb, seconds) in reached.items()
        for name, value in ((ROUNDS, first), (MB, mb), (SIM_TIME, seconds))
        if not (name == MB and math.isfinite(first) and not math.isfinite(mb))  # no byte counts: no value
        and (name != SIM_TIME or run in simulated)  # no simulated time: no value
    ]
    return pd.DataFrame(rows, columns=["run", *runs.columns, "quantity", "value"]), limits
