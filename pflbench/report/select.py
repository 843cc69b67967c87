"""``--select-by METRIC``: one setting per algorithm and column group, chosen on validation.

A *setting* is what the leaderboard keys runs on besides the grid axes (``config_key``: the run's
identity without algorithm, dataset, partition and seed; hyperparameters included). Where one
algorithm's runs in a column group (dataset, partition) have several settings — a sweep over
``--set lr=0.01,0.1`` — the setting with the best mean of METRIC (a validation metric, ``val_*``)
over the seeds every candidate setting has (all of its seeds when they share none) is kept and the others are dropped, so the table shows that setting's test metrics on
one row per algorithm. A tie goes to the setting run on more seeds, then to the first in the
settings' sorted order. A setting
with a run whose status is not normal (diverged) is never chosen. Every run must have METRIC:
one without it (e.g. run with ``--val-frac 0``) is an error naming it. Selecting on anything
but a validation metric needs ``allow_test=True`` and is marked in the table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from pflbench.errors import ConfigError
from pflbench.report.names import flat_setting, metric_role, quantity, setting_text, varying_settings

SHOWN_MISSING = 3  # run folders named in the error for runs without the selection metric


@dataclass(frozen=True)
class Choice:
    """The setting kept for one (algorithm, dataset, partition): its differing values as text
    (``lr=0.1``; empty when there was one candidate), its mean of the metric, the candidates."""

    algo: str
    dataset: str
    partition: str
    setting: str
    value: float
    candidates: int
    seeds: tuple[int, ...] = ()  # the seeds the means are over (shared by every candidate); () = each its own


def shared_seeds(group: pd.DataFrame, candidates: list[str]) -> list[int]:
    """The seeds every candidate setting has run: the settings are compared on these only, so a
    setting run on more seeds (``pflbench tune``'s choice, run on every seed after trials on the
    first) competes on the same data as the trials, not on a different mean."""
    seeds = [set(group.loc[group["config_key"] == k, "seed"]) for k in candidates]
    return sorted(set.intersection(*seeds)) if seeds else []


@dataclass(frozen=True)
class Selection:
    metric: str
    on_test: bool  # selected on a metric other than a validation one (asked for explicitly)
    choices: list[Choice] = field(default_factory=list)
    # settings never chosen because a run of theirs was not normal: (algo, dataset, partition, setting)
    unselectable: list[tuple[str, str, str, str]] = field(default_factory=list)


def check_metric(metric: str, allow_test: bool) -> None:
    """ConfigError unless ``metric`` is a validation metric or ``allow_test`` says otherwise."""
    if metric_role(metric) != "validation" and not allow_test:
        kind = "a test metric" if metric_role(metric) == "test" else "not a validation metric"
        raise ConfigError(
            f"--select-by {metric} is {kind}; select on a validation metric (val_pers_acc, "
            "val_global_acc, ...) or add --allow-test-selection (the table is then marked 'selected on test')"
        )
    if quantity(metric).higher_is_better is None:
        raise ConfigError(f"--select-by {metric}: it is not known whether higher or lower is better")


def _values_text(keys: list[str], chosen: str) -> str:
    """The settings in which ``keys`` differ, with ``chosen``'s values, as a row label names
    them: ``lr=0.1, mu=0.01``."""
    picked = flat_setting(chosen)
    return ", ".join(f"{n}={setting_text(picked, n)}" for n in varying_settings([flat_setting(k) for k in keys]))


def select_settings(frame: pd.DataFrame, metric: str, allow_test: bool = False) -> tuple[pd.DataFrame, Selection]:
    """``frame`` with only the chosen setting's runs per (algorithm, dataset, partition), and
    what was chosen. ``frame`` may hold runs whose status is not normal: they are never chosen
    and are dropped."""
    check_metric(metric, allow_test)
    finals = frame[frame["round"].isna()]
    runs = frame.drop_duplicates("run").set_index("run")[
        ["algo", "dataset", "partition", "seed", "config_key", "status"]
    ]
    values = finals[finals["metric"] == metric].set_index("run")["value"]
    runs = runs.assign(value=values.reindex(runs.index))
    normal = runs["status"].isna()
    missing = [run for run, value in runs.loc[normal, "value"].items() if pd.isna(value) or not math.isfinite(value)]
    if missing:
        named = ", ".join(missing[:SHOWN_MISSING]) + (
            f" and {len(missing) - SHOWN_MISSING} more" if len(missing) > SHOWN_MISSING else ""
        )
        hint = " (runs without a validation split: --val-frac 0)" if metric_role(metric) == "validation" else ""
        runs_have = "1 run has" if len(missing) == 1 else f"{len(missing)} runs have"
        raise ConfigError(f"--select-by {metric}: {runs_have} no value of it{hint}: {named}")
    better = quantity(metric).higher_is_better
    keep: set[tuple[str, str, str, str]] = set()
    choices, unselectable = [], []
    for (algo, dataset, partition), group in runs.groupby(["algo", "dataset", "partition"], sort=True):
        keys = sorted(group["config_key"].unique())
        bad = {k for k in keys if not normal[group.index[group["config_key"] == k]].all()}
        candidates = [k for k in keys if k not in bad]
        for key in sorted(bad):
            text = _values_text(keys, key) if len(keys) > 1 else "its only setting"
            unselectable.append((algo, dataset, partition, text))
        if not candidates:
            continue
        shared = shared_seeds(group, candidates)
        on = group[group["seed"].isin(shared)] if shared else group
        means = {k: float(on.loc[on["config_key"] == k, "value"].mean()) for k in candidates}
        seeds = {k: group.loc[group["config_key"] == k, "seed"].nunique() for k in candidates}
        # a tie goes to the setting run on more seeds (``pflbench tune``'s choice), then the first
        best = max(candidates, key=lambda k: (means[k] if better else -means[k], seeds[k], -candidates.index(k)))
        keep.add((algo, dataset, partition, best))
        text = _values_text(keys, best) if len(keys) > 1 else ""
        choices.append(Choice(algo, dataset, partition, text, means[best], len(keys), tuple(shared)))
    chosen = [
        run
        for run, row in runs.iterrows()
        if (row["algo"], row["dataset"], row["partition"], row["config_key"]) in keep and pd.isna(row["status"])
    ]
    selection = Selection(metric, metric_role(metric) != "validation", choices, unselectable)
    return frame[frame["run"].isin(chosen)], selection
