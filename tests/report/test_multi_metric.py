"""Multi-metric leaderboards on run folders with hand-computed numbers: several metrics per
(dataset, partition), each metric's direction, rounds and MB to a target (absolute, relative,
lower-is-better), ties for best, significance marks only with ≥ 3 paired seeds, precision,
row order, caption, CSV/HTML/LaTeX (compiled when a TeX engine is installed)."""

from __future__ import annotations

import math
import shutil
import subprocess
from io import StringIO
from pathlib import Path

import pandas as pd
import pytest

from pflbench.errors import ConfigError
from pflbench.report.latex import to_latex
from pflbench.report.leaderboard import cells, pivot, row_ranks
from pflbench.report.names import quantity
from pflbench.report.render import to_csv, to_html, to_markdown
from pflbench.report.targets import Target, first_reach, parse_target, thresholds
from pflbench.store.reader import load_runs


def _sibling(name: str):
    """A module next to this file (tests run with --import-mode=importlib, so no plain import)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_run = _sibling("fake_runs").make_run

# (algo, alpha) → per seed: pers_acc at the evaluation rounds 2 and 4 (rounds 1 and 3 not evaluated)
CURVES = {
    ("fedavg", 0.1): [(0.50, 0.70), (0.60, 0.72), (0.55, 0.74)],
    ("fedper", 0.1): [(0.80, 0.90), (0.85, 0.91), (0.70, 0.92)],
    ("fedprox", 0.1): [(0.60, 0.89), (0.70, 0.915), (0.80, 0.905)],
    ("fedavg", 1.0): [(0.60, 0.70)] * 3,
    ("fedper", 1.0): [(0.60, 0.69), (0.60, 0.70), (0.60, 0.71)],
    ("fedprox", 1.0): [(0.60, 0.60), (0.60, 0.61), (0.60, 0.62)],
}
MB_PER_ROUND = {"fedavg": 1.0, "fedper": 0.5, "fedprox": 1.0}  # each way
STD = {"fedavg": (0.10, 0.11, 0.12), "fedper": (0.05, 0.06, 0.07), "fedprox": (0.08, 0.08, 0.08)}
MEMORY = {"fedavg": 100.0, "fedper": 90.0, "fedprox": 110.0}
A01, A1 = ("digits", "α=0.1"), ("digits", "α=1")


def write_results(out: Path) -> Path:
    for (algo, alpha), seeds in CURVES.items():
        for seed, (early, final) in enumerate(seeds):
            summary = {
                "pers_acc_std": STD[algo][seed],
                "val_pers_acc": final - 0.01,
                "new_acc": 0.5,
                "peak_mem_mb": MEMORY[algo],
                "gate_frac": 0.3,
            }
            make_run(
                out,
                algo,
                seed,
                [None, early, None, final],
                alpha=alpha,
                mb_per_round=MB_PER_ROUND[algo],
                summary=summary,
            )
    return out


@pytest.fixture(scope="module")
def frame(tmp_path_factory: pytest.TempPathFactory) -> pd.DataFrame:
    return load_runs(write_results(tmp_path_factory.mktemp("multi")))


def cell(table: pd.DataFrame, row: str, group: tuple[str, str], quantity_: str):
    return cells(table)[row, (*group, quantity_)]


def test_first_reach_counts_only_evaluated_rounds() -> None:
    assert first_reach([1, 2, 3, 4], [None, 0.80, None, 0.9], 0.8, True) == 2  # ≥, at the first evaluation
    assert first_reach([1, 2, 3, 4], [None, 0.79, None, 0.9], 0.8, True) == 4
    assert first_reach([1, 2], [0.5, 0.7], 0.8, True) is None
    assert first_reach([1, 2, 3], [1.0, 0.5, 0.25], 0.5, False) == 2  # lower is better: ≤
    assert first_reach([1], [0.9 * 0.91 - 1e-15], 0.9 * 0.91, True) == 1  # float rounding is no miss
    assert first_reach([1, 2], [math.nan, 0.9], 0.8, True) == 2


def test_parse_target_and_thresholds() -> None:
    assert parse_target("0.8", "pers_acc_last10", ["pers_acc"]) == Target("pers_acc", 0.8, False, True)
    assert parse_target("90%", "pers_acc", ["pers_acc"]) == Target("pers_acc", 0.9, True, True)
    assert parse_target("train_loss=110%", "pers_acc", ["pers_acc", "train_loss"]).higher_is_better is False
    finals = {("A", "d", "a"): 0.91, ("B", "d", "a"): 0.7, ("A", "d", "b"): 0.5}
    assert thresholds(Target("pers_acc", 0.9, True, True), finals) == {
        ("d", "a"): pytest.approx(0.819),
        ("d", "b"): pytest.approx(0.45),
    }
    assert thresholds(Target("train_loss", 1.1, True, False), finals)[("d", "a")] == pytest.approx(0.77)  # min
    for text, message in (
        ("80", "accuracies are fractions"),
        ("nope=0.5", "'nope' is not a per-round metric"),
        ("fast", r"is not \[METRIC=\]VALUE"),
        ("-5%", "must be a finite number"),
        ("inf", "must be a finite number"),
    ):
        with pytest.raises(ConfigError, match=message):
            parse_target(text, "pers_acc", ["pers_acc"])


def test_metrics_get_their_units_and_direction() -> None:
    assert quantity("val_pers_acc").label == "Validation personalized accuracy (%)"
    assert quantity("new_acc_worst10_last10").label == "Worst-10% new-client accuracy, last 10% (%)"
    assert quantity("pers_acc_std").higher_is_better is False and quantity("new_acc").higher_is_better is True
    assert quantity("peak_mem_mb") == quantity("peak_mem_mb").__class__("Peak memory (MB)", 1.0, False)
    assert quantity("round_time_s_mean").label == "Time per round (s)"
    assert quantity("bytes_up_total").scale == 1 / 2**20
    assert quantity("gate_frac").higher_is_better is None  # unknown: no best, no rank


def test_several_metrics_in_one_table_each_with_its_direction(frame: pd.DataFrame) -> None:
    metrics = ["pers_acc", "pers_acc_std", "bytes_up_total", "peak_mem_mb", "val_pers_acc", "new_acc", "gate_frac"]
    table = pivot(frame, metrics[0], metrics[1:])
    assert [c[2] for c in table.columns[::3]][: len(metrics)] == metrics  # grouped by setting, one sub-column each
    assert cell(table, "FedPer", A01, "pers_acc").best  # 91.00 highest
    assert cell(table, "FedPer", A01, "pers_acc_std").best  # 6.00 lowest spread
    assert cell(table, "FedPer", A01, "pers_acc_std").mean == pytest.approx(6.0)
    assert cell(table, "FedPer", A01, "bytes_up_total").best  # 4 rounds × 0.5 MB = 2 MB
    assert cell(table, "FedPer", A01, "bytes_up_total").mean == pytest.approx(2.0)
    assert cell(table, "FedPer", A01, "peak_mem_mb").best and cell(table, "FedPer", A01, "peak_mem_mb").mean == 90
    assert cell(table, "FedAvg", A01, "val_pers_acc").mean == pytest.approx(71.0)
    gate = [cell(table, row, A01, "gate_frac") for row in table.index]
    assert all(c.rank is None and not c.best and not c.tied_best for c in gate)
    text = to_markdown(table)
    header = text.splitlines()[0]
    assert "digits α=0.1 Std of client accuracy (%)" in header and "digits α=1 Peak memory (MB)" in header
    assert "Not ranked, no best marked (which way is better is not known): Gate frac." in text
    assert "| **6.00 ± 1.00** |" in text.splitlines()[3]  # FedPer's std at α=0.1


def test_significance_needs_three_paired_seeds_and_ties_are_no_win(frame: pd.DataFrame) -> None:
    table = pivot(frame)
    # α=0.1, FedPer best; FedProx d = (1, −0.5, 1.5) points, t = 1.109, df = 2: p = 1 − t/√(t² + 2) = 0.383
    prox = cell(table, "FedProx", A01, "pers_acc")
    assert prox.pairs == 3 and prox.p == pytest.approx(0.3828, abs=1e-4) and prox.tied
    assert cell(table, "FedAvg", A01, "pers_acc").tied is False  # d = (20, 19, 18): p < 0.001
    # α=1: FedAvg 70.00 ± 0.00 and FedPer 70.00 ± 1.00 tie at 2 decimals: both italic, neither bold
    for row in ("FedAvg", "FedPer"):
        tied = cell(table, row, A1, "pers_acc")
        assert tied.tied_best and not tied.best and tied.rank == 1.5
    lines = to_markdown(table).splitlines()
    assert lines[2] == "| FedAvg | 72.00 ± 2.00 | *70.00 ± 0.00* | 2.25 | 2 |"
    assert lines[3] == "| FedPer | **91.00 ± 1.00** | *70.00 ± 1.00* | 1.25 | 1 |"
    assert lines[4] == "| FedProx | <ins>90.33 ± 1.26</ins> | 61.00 ± 1.00 | 2.5 | 3 |"
    assert "Italic: tied for best at the 2 decimals shown; no entry is bold in such a column." in to_markdown(table)


def test_two_seeds_give_no_significance_marks(tmp_path: Path) -> None:
    for seed, (best, other) in enumerate([(0.90, 0.70), (0.92, 0.74)]):  # a 19-point gap, p = 0.07 at n = 2
        make_run(tmp_path, "fedavg", seed, [best])
        make_run(tmp_path, "fedprox", seed, [other])
    table = pivot(load_runs(tmp_path))
    other = cell(table, "FedProx", A01, "pers_acc")
    assert other.tied is None and other.p is None and other.pairs == 2
    text = to_markdown(table)
    assert "<ins>" not in text and "Underlined" not in text
    assert (
        "No significance marks: a paired test needs at least 3 seeds shared with the column's best, and at most 2 are."
        in text
    )
    assert pd.read_csv(StringIO(to_csv(table)))["tied"].isna().all()


def test_rounds_and_mb_to_an_absolute_target(frame: pd.DataFrame) -> None:
    table = pivot(frame, target="0.8")
    per = cell(table, "FedPer", A01, "rounds_to_target")  # seeds reach 0.8 at rounds 2, 2, 4
    assert per.mean == pytest.approx(8 / 3) and per.std == pytest.approx(2 / math.sqrt(3)) and per.best
    assert cell(table, "FedPer", A01, "mb_to_target").mean == pytest.approx(8 / 3)  # 1 MB per round up + down
    prox = cell(table, "FedProx", A01, "mb_to_target")  # rounds 4, 4, 2 × 2 MB
    assert prox.mean == pytest.approx(20 / 3)
    assert cell(table, "FedProx", A01, "rounds_to_target").mean == pytest.approx(10 / 3)
    never = cell(table, "FedAvg", A01, "rounds_to_target")
    assert never.mean is None and never.reached == (0, 3) and never.rank == 3  # after 2.67 and 3.33
    alone = pivot(frame, "pers_acc", target="0.9")  # only FedPer reaches 0.9 at α=0.1 (in every seed, round 4)
    assert cell(alone, "FedPer", A01, "rounds_to_target").best
    assert cell(alone, "FedAvg", A01, "rounds_to_target").rank == 2.5  # 0 and 2 of 3 seeds: tied, after FedPer
    text = to_markdown(table)
    assert "| FedAvg | 72.00 ± 2.00 | — (0/3) | — (0/3) |" in text
    assert "Rounds to target: the first evaluation round at which Personalized accuracy ≥ 80%; MB to target" in text
    assert "— (k/n): only k of n seeds reached the target within the rounds run (0: never)" in text


def test_relative_and_lower_is_better_targets(frame: pd.DataFrame) -> None:
    table = pivot(frame, target="90%")  # 90% of the best final mean: 0.9 × 0.91 = 0.819 and 0.9 × 0.70 = 0.63
    assert cell(table, "FedPer", A01, "rounds_to_target").mean == pytest.approx(10 / 3)  # rounds 4, 2, 4
    assert cell(table, "FedProx", A01, "rounds_to_target").mean == pytest.approx(4.0)  # 0.80 < 0.819 at round 2
    assert cell(table, "FedAvg", A1, "rounds_to_target").mean == pytest.approx(4.0)
    assert cell(table, "FedProx", A1, "rounds_to_target").reached == (0, 3)  # 0.60-0.62 < 0.63
    assert "(digits α=0.1: 81.9%, digits α=1: 63%)" in to_markdown(table)
    loss = pivot(frame, target="train_loss=0.3")  # train_loss = 1/r: first ≤ 0.3 at round 4
    assert cell(loss, "FedAvg", A01, "rounds_to_target").mean == 4.0
    assert "Training loss ≤ 0.3" in to_markdown(loss)


def test_precision_order_and_caption(frame: pd.DataFrame) -> None:
    table = pivot(frame, precision=1, caption="Main results & more")
    assert "| FedPer | **91.0 ± 1.0** |" in to_markdown(table)
    assert to_markdown(table).startswith("Table: Main results &amp; more\n\n| Algorithm |")
    assert r"\caption[Main results \& more]{Main results \& more. Setup: digits" in to_latex(table)
    assert "<caption>Main results &amp; more</caption>" in to_html(table)
    zero = pivot(frame, precision=0)
    assert cell(zero, "FedProx", A01, "pers_acc").rank == 2  # 90 vs FedPer's 91: still apart
    assert list(pivot(frame, order="rank").index) == ["FedPer", "FedAvg", "FedProx"]
    assert list(pivot(frame, order="fedprox, FedAvg").index) == ["FedProx", "FedAvg", "FedPer"]
    by_std = pivot(frame, "pers_acc", ["pers_acc_std"], order="pers_acc_std")
    assert list(by_std.index) == ["FedPer", "FedProx", "FedAvg"]  # 6 < 8 < 11 at α=0.1 (α=1 alike)
    assert row_ranks(by_std)["FedPer"] == (1.25, 1.0)  # ranks stay those of the main metric
    with pytest.raises(ConfigError, match="--order 'fedx' names no row"):
        pivot(frame, order="fedavg,fedx")


def test_csv_is_tidy_with_the_new_columns(frame: pd.DataFrame) -> None:
    rows = pd.read_csv(StringIO(to_csv(pivot(frame, "pers_acc", ["comm"], target="0.8"))))
    assert set(rows["quantity"]) == {"pers_acc", "comm", "rounds_to_target", "mb_to_target"}
    assert len(rows) == 3 * 2 * 4  # algorithms × column groups × quantities
    never = rows[
        (rows["algorithm"] == "FedAvg") & (rows["quantity"] == "rounds_to_target") & (rows["partition"] == "α=0.1")
    ]
    assert never.iloc[0]["reached"] == "0/3" and pd.isna(never.iloc[0]["mean"])
    tie = rows[(rows["partition"] == "α=1") & (rows["quantity"] == "pers_acc") & rows["tied_best"]]
    assert sorted(tie["algorithm"]) == ["FedAvg", "FedPer"] and not tie["best"].any()


def test_latex_multi_metric_header_has_cmidrules(frame: pd.DataFrame) -> None:
    text = to_latex(pivot(frame, "pers_acc", ["pers_acc_std", "comm"], target="90%"))
    for piece in (
        r"\begin{tabular}{l" + "c" * 12 + "}",  # 2 groups × 5 quantities + 2 rank columns
        r"\multicolumn{10}{c}{digits}",
        r"\multicolumn{5}{c}{$\alpha=0.1$} & \multicolumn{5}{c}{$\alpha=1$}",
        r"\cmidrule(lr){2-6} \cmidrule(lr){7-11}",
        r"Rounds to target",
        r"\textit{70.00 $\pm$ 0.00}",
        r"--- (0/3)",
    ):
        assert piece in text, piece


def _compile(document: str, folder: Path) -> str:
    engine = next(e for e in ("pdflatex", "lualatex", "tectonic") if shutil.which(e))
    (folder / "table.tex").write_text(document)
    command = (
        [engine, "table.tex"]
        if engine == "tectonic"
        else [engine, "-interaction=nonstopmode", "-halt-on-error", "table.tex"]
    )
    result = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout[-3000:]
    log = folder / "table.log"
    return log.read_text(errors="replace") if log.exists() else result.stdout + result.stderr


@pytest.mark.skipif(
    not any(shutil.which(e) for e in ("pdflatex", "lualatex", "tectonic")), reason="no TeX engine on PATH"
)
def test_multi_metric_latex_compiles_and_fits_the_page(frame: pd.DataFrame, tmp_path: Path) -> None:
    metrics = ["pers_acc_std", "new_acc", "comm", "round_time_s_mean", "peak_mem_mb", "val_pers_acc"]
    table = pivot(frame, "pers_acc", metrics, target="90%", caption="Digits: every metric", precision=1)
    document = (
        "\\documentclass{article}\n\\usepackage[T1]{fontenc}\n\\usepackage{booktabs,graphicx}\n"
        "\\begin{document}\n" + to_latex(table) + to_latex(table, fit="transpose") + "\\end{document}\n"
    )
    log = _compile(document, tmp_path)
    assert "Overfull \\hbox" not in log
