"""Fashion-MNIST numbers from the papers beside the reference's own (``LITERATURE.md``).

The numbers a paper reports are data, not code: ``results/reference/literature.csv`` holds one
row per number read in a paper or its authors' repository, with the protocol it was measured
under, its source and a short "why they differ" written by hand. This module only renders that
file beside the matching scenario's ``summary.csv`` (tuned and default rows, mean ± std over the
finished seeds), so the comparison regenerates whenever the reference does:

    write_literature("results/reference")   # reads literature.csv, writes LITERATURE.md

A row whose scenario has no finished run of its algorithm yet says "pending"; a paper that
reports Fashion-MNIST but whose number could not be read is listed as "not found" (never a
guessed number); a paper whose experiments use no Fashion-MNIST is listed as such. Nothing here
runs anything: the render is a pure function of the two tables.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from pflbench.errors import ConfigError
from pflbench.report.names import display_name
from pflbench.util.atomic import atomic_write_text

LITERATURE_FILE = "literature.csv"
LITERATURE_MD = "LITERATURE.md"
SUMMARY_FILE = "summary.csv"
COLUMNS = (
    "algo",
    "method",
    "paper",
    "table",
    "metric",
    "value",
    "std",
    "status",
    "scenario",
    "our_metric",
    "clients",
    "participation",
    "partition",
    "model",
    "rounds",
    "local_epochs",
    "data_per_client",
    "test_split",
    "seeds",
    "source",
    "why_differ",
)
READ, NOT_FOUND, NO_FMNIST = "read", "not found", "no fmnist"
STATUSES = (READ, NOT_FOUND, NO_FMNIST)
SETTINGS = ("tuned", "default")
PENDING = "pending"
SETTING_LABELS = {  # protocol columns → how a reader sees them, in this order
    "clients": "clients",
    "participation": "participation",
    "partition": "partition",
    "model": "model",
    "rounds": "rounds",
    "local_epochs": "local training",
    "data_per_client": "data per client",
    "test_split": "test",
    "seeds": "seeds",
}


def read_literature(path: str | Path) -> pd.DataFrame:
    """``literature.csv`` as strings (empty cells ""), checked: every column present, a known
    status, and a number for every row whose status says it was read."""
    path = Path(path)
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (OSError, pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not a readable CSV ({exc})") from exc
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise ConfigError(f"{path}: missing column(s) {', '.join(missing)}; expected: {', '.join(COLUMNS)}")
    for line, row in enumerate(frame.itertuples(index=False), start=2):
        if row.status not in STATUSES:
            raise ConfigError(f"{path} line {line}: status {row.status!r} is not one of: {', '.join(STATUSES)}")
        if row.status == READ and not _is_number(row.value):
            raise ConfigError(f"{path} line {line}: status 'read' needs a number in 'value', got {row.value!r}")
        if row.std and not _is_number(row.std):
            raise ConfigError(f"{path} line {line}: 'std' must be a number or empty, got {row.std!r}")
        if row.status == READ and not (row.scenario and row.our_metric):
            raise ConfigError(f"{path} line {line}: status 'read' needs a 'scenario' and an 'our_metric'")
    return frame


def our_stat(summary: pd.DataFrame | None, algo: str, setting: str, metric: str) -> tuple[float, float, int] | None:
    """Mean, sample std (ddof 1; NaN for one seed) and seed count of ``metric`` × 100 over the
    finished (``status == "done"``) rows of ``algo`` × ``setting`` in a scenario's summary;
    None when there is none yet."""
    if summary is None or not algo or metric not in summary.columns:
        return None
    rows = summary[(summary["algo"] == algo) & (summary["setting"] == setting)]
    if "status" in summary.columns:
        rows = rows[rows["status"] == "done"]
    values = pd.to_numeric(rows[metric], errors="coerce").dropna() * 100.0
    if values.empty:
        return None
    std = float(values.std(ddof=1)) if len(values) > 1 else math.nan
    return float(values.mean()), std, len(values)


def stat_text(stat: tuple[float, float, int] | None, seeds: int = 3, decimals: int = 2, none: str = PENDING) -> str:
    """``"95.67 ± 0.68"`` (``decimals`` places); the seed count is written when it is not the
    protocol's ``seeds``; ``none`` when there is no finished seed."""
    if stat is None:
        return none
    mean, std, n = stat
    text = f"{mean:.{decimals}f}" if math.isnan(std) else f"{mean:.{decimals}f} ± {std:.{decimals}f}"
    return text if n == seeds else f"{text} ({n} seed{'s' if n != 1 else ''})"


