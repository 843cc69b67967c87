"""Leaderboards on a generated results folder with known numbers: values, ranking marks,
seed counts, runs that must not be averaged together, broken run folders, all formats, plots."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import subprocess
from io import StringIO
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from pflbench.cli import cli
from pflbench.config.run_config import RunConfig, with_base_defaults
from pflbench.data.partition import DEFAULT_NUM_CLIENTS
from pflbench.errors import ConfigError
from pflbench.report.latex import to_latex
from pflbench.report.leaderboard import cells, curve_bands, pivot
from pflbench.report.render import to_csv, to_html, to_markdown
from pflbench.store.reader import RunFolderWarning, load_runs

MB = 2**20
# (algo, alpha) → final pers_acc per seed, final global_acc per seed (None: no global model)
KNOWN = {
    ("fedavg", 0.1): ([0.80, 0.82, 0.84], [0.70, 0.72, 0.74]),
    ("fedper", 0.1): ([0.90, 0.91, 0.92], [None, None, None]),
    ("fedprox", 0.1): ([0.85, 0.86], [0.75, 0.76]),  # one seed short
    ("fedavg", 1.0): ([0.70, 0.70, 0.70], [0.60, 0.60, 0.60]),
    ("fedper", 1.0): ([0.65, 0.66, 0.67], [None, None, None]),
    ("fedprox", 1.0): ([0.60, 0.61, 0.62], [0.50, 0.51, 0.52]),
}
MB_PER_ROUND = {"fedavg": 1.0, "fedprox": 1.0, "fedper": 0.5}


def write_run(
    out: Path,
    algo: str,
    alpha: float,
    seed: int,
    final: float,
    global_acc: float | None,
    rounds: int = 2,
    dataset: str = "digits",
    **settings: object,
) -> Path:
    """A finished run folder as the runner writes it; pers_acc rises by 0.1 per round to ``final``."""
    resolved = with_base_defaults(
        RunConfig(algo=algo, dataset=dataset, alpha=alpha, seed=seed, rounds=rounds, out=str(out), **settings)
    )
    if resolved.num_clients is None:  # a run's config.json holds K as fitted (data.partition.fit_num_clients)
        resolved = dataclasses.replace(resolved, num_clients=DEFAULT_NUM_CLIENTS)
    config = {**dataclasses.asdict(resolved), "algo_hparams": {"mu": 0.01} if algo == "fedprox" else {}}
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:8]
    folder = out / "runs" / f"{algo}__{dataset}__a{alpha:g}__s{seed}__{digest}"
    folder.mkdir(parents=True)
    sent = MB_PER_ROUND[algo] * MB
    records = [
        {
            "round": r,
            "clients": [0, 1],
            "train_loss": 1.0 / r,
            "bytes_up": sent,
            "bytes_down": sent,
            "bytes_up_cum": r * sent,
            "bytes_down_cum": r * sent,
            "pers_acc": final - 0.1 * (rounds - r),
            "global_acc": None if global_acc is None else global_acc - 0.1 * (rounds - r),
        }
        for r in range(1, rounds + 1)
    ]
    summary = {
        "algo": algo,
        "dataset": dataset,
        "alpha": alpha,
        "seed": seed,
        "pers_acc": final,
        "pers_acc_last10": final,
        "pers_acc_worst10": final - 0.2,
        "global_acc": global_acc,
        "rounds": rounds,
        "bytes_up_total": rounds * sent,
        "bytes_down_total": rounds * sent,
        "wall_time_s": 10.0 + seed,
        "run_dir": str(folder),
    }
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def write_known(out: Path) -> Path:
    for (algo, alpha), (finals, globals_) in KNOWN.items():
        for seed, (final, global_acc) in enumerate(zip(finals, globals_)):
            write_run(out, algo, alpha, seed, final, global_acc)
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_known(tmp_path_factory.mktemp("results"))


@pytest.fixture(scope="module")
def frame(results: Path) -> pd.DataFrame:
    return load_runs(results)


def test_load_runs_is_tidy(frame: pd.DataFrame) -> None:
    assert list(frame.columns) == [
        "run",
        "algo",
        "dataset",
        "partition",
        "seed",
        "round",
        "metric",
        "value",
        "config_key",
        "status",
    ]
    assert frame["run"].nunique() == 17
    finals = frame[frame["round"].isna()]
    fedavg = finals[(finals["algo"] == "fedavg") & (finals["partition"] == "α=0.1") & (finals["metric"] == "pers_acc")]
    assert sorted(fedavg["value"]) == pytest.approx([0.80, 0.82, 0.84])
    first = frame[
        (frame["round"] == 1)
        & (frame["algo"] == "fedper")
        & (frame["seed"] == 2)
        & (frame["partition"] == "α=0.1")
        & (frame["metric"] == "pers_acc")
    ]
    assert first["value"].tolist() == pytest.approx([0.82])
    fedper_global = finals[(finals["algo"] == "fedper") & (finals["metric"] == "global_acc")]
    assert len(fedper_global) == 6 and fedper_global["value"].isna().all()
    assert frame["config_key"].nunique() == 2  # fedprox's mu sets it apart, nothing else differs


def test_pivot_mean_std_and_seed_counts(frame: pd.DataFrame) -> None:
    table = pivot(frame)
    assert list(table.index) == ["FedAvg", "FedPer", "FedProx"]
    assert table.loc["FedAvg", ("digits", "α=0.1", "pers_acc", "mean")] == pytest.approx(82.0)
    assert table.loc["FedAvg", ("digits", "α=0.1", "pers_acc", "std")] == pytest.approx(2.0)
    assert table.loc["FedProx", ("digits", "α=0.1", "pers_acc", "mean")] == pytest.approx(85.5)
    assert table.loc["FedProx", ("digits", "α=0.1", "pers_acc", "std")] == pytest.approx(0.7071, abs=1e-4)
    counts = table.xs("n", axis=1, level="stat")
    assert counts.loc["FedAvg"].tolist() == [3, 3] and counts.loc["FedProx"].tolist() == [2, 3]
    marks = cells(table)
    assert marks["FedProx", ("digits", "α=0.1", "pers_acc")].fewer_seeds
    assert not marks["FedProx", ("digits", "α=1", "pers_acc")].fewer_seeds


def test_markdown_marks_best_ranks_and_fewer_seeds(frame: pd.DataFrame) -> None:
    # every non-best entry here is significantly worse (paired t, p < 0.05): no underline
    text = to_markdown(pivot(frame))
    assert text.splitlines()[:5] == [
        "| Algorithm | digits α=0.1 | digits α=1 | Avg. rank | Rank |",
        "| :-- | --: | --: | --: | --: |",
        "| FedAvg | 82.00 ± 2.00 | **70.00 ± 0.00** | 2 | 2 |",
        "| FedPer | **91.00 ± 1.00** | 66.00 ± 1.00 | 1.5 | 1 |",
        "| FedProx | 85.50 ± 0.71 †n=2 | 61.00 ± 1.00 | 2.5 | 3 |",
    ]
    assert "n=3 seeds per cell unless marked" in text and "† fewer seeds" in text


def test_missing_values_are_dashes_and_not_ranked(frame: pd.DataFrame) -> None:
    text = to_markdown(pivot(frame, "global_acc"))
    lines = text.splitlines()
    # FedAvg vs FedProx at α=0.1 pairs only seeds 0, 1 (t = 9, df = 1, p = 0.070): too few to test, no mark
    assert lines[2] == "| FedAvg | 72.00 ± 2.00 | **60.00 ± 0.00** | 1.5 | 1.5 |"
    assert lines[3] == "| FedPer | — | — | — | — |"
    assert lines[4] == "| FedProx | **75.50 ± 0.71** †n=2 | 51.00 ± 1.00 | 1.5 | 1.5 |"
    assert "1 entry is not tested and carries no mark: fewer than 3 seeds pair with the best." in text


def test_lower_is_better_for_communication(frame: pd.DataFrame) -> None:
    table = pivot(frame, extras=["comm", "time"])
    marks = cells(table)
    assert marks["FedPer", ("digits", "α=0.1", "comm")].rank == 1
    assert marks["FedPer", ("digits", "α=0.1", "comm")].mean == pytest.approx(2.0)  # 0.5 MB × 2 rounds × 2 ways
    assert (
        marks["FedAvg", ("digits", "α=0.1", "comm")].rank == 2.5 == marks["FedProx", ("digits", "α=0.1", "comm")].rank
    )
    assert marks["FedProx", ("digits", "α=0.1", "time")].rank == 1  # seeds 0, 1 → 10.5 s < 11 s
    assert "digits α=0.1 Communication (MB)" in to_markdown(table).splitlines()[0]


def test_latex_booktabs_bold_underline_and_escaping(frame: pd.DataFrame) -> None:
    text = to_latex(pivot(frame, extras=["worst10"]))
    for piece in (
        r"\toprule",
        r"\midrule",
        r"\bottomrule",
        r"\begin{tabular}{lcccccc}",
        r"\multicolumn{4}{c}{digits}",
        r"\cmidrule(lr){2-3}",
        r"$\alpha=0.1$",
        r"FedPer & \textbf{91.00 $\pm$ 1.00}",
        r"85.50 $\pm$ 0.71\textsuperscript{$\dagger$n=2}",
        r"Personalized accuracy (\%)",
        r"Worst-10\% client accuracy (\%)",
    ):
        assert piece in text, piece
    assert "±" not in text and "α" not in text and "—" not in text
    assert all(line.count("_") == line.count(r"\_") for line in text.splitlines())
    assert r"FedPer & --- & --- & --- & --- \\" in to_latex(pivot(frame, "global_acc"))


def test_html_and_csv(frame: pd.DataFrame) -> None:
    table = pivot(frame)
    page = to_html(table)
    assert '<th colspan="2">digits</th>' in page and "<b>91.00 ± 1.00</b>" in page
    assert "<td>85.50 ± 0.71<sup>†n=2</sup></td>" in page
    rows = pd.read_csv(StringIO(to_csv(table)))
    fedprox = rows[(rows["algorithm"] == "FedProx") & (rows["partition"] == "α=0.1")].iloc[0]
    assert fedprox["mean"] == pytest.approx(85.5) and fedprox["n"] == 2 and bool(fedprox["fewer_seeds"])
    assert fedprox["rank"] == 2


def test_runs_with_other_settings_are_split_never_averaged(tmp_path: Path) -> None:
    write_known(tmp_path)
    for seed, final in enumerate([0.50, 0.52, 0.54]):
        write_run(tmp_path, "fedavg", 0.1, seed, final, 0.4, lr=0.05)
    write_run(tmp_path, "fedper", 0.1, 0, 0.3, None, dataset="synthetic", rounds=3)
    table = pivot(load_runs(tmp_path))
    assert list(table.index) == ["FedAvg (lr=0.01)", "FedAvg (lr=0.05)", "FedPer", "FedProx"]
    assert table.loc["FedAvg (lr=0.05)", ("digits", "α=0.1", "pers_acc", "mean")] == pytest.approx(52.0)
    assert table.loc["FedAvg (lr=0.01)", ("digits", "α=0.1", "pers_acc", "mean")] == pytest.approx(82.0)
    assert pd.isna(table.loc["FedAvg (lr=0.05)", ("digits", "α=1", "pers_acc", "mean")])
    # rounds differs only across cells (synthetic vs digits): one fedper row, and a note says so
    assert table.loc["FedPer", ("synthetic", "α=0.1", "pers_acc", "mean")] == pytest.approx(30.0)
    assert "Runs differ in rounds: 2, 3." in to_markdown(table)


def test_settings_that_print_alike_are_an_error_not_an_average(tmp_path: Path) -> None:
    write_run(tmp_path, "fedavg", 0.1, 0, 0.8, 0.7)
    folder = write_run(tmp_path, "fedavg", 0.1, 1, 0.6, 0.5, lr=0.02)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "lr": "0.01"}))  # str, not float
    with pytest.raises(ConfigError, match="runs with different settings share the cell"):
        pivot(load_runs(tmp_path))


def test_broken_run_folders_are_skipped_with_warnings(tmp_path: Path) -> None:
    write_known(tmp_path)
    runs = sorted((tmp_path / "runs").glob("fedavg__digits__a0.1__*"))
    (runs[0] / "summary.json").write_text("{not json")
    (runs[1] / "rounds.jsonl").write_text('{"round": 1, "pers_acc": 0.5}\n{"round": 2, "pers_a')
    unfinished = tmp_path / "runs" / "fedper__digits__a0.1__s7__00000000"
    unfinished.mkdir()
    shutil.copy(runs[2] / "config.json", unfinished / "config.json")
    failed = tmp_path / "runs" / "fedrep__digits__a0.1__s0__00000000"
    failed.mkdir()
    (failed / "error.json").write_text(json.dumps({"error_type": "RuntimeError", "message": "boom"}))
    (tmp_path / "runs" / "empty").mkdir()
    with pytest.warns(RunFolderWarning) as caught:
        table = pivot(load_runs(tmp_path))
    messages = sorted(str(w.message) for w in caught)
    assert len(messages) == 5
    assert any("summary.json is unreadable" in m for m in messages)
    assert any("rounds.jsonl is unreadable" in m for m in messages)
    assert any("failed run (RuntimeError: boom)" in m for m in messages)
    assert sum("unfinished run" in m for m in messages) == 2
    assert table.loc["FedAvg", ("digits", "α=0.1", "pers_acc", "n")] == 1
    assert "FedRep" not in table.index


def test_curve_bands_mean_over_seeds(frame: pd.DataFrame) -> None:
    bands = curve_bands(frame, "pers_acc", x="comm")
    first = bands[(bands["row"] == "FedAvg") & (bands["partition"] == "α=0.1") & (bands["round"] == 1)].iloc[0]
    assert first["mean"] == pytest.approx(72.0) and first["std"] == pytest.approx(2.0)
    assert first["x"] == pytest.approx(2.0) and first["n"] == 3


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def test_cli_writes_every_format_and_plots(results: Path, frame: pd.DataFrame, tmp_path: Path) -> None:
    code, output = invoke(
        "leaderboard",
        str(results),
        "--format",
        "all",
        "--extra",
        "comm,worst10",
        "--output",
        str(tmp_path / "tables"),
        "--plots",
        str(tmp_path / "plots"),
    )
    assert code == 0, output
    written = sorted(p.name for p in (tmp_path / "tables").iterdir())
    assert written == [f"leaderboard_pers_acc{s}" for s in (".csv", ".html", ".md", ".tex")]
    expected = to_markdown(pivot(frame, extras=["comm", "worst10"]))
    assert (tmp_path / "tables" / "leaderboard_pers_acc.md").read_text() == expected
    for name in ("accuracy_vs_round", "accuracy_vs_comm"):
        assert (tmp_path / "plots" / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
        assert (tmp_path / "plots" / f"{name}.pdf").read_bytes()[:4] == b"%PDF"
    code, output = invoke("leaderboard", str(results), "--metric", "global_acc")
    assert code == 0 and "| FedPer | — | — | — | — |" in output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--format", "all"], "give --output FOLDER"),
        (["--metric", "nope"], "metric 'nope' is not in the runs' summary.json"),
        (["--extra", "speed"], "metric 'speed' is not in the runs' summary.json; available: bytes_down_total"),
        (["--metrics", "pers_acc,speed"], "available: bytes_down_total, bytes_up_total, global_acc, pers_acc,"),
    ],
)
def test_cli_bad_input_is_one_error_line(results: Path, args: list[str], message: str) -> None:
    code, output = invoke("leaderboard", str(results), *args)
    assert code == 2 and message in output and output.count("\n") == 1, output


def test_cli_without_finished_runs_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "runs").mkdir()
    code, output = invoke("leaderboard", str(tmp_path))
    assert code == 2 and "no finished runs" in output


@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="pdflatex is not installed")
def test_latex_compiles_in_a_booktabs_document(frame: pd.DataFrame, tmp_path: Path) -> None:
    body = to_latex(pivot(frame, extras=["comm", "time", "worst10"]))
    document = (
        "\\documentclass{article}\n\\usepackage{booktabs,graphicx}\n\\begin{document}\n" + body + "\\end{document}\n"
    )
    (tmp_path / "table.tex").write_text(document)
    result = subprocess.run(
        ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "table.tex"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-2000:]
    assert (tmp_path / "table.pdf").is_file()
