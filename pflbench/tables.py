"""Render a leaderboard pivot (``leaderboard.pivot``) as Markdown, LaTeX (booktabs), CSV or HTML.

Cells read ``mean ± std`` over seeds in display units (accuracy in percent, 2 decimals); per
column the best mean is bold and the second underlined; a cell with fewer seeds than the most
in the table carries ``†n=<seeds>``; a missing value is ``—`` and takes no rank.
"""
from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Callable

import pandas as pd

from .leaderboard import Cell, cells, max_seeds, quantity

LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
                 "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
                 "^": r"\textasciicircum{}", "α": r"$\alpha$", "±": r"$\pm$", "—": "---",
                 "†": r"$\dagger$", "≥": r"$\geq$"}


def latex_escape(text: str) -> str:
    return "".join(LATEX_SPECIAL.get(char, char) for char in text)


@dataclass(frozen=True)
class Style:
    """How one output format writes the parts of a cell."""

    plus_minus: str
    bold: Callable[[str], str]
    underline: Callable[[str], str]
    flag: Callable[[int], str]
    missing: str


MARKDOWN = Style(" ± ", lambda t: f"**{t}**", lambda t: f"<ins>{t}</ins>", lambda n: f" †n={n}", "—")
LATEX = Style(r" $\pm$ ", lambda t: rf"\textbf{{{t}}}", lambda t: rf"\underline{{{t}}}",
              lambda n: rf"\textsuperscript{{$\dagger$n={n}}}", "---")
HTML = Style(" ± ", lambda t: f"<b>{t}</b>", lambda t: f"<u>{t}</u>", lambda n: f"<sup>†n={n}</sup>", "—")


def cell_text(cell: Cell, style: Style, decimals: int = 2) -> str:
    if cell.mean is None:
        return style.missing
    text = f"{cell.mean:.{decimals}f}"
    if cell.std is not None:
        text += f"{style.plus_minus}{cell.std:.{decimals}f}"
    text = style.bold(text) if cell.rank == 1 else style.underline(text) if cell.rank == 2 else text
    return text + (style.flag(cell.n) if cell.fewer_seeds else "")


def columns_of(table: pd.DataFrame) -> list[tuple[str, float, str]]:
    """(dataset, alpha, quantity) in table order."""
    return list(dict.fromkeys(column[:3] for column in table.columns))


def notes(table: pd.DataFrame) -> list[str]:
    """What the numbers are, the seed count, the markers used, and settings that differ."""
    metric = table.attrs.get("metric", "")
    kind = "mean of the last 10% of evaluations" if metric.endswith("_last10") else "final value"
    shown = ", ".join(quantity(q).label for q in table.attrs.get("quantities", [metric]))
    result = [f"{shown}: {kind}, mean ± std over seeds (n={max_seeds(table)} seeds per cell "
              "unless marked). Best per column in bold, second underlined."]
    table_cells = cells(table).values()
    if any(c.fewer_seeds for c in table_cells):
        result.append("† fewer seeds than the other cells; n = seeds in that cell.")
    if any(c.mean is None for c in table_cells):
        result.append("— no value (undefined for the algorithm, or no finished run).")
    for name, values in table.attrs.get("differing", {}).items():
        result.append(f"Runs differ in {name}: {', '.join(values)}.")
    return result


def _rows(table: pd.DataFrame, style: Style) -> list[tuple[str, list[str]]]:
    table_cells = cells(table)
    return [(row, [cell_text(table_cells[row, column], style) for column in columns_of(table)])
            for row in table.index]


def _spans(keys: list[tuple]) -> list[tuple[tuple, int]]:
    """Consecutive runs of equal keys: [(key, length), ...]."""
    spans: list[tuple[tuple, int]] = []
    for key in keys:
        if spans and spans[-1][0] == key:
            spans[-1] = (key, spans[-1][1] + 1)
        else:
            spans.append((key, 1))
    return spans


def _multi_quantity(table: pd.DataFrame) -> bool:
    return len(table.attrs.get("quantities", [None])) > 1