def render_literature(literature: pd.DataFrame, summaries: Mapping[str, pd.DataFrame | None]) -> str:
    """Markdown: per source and scenario, the numbers read beside ours (tuned, default), with the
    source's setting and the differences shared by its rows written once above its table; then
    the papers whose Fashion-MNIST number was not found, then those without Fashion-MNIST.
    ``summaries`` maps a scenario name to its ``summary.csv`` (None or absent: nothing finished)."""
    lines = [
        "# Against the literature: Fashion-MNIST numbers beside the reference",
        "",
        f"Generated from [`{LITERATURE_FILE}`]({LITERATURE_FILE}) and each scenario's `{SUMMARY_FILE}` by",
        "`pflbench.report.literature.write_literature`; edit the CSV, not this file. *Theirs* is the",
        "number printed in the paper or its authors' repository (the source named under each table);",
        "*ours* is the mean ± std over the finished seeds (the protocol: 3) of the metric named, in %,",
        f'for the tuned and the default row; "{PENDING}" until that scenario\'s runs finish. No number',
        "here was estimated: one that could not be read is listed as not found.",
    ]
    read = literature[literature["status"] == READ]
    for (paper, source, scenario), group in read.groupby(["paper", "source", "scenario"], sort=False):
        shared = [f for f in SETTING_LABELS if group[f].nunique() == 1]  # said once, above the table
        own = [f for f in SETTING_LABELS if f not in shared]  # said per row
        shared_setting = _setting(group.iloc[0], shared)
        shared_why = group["why_differ"].mode().iloc[0] if (group["why_differ"].value_counts() > 1).any() else ""
        lines += ["", f"## {paper}, beside [{scenario}]({scenario}/)"]
        if shared_setting:
            lines += ["", f"Their setting: {shared_setting}."]
        if shared_why:
            lines += ["", f"Why they differ: {shared_why}"]
        lines += [
            "",
            "| method (ours) | their metric | theirs | ours | ours tuned | ours default | why they differ |",
            "| --- | --- | ---: | --- | ---: | ---: | --- |",
        ]
        for row in group.itertuples(index=False):
            ours = _ours(summaries, row) if row.algo else ["—", "—"]
            why = row.why_differ
            if shared_why and why.startswith(shared_why):  # the shared text, and what this row adds
                why = ("as above. " + why[len(shared_why) :].strip()).strip()
            if own and _setting(row, own):  # where the rows' settings differ, each says its own
                why = f"Their setting: {_setting(row, own)}. {why}"
            theirs = f"{float(row.value):.2f}" + (f" ± {float(row.std):.2f}" if row.std else "")
            cells = [_method(row.method, row.algo), row.metric, theirs, f"`{row.our_metric}`", *ours, why]
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        lines += ["", f"Source: {source}; {group['table'].iloc[0]}."]
    missing = literature[literature["status"] == NOT_FOUND]
    if not missing.empty:
        lines += ["", "## Reported on Fashion-MNIST, number not found here", ""]
        for row in missing.itertuples(index=False):
            beside = ""
            if row.algo and row.scenario and row.our_metric:
                tuned, default = _ours(summaries, row)
                beside = f" Ours on {row.scenario} (`{row.our_metric}`): tuned {tuned}, default {default}."
            lines.append(
                f"- **{_method(row.method, row.algo)}**, {row.paper} ({row.table}). Setting as read: {_setting(row)}."
                f"{beside} {row.why_differ} Source: {row.source}."
            )
    absent = literature[literature["status"] == NO_FMNIST]
    if not absent.empty:
        lines += ["", "## No Fashion-MNIST in the paper's experiments", ""]
        for row in absent.itertuples(index=False):
            lines.append(f"- **{_method(row.method, row.algo)}**, {row.paper}. Source: {row.source}.")
    return "\n".join(lines) + "\n"


def write_literature(reference_dir: str | Path = "results/reference") -> Path:
    """Render ``<reference_dir>/literature.csv`` beside each named scenario's ``summary.csv``
    into ``<reference_dir>/LITERATURE.md``; returns its path. A scenario the CSV names that is no
    folder with a ``scenario.toml`` is one ``ConfigError`` naming it and the valid ones."""
    root = Path(reference_dir)
    literature = read_literature(root / LITERATURE_FILE)
    known = sorted(p.parent.name for p in root.glob("*/scenario.toml"))
    summaries: dict[str, pd.DataFrame | None] = {}
    for scenario in sorted({s for s in literature["scenario"] if s}):
        if scenario not in known:
            raise ConfigError(
                f"{root / LITERATURE_FILE}: scenario {scenario!r} is not one of: {', '.join(known) or '(none)'}"
            )
        path = root / scenario / SUMMARY_FILE
        summaries[scenario] = pd.read_csv(path) if path.is_file() else None
    out = root / LITERATURE_MD
    atomic_write_text(out, render_literature(literature, summaries))
    return out


def _ours(summaries: Mapping[str, pd.DataFrame | None], row: Any) -> list[str]:
    """Our tuned and default text for a literature row (its scenario, algorithm and metric)."""
    summary = summaries.get(row.scenario)
    return [stat_text(our_stat(summary, row.algo, setting, row.our_metric)) for setting in SETTINGS]


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def _method(method: str, algo: str) -> str:
    """The paper's name for the method, with ours when it differs (or "no counterpart")."""
    if not algo:
        return f"{method} (no counterpart)"
    ours = display_name(algo)
    return method if ours == method else f"{method} ({ours})"


def _setting(row: Any, fields: Iterable[str] = tuple(SETTING_LABELS)) -> str:
    """The protocol columns of a literature row named in ``fields``, as one readable line."""
    return "; ".join(f"{SETTING_LABELS[name]}: {getattr(row, name)}" for name in fields if getattr(row, name))


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")
