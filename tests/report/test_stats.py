"""Statistics of the leaderboard: hand-computed t and Wilcoxon values, cross-checked with SciPy
where it is installed, and a constructed results folder whose significance marks are known."""

from __future__ import annotations

import math
from io import StringIO
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from pflbench.cli import cli
from pflbench.report import stats
from pflbench.report.leaderboard import cells, pivot, row_ranks
from pflbench.report.render import to_csv, to_markdown
from pflbench.store.reader import load_runs


def _sibling(name: str):
    """A module next to this file (tests run with --import-mode=importlib, so no plain import)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


helpers = _sibling("test_leaderboard")
helpers.MB_PER_ROUND.setdefault("fedrep", 0.5)
write_run = helpers.write_run  # a finished run folder as the runner writes it

# t_(0.975, df) from printed tables: the two-sided p of these is 0.05
T_TABLE = {1: 12.706, 2: 4.303, 4: 2.776, 5: 2.571, 9: 2.262, 10: 2.228, 30: 2.042}


@pytest.mark.parametrize("df, t", sorted(T_TABLE.items()))
def test_t_distribution_matches_printed_tables(df: int, t: float) -> None:
    assert stats.t_two_sided_p(t, df) == pytest.approx(0.05, abs=2e-4)
    assert stats.t_quantile(0.975, df) == pytest.approx(t, abs=1e-3)


def test_t_closed_forms_for_one_and_two_degrees_of_freedom() -> None:
    # df = 1 (Cauchy): p = 1 − (2/π)·atan|t|; df = 2: p = 1 − |t|/√(t² + 2)
    assert stats.t_two_sided_p(9.0, 1) == pytest.approx(1 - 2 / math.pi * math.atan(9.0))
    assert stats.t_two_sided_p(-3.0, 2) == pytest.approx(1 - 3 / math.sqrt(11))
    assert stats.t_two_sided_p(0.0, 7) == 1.0 and stats.t_two_sided_p(math.inf, 3) == 0.0


def test_paired_t_test_by_hand() -> None:
    # d = (-10, -9, -8): mean −9, s_d = 1, t = −9/(1/√3) = −9√3, df = 2
    t, p = stats.paired_t_test([80, 82, 84], [90, 91, 92])
    assert t == pytest.approx(-9 * math.sqrt(3))
    assert p == pytest.approx(1 - 9 * math.sqrt(3) / math.sqrt(243 + 2))
    assert stats.paired_t_test([1, 2, 3], [1, 2, 3]) == (0.0, 1.0)  # no difference at all
    assert stats.paired_t_test([2, 3, 4], [1, 2, 3]) == (math.inf, 0.0)  # constant difference
    with pytest.raises(ValueError):
        stats.paired_t_test([1.0], [2.0])


def test_wilcoxon_exact_by_hand() -> None:
    # 3 positive differences: W+ = 6 is the most extreme of 2^3 sign patterns, p = 2/8
    assert stats.wilcoxon_signed_rank([1, 2, 3], [0, 0, 0]) == (6.0, 0.25)
    assert stats.wilcoxon_signed_rank([1, 2, 3, 4, 5, 6], [0] * 6) == (21.0, 2 / 64)
    # d = (1, 1, 2, −3): ranks 1.5, 1.5, 3, 4; W+ = 6; W+ ≥ 6 in 6 of the 16 patterns
    # ({1.5,1.5,3}, {3,4}, {1.5,1.5,4}, {1.5,3,4} twice, all), so p = 2·6/16
    w, p = stats.wilcoxon_signed_rank([1, 1, 2, -3], [0, 0, 0, 0])
    assert w == 6.0 and p == 0.75
    # zero differences are dropped: d = (0, 2, 3) → n = 2, W+ = 3 of max 3, p = 2/4
    assert stats.wilcoxon_signed_rank([5, 2, 3], [5, 0, 0]) == (3.0, 0.5)
    assert stats.wilcoxon_signed_rank([1, 2], [1, 2]) == (0.0, 1.0)


def test_spread_std_and_ci95() -> None:
    assert stats.spread([1.0, 2.0, 3.0]) == pytest.approx(1.0)
    assert stats.spread([1.0, 2.0, 3.0], "ci95") == pytest.approx(4.302653 / math.sqrt(3), abs=1e-5)
    assert stats.spread([1.0]) is None and stats.spread([1.0], "ci95") is None


def test_absurd_values_give_inf_or_no_test_never_an_exception() -> None:
    assert stats.sample_std([1e308, -1e308]) == math.inf
    assert stats.paired_p_value({0: 1e308, 1: -1e308}, {0: -1e308, 1: 1e308}, "ttest") == (None, 2)


def test_average_ranks_share_ties() -> None:
    assert stats.average_ranks([3, 1, 2, 2]) == [1.0, 4.0, 2.5, 2.5]
    assert stats.average_ranks([3, 1, 2], higher_is_better=False) == [3.0, 1.0, 2.0]


def test_paired_p_value_pairs_common_seeds_only() -> None:
    assert stats.paired_p_value({0: 1.0}, {0: 0.5, 1: 0.2}, "ttest") == (None, 1)
    assert stats.paired_p_value({0: 3.0, 1: 4.0, 2: 9.0}, {1: 3.0, 2: 7.0, 5: 0.0}, "ttest")[1] == 2
    assert stats.paired_p_value({0: 1.0, 1: 2.0}, {0: 0.0, 1: 0.0}, "none") == (None, 2)


def test_against_scipy() -> None:
    scipy_stats = pytest.importorskip("scipy.stats")
    a = [0.81, 0.79, 0.86, 0.90, 0.77, 0.84, 0.80]
    b = [0.78, 0.80, 0.81, 0.85, 0.76, 0.80, 0.79]
    t, p = stats.paired_t_test(a, b)
    reference = scipy_stats.ttest_rel(a, b)
    assert t == pytest.approx(reference.statistic) and p == pytest.approx(reference.pvalue)
    differences = [1.5, -0.5, 2.5, 3.0, 4.5, -1.0, 6.0, 2.0]
    w, p = stats.wilcoxon_signed_rank(differences, [0.0] * 8)
    reference = scipy_stats.wilcoxon(differences, method="exact")
    assert p == pytest.approx(reference.pvalue)
    assert w == sum(r for r, d in zip(stats.average_ranks([abs(d) for d in differences], False), differences) if d > 0)
    for df in (1, 2, 3, 6, 11):
        assert stats.t_quantile(0.975, df) == pytest.approx(scipy_stats.t.ppf(0.975, df), rel=1e-9)


# Known outcome per seed (pers_acc): A best; B noisy, not significantly worse (paired t, p ≈ 0.50);
# C consistently worse (p ≈ 0.001, but Wilcoxon with 3 seeds cannot go below p = 0.25); D one seed.
CONSTRUCTED = {
    "fedavg": [0.90, 0.80, 0.85],
    "fedper": [0.88, 0.82, 0.80],
    "fedprox": [0.80, 0.70, 0.76],
    "fedrep": [0.50],
}


@pytest.fixture(scope="module")
def constructed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("constructed")
    for algo, finals in CONSTRUCTED.items():
        for seed, final in enumerate(finals):
            write_run(out, algo, 0.5, seed, final, None)
    return out


def column(table: pd.DataFrame) -> dict:
    return {row: cell for (row, _), cell in cells(table).items()}


def test_paired_t_marks_known_outcome(constructed: Path) -> None:
    table = pivot(load_runs(constructed))
    marks = column(table)
    assert marks["FedAvg"].best and marks["FedAvg"].tied is None
    # B: d = (2, −2, 5) points; mean 5/3, s_d = √(37/3); t = (5/3)/(s_d/√3) = 0.8220
    t = (5 / 3) / (math.sqrt(37 / 3) / math.sqrt(3))
    assert marks["FedPer"].p == pytest.approx(1 - t / math.sqrt(t * t + 2)) and marks["FedPer"].tied
    assert marks["FedProx"].p < 0.01 and marks["FedProx"].tied is False
    assert marks["FedRep"].tied is None and marks["FedRep"].pairs == 1  # n < 2: not tested
    text = to_markdown(table)
    assert "| FedAvg | **85.00 ± 5.00** |" in text
    assert "| FedPer | <ins>83.33 ± 4.16</ins> |" in text
    assert "| FedProx | 75.33 ± 5.03 |" in text and "| FedRep | 50.00 †n=1 |" in text
    assert "paired two-sided t-test" in text and "1 entry is not tested" in text


def test_wilcoxon_and_no_test(constructed: Path) -> None:
    frame = load_runs(constructed)
    marks = column(pivot(frame, test="wilcoxon"))
    assert marks["FedProx"].p == pytest.approx(0.25) and marks["FedProx"].tied  # 3 pairs: p ≥ 0.25
    assert marks["FedPer"].tied
    marks = column(pivot(frame, test="none"))
    assert all(cell.tied is None for cell in marks.values())
    assert "Underlined" not in to_markdown(pivot(frame, test="none"))
    assert column(pivot(frame, level=0.6))["FedPer"].tied is False  # p ≈ 0.50 < 0.6


def test_ci95_and_show_n(constructed: Path) -> None:
    table = pivot(load_runs(constructed), interval="ci95", show_n=True)
    cell = column(table)["FedAvg"]
    assert cell.std == pytest.approx(4.302653 * 5.0 / math.sqrt(3), rel=1e-5)
    text = to_markdown(table)
    assert "| FedAvg | **85.00 ± 12.42** n=3 |" in text and "95% confidence interval" in text


def test_ranks_and_csv(constructed: Path, tmp_path: Path) -> None:
    write_run(tmp_path, "fedavg", 0.1, 0, 0.5, None)
    write_run(tmp_path, "fedper", 0.1, 0, 0.9, None)
    write_run(tmp_path, "fedprox", 0.1, 0, 0.5, None)
    table = pivot(load_runs([constructed, tmp_path]))
    # α=0.1: FedPer 1, FedAvg and FedProx tie at 2.5; α=0.5: FedAvg 1, FedPer 2, FedProx 3, FedRep 4
    ranks = row_ranks(table)
    assert ranks["FedAvg"] == (pytest.approx(1.75), 2.0) and ranks["FedPer"] == (pytest.approx(1.5), 1.0)
    assert ranks["FedProx"] == (pytest.approx(2.75), 3.0) and ranks["FedRep"] == (4.0, 4.0)
    rows = pd.read_csv(StringIO(to_csv(table)))
    fedper = rows[(rows["algorithm"] == "FedPer") & (rows["partition"] == "α=0.5")].iloc[0]
    assert fedper["rank"] == 2 and bool(fedper["tied"]) and fedper["pairs"] == 3 and fedper["avg_rank"] == 1.5


def test_cli_statistics_options(constructed: Path) -> None:
    result = CliRunner().invoke(
        cli,
        [
            "leaderboard",
            str(constructed),
            "--test",
            "wilcoxon",
            "--interval",
            "ci95",
            "--show-n",
            "--rename",
            "fedprox=FedProx (ours)",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "| <ins>75.33 ± 12.50</ins> n=3 |" in result.output and "FedProx (ours)" in result.output
    assert "Wilcoxon signed-rank" in result.output
    for bad in (["--level", "1.5"], ["--test", "anova"], ["--rename", "fedavg"]):
        result = CliRunner().invoke(cli, ["leaderboard", str(constructed), *bad])
        assert result.exit_code == 2 and result.output.startswith("Error:"), result.output
