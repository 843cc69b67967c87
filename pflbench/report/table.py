"""The table model shared by every format: cell text, column headers, row spans, notes under the table (Markdown, HTML, CSV in ``render``; LaTeX in ``latex``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from pflbench.report.leaderboard import Cell, cells, max_seeds, row_ranks
from pflbench.report.names import quantity, readable

TEST_NAMES = {"ttest": "paired two-sided t-test", "wilcoxon": "two-sided Wilcoxon signed-rank test (exact)"}


@dataclass(frozen=True)
class Style:
    """How one output format writes the parts of a cell."""

    plus_minus: str
    bold: Callable[[str], str]
    underline: Callable[[str], str]
    flag: Callable[[int, bool], str]
    missing: str
    escape: Callable[[str], str]


def cell_text(cell: Cell, style: Style, decimals: int = 2, show_n: bool = False) -> str:
    if cell.mean is None:
        return style.missing
    text = f"{cell.mean:.{decimals}f}"
    if cell.std is not None:
        text += f"{style.plus_minus}{cell.std:.{decimals}f}"
    text = style.bold(text) if cell.best else style.underline(text) if cell.tied else text
    return text + (style.flag(cell.n, cell.fewer_seeds) if cell.fewer_seeds or show_n else "")


def rank_text(value: float | None, missing: str = "—") -> str:
    return missing if value is None else f"{value:.2f}".rstrip("0").rstrip(".")


def columns_of(table: pd.DataFrame) -> list[tuple[str, str, str]]:
    """(dataset, partition, quantity) in table order."""
    return list(dict.fromkeys(column[:3] for column in table.columns))


def multi_quantity(table: pd.DataFrame) -> bool:
    return len(table.attrs.get("quantities", [None])) > 1


def metric_title(table: pd.DataFrame) -> str:
    metric = table.attrs.get("metric", "")
    kind = "mean of the last 10% of evaluations" if metric.endswith("_last10") else "final value"
    return f"{quantity(metric).label}, {kind}"


def notes(table: pd.DataFrame) -> list[str]:
    """The setup, what the numbers are, the seed count, the marks used, settings that differ."""
    spread = "95% confidence interval (t-based)" if table.attrs.get("interval") == "ci95" else "sample std"
    shown = ", ".join(quantity(q).label for q in table.attrs.get("quantities", [table.attrs.get("metric", "")]))
    result = []
    if table.attrs.get("setup"):
        result.append(f"Setup: {table.attrs['setup']}.")
    result.append(
        f"Metric: {metric_title(table)}. Cells: {shown} as mean ± {spread} over seeds "
        f"(n={max_seeds(table)} seeds per cell unless marked). Best per column in bold."
    )
    table_cells = cells(table).values()
    test = table.attrs.get("test", "ttest")
    if test in TEST_NAMES:
        result.append(
            f"Underlined: not significantly worse than the column's best ({TEST_NAMES[test]} "
            f"over the seeds both share, p ≥ {table.attrs.get('level', 0.05):g})."
        )
        untested = sum(1 for c in table_cells if c.rank is not None and c.rank > 1 and c.tied is None)
        if untested:
            result.append(
                f"{untested} {'entry is' if untested == 1 else 'entries are'} not tested and carry "
                "no mark: fewer than 2 seeds pair with the best (a paired test needs n ≥ 2)."
            )
    if any(c.fewer_seeds for c in table_cells):
        result.append("† fewer seeds than the other cells; n = seeds in that cell.")
    if any(c.mean is None for c in table_cells):
        result.append("— no value (undefined for the algorithm, or no finished run).")
    result.append(
        f"Avg. rank: mean rank over the {quantity(table.attrs.get('metric', '')).label} "
        "columns (1 = best, ties share the mean rank); Rank: order by average rank."
    )
    if any(label.endswith("]") for label in table.index):
        result.append("[status]: runs that did not end normally (e.g. diverged), shown apart, never averaged in.")
    for name, values in table.attrs.get("differing", {}).items():
        result.append(f"Runs differ in {readable(name).lower()}: {', '.join(values)}.")
    return result


def body_rows(table: pd.DataFrame, style: Style) -> list[tuple[str, list[str]]]:
    """(escaped row label, cell texts + average rank + rank) per table row."""
    table_cells, ranks = cells(table), row_ranks(table)
    show_n = table.attrs.get("show_n", False)
    return [
        (
            style.escape(row),
            [cell_text(table_cells[row, column], style, show_n=show_n) for column in columns_of(table)]
            + [rank_text(r, style.missing) for r in ranks[row]],
        )
        for row in table.index
    ]


def header_text(column: tuple[str, str, str], multi: bool) -> str:
    text = f"{column[0]} {column[1]}"
    return f"{text} {quantity(column[2]).label}" if multi else text


def spans(keys: list[tuple]) -> list[tuple[tuple, int]]:
    """Consecutive runs of equal keys: [(key, length), ...]."""
    result: list[tuple[tuple, int]] = []
    for key in keys:
        if result and result[-1][0] == key:
            result[-1] = (key, result[-1][1] + 1)
        else:
            result.append((key, 1))
    return result