def to_markdown(table: pd.DataFrame) -> str:
    def header(column: tuple[str, float, str]) -> str:
        text = f"{column[0]} α={column[1]:g}"
        return f"{text} {quantity(column[2]).label}" if _multi_quantity(table) else text

    def line(cells_: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", r"\|") for c in cells_) + " |"

    columns = columns_of(table)
    lines = [line(["algorithm", *map(header, columns)]), "| :-- |" + " --: |" * len(columns)]
    lines += [line([row, *texts]) for row, texts in _rows(table, MARKDOWN)]
    return "\n".join(lines) + "\n\n" + "\n\n".join(notes(table)) + "\n"


def to_latex(table: pd.DataFrame, label: str | None = None) -> str:
    """A ``table`` float with a booktabs ``tabular``; needs only ``\\usepackage{booktabs}``."""
    columns = columns_of(table)
    metric = table.attrs.get("metric", "metric")
    lines = [r"\begin{table}[t]", r"\centering",
             rf"\caption{{{latex_escape(' '.join(notes(table)))}}}",
             rf"\label{{{label or 'tab:' + metric.replace('_', '-')}}}", r"\smallskip",
             r"\begin{tabular}{l" + "c" * len(columns) + "}", r"\toprule"]
    levels = [lambda c: (c[0],), lambda c: (c[0], c[1])]
    texts = [lambda key: latex_escape(key[0]), lambda key: rf"$\alpha={key[1]:g}$"]
    if _multi_quantity(table):
        levels.append(lambda c: c)
        texts.append(lambda key: latex_escape(quantity(key[2]).label))
    for depth, (level, text) in enumerate(zip(levels, texts)):
        start, parts, rules = 2, [], []
        for key, length in _spans([level(c) for c in columns]):
            parts.append(rf"\multicolumn{{{length}}}{{c}}{{{text(key)}}}")
            rules.append(rf"\cmidrule(lr){{{start}-{start + length - 1}}}")
            start += length
        first = "Algorithm" if depth == len(levels) - 1 else ""
        lines.append(" & ".join([first, *parts]) + r" \\")
        if depth < len(levels) - 1:
            lines.append(" ".join(rules))
    lines.append(r"\midrule")
    lines += [" & ".join([latex_escape(row), *cells_]) + r" \\" for row, cells_ in _rows(table, LATEX)]
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def to_html(table: pd.DataFrame) -> str:
    """A standalone page: the table with grouped headers, then the notes."""
    columns = columns_of(table)
    levels = [lambda c: (c[0],), lambda c: (c[0], c[1])] + ([lambda c: c] if _multi_quantity(table) else [])
    texts = [lambda key: html.escape(key[0]), lambda key: f"α={key[1]:g}",
             lambda key: html.escape(quantity(key[2]).label)]
    head = []
    for depth, level in enumerate(levels):
        first = f'<th rowspan="{len(levels)}">algorithm</th>' if depth == 0 else ""
        spans = "".join(f'<th colspan="{length}">{texts[depth](key)}</th>'
                        for key, length in _spans([level(c) for c in columns]))
        head.append(f"<tr>{first}{spans}</tr>")
    body = ["<tr><th>" + html.escape(row) + "</th>" + "".join(f"<td>{t}</td>" for t in texts_) + "</tr>"
            for row, texts_ in _rows(table, HTML)]
    paragraphs = "".join(f"<p>{html.escape(note)}</p>" for note in notes(table))
    style = ("table{border-collapse:collapse;font-family:sans-serif}th,td{padding:4px 10px;"
             "text-align:right}thead th{text-align:center;border-bottom:1px solid #444}"
             "tbody th{text-align:left}table{border-top:2px solid #000;border-bottom:2px solid #000}")
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>pflbench leaderboard</title>"
            f"<style>{style}</style></head><body>\n<table>\n<thead>{''.join(head)}</thead>\n"
            f"<tbody>\n{chr(10).join(body)}\n</tbody>\n</table>\n{paragraphs}\n</body></html>\n")


def to_csv(table: pd.DataFrame) -> str:
    """One line per cell: algorithm, dataset, alpha, quantity, unit label, mean, std, n, flags."""
    table_cells = cells(table)
    records = [{"algorithm": row, "dataset": column[0], "alpha": column[1], "quantity": column[2],
                "label": quantity(column[2]).label, "mean": cell.mean, "std": cell.std, "n": cell.n,
                "rank": cell.rank, "fewer_seeds": cell.fewer_seeds}
               for (row, column), cell in table_cells.items()]
    return pd.DataFrame(records).astype({"rank": "Int64"}).to_csv(index=False)


FORMATS: dict[str, tuple[Callable[[pd.DataFrame], str], str]] = {
    "md": (to_markdown, ".md"), "latex": (to_latex, ".tex"), "csv": (to_csv, ".csv"), "html": (to_html, ".html")}
