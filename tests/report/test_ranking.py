"""``ranking.md``: the short per-algorithm table of a reference scenario, by hand, and the README's
copy of the Dir(0.1) one checked against the shipped file (so its numbers are generated, not typed)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from pflbench.report.ranking import (
    RANKING_FILE,
    marked_block,
    ranking_markdown,
    ranking_rows,
    replace_marked_block,
)

ROOT = Path(__file__).resolve().parents[2]


def test_cells_by_hand() -> None:
    summary = pd.DataFrame(
        {
            "algo": ["a"] * 3 + ["b"] * 2,
            "setting": ["tuned"] * 5,
            "status": ["done"] * 5,
            "pers_acc": [0.90, 0.92, 0.97, 0.90, 0.92],
            "new_acc": [float("nan")] * 5,
        }
    )
    rows = {row[1]: row for row in ranking_rows(summary, 3, family=lambda algo: "global")}
    # a: (90, 92, 97) → mean 93.0, sample std sqrt(((−3)² + (−1)² + 4²)/2) = sqrt(13) = 3.6
    assert rows["a"][3] == "93.0 ± 3.6"
    assert rows["b"][3] == "91.0 ± 1.4 (2 seeds)"  # fewer seeds than the protocol's: marked
    assert rows["a"][4] == "—" and rows["a"][5] == "—"  # no default row, no new-client values


def _summary() -> pd.DataFrame:
    rows = []
    for algo, setting, seed, acc, new in [
        ("fedavg", "default", 0, 0.80, 0.90),
        ("fedavg", "tuned", 0, 0.82, 0.91),
        ("fedper", "default", 0, 0.95, 0.85),
        ("fedper", "tuned", 0, 0.93, 0.84),
        ("local", "default", 0, 0.96, float("nan")),
    ]:
        rows.append({"algo": algo, "setting": setting, "seed": seed, "status": "done", "pers_acc": acc, "new_acc": new})
    rows.append(
        {"algo": "fedper", "setting": "tuned", "seed": 1, "status": "diverged", "pers_acc": None, "new_acc": None}
    )
    rows.append(
        {"algo": "ditto", "setting": "default", "seed": 0, "status": "missing", "pers_acc": None, "new_acc": None}
    )
    return pd.DataFrame(rows)


def test_ranking_sorts_by_the_tuned_mean_else_the_default_and_skips_unfinished_algorithms() -> None:
    families = {"fedavg": "global", "fedper": "decoupling", "local": "local"}
    rows = ranking_rows(_summary(), 1, family=families.__getitem__)
    # local has no tuned run: ranked by its default 96; fedper by its tuned 93 (not its default
    # 95); ditto finished nothing: no row; the diverged seed does not count
    assert rows == [
        ("1", "Local", "local only", "—", "96.0", "—"),
        ("2", "FedPer", "decoupling", "93.0", "95.0", "84.0"),
        ("3", "FedAvg", "global model", "82.0", "80.0", "91.0"),
    ]
    text = ranking_markdown(rows)
    assert text.splitlines()[2] == "| 1 | Local | local only | — | 96.0 | — |"
    assert text.endswith("| 3 | FedAvg | global model | 82.0 | 80.0 | 91.0 |\n")


def test_marked_blocks_are_read_and_replaced() -> None:
    text = "a\n<!-- t -->\nold\n<!-- /t -->\nb\n"
    assert marked_block(text, "t") == "old\n"
    assert replace_marked_block(text, "t", "new\nrows\n") == "a\n<!-- t -->\nnew\nrows\n<!-- /t -->\nb\n"
    with pytest.raises(ValueError, match="no block marked"):
        marked_block(text, "other")


def test_the_readme_table_is_the_shipped_dir01_ranking() -> None:
    """The README quotes results/reference/fmnist-dir0.1/ranking.md between its markers; after
    the artifacts change, copy it again (``replace_marked_block``)."""
    shipped = ROOT / "results" / "reference" / "fmnist-dir0.1" / RANKING_FILE
    quoted = marked_block((ROOT / "README.md").read_text(), "reference-table")
    assert quoted == shipped.read_text(), f"README's reference table is not {shipped}: {QUOTE}"


QUOTE = (
    'python -c "from pathlib import Path; from pflbench.report.ranking import replace_marked_block as r; '
    "p = Path('README.md'); p.write_text(r(p.read_text(), 'reference-table', "
    "Path('results/reference/fmnist-dir0.1/ranking.md').read_text()))\""
)


def test_each_shipped_ranking_is_generated_from_the_shipped_summary() -> None:
    from pflbench.config.reference import read_scenario, scenario_folders
    from pflbench.report.reference import variant_names

    folders = [f for f in scenario_folders(ROOT / "results" / "reference") if (f / RANKING_FILE).is_file()]
    assert {f.name for f in folders} >= {"fmnist-dir0.1", "fmnist-lora-dir0.1"}
    for folder in folders:
        summary = pd.read_csv(folder / "summary.csv")
        rows = ranking_rows(summary, 3, renames=variant_names(read_scenario(folder)))
        assert (folder / RANKING_FILE).read_text() == ranking_markdown(rows), folder.name


def test_a_scenarios_variants_are_named_as_such(tmp_path: Path) -> None:
    from pflbench.config.reference import read_scenario
    from pflbench.report.reference import variant_names

    text = (ROOT / "results" / "reference" / "fmnist-lora-dir0.1" / "scenario.toml").read_text()
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "scenario.toml").write_text(text + "\n[algo_options.fedprox]\nmu = 0.1\nlora_rank = 4\n")
    assert variant_names(read_scenario(tmp_path / "s"))["fedprox"] == "FedProx + LoRA (mu=0.1)"

    lora = read_scenario(ROOT / "results" / "reference" / "fmnist-lora-dir0.1")
    assert variant_names(lora) == {"fedavg": "FedAvg + LoRA", "fedper": "FedPer + LoRA"}
    assert variant_names(read_scenario(ROOT / "results" / "reference" / "fmnist-dir0.1")) == {}
    ranking = (ROOT / "results" / "reference" / "fmnist-lora-dir0.1" / RANKING_FILE).read_text()
    assert "| FedAvg + LoRA |" in ranking and "| FedAvg |" not in ranking
