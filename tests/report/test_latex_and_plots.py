"""Tables and plots that drop into a paper: display names, readable metric names, a caption with
the setup, unique labels, tables that fit the page (compiled with pdflatex when installed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from pflbench import registry
from pflbench.cli import cli
from pflbench.report.latex import table_label, to_latex
from pflbench.report.leaderboard import curve_bands, pivot, write_plots
from pflbench.report.names import display_name, quantity
from pflbench.report.plots import curve_figure
from pflbench.report.render import to_html, to_markdown
from pflbench.store.reader import load_runs


def _sibling(name: str):
    """A module next to this file (tests run with --import-mode=importlib, so no plain import)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


helpers = _sibling("test_leaderboard")


@pytest.fixture(scope="module")
def frame(tmp_path_factory: pytest.TempPathFactory) -> pd.DataFrame:
    return load_runs(helpers.write_known(tmp_path_factory.mktemp("results")))


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> pd.DataFrame:
    """4 datasets × 2 α × 3 quantities = 24 value columns: far wider than a page."""
    out = tmp_path_factory.mktemp("wide")
    for dataset in ("digits", "synthetic", "cifar10", "femnist"):
        for alpha in (0.1, 1.0):
            for algo, final in (("fedavg", 0.7), ("fedper", 0.8), ("fedprox", 0.75)):
                for seed in range(2):
                    helpers.write_run(out, algo, alpha, seed, final + 0.01 * seed, 0.5, dataset=dataset)
    return load_runs(out)


def test_display_names_come_from_the_class_the_builtin_map_or_the_name(monkeypatch: pytest.MonkeyPatch) -> None:
    class Declared:
        display_name = "pFedX"

    monkeypatch.setitem(registry.ALGORITHMS._items, "pfedx", Declared)  # registered at run time
    assert display_name("pfedx") == "pFedX"
    assert display_name("fedrep") == "FedRep" and display_name("flexlora") == "FlexLoRA"
    assert display_name("my_algo") == "my_algo"  # not registered: the raw name
    assert display_name("fedrep", {"fedrep": "FedRep (ours)"}) == "FedRep (ours)"


def test_readable_metric_names() -> None:
    assert quantity("pers_acc").label == "Personalized accuracy (%)"
    assert quantity("global_acc").label == "Global accuracy (%)"
    assert quantity("comm").label == "Communication (MB)"
    assert quantity("train_loss").label == "Training loss"
    assert quantity("some_new_metric").label == "Some new metric"


def test_caption_states_the_setup_and_labels_are_unique(frame: pd.DataFrame) -> None:
    text = to_latex(pivot(frame))
    assert (
        r"\caption[Personalized accuracy (\%), final value]{Setup: digits, dirichlet partition "
        r"($\alpha$ = 0.1, 1), 20 clients, 20 sampled per round, 2 rounds, 1 local epoch, model cnn. "
        r"Metric: Personalized accuracy (\%), final value."
    ) in text
    assert "pers_acc" not in text.replace(r"\_", "_").split(r"\label")[0]  # no raw keys before the label
    labels = {
        table_label(pivot(frame)),
        table_label(pivot(frame, "global_acc")),
        table_label(pivot(frame, extras=["comm"])),
        table_label(pivot(frame, test="wilcoxon")),
    }
    assert len(labels) == 4 and all(label.startswith("tab:") for label in labels)
    assert table_label(pivot(frame)) == table_label(pivot(frame))  # stable across calls
    assert r"\label{tab:main_results}" in to_latex(pivot(frame), label="tab:main_results")
    assert r"\label{tab:a-b-}" in to_latex(pivot(frame), label="tab:a b}")


def test_fit_options(wide: pd.DataFrame) -> None:
    table = pivot(wide, extras=["comm", "time"])
    resized = to_latex(table)
    assert r"\resizebox{\ifdim\width>\linewidth\linewidth\else\width\fi}{!}{%" in resized
    assert r"\resizebox" not in to_latex(table, fit="none")
    transposed = to_latex(table, fit="transpose").splitlines()
    assert r"\begin{tabular}{lccc}" in transposed
    assert r"Dataset, $\alpha$ & FedAvg & FedPer & FedProx \\" in transposed
    assert sum(line.startswith(r"cifar10, $\alpha=0.1$") for line in transposed) == 3  # one per quantity
    assert any(line.startswith("Avg. rank & ") for line in transposed)
    with pytest.raises(ValueError):
        to_latex(table, fit="squeeze")


def _compile(body: str, folder: Path) -> str:
    document = (
        "\\documentclass{article}\n\\usepackage[T1]{fontenc}\n\\usepackage{booktabs,graphicx}\n"
        "\\begin{document}\n" + body + "\\end{document}\n"
    )
    (folder / "table.tex").write_text(document)
    result = subprocess.run(
        ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "table.tex"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    return (folder / "table.log").read_text(errors="replace")


@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="pdflatex is not installed")
def test_wide_tables_fit_the_page_when_compiled(wide: pd.DataFrame, tmp_path: Path) -> None:
    table = pivot(wide, extras=["comm", "time"], renames={"fedavg": "Fed&Avg_$#%"})
    for fit in ("resize", "transpose", "none"):
        folder = tmp_path / fit
        folder.mkdir()
        log = _compile(to_latex(table, fit=fit) + to_latex(pivot(wide), fit=fit), folder)
        overfull = "Overfull \\hbox" in log
        assert overfull == (fit == "none"), fit  # 'none' really is too wide: the check can fail
        assert "multiply defined" not in log  # two tables, two labels


def test_markdown_and_html_carry_the_same_content(frame: pd.DataFrame) -> None:
    table = pivot(frame, extras=["comm"])
    markdown, page = to_markdown(table), to_html(table)
    for piece in (
        "Setup: digits, dirichlet partition",
        "Communication (MB)",
        "Avg. rank",
        "FedPer",
        "Best per column in bold",
        "paired two-sided t-test",
    ):
        assert piece in markdown and piece in page, piece
    assert "<style>" in page and "font-family" in page and "<caption>" in page


def test_plots_have_integer_round_ticks_display_names_and_vector_formats(frame: pd.DataFrame, tmp_path: Path) -> None:
    bands = curve_bands(frame, "pers_acc", renames={"fedper": "FedPer (ours)"})
    figure = curve_figure(bands, "Round", "Personalized accuracy (%)", integer_x=True)
    figure.canvas.draw()
    axes = figure.axes[0]
    ticks = [t for t in axes.get_xticks() if axes.get_xlim()[0] <= t <= axes.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
    legend = [text.get_text() for text in figure.legends[0].get_texts()]
    assert legend == ["FedAvg", "FedPer (ours)", "FedProx"]
    written = write_plots(frame, "pers_acc", tmp_path)
    assert sorted(p.name for p in written) == sorted(
        f"accuracy_vs_{x}.{s}" for x in ("round", "comm") for s in ("png", "pdf", "svg")
    )
    assert (tmp_path / "accuracy_vs_round.svg").read_text().lstrip().startswith("<?xml")


def test_cli_latex_options(tmp_path: Path) -> None:
    results = helpers.write_known(tmp_path / "results")
    result = CliRunner().invoke(
        cli,
        [
            "leaderboard",
            str(results),
            "--format",
            "latex",
            "--latex-fit",
            "transpose",
            "--label",
            "tab:main",
            "--rename",
            "fedper=FedPer*",
        ],
    )
    assert result.exit_code == 0, result.output
    assert r"\label{tab:main}" in result.output and "FedPer*" in result.output
    assert r"Dataset, $\alpha$" in result.output
