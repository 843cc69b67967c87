"""LITERATURE.md from literature.csv and a hand-made summary: paper numbers beside ours (mean ±
std over the finished seeds, "pending" where nothing finished), the not-found and no-FMNIST lists,
and the refusals (bad status, a "read" row without a number, an unknown scenario). Also checks
that the shipped results/reference/literature.csv parses and names only real scenarios."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from pflbench.errors import ConfigError
from pflbench.report.literature import (
    COLUMNS,
    LITERATURE_FILE,
    LITERATURE_MD,
    our_stat,
    read_literature,
    render_literature,
    stat_text,
    write_literature,
)

ROOT = Path(__file__).resolve().parents[2]


def _row(**values: str) -> dict[str, str]:
    row = dict.fromkeys(COLUMNS, "")
    row.update(values)
    return row


def _literature() -> pd.DataFrame:
    paper_a = dict(paper="Paper A", table="Table 1", scenario="tiny", status="read", clients="100", rounds="1000")
    paper_a["source"] = "https://example.org/a"
    return pd.DataFrame(
        [
            _row(
                **paper_a,
                algo="fedavg",
                method="FedAvg",
                metric="global acc",
                value="90",
                std="0.19",
                our_metric="global_acc",
                why_differ="1000 rounds vs 4. Global model.",
            ),
            _row(
                **paper_a,
                algo="local",
                method="Local",
                metric="local acc",
                value="84.87",
                our_metric="pers_acc",
                why_differ="1000 rounds vs 4.",
            ),
            _row(
                **paper_a,
                algo="fedrep",
                method="FedRep",
                metric="local acc",
                value="97.5",
                our_metric="pers_acc",
                why_differ="1000 rounds vs 4.",
            ),
            _row(
                **paper_a,
                algo="",
                method="PFL-FB",
                metric="local acc",
                value="92.84",
                our_metric="pers_acc",
                why_differ="No counterpart.",
            ),
            _row(
                algo="ditto",
                method="Ditto",
                paper="Paper B",
                table="Fashion results",
                status="not found",
                scenario="tiny",
                our_metric="pers_acc",
                clients="500 devices",
                source="https://example.org/b",
                why_differ="Number not read.",
            ),
            _row(algo="fedrep", method="FedRep", paper="Paper C", status="no fmnist", source="https://example.org/c"),
        ],
        columns=list(COLUMNS),
    )


def _summary() -> pd.DataFrame:
    rows = [
        ("fedavg", "tuned", 0, "done", 0.80, 0.79),
        ("fedavg", "tuned", 1, "done", 0.82, 0.81),
        ("fedavg", "tuned", 2, "done", 0.84, 0.83),
        ("fedavg", "default", 0, "failed", float("nan"), float("nan")),
        ("local", "tuned", 0, "done", 0.95, float("nan")),
        ("local", "default", 0, "done", 0.96, float("nan")),
        ("local", "default", 1, "done", 0.94, float("nan")),
    ]
    return pd.DataFrame(rows, columns=["algo", "setting", "seed", "status", "pers_acc", "global_acc"])


def test_our_stat_counts_only_finished_seeds() -> None:
    summary = _summary()
    stat = our_stat(summary, "fedavg", "tuned", "global_acc")
    assert stat is not None
    mean, std, n = stat
    assert (round(mean, 6), round(std, 6), n) == (81.0, 2.0, 3)
    assert our_stat(summary, "fedavg", "default", "global_acc") is None  # only a failed row
    assert our_stat(None, "fedavg", "tuned", "pers_acc") is None
    assert our_stat(summary, "fedavg", "tuned", "no_such_metric") is None
    assert stat_text(our_stat(summary, "local", "tuned", "pers_acc")) == "95.00 (1 seed)"
    assert stat_text(our_stat(summary, "local", "default", "pers_acc")) == "95.00 ± 1.41 (2 seeds)"
    assert stat_text(None) == "pending"


def _cells(text: str, method: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith(f"| {method} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_render_puts_paper_numbers_beside_ours() -> None:
    text = render_literature(_literature(), {"tiny": _summary()})
    assert "## Paper A, beside [tiny](tiny/)" in text
    assert "Their setting: clients: 100; rounds: 1000." in text  # shared by the source's rows: once
    assert "Why they differ: 1000 rounds vs 4." in text  # shared by two rows or more: once
    fedavg = _cells(text, "FedAvg")
    assert fedavg[2:4] == ["90.00 ± 0.19", "`global_acc`"]
    assert fedavg[4:6] == ["81.00 ± 2.00", "pending"]  # tuned: 3 seeds; default: only a failed run
    assert fedavg[6] == "as above. Global model."  # the shared text, and what this row adds
    assert _cells(text, "Local")[2:] == ["84.87", "`pers_acc`", "95.00 (1 seed)", "95.00 ± 1.41 (2 seeds)", "as above."]
    assert _cells(text, "FedRep")[4:6] == ["pending", "pending"]
    assert _cells(text, "PFL-FB (no counterpart)")[4:] == ["—", "—", "No counterpart."]
    assert "Source: https://example.org/a; Table 1." in text
    assert "## Reported on Fashion-MNIST, number not found here" in text
    ditto = next(line for line in text.splitlines() if line.startswith("- **Ditto"))
    assert "clients: 500 devices" in ditto and "tuned pending, default pending" in ditto
    assert "## No Fashion-MNIST in the paper's experiments" in text
    assert any(line.startswith("- **FedRep**, Paper C") for line in text.splitlines())


def test_rows_with_different_settings_each_say_their_own() -> None:
    literature = _literature()
    literature.loc[1, "clients"] = "50"
    text = render_literature(literature, {"tiny": _summary()})
    assert "Their setting: rounds: 1000." in text  # still shared: once above the table
    assert _cells(text, "Local")[6] == "Their setting: clients: 50. as above."
    assert _cells(text, "FedAvg")[6] == "Their setting: clients: 100. as above. Global model."


def test_render_without_any_summary_is_all_pending() -> None:
    text = render_literature(_literature(), {})
    assert _cells(text, "Local")[4:6] == ["pending", "pending"]


def _reference(tmp_path: Path, literature: pd.DataFrame) -> Path:
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "scenario.toml").write_text('name = "tiny"\n')
    _summary().to_csv(tmp_path / "tiny" / "summary.csv", index=False)
    literature.to_csv(tmp_path / LITERATURE_FILE, index=False)
    return tmp_path


def test_write_literature_reads_the_scenario_summaries(tmp_path: Path) -> None:
    root = _reference(tmp_path, _literature())
    out = write_literature(root)
    assert out == root / LITERATURE_MD
    assert "81.00 ± 2.00" in out.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"status": "maybe"}, "status 'maybe' is not one of: read, not found, no fmnist"),
        ({"value": ""}, "status 'read' needs a number in 'value'"),
        ({"value": "about 90"}, "status 'read' needs a number in 'value'"),
        ({"std": "n/a"}, "'std' must be a number or empty"),
        ({"scenario": "fmnist-dir9"}, "scenario 'fmnist-dir9' is not one of: tiny"),
    ],
)
def test_bad_rows_are_one_clear_error_and_nothing_written(tmp_path: Path, change: dict, message: str) -> None:
    literature = _literature()
    for column, value in change.items():
        literature.loc[0, column] = value
    root = _reference(tmp_path, literature)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        write_literature(root)
    assert not (root / LITERATURE_MD).exists()


def test_missing_column_is_named(tmp_path: Path) -> None:
    root = _reference(tmp_path, _literature().drop(columns=["why_differ"]))
    with pytest.raises(ConfigError, match="missing column\\(s\\) why_differ"):
        write_literature(root)


def test_shipped_literature_csv_parses_and_names_real_scenarios() -> None:
    reference = ROOT / "results" / "reference"
    literature = read_literature(reference / LITERATURE_FILE)
    scenarios = {p.parent.name for p in reference.glob("*/scenario.toml")}
    assert set(literature["scenario"]) - {""} <= scenarios
    assert (literature["status"] == "read").any()
    assert all(literature["source"].str.len() > 0)
