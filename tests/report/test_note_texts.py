"""The leaderboard's notes (issue 34, item 13): no Markdown backticks in the LaTeX caption or
the HTML notes of ``--families``, and the hyperparameters with one value over a row's runs are
named (a row label names only the settings that differ)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from pflbench.report.latex import to_latex
from pflbench.report.leaderboard import pivot
from pflbench.report.render import to_html, to_markdown
from pflbench.store.reader import load_runs


def _sibling(name: str):
    spec = importlib.util.spec_from_file_location(f"_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_run = _sibling("fake_runs").make_run
NOTE = "Hyperparameters (one value over all of a row's runs): "


def test_family_note_has_no_backticks_in_latex_and_html(tmp_path: Path) -> None:
    for seed in range(2):
        make_run(tmp_path, "fedavg", seed, [0.5, 0.7 + seed / 100])
        make_run(tmp_path, "local", seed, [0.5, 0.8 + seed / 100])
    table = pivot(load_runs(tmp_path), families=True)
    latex, page = to_latex(table), to_html(table)
    assert "family of pFL methods (as pflbench list groups them)" in latex
    assert "family of pFL methods (as pflbench list groups them)" in page
    assert "`" not in latex and "`" not in page


def test_hyperparameters_with_one_value_per_row_are_named(tmp_path: Path) -> None:
    for seed in range(2):
        make_run(tmp_path, "fedprox", seed, [0.5, 0.8], hparams={"mu": 0.1})
        make_run(tmp_path, "fedrep", seed, [0.5, 0.9], hparams={"head_epochs": 2})
        make_run(tmp_path, "fedavg", seed, [0.5, 0.7])
    table = pivot(load_runs(tmp_path))
    note = NOTE + "FedProx: mu = 0.1; FedRep: head_epochs = 2."
    assert note in to_markdown(table).replace(r"\_", "_")
    assert note.replace("'", "&#x27;") in to_html(table)
    assert r"FedProx: mu = 0.1; FedRep: head\_epochs = 2." in to_latex(table)


def test_a_hyperparameter_shared_by_every_row_is_said_once(tmp_path: Path) -> None:
    """Two FedProx rows (lr differs) at one μ: ``mu = 0.1 for all rows``."""
    for seed in range(2):
        for lr in (0.05, 0.1):
            make_run(tmp_path, "fedprox", seed, [0.5, 0.8 + lr], lr=lr, hparams={"mu": 0.1})
    table = pivot(load_runs(tmp_path))
    assert list(table.index) == ["FedProx (lr=0.05)", "FedProx (lr=0.1)"]
    assert NOTE + "mu = 0.1 for all rows." in to_markdown(table)


def test_a_hyperparameter_the_row_label_names_is_not_repeated(tmp_path: Path) -> None:
    for seed in range(2):
        for mu in (0.01, 0.1):
            make_run(tmp_path, "fedprox", seed, [0.5, 0.8 + mu], hparams={"mu": mu, "tau": 3})
    table = pivot(load_runs(tmp_path))
    assert list(table.index) == ["FedProx (mu=0.01)", "FedProx (mu=0.1)"]
    markdown = to_markdown(table)
    assert NOTE + "tau = 3 for all rows." in markdown and "mu = " not in markdown


def test_no_note_without_hyperparameters(tmp_path: Path) -> None:
    for seed in range(2):
        make_run(tmp_path, "fedavg", seed, [0.5, 0.7])
    assert "Hyperparameters" not in to_markdown(pivot(load_runs(tmp_path)))
