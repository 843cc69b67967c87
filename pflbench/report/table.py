"""The table model shared by every format: cell text, column headers, row spans, notes under the table (Markdown, HTML, CSV in ``render``; LaTeX in ``latex``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from pflbench.report.families import short_label
from pflbench.report.marks import MIN_PAIRS, Cell, cells, max_seeds, precision_of, row_ranks
from pflbench.report.names import LAST, quantity, readable
from pflbench.report.targets import QUANTITIES, SIM_TIME

MISSING = "—"
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
    italic: Callable[[str], str]


def cell_text(cell: Cell, style: Style, decimals: int = 2, show_n: bool = False) -> str:
    if cell.reached is not None:  # a target only some seeds reached: no mean
        return f"{style.missing} ({cell.reached[0]}/{cell.reached[1]})"
    if cell.mean is None:
        return style.missing
    text = f"{cell.mean:.{decimals}f}"
    if cell.std is not None:
        text += f"{style.plus_minus}{cell.std:.{decimals}f}"
    if cell.best:
        text = style.bold(text)
    elif cell.tied_best:
        text = style.italic(text)
    elif cell.tied:
        text = style.underline(text)
    return text + (style.flag(cell.n, cell.fewer_seeds) if cell.fewer_seeds or show_n else "")


def rank_text(value: float | None, missing: str = "—") -> str:
    return missing if value is None else f"{value:.2f}".rstrip("0").rstrip(".")


def columns_of(table: pd.DataFrame) -> list[tuple[str, str, str]]:
    """(dataset, partition, quantity) in table order."""
    return list(dict.fromkeys(column[:3] for column in table.columns))


def multi_quantity(table: pd.DataFrame) -> bool:
    return len(table.attrs.get("quantities", [None])) > 1


def _kind(metric: str) -> str:
    return "mean of the last 10% of evaluations" if metric.endswith(LAST) else "final value"


def metric_title(table: pd.DataFrame) -> str:
    """The main metric and how it is taken, marked when settings were selected on test."""
    metric = table.attrs.get("metric", "")
    title = f"{quantity(metric).label}, {_kind(metric)}"
    return title + (" (selected on test)" if table.attrs.get("selection", {}).get("on_test") else "")


def caption_text(table: pd.DataFrame) -> str:
    """``--caption`` if given, else the metric title."""
    return table.attrs.get("caption") or metric_title(table)


def _selection_notes(table: pd.DataFrame) -> list[str]:
    selection = table.attrs.get("selection") or {}
    if not selection:
        return []
    metric = selection["metric"]
    rule = (
        f"Settings selected per algorithm and column group by the best mean {quantity(metric).label} "
        f"over the seeds all its settings share ({_kind(metric)}); the cells show the selected setting's values "
        "over all of its seeds."
    )
    if selection["on_test"]:
        rule = f"Selected on test: {rule} {readable(metric)} is not a validation metric, so the numbers are optimistic."
    chosen = "; ".join(
        f"{algo} {d} {a}: {setting}"
        + (f" (on seed{'s' * (len(seeds) > 1)} {','.join(map(str, seeds))})" if seeds else "")
        for algo, d, a, setting, _, seeds in selection["chosen"]
    )
    result = [rule, f"Selected: {chosen}." if chosen else "Every algorithm had one setting per column group."]
    if selection["unselectable"]:
        result.append(f"Never selected (a run diverged): {'; '.join(selection['unselectable'])}.")
    return result


def _target_notes(table: pd.DataFrame, table_cells: list[Cell]) -> list[str]:
    target = table.attrs.get("target") or {}
    if not target:
        return []
    where = ", ".join(f"{group}: {value}" for group, value in target["thresholds"].items())
    result = [
        f"Rounds to target: the first evaluation round at which {target['text']}"
        f"{f' ({where})' if target['relative'] else ''}; "
        "MB to target: MB sent up + down by the end of that round; mean over the seeds."
    ]
    if SIM_TIME in table.attrs.get("quantities", []):
        result.append(
            "Simulated time to target: the simulated seconds (client availability and system model) "
            "by the end of that round; mean over the seeds."
        )
    if any(c.reached is not None for c in table_cells):
        result.append(
            f"{MISSING} (k/n): only k of n seeds reached the target within the rounds run (0: never), so no mean is shown."
        )
    return result


def _significance_notes(table: pd.DataFrame, table_cells: list[Cell]) -> list[str]:
    test = table.attrs.get("test", "ttest")
    if test not in TEST_NAMES:
        return []
    contenders = [  # entries that could carry a mark: ranked below a best, with a mean
        c for c in table_cells if c.rank is not None and c.rank > 1 and not c.tied_best and c.reached is None
    ]
    tested = [c for c in contenders if c.tied is not None]
    untested = len(contenders) - len(tested)
    most = max((c.pairs for c in contenders), default=0)
    if contenders and not tested and most < MIN_PAIRS:
        return [
            f"No significance marks: a paired test needs at least {MIN_PAIRS} seeds shared with the column's "
            f"best, and at most {most} {'is' if most == 1 else 'are'}."
        ]
    result = []
    if tested:
        result.append(
            f"Underlined: not significantly worse than the column's best ({TEST_NAMES[test]} "
            f"over the seeds both share, p ≥ {table.attrs.get('level', 0.05):g})."
        )
    if untested:
        result.append(
            f"{untested} {'entry is not tested and carries' if untested == 1 else 'entries are not tested and carry'} no mark: "
            f"fewer than {MIN_PAIRS} seeds pair with the best."
        )
    return result


def notes(table: pd.DataFrame) -> list[str]:
    """The setup, the selection rule, what the numbers are, the seed count, the marks used,
    the target, settings that differ."""
    spread = "95% confidence interval (t-based)" if table.attrs.get("interval") == "ci95" else "sample std"
    quantities = table.attrs.get("quantities", [table.attrs.get("metric", "")])
    shown = ", ".join(quantity(q).label for q in quantities if q not in QUANTITIES)
    table_cells = list(cells(table).values())
    result = []
    if table.attrs.get("setup"):
        result.append(f"Setup: {table.attrs['setup']}.")
    result += _selection_notes(table)
    result.append(
        f"Metric: {metric_title(table)}. Cells: {shown} as mean ± {spread} over seeds "
        f"(n={max_seeds(table)} seeds per cell unless marked). Best per column in bold."
    )
    if any(c.tied_best for c in table_cells):
        decimals = precision_of(table)
        result.append(
            f"Italic: tied for best at the {decimals} decimal{'' if decimals == 1 else 's'} shown; "
            "no entry is bold in such a column."
        )
    result += _significance_notes(table, table_cells)
    result += _target_notes(table, table_cells)
    if any(c.fewer_seeds for c in table_cells):
        result.append("† fewer seeds than the other cells; n = seeds in that cell.")
    if any(c.mean is None and c.reached is None for c in table_cells):
        result.append(f"{MISSING} no value (undefined for the algorithm, or no finished run).")
    unranked = [quantity(q).label for q in quantities if quantity(q).higher_is_better is None]
    if unranked:
        result.append(f"Not ranked, no best marked (which way is better is not known): {', '.join(unranked)}.")
    result.append(
        f"Avg. rank: mean rank over the {quantity(table.attrs.get('metric', '')).label} "
        "columns (1 = best, ties share the mean rank); Rank: order by average rank."
    )
    if any(label.endswith("]") for label in table.index):
        result.append("[status]: runs that did not end normally (e.g. diverged), shown apart, never averaged in.")
    if table.attrs.get("families"):
        result.append(
            "Family: each algorithm's family of pFL methods (as pflbench list groups them); rows grouped by family."
        )
    rates = table.attrs.get("learning_rates") or {}
    if rates:
        result.append(learning_rate_note(table))
    for name, values in table.attrs.get("differing", {}).items():
        if name != "lr" or not rates:  # the learning-rate note names each row's
            result.append(f"Runs differ in {readable(name).lower()}: {', '.join(values)}.")
    hyperparameters = hyperparameter_note(table)
    if hyperparameters:
        result.append(hyperparameters)
    return result


def hyperparameter_note(table: pd.DataFrame) -> str:
    """The algorithms' hyperparameters that have one value over a row's runs
    (``attrs["hyperparameters"]``): ``mu = 0.1 for all rows`` when every row has that value,
    else by row (``FedRep: head_epochs = 2``); empty when there are none."""
    by_row = {row: values for row, values in (table.attrs.get("hyperparameters") or {}).items() if row in table.index}
    if not by_row:
        return ""
    names = sorted(set().union(*(values.keys() for values in by_row.values())))
    shared = {
        name: by_row[table.index[0]][name]
        for name in names
        if len(by_row) == len(table.index) and len({values.get(name) for values in by_row.values()}) == 1
    }
    parts = [f"{name} = {value} for all rows" for name, value in shared.items()]
    for row in table.index:
        own = {name: value for name, value in by_row.get(row, {}).items() if name not in shared}
        if own:
            parts.append(f"{row}: " + ", ".join(f"{name} = {value}" for name, value in own.items()))
    return f"Hyperparameters (one value over all of a row's runs): {'; '.join(parts)}."


def learning_rate_note(table: pd.DataFrame) -> str:
    """Which row ran at which learning rate, when they differ (``attrs["learning_rates"]``)."""
    rates = table.attrs.get("learning_rates") or {}
    listed = "; ".join(f"{row}: {rates[row]}" for row in table.index if row in rates)
    return f"Not one learning rate for all: the rows ran at different learning rates ({listed})."


def family_texts(table: pd.DataFrame, style: Style) -> list[str] | None:
    """Each row's method family (short label, escaped) when the table has a Family column
    (``--families``), else None."""
    families = table.attrs.get("families") or {}
    if not families:
        return None
    return [style.escape(short_label(families.get(row, ""))) for row in table.index]


def body_rows(table: pd.DataFrame, style: Style) -> list[tuple[str, list[str]]]:
    """(escaped row label, cell texts + average rank + rank) per table row."""
    table_cells, ranks = cells(table), row_ranks(table)
    show_n, decimals = table.attrs.get("show_n", False), precision_of(table)
    return [
        (
            style.escape(row),
            [cell_text(table_cells[row, column], style, decimals, show_n) for column in columns_of(table)]
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
