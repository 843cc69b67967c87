"""A reference scenario's ranking: one short Markdown table, one row per algorithm.

``ranking.md`` (written with the other artifacts, ``report.reference.write_artifacts``) is what a
README or a paper's appendix quotes: the tuned and default rows' personalized accuracy and the
tuned row's new-client accuracy, in %, as mean ± sample std over the finished seeds ("(n seeds)"
when fewer than the protocol's, "—" when none), sorted by the tuned mean (the default's where no
tuned run finished yet), best first. It is computed from ``summary.csv`` alone, so a quoted copy
can be checked against it (the repository's README is, by a test).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence

import pandas as pd

from pflbench.plugin_sources import declared_method_family
from pflbench.report.families import short_label
from pflbench.report.names import display_name

RANKING_FILE = "ranking.md"
HEADER = (
    "| # | algorithm | family | tuned | default | new clients (tuned) |",
    "| --: | --- | --- | --: | --: | --: |",
)


def mean_std_cell(values: Sequence[float], seeds: int) -> str:
    """``values`` (fractions) as "mean ± sample std" in % with one decimal; fewer than ``seeds``
    values are marked with their count; one value has no std; none is "—"."""
    if not values:
        return "—"
    percent = [100 * v for v in values]
    text = (
        f"{percent[0]:.1f}"
        if len(percent) == 1
        else f"{statistics.mean(percent):.1f} ± {statistics.stdev(percent):.1f}"
    )
    return text if len(percent) >= seeds else f"{text} ({len(percent)} seed{'s' if len(percent) > 1 else ''})"


def _finished(summary: pd.DataFrame, algo: str, setting: str, metric: str) -> list[float]:
    rows = summary[(summary["algo"] == algo) & (summary["setting"] == setting) & (summary["status"] == "done")]
    return [float(v) for v in rows[metric] if not (isinstance(v, float) and math.isnan(v))]


def ranking_rows(
    summary: pd.DataFrame, seeds: int, family: Callable[[str], str] = declared_method_family
) -> list[tuple[str, ...]]:
    """(rank, name, family, tuned, default, new clients) per algorithm with a finished run,
    best tuned mean first (ties: by algorithm name)."""

    def sort_key(algo: str) -> tuple[float, str]:
        accuracy = _finished(summary, algo, "tuned", "pers_acc") or _finished(summary, algo, "default", "pers_acc")
        return (-statistics.mean(accuracy), algo)

    algos = sorted({a for a in summary.loc[summary["status"] == "done", "algo"]}, key=sort_key)
    return [
        (
            str(rank),
            display_name(algo),
            short_label(family(algo)),
            mean_std_cell(_finished(summary, algo, "tuned", "pers_acc"), seeds),
            mean_std_cell(_finished(summary, algo, "default", "pers_acc"), seeds),
            mean_std_cell(_finished(summary, algo, "tuned", "new_acc"), seeds),
        )
        for rank, algo in enumerate(algos, 1)
    ]


def ranking_markdown(rows: Iterable[tuple[str, ...]]) -> str:
    """The rows as the Markdown table ``ranking.md`` holds (header, alignment, one line each)."""
    return "\n".join([*HEADER, *("| " + " | ".join(row) + " |" for row in rows)]) + "\n"


def marked_block(text: str, marker: str) -> str:
    """What ``text`` holds between ``<!-- marker -->`` and ``<!-- /marker -->`` (each on its own
    line), as quoted copies of a ranking are marked."""
    start, end = f"<!-- {marker} -->\n", f"<!-- /{marker} -->"
    if start not in text or end not in text:
        raise ValueError(f"no block marked {start.strip()} … {end}")
    return text[text.index(start) + len(start) : text.index(end)]


def replace_marked_block(text: str, marker: str, block: str) -> str:
    """``text`` with the block between the markers replaced by ``block``."""
    old = marked_block(text, marker)
    start = text.index(f"<!-- {marker} -->\n") + len(f"<!-- {marker} -->\n")
    return text[:start] + block + text[start + len(old) :]
