"""Render a leaderboard pivot (``leaderboard.pivot``) as Markdown, LaTeX, CSV or HTML.

Cells read ``mean ± std`` (or ``± 95% CI``) over seeds in display units (accuracy in percent,
2 decimals). Per column the best mean is bold; entries not significantly worse than the best
(paired test across seeds, ``leaderboard.cells``) are underlined; a cell with fewer seeds than
the most in the table carries ``†n=<seeds>`` (every cell shows ``n=`` with ``show_n``); a
missing value is ``—`` and takes no rank. Two last columns give each row's average rank over the
metric's columns and its overall rank. All formats carry the same content; names and values
from the run folders are escaped for the format (HTML in Markdown and HTML pages). LaTeX lives
in ``pflbench.report.latex``.
"""

from __future__ import annotations

import html
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


def _md_escape(text: str) -> str:
    text = " ".join(text.split()) if any(c in text for c in "\r\n\t\v\f") else text  # one table line
    return html.escape(text, quote=False).replace("|", r"\|").replace("*", r"\*").replace("`", r"\`")


MARKDOWN = Style(
    " ± ",
    lambda t: f"**{t}**",
    lambda t: f"<ins>{t}</ins>",
    lambda n, dagger: f" {'†' if dagger else ''}n={n}",
    "—",
    _md_escape,
)
HTML = Style(
    " ± ",
    lambda t: f"<b>{t}</b>",
    lambda t: f"<u>{t}</u>",
    lambda n, dagger: f"<sup>{'†' if dagger else ''}n={n}</sup>",
    "—",
    html.escape,
)


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


def columns_of(table: pd.DataFrame) -> list[tuple[str, float, str]]:
    """(dataset, alpha, quantity) in table order."""
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


def header_text(column: tuple[str, float, str], multi: bool) -> str:
    text = f"{column[0]} α={column[1]:g}"
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


def to_markdown(table: pd.DataFrame) -> str:
    def line(cells_: list[str]) -> str:
        return "| " + " | ".join(cells_) + " |"

    columns = columns_of(table)
    headers = [_md_escape(header_text(c, multi_quantity(table))) for c in columns]
    lines = [line(["Algorithm", *headers, "Avg. rank", "Rank"]), "| :-- |" + " --: |" * (len(columns) + 2)]
    lines += [line([row, *texts]) for row, texts in body_rows(table, MARKDOWN)]
    return "\n".join(lines) + "\n\n" + "\n\n".join(map(_md_escape, notes(table))) + "\n"


HTML_STYLE = (
    "body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:2rem auto;max-width:72rem;"
    "padding:0 1rem;color:#222;line-height:1.45}"
    "table{border-collapse:collapse;border-top:2px solid #222;border-bottom:2px solid #222;margin:1rem 0;"
    "font-variant-numeric:tabular-nums}"
    "caption{caption-side:top;text-align:left;font-weight:600;padding-bottom:.5rem}"
    "th,td{padding:.35rem .8rem;text-align:right;white-space:nowrap}"
    "thead th{text-align:center;border-bottom:1px solid #888}tbody th{text-align:left;font-weight:500}"
    "tbody tr:nth-child(even){background:#f5f6f8}tbody tr:hover{background:#e8eefc}"
    "p.note{color:#555;font-size:.92rem;margin:.3rem 0}sup{font-size:.7em}"
)


def to_html(table: pd.DataFrame) -> str:
    """A standalone page with inline CSS: caption, the table with grouped headers, the notes."""
    columns = columns_of(table)
    multi = multi_quantity(table)
    levels = [lambda c: (c[0],), lambda c: (c[0], c[1])] + ([lambda c: c] if multi else [])
    texts = [
        lambda key: html.escape(key[0]),
        lambda key: f"α={key[1]:g}",
        lambda key: html.escape(quantity(key[2]).label),
    ]
    head = []
    for depth, level in enumerate(levels):
        first = f'<th rowspan="{len(levels)}">Algorithm</th>' if depth == 0 else ""
        last = f'<th rowspan="{len(levels)}">Avg. rank</th><th rowspan="{len(levels)}">Rank</th>' if depth == 0 else ""
        groups = "".join(
            f'<th colspan="{length}">{texts[depth](key)}</th>' for key, length in spans([level(c) for c in columns])
        )
        head.append(f"<tr>{first}{groups}{last}</tr>")
    body = [
        "<tr><th>" + row + "</th>" + "".join(f"<td>{t}</td>" for t in texts_) + "</tr>"
        for row, texts_ in body_rows(table, HTML)
    ]
    paragraphs = "".join(f'<p class="note">{html.escape(note)}</p>\n' for note in notes(table))
    caption = html.escape(metric_title(table))
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>pflbench leaderboard: {caption}</title><style>{HTML_STYLE}</style></head><body>\n"
        f"<table>\n<caption>{caption}</caption>\n<thead>{''.join(head)}</thead>\n"
        f"<tbody>\n{chr(10).join(body)}\n</tbody>\n</table>\n{paragraphs}</body></html>\n"
    )


def to_csv(table: pd.DataFrame) -> str:
    """One line per cell: algorithm, dataset, alpha, quantity, label, mean, std (± part), n, rank,
    best, tied (not significantly worse than the best), p, pairs, flags, the row's ranks."""
    table_cells, ranks = cells(table), row_ranks(table)
    records = [
        {
            "algorithm": row,
            "dataset": column[0],
            "alpha": column[1],
            "quantity": column[2],
            "label": quantity(column[2]).label,
            "mean": cell.mean,
            "std": cell.std,
            "n": cell.n,
            "rank": cell.rank,
            "best": cell.best,
            "tied": cell.tied,
            "p": cell.p,
            "pairs": cell.pairs,
            "fewer_seeds": cell.fewer_seeds,
            "avg_rank": ranks[row][0],
            "overall_rank": ranks[row][1],
        }
        for (row, column), cell in table_cells.items()
    ]
    return pd.DataFrame(records).to_csv(index=False)


def _latex(table: pd.DataFrame) -> str:
    from pflbench.report.latex import to_latex

    return to_latex(table)


FORMATS: dict[str, tuple[Callable[[pd.DataFrame], str], str]] = {
    "md": (to_markdown, ".md"),
    "latex": (_latex, ".tex"),
    "csv": (to_csv, ".csv"),
    "html": (to_html, ".html"),
}


def __getattr__(name: str):  # ``from pflbench.report.render import to_latex`` keeps working
    if name in ("to_latex", "latex_escape"):
        from pflbench.report import latex

        return getattr(latex, name)
    raise AttributeError(name)
