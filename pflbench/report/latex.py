"""A leaderboard as a LaTeX ``table`` float that drops into a paper.

Needs ``\\usepackage{booktabs}`` and, for ``fit="resize"`` (the default), ``\\usepackage{graphicx}``.
The caption states the setup and how to read the cells (``table.notes``); the label is unique
per table content (``tab:<metric>-<hash>``) unless given. ``fit``: ``resize`` scales a table
wider than ``\\linewidth`` down to it (narrower tables keep their size), ``transpose`` puts the
algorithms in columns and the (dataset, partition) panels in rows (and shrinks it too if it is still
wider than the text), ``none`` leaves it as it is.
"""

from __future__ import annotations

import hashlib
import json
import re

import pandas as pd

from pflbench.report.names import quantity
from pflbench.report.table import (
    Style,
    body_rows,
    caption_text,
    columns_of,
    family_texts,
    multi_quantity,
    notes,
    rank_text,
    spans,
)

FITS = ("resize", "transpose", "none")
LATEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "<": r"\textless{}",
    ">": r"\textgreater{}",
    "|": r"\textbar{}",
    "α": r"$\alpha$",
    "±": r"$\pm$",
    "—": "---",
    "†": r"$\dagger$",
    "≥": r"$\geq$",
    "≤": r"$\leq$",
    "≈": r"$\approx$",
    "–": "--",
}


def latex_escape(text: str) -> str:
    """Text as LaTeX typesets it literally; line breaks and other control characters become spaces."""
    return "".join(LATEX_SPECIAL.get(char, " " if char.isspace() or not char.isprintable() else char) for char in text)


DAGGER = r"$\dagger$"
LATEX = Style(
    r" $\pm$ ",
    lambda t: rf"\textbf{{{t}}}",
    lambda t: rf"\underline{{{t}}}",
    lambda n, dagger: r"\textsuperscript{" + (DAGGER if dagger else "") + f"n={n}}}",
    "---",
    latex_escape,
    lambda t: rf"\textit{{{t}}}",
)


def table_label(table: pd.DataFrame) -> str:
    """``tab:<metric>-<8 hex>``: a hash of the rows, columns, setup and options shown."""
    content = json.dumps(
        [
            list(table.index),
            [list(map(str, c)) for c in table.columns],
            {k: v for k, v in table.attrs.items() if k != "per_seed"},
        ],
        sort_keys=True,
        default=str,
    )
    metric = "".join(c if c.isalnum() else "-" for c in table.attrs.get("metric", "metric"))
    return f"tab:{metric}-{hashlib.sha256(content.encode()).hexdigest()[:8]}"


def safe_label(label: str) -> str:
    """A ``\\label`` key: letters, digits and ``:-_.`` kept, anything else becomes ``-``."""
    return "".join(c if c.isascii() and (c.isalnum() or c in ":-_.") else "-" for c in label)


def partition_tex(label: str) -> str:
    """A partition's name in LaTeX: ``α=0.1`` → ``$\\alpha=0.1$``, the rest escaped."""
    parts = re.split(r"(α=[0-9.eE+-]+)", label)
    return "".join(rf"$\alpha={p[2:]}$" if p.startswith("α=") else latex_escape(p) for p in parts if p)


def partition_heading(columns: list[tuple[str, str, str]]) -> str:
    """The heading of the partition axis: ``$\\alpha$`` when every partition is Dirichlet's α."""
    return r"$\alpha$" if all(re.fullmatch(r"α=[0-9.eE+-]+", c[1]) for c in columns) else "partition"


def stacked(label: str, width: int = 14) -> str:
    """A header label broken into lines of about ``width`` characters (at spaces), stacked in a
    one-column tabular, so that a metric's column is as wide as its numbers, not its name."""
    lines: list[str] = []
    for word in label.split():
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    if len(lines) < 2:
        return latex_escape(label)
    return r"\begin{tabular}[b]{@{}c@{}}" + r" \\ ".join(latex_escape(line) for line in lines) + r"\end{tabular}"


