"""Render a leaderboard pivot (``leaderboard.pivot``) as Markdown, LaTeX, CSV or HTML.

Cells read ``mean ± std`` (or ``± 95% CI``) over seeds in display units (accuracy in percent,
``precision`` decimals, 2 by default). Per column the best mean is bold, or, when several tie for
best at the shown precision, they are in italics and none is bold; entries not significantly worse
than the best (paired test across ≥ 3 shared seeds, ``marks.cells``) are underlined; a cell with fewer seeds than
the most in the table carries ``†n=<seeds>`` (every cell shows ``n=`` with ``show_n``); a
missing value is ``—`` and takes no rank. Two last columns give each row's average rank over the
metric's columns and its overall rank. All formats carry the same content; names and values
from the run folders are escaped for the format (HTML in Markdown and HTML pages). LaTeX lives
in ``pflbench.report.latex``.
"""

from __future__ import annotations

import html
from collections.abc import Callable

import pandas as pd

from pflbench.report.latex import to_latex
from pflbench.report.marks import cells, row_ranks
from pflbench.report.names import quantity
from pflbench.report.table import (
    Style,
    body_rows,
    caption_text,
    columns_of,
    family_texts,
    header_text,
    multi_quantity,
    notes,
    spans,
)


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
    lambda t: f"*{t}*",
)
HTML = Style(
    " ± ",
    lambda t: f"<b>{t}</b>",
    lambda t: f"<u>{t}</u>",
    lambda n, dagger: f"<sup>{'†' if dagger else ''}n={n}</sup>",
    "—",
    html.escape,
    lambda t: f"<i>{t}</i>",
)


def to_markdown(table: pd.DataFrame) -> str:
    def line(cells_: list[str]) -> str:
        return "| " + " | ".join(cells_) + " |"

    columns = columns_of(table)
    headers = [_md_escape(header_text(c, multi_quantity(table))) for c in columns]
    families = family_texts(table, MARKDOWN)
    family_head, family_align = (["Family"], " :-- |") if families else ([], "")
    lines = [
        line(["Algorithm", *family_head, *headers, "Avg. rank", "Rank"]),
        "| :-- |" + family_align + " --: |" * (len(columns) + 2),
    ]
    rows = body_rows(table, MARKDOWN)
    lines += [line([row, *([families[i]] if families else []), *texts]) for i, (row, texts) in enumerate(rows)]
    caption = table.attrs.get("caption")  # pandoc reads "Table: ..." next to a table as its caption
    head = f"Table: {_md_escape(caption)}\n\n" if caption else ""
    return head + "\n".join(lines) + "\n\n" + "\n\n".join(map(_md_escape, notes(table))) + "\n"


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
        lambda key: html.escape(key[1]),
        lambda key: html.escape(quantity(key[2]).label),
    ]
    head = []
    families = family_texts(table, HTML)
    for depth, level in enumerate(levels):
        first = f'<th rowspan="{len(levels)}">Algorithm</th>' if depth == 0 else ""
        if depth == 0 and families:
            first += f'<th rowspan="{len(levels)}">Family</th>'
        last = f'<th rowspan="{len(levels)}">Avg. rank</th><th rowspan="{len(levels)}">Rank</th>' if depth == 0 else ""
        groups = "".join(
            f'<th colspan="{length}">{texts[depth](key)}</th>' for key, length in spans([level(c) for c in columns])
        )
        head.append(f"<tr>{first}{groups}{last}</tr>")
    body = [
        "<tr><th>"
        + row
        + "</th>"
        + (f'<td style="text-align:left">{families[i]}</td>' if families else "")
        + "".join(f"<td>{t}</td>" for t in texts_)
        + "</tr>"
        for i, (row, texts_) in enumerate(body_rows(table, HTML))
    ]
    paragraphs = "".join(f'<p class="note">{html.escape(note)}</p>\n' for note in notes(table))
    caption = html.escape(caption_text(table))
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>pflbench leaderboard: {caption}</title><style>{HTML_STYLE}</style></head><body>\n"
        f"<table>\n<caption>{caption}</caption>\n<thead>{''.join(head)}</thead>\n"
        f"<tbody>\n{chr(10).join(body)}\n</tbody>\n</table>\n{paragraphs}</body></html>\n"
    )


def to_csv(table: pd.DataFrame) -> str:
    """Tidy, one line per cell: algorithm, dataset, partition, quantity, label, mean, std (± part),
    n, rank, best, tied_best, tied (not significantly worse than the best), p, pairs, flags,
    reached (``k/n`` where only k of n seeds reached a target), selected (the setting chosen by
    ``--select-by``), the row's ranks, and ``lr`` (the row's learning rate) when the rows ran at
    different learning rates. Numbers are unrounded (``--precision`` is for display)."""
    table_cells, ranks = cells(table), row_ranks(table)
    chosen = {(row, d, a): text for row, d, a, text, *_ in (table.attrs.get("selection") or {}).get("chosen", [])}
    records = [
        {
            "algorithm": row,
            "dataset": column[0],
            "partition": column[1],
            "quantity": column[2],
            "label": quantity(column[2]).label,
            "mean": cell.mean,
            "std": cell.std,
            "n": cell.n,
            "rank": cell.rank,
            "best": cell.best,
            "tied_best": cell.tied_best,
            "tied": cell.tied,
            "p": cell.p,
            "pairs": cell.pairs,
            "fewer_seeds": cell.fewer_seeds,
            "reached": f"{cell.reached[0]}/{cell.reached[1]}" if cell.reached else None,
            "selected": chosen.get((row, column[0], column[1])),
            "avg_rank": ranks[row][0],
            "overall_rank": ranks[row][1],
        }
        for (row, column), cell in table_cells.items()
    ]
    families = table.attrs.get("families") or {}
    if families:  # --families: each line names its row's method family
        for record in records:
            record["family"] = families.get(record["algorithm"], "")
    rates = table.attrs.get("learning_rates") or {}
    if rates:  # the rows ran at different learning rates: each line says its row's
        for record in records:
            record["lr"] = rates.get(record["algorithm"])
    return pd.DataFrame(records).to_csv(index=False)


FORMATS: dict[str, tuple[Callable[[pd.DataFrame], str], str]] = {
    "md": (to_markdown, ".md"),
    "latex": (to_latex, ".tex"),
    "csv": (to_csv, ".csv"),
    "html": (to_html, ".html"),
}
