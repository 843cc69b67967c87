"""A leaderboard whose rows ran at different learning rates (SCAFFOLD and FedDyn declare their
own defaults) says which algorithm ran at which lr, in every format (issue 23)."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pandas as pd

from pflbench.report.latex import to_latex
from pflbench.report.leaderboard import pivot
from pflbench.report.render import to_csv, to_html, to_markdown
from pflbench.store.reader import load_runs

NOTE = "Not one learning rate for all: the rows ran at different learning rates (FedAvg: 0.1; FedDyn: 0.05; SCAFFOLD: 0.02)."


def _sibling(name: str):
    """A module next to this file (tests run with --import-mode=importlib, so no plain import)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_run = _sibling("fake_runs").make_run


def default_lr_runs(out: Path) -> None:
    for seed in range(2):
        make_run(out, "fedavg", seed, [0.5, 0.6 + seed / 100], lr=0.1)
        make_run(out, "scaffold", seed, [0.5, 0.55 + seed / 100], lr=0.02)
        make_run(out, "feddyn", seed, [0.5, 0.57 + seed / 100], lr=0.05)


def test_rows_at_different_learning_rates_are_named_in_every_format(tmp_path: Path) -> None:
    default_lr_runs(tmp_path)
    table = pivot(load_runs(tmp_path))
    assert table.attrs["learning_rates"] == {"FedAvg": "0.1", "FedDyn": "0.05", "SCAFFOLD": "0.02"}
    markdown = to_markdown(table)
    assert NOTE in markdown
    assert "Runs differ in lr" not in markdown  # the per-row note replaces the bare list of values
    assert NOTE in to_html(table)
    assert "FedAvg: 0.1; FedDyn: 0.05; SCAFFOLD: 0.02" in to_latex(table).replace("\n", " ")
    rows = pd.read_csv(StringIO(to_csv(table)))
    assert dict(zip(rows["algorithm"], rows["lr"])) == {"FedAvg": 0.1, "FedDyn": 0.05, "SCAFFOLD": 0.02}
    # rows follow the table's order: by rank, SCAFFOLD last either way here
    ranked = pivot(load_runs(tmp_path), order="rank")
    assert "(FedAvg: 0.1; FedDyn: 0.05; SCAFFOLD: 0.02)" in to_markdown(ranked)


def test_one_learning_rate_for_all_adds_no_note_and_no_csv_column(tmp_path: Path) -> None:
    for seed in range(2):
        make_run(tmp_path, "fedavg", seed, [0.6], lr=0.1)
        make_run(tmp_path, "scaffold", seed, [0.5], lr=0.1)
    table = pivot(load_runs(tmp_path))
    assert table.attrs["learning_rates"] == {}
    assert "learning rate" not in to_markdown(table)
    assert "lr" not in pd.read_csv(StringIO(to_csv(table))).columns


def test_an_algorithm_run_at_several_learning_rates_lists_them(tmp_path: Path) -> None:
    make_run(tmp_path, "fedavg", 0, [0.6], lr=0.1)
    make_run(tmp_path, "fedavg", 0, [0.6], lr=0.1, alpha=1.0)
    make_run(tmp_path, "scaffold", 0, [0.5], lr=0.02)
    make_run(tmp_path, "scaffold", 0, [0.5], lr=0.04, alpha=1.0)  # another lr in another column
    table = pivot(load_runs(tmp_path))
    assert table.attrs["learning_rates"] == {"FedAvg": "0.1", "SCAFFOLD": "0.02/0.04"}