def _header_lines(table: pd.DataFrame) -> list[str]:
    columns = columns_of(table)
    levels = [lambda c: (c[0],), lambda c: (c[0], c[1])]
    texts = [lambda key: latex_escape(key[0]), lambda key: partition_tex(key[1])]
    if multi_quantity(table):
        levels.append(lambda c: c)
        texts.append(lambda key: stacked(quantity(key[2]).label))
    lines = []
    family = bool(table.attrs.get("families"))  # a Family column after the algorithm's
    for depth, (level, text) in enumerate(zip(levels, texts)):
        start, parts, rules = 3 if family else 2, [], []
        for key, length in spans([level(c) for c in columns]):
            parts.append(rf"\multicolumn{{{length}}}{{c}}{{{text(key)}}}")
            rules.append(rf"\cmidrule(lr){{{start}-{start + length - 1}}}")
            start += length
        last = depth == len(levels) - 1
        ranks = ["Avg. rank", "Rank"] if last else ["", ""]
        labels = ["Algorithm", "Family"] if family else ["Algorithm"]
        lines.append(" & ".join([*(labels if last else [""] * len(labels)), *parts, *ranks]) + r" \\")
        if not last:
            lines.append(" ".join(rules))
    return lines


def _tabular(table: pd.DataFrame) -> list[str]:
    columns = columns_of(table)
    families = family_texts(table, LATEX)
    spec = "ll" if families else "l"
    lines = [r"\begin{tabular}{" + spec + "c" * len(columns) + "cc}", r"\toprule", *_header_lines(table), r"\midrule"]
    lines += [
        " & ".join([row, *([families[i]] if families else []), *cells_]) + r" \\"
        for i, (row, cells_) in enumerate(body_rows(table, LATEX))
    ]
    return lines + [r"\bottomrule", r"\end{tabular}"]


def _transposed(table: pd.DataFrame) -> list[str]:
    rows = body_rows(table, LATEX)
    columns = columns_of(table)
    multi = multi_quantity(table)
    lines = [
        r"\begin{tabular}{l" + "c" * len(rows) + "}",
        r"\toprule",
        " & ".join([f"Dataset, {partition_heading(columns)}", *(row for row, _ in rows)]) + r" \\",
        r"\midrule",
    ]
    families = family_texts(table, LATEX)
    if families:
        lines.append(" & ".join(["Family", *families]) + r" \\")
    for index, column in enumerate(columns):
        label = f"{latex_escape(column[0])}, {partition_tex(column[1])}"
        if multi:
            label += ", " + latex_escape(quantity(column[2]).label)
        lines.append(" & ".join([label, *(texts[index] for _, texts in rows)]) + r" \\")
    lines.append(r"\midrule")
    for offset, name in ((len(columns), "Avg. rank"), (len(columns) + 1, "Rank")):
        lines.append(" & ".join([name, *(texts[offset] for _, texts in rows)]) + r" \\")
    return lines + [r"\bottomrule", r"\end{tabular}"]


def to_latex(table: pd.DataFrame, label: str | None = None, fit: str = "resize") -> str:
    """A ``table`` float: caption (setup, metric, marks), unique label, booktabs ``tabular``."""
    if fit not in FITS:
        raise ValueError(f"fit must be one of {FITS}")
    given = table.attrs.get("caption")
    sentence = given if not given or given.rstrip()[-1:] in ".!?:" else given.rstrip() + "."
    caption = latex_escape(" ".join([sentence, *notes(table)] if given else notes(table)))
    short = latex_escape(caption_text(table))
    short = f"{{{short}}}" if "]" in short else short  # a ] would end the optional argument
    body = _transposed(table) if fit == "transpose" else _tabular(table)
    if fit != "none":  # shrink to \linewidth only when wider
        body = [r"\resizebox{\ifdim\width>\linewidth\linewidth\else\width\fi}{!}{%", *body, "}"]
    lines = [
        r"\begin{table}[t]",
        r"\centering",
        rf"\caption[{short}]{{{caption}}}",
        rf"\label{{{safe_label(label) if label else table_label(table)}}}",
        r"\smallskip",
        *body,
        r"\end{table}",
    ]
    return "\n".join(lines) + "\n"


__all__ = ["FITS", "LATEX", "latex_escape", "rank_text", "table_label", "to_latex"]
