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
import json
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
    "th.sortable{cursor:pointer;user-select:none}th.sortable:hover{background:#e8eefc}"
    "th[aria-sort=ascending]::after{content:' \\25B2'}th[aria-sort=descending]::after{content:' \\25BC'}"
    ".controls{margin:1rem 0;display:flex;gap:1rem;align-items:center;flex-wrap:wrap}"
    ".controls input,.controls select{font:inherit;padding:.2rem .4rem}"
    "tbody th.has-curve{cursor:pointer;text-decoration:underline dotted}"
    "figure.curve{margin:1rem 0}figure.curve figcaption{font-weight:600;margin-bottom:.3rem}"
    "figure.curve svg{max-width:100%;font-size:11px}"
)

# The page's interactivity, inline (no server, no network): a click on a column's header sorts the
# rows by it (numbers by their mean, "—" last; again: the other way), a text box filters the rows by
# algorithm, and a Family menu (tables with a Family column) shows one family. The static table
# stays as it was rendered; without JavaScript it is the same page.
HTML_SCRIPT = """
(function () {
  var table = document.querySelector("table"); if (!table) return;
  var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
  var grid = [], leaves = [];
  Array.prototype.forEach.call(table.tHead.rows, function (tr, r) {
    grid[r] = grid[r] || []; var c = 0;
    Array.prototype.forEach.call(tr.cells, function (th) {
      while (grid[r][c]) c++;
      for (var i = 0; i < th.rowSpan; i++) for (var j = 0; j < th.colSpan; j++) {
        grid[r + i] = grid[r + i] || []; grid[r + i][c + j] = th; }
      if (th.colSpan === 1) leaves.push([th, c]);
      c += th.colSpan;
    });
  });
  function value(cell) {
    var text = cell ? cell.textContent.trim() : "";
    var number = parseFloat(text.replace(/^[^0-9.-]*/, ""));
    return isNaN(number) ? text.toLowerCase() : number;
  }
  function compare(a, b, dir) {
    var missingA = a === "\u2014" || a === "", missingB = b === "\u2014" || b === "";
    if (missingA || missingB) return missingA - missingB;
    if (typeof a === typeof b) return (a < b ? -1 : a > b ? 1 : 0) * dir;
    return typeof a === "number" ? -1 : 1;
  }
  leaves.forEach(function (leaf) {
    var th = leaf[0], column = leaf[1];
    th.classList.add("sortable"); th.title = "Sort by this column";
    th.addEventListener("click", function () {
      var dir = th.getAttribute("aria-sort") === "ascending" ? -1 : 1;
      leaves.forEach(function (other) { other[0].removeAttribute("aria-sort"); });
      th.setAttribute("aria-sort", dir === 1 ? "ascending" : "descending");
      rows.slice().sort(function (x, y) {
        return compare(value(x.cells[column]), value(y.cells[column]), dir);
      }).forEach(function (row) { body.appendChild(row); });
    });
  });
  var controls = document.createElement("div"); controls.className = "controls";
  var search = document.createElement("input");
  search.type = "search"; search.placeholder = "Filter algorithms"; search.setAttribute("aria-label", "Filter algorithms");
  controls.appendChild(search);
  var familyColumn = -1, menu = null;
  leaves.forEach(function (leaf) { if (leaf[0].textContent.trim() === "Family") familyColumn = leaf[1]; });
  if (familyColumn >= 0) {
    menu = document.createElement("select"); menu.setAttribute("aria-label", "Family");
    var seen = {}, all = document.createElement("option"); all.value = ""; all.textContent = "All families";
    menu.appendChild(all);
    rows.forEach(function (row) {
      var name = row.cells[familyColumn].textContent.trim();
      if (!seen[name]) { seen[name] = 1; var o = document.createElement("option"); o.value = o.textContent = name; menu.appendChild(o); }
    });
    controls.appendChild(menu);
  }
  function apply() {
    var text = search.value.trim().toLowerCase(), family = menu ? menu.value : "";
    rows.forEach(function (row) {
      var show = row.cells[0].textContent.toLowerCase().indexOf(text) >= 0 &&
        (!family || row.cells[familyColumn].textContent.trim() === family);
      row.style.display = show ? "" : "none";
    });
  }
  search.addEventListener("input", apply); if (menu) menu.addEventListener("change", apply);
  table.parentNode.insertBefore(controls, table);
  var source = document.getElementById("curves"); if (!source) return;
  var data = JSON.parse(source.textContent), shown = null, svgNS = "http://www.w3.org/2000/svg";
  var figure = document.createElement("figure"); figure.className = "curve"; figure.hidden = true;
  table.parentNode.insertBefore(figure, table.nextSibling);
  function element(name, attributes, text) {
    var e = document.createElementNS(svgNS, name);
    for (var key in attributes) e.setAttribute(key, attributes[key]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function draw(name, groups) {
    var W = 560, H = 240, L = 48, R = 150, T = 10, B = 30, xs = [], ys = [];
    Object.keys(groups).forEach(function (g) { groups[g].forEach(function (p) { xs.push(p[0]); ys.push(p[1]); }); });
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs), y0 = Math.min.apply(null, ys), y1 = Math.max.apply(null, ys);
    if (x1 === x0) x1 = x0 + 1; if (y1 === y0) { y0 -= 1; y1 += 1; }
    function X(v) { return L + (v - x0) / (x1 - x0) * (W - L - R); }
    function Y(v) { return T + (y1 - v) / (y1 - y0) * (H - T - B); }
    var svg = element("svg", {width: W, height: H, viewBox: "0 0 " + W + " " + H, role: "img"});
    svg.appendChild(element("line", {x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#888"}));
    svg.appendChild(element("line", {x1: L, y1: T, x2: L, y2: H - B, stroke: "#888"}));
    svg.appendChild(element("text", {x: L - 4, y: Y(y1) + 4, "text-anchor": "end"}, y1.toFixed(1)));
    svg.appendChild(element("text", {x: L - 4, y: Y(y0) + 4, "text-anchor": "end"}, y0.toFixed(1)));
    svg.appendChild(element("text", {x: X(x0), y: H - B + 14, "text-anchor": "middle"}, String(x0)));
    svg.appendChild(element("text", {x: X(x1), y: H - B + 14, "text-anchor": "middle"}, String(x1)));
    svg.appendChild(element("text", {x: (L + W - R) / 2, y: H - 4, "text-anchor": "middle"}, "Round"));
    var colours = ["#3b5bdb", "#e8590c", "#2b8a3e", "#c2255c", "#5f3dc4", "#0b7285"];
    Object.keys(groups).forEach(function (g, i) {
      var colour = colours[i % colours.length];
      var points = groups[g].map(function (p) { return X(p[0]).toFixed(1) + "," + Y(p[1]).toFixed(1); }).join(" ");
      svg.appendChild(element("polyline", {points: points, fill: "none", stroke: colour, "stroke-width": 2}));
      groups[g].forEach(function (p) { svg.appendChild(element("circle", {cx: X(p[0]), cy: Y(p[1]), r: 2.5, fill: colour})); });
      svg.appendChild(element("text", {x: W - R + 10, y: T + 14 + 16 * i, fill: colour}, g));
    });
    var caption = document.createElement("figcaption");
    caption.textContent = name + ": " + data.label + " per round (mean over seeds)";
    figure.textContent = ""; figure.appendChild(caption); figure.appendChild(svg); figure.hidden = false;
  }
  rows.forEach(function (row) {
    var groups = data.rows[row.getAttribute("data-row")], head = row.cells[0];
    if (!groups) return;
    head.classList.add("has-curve"); head.title = "Click: this row's per-round curve";
    head.addEventListener("click", function () {
      if (shown === row) { figure.hidden = true; shown = null; return; }
      shown = row; draw(head.textContent.trim(), groups);
    });
  });
})();
"""


