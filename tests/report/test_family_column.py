"""`pflbench leaderboard --families`: a Family column (the method families `pflbench list` groups
by) in every format, rows grouped by family in the survey's order (issue 24)."""

from __future__ import annotations

import importlib.util
import re
from io import StringIO
from pathlib import Path

import pandas as pd
from click.testing import CliRunner

from pflbench.cli import cli
from pflbench.report.latex import to_latex
from pflbench.report.leaderboard import pivot
from pflbench.report.render import to_csv, to_html, to_markdown
from pflbench.store.reader import load_runs


def _sibling(name: str):
    spec = importlib.util.spec_from_file_location(f"_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_run = _sibling("fake_runs").make_run


def runs(out: Path) -> None:
    for seed in range(2):  # names sort local < fedper < fedavg's display... by family: global, decoupling, local
        make_run(out, "local", seed, [0.5, 0.9 + seed / 100], lr=0.1)
        make_run(out, "fedper", seed, [0.5, 0.8 + seed / 100], lr=0.1)
        make_run(out, "fedavg", seed, [0.5, 0.7 + seed / 100], lr=0.1)
        make_run(out, "fedprox", seed, [0.5, 0.75 + seed / 100], lr=0.1)


def test_family_column_in_every_format_and_rows_grouped_in_survey_order(tmp_path: Path) -> None:
    runs(tmp_path)
    table = pivot(load_runs(tmp_path), families=True, order="rank")
    # survey order: global, regularisation, ..., decoupling, ..., local; --order rank within a family
    assert list(table.index) == ["FedAvg", "FedProx", "FedPer", "Local"]
    markdown = to_markdown(table)
    lines = markdown.splitlines()
    assert lines[0].startswith("| Algorithm | Family | ") and lines[1].startswith("| :-- | :-- | --: |")
    assert lines[2].startswith("| FedAvg | global model | ") and lines[4].startswith("| FedPer | decoupling | ")
    assert "Family: each algorithm's family of pFL methods" in markdown
    assert '<th rowspan="2">Family</th>' in to_html(table) and '<td style="text-align:left">local only</td>' in to_html(
        table
    )
    latex = to_latex(table)
    assert r"\begin{tabular}{llcccc}" in latex.replace("\n", "") or re.search(r"\\begin\{tabular\}\{llc+\}", latex)
    assert "Algorithm & Family &" in latex and "FedProx & regularisation &" in latex
    assert "Family &" in to_latex(table, fit="transpose")
    rows = pd.read_csv(StringIO(to_csv(table)))
    assert dict(zip(rows["algorithm"], rows["family"])) == {
        "FedAvg": "global", "FedProx": "regularization", "FedPer": "decoupling", "Local": "local",
    }  # fmt: skip


def test_without_the_flag_nothing_changes(tmp_path: Path) -> None:
    runs(tmp_path)
    table = pivot(load_runs(tmp_path))
    assert list(table.index) == ["FedAvg", "FedPer", "FedProx", "Local"] and "Family" not in to_markdown(table)
    assert "family" not in pd.read_csv(StringIO(to_csv(table))).columns


def test_cli_flag_and_an_unknown_algorithm_is_other(tmp_path: Path) -> None:
    runs(tmp_path)
    make_run(tmp_path, "someone_elses", 0, [0.5, 0.6], lr=0.1)  # a results folder from a plugin not here
    result = CliRunner().invoke(cli, ["leaderboard", str(tmp_path), "--families"])
    assert result.exit_code == 0, result.output
    assert "| Algorithm | Family |" in result.output and "| someone_elses | other |" in result.output
