"""What each leaderboard cell is marked with: rank, best (bold), tied for best, not significantly
worse than the best (underlined), fewer seeds, a target not reached by every seed.

Rules (``cells``): ranks use the mean as shown (``precision`` decimals), so values that print
alike share a rank. Per column, the single best entry is bold; entries tied for best at the shown
precision are all marked ``tied_best`` and none is bold (no win for one). Each other entry is
tested against the column's best (the tied best with the highest unrounded mean), paired by seed,
and only on ``MIN_PAIRS`` or more shared seeds — with 2 seeds a paired t-test has one degree of
freedom and calls even a 20-point gap "not significant" — else it carries no mark. Columns whose
direction is unknown get no ranks and no marks. In a rounds/MB-to-target column, an entry with
seeds that never reached the target has no mean and ranks after every entry that has one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from pflbench.report import stats
from pflbench.report.names import quantity

MIN_PAIRS = 3  # shared seeds a paired test needs before an entry is marked


@dataclass(frozen=True)
class Cell:
    """One table cell in display units: mean, ± part (std or CI half-width), seeds, rank in its
    column (1 best, ties share the mean rank), ``best`` (bold: the one best), ``tied_best`` (tied
    for best at the shown precision), ``tied`` (not significantly worse than the best:
    True/False, None when not tested), the paired test's p and pairs, and ``reached`` (k, n) for
    a target column where only k of n seeds reached the target (no mean then)."""

    mean: float | None
    std: float | None
    n: int
    rank: float | None
    fewer_seeds: bool
    best: bool = False
    tied: bool | None = None
    p: float | None = None
    pairs: int = 0
    tied_best: bool = False
    reached: tuple[int, int] | None = None


def _finite(value: Any) -> float | None:
    return None if value is None or pd.isna(value) or not math.isfinite(value) else float(value)


def _key(row: str, column: tuple[str, str, str]) -> str:
    return "|".join(map(str, (row, *column)))


def _seeds(table: pd.DataFrame, row: str, column: tuple[str, str, str]) -> dict[int, float]:
    return table.attrs.get("per_seed", {}).get(_key(row, column), {})


def precision_of(table: pd.DataFrame, decimals: int | None = None) -> int:
    return int(table.attrs.get("precision", 2)) if decimals is None else decimals


def max_seeds(table: pd.DataFrame) -> int:
    """The most seeds any cell of the table has."""
    counts = table.xs("n", axis=1, level="stat").fillna(0)
    return int(counts.to_numpy().max()) if counts.size else 0


class _Values:
    """The table's cells by (row, column) from one NumPy copy: ``table.loc[row, column]`` makes
    pandas deep-copy ``table.attrs`` (per-seed values, curves) for every lookup, which made a
    reference scenario's artifacts take minutes (measured: 223 of 245 s)."""

    def __init__(self, table: pd.DataFrame) -> None:
        self.array = table.to_numpy()
        self.rows = {row: i for i, row in enumerate(table.index)}
        self.columns = {column: j for j, column in enumerate(table.columns)}

    def __call__(self, row: str, column: tuple[str, ...]) -> Any:
        return self.array[self.rows[row], self.columns[column]]


def _column_cells(
    table: pd.DataFrame, column: tuple[str, str, str], decimals: int, most: int, value: _Values
) -> dict[str, Cell]:
    better = quantity(column[2]).higher_is_better
    test, level = table.attrs.get("test", "ttest"), table.attrs.get("level", 0.05)
    unreached = table.attrs.get("unreached", {})
    means = {row: _finite(value(row, (*column, "mean"))) for row in table.index}
    shown = {row: round(m, decimals) for row, m in means.items() if m is not None}
    ranks: dict[str, float] = {}
    leaders: list[str] = []
    if better is not None:
        # a target some seeds never reached ranks after every entry all of whose seeds did
        last = {_key(row, column) for row in table.index} & set(unreached)
        worst = -math.inf if better else math.inf
        ranked = list(shown) + [row for row in table.index if _key(row, column) in last]
        values = [shown.get(r, worst) for r in ranked]
        ranks = dict(zip(ranked, stats.average_ranks(values, better)))
        best = min(ranks.values(), default=None)
        leaders = [r for r in shown if ranks[r] == best] if len(ranked) >= 2 else []
    reference = max(leaders, key=lambda r: means[r] if better else -means[r]) if leaders else None  # type: ignore[operator]
    result = {}
    for row in table.index:
        n = _finite(value(row, (*column, "n")))
        n = int(n) if n is not None else 0
        tied, p, pairs = None, None, 0
        if reference is not None and row in shown and row not in leaders:
            best_seeds, seeds = _seeds(table, reference, column), _seeds(table, row, column)
            pairs = len(set(best_seeds) & set(seeds))
            if pairs >= MIN_PAIRS:
                p, pairs = stats.paired_p_value(best_seeds, seeds, test)
            if p is not None:
                common = sorted(set(best_seeds) & set(seeds))
                gap = sum(best_seeds[s] - seeds[s] for s in common) * (1 if better else -1)
                tied = gap <= 0 or p >= level
        reached = unreached.get(_key(row, column))
        result[row] = Cell(
            means[row],
            _finite(value(row, (*column, "std"))),
            n,
            ranks.get(row),
            0 < n < most,
            row in leaders and len(leaders) == 1,
            tied,
            p,
            pairs,
            row in leaders and len(leaders) > 1,
            tuple(reached) if reached is not None else None,
        )
    return result


def cells(table: pd.DataFrame, decimals: int | None = None) -> dict[tuple[str, tuple[str, str, str]], Cell]:
    """(row, (dataset, partition, quantity)) → Cell, by the rules in the module docstring;
    ``decimals``: the shown precision (default: the table's ``precision``, 2)."""
    decimals = precision_of(table, decimals)
    most = max_seeds(table)
    value = _Values(table)
    result = {}
    for column in dict.fromkeys(c[:3] for c in table.columns):
        for row, cell in _column_cells(table, column, decimals, most, value).items():
            result[row, column] = cell
    return result


def row_ranks(
    table: pd.DataFrame, decimals: int | None = None, metric: str | None = None
) -> dict[str, tuple[float | None, float | None]]:
    """row → (average rank over ``metric``'s columns (default: the main metric), overall rank by
    that average)."""
    decimals = precision_of(table, decimals)
    metric = metric or table.attrs.get("metric")
    table_cells = cells(table, decimals)
    averages: dict[str, float | None] = {}
    for row in table.index:
        ranks = [
            c.rank for (r, column), c in table_cells.items() if r == row and column[2] == metric and c.rank is not None
        ]
        averages[row] = sum(ranks) / len(ranks) if ranks else None
    ranked = [r for r in table.index if averages[r] is not None]
    overall = dict(zip(ranked, stats.average_ranks([round(averages[r], 2) for r in ranked], False)))
    return {row: (averages[row], overall.get(row)) for row in table.index}