def to_html(table: pd.DataFrame) -> str:
    """A standalone page with inline CSS: caption, the table with grouped headers, the notes, and
    an inline script that sorts by a clicked column, filters by algorithm and family, and draws a
    row's per-round curve when its name is clicked."""
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
        f'<tr data-row="{i}"><th>'
        + row
        + "</th>"
        + (f'<td style="text-align:left">{families[i]}</td>' if families else "")
        + "".join(f"<td>{t}</td>" for t in texts_)
        + "</tr>"
        for i, (row, texts_) in enumerate(body_rows(table, HTML))
    ]
    paragraphs = "".join(f'<p class="note">{html.escape(note)}</p>\n' for note in notes(table))
    paragraphs += curve_data(table)
    caption = html.escape(caption_text(table))
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>pflbench leaderboard: {caption}</title><style>{HTML_STYLE}</style></head><body>\n"
        f"<table>\n<caption>{caption}</caption>\n<thead>{''.join(head)}</thead>\n"
        f"<tbody>\n{chr(10).join(body)}\n</tbody>\n</table>\n{paragraphs}<script type='text/javascript'>{HTML_SCRIPT}</script></body></html>\n"
    )


def curve_data(table: pd.DataFrame) -> str:
    """The rows' per-round curves of the main metric (``table.attrs["curves"]``, in display units)
    as a JSON script block the page's script draws from; rows listed in the table's order. Every
    ``<`` is written ``\\u003c``, so no name from a run folder can close the block or open a tag."""
    curves = table.attrs.get("curves") or {}
    if not curves:
        return ""
    shown = quantity(str(table.attrs["metric"]).removesuffix("_last10"))
    rows = {
        str(i): {group: [[r, v * shown.scale] for r, v in points] for group, points in curves[row].items()}
        for i, row in enumerate(table.index)
        if row in curves
    }
    payload = json.dumps({"label": shown.label, "rows": rows}, ensure_ascii=False).replace("<", "\\u003c")
    return f'<script type="application/json" id="curves">{payload}</script>\n'


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
