"""A reference scenario's ranking: one short Markdown table, one row per algorithm.

``ranking.md`` (written with the other artifacts, ``report.reference.write_artifacts``) is what a
README or a paper's appendix quotes: the tuned and default rows' personalized accuracy and the
tuned row's new-client accuracy, in %, as mean ± sample std over the finished seeds ("(n seeds)"
when fewer than the protocol's, "—" when none), sorted by the tuned mean (the default's where no
tuned run finished yet), best first. It is computed from ``summary.csv`` alone, so a quoted copy
can be checked against it (the repository's README is, by a test).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import pandas as pd

from pflbench.plugin_sources import declared_method_family
from pflbench.report.families import short_label
from pflbench.report.literature import our_stat, stat_text
from pflbench.report.names import display_name

RANKING_FILE = "ranking.md"
HEADER = (
    "| # | algorithm | family | tuned | default | new clients (tuned) |",
    "| --: | --- | --- | --: | --: | --: |",
)


def ranking_rows(
    summary: pd.DataFrame,
    seeds: int,
    family: Callable[[str], str] = declared_method_family,
    renames: Mapping[str, str] | None = None,
) -> list[tuple[str, ...]]:
    """(rank, name, family, tuned, default, new clients) per algorithm with a finished run,
    best tuned mean first (ties: by algorithm name); ``renames``: names in place of the
    algorithms' display names (a scenario's variants, e.g. FedAvg + LoRA)."""

    def cell(algo: str, setting: str, metric: str) -> str:
        return stat_text(our_stat(summary, algo, setting, metric), seeds, decimals=1, none="—")

    def sort_key(algo: str) -> tuple[float, str]:
        stat = our_stat(summary, algo, "tuned", "pers_acc") or our_stat(summary, algo, "default", "pers_acc")
        return (-stat[0] if stat else 0.0, algo)

    algos = sorted({a for a in summary.loc[summary["status"] == "done", "algo"]}, key=sort_key)
    return [
        (
            str(rank),
            display_name(algo, renames),
            short_label(family(algo)),
            cell(algo, "tuned", "pers_acc"),
            cell(algo, "default", "pers_acc"),
            cell(algo, "tuned", "new_acc"),
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
