"""Divergence is never a normal result: a non-finite loss or parameter stops the
run with status ``diverged`` (round, client, term), keeps the partial results, exits 1 with one
``Error:`` line; a finished run says ``"status": "completed"``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from pflbench.cli import cli
from pflbench.config.run_config import RunConfig
from pflbench.engine import ClientUpdate, Diverged
from pflbench.engine.federation import check_finite
from pflbench.runs.api import run_experiment
from pflbench.runs.execute import RunDiverged

TINY = ["--dataset", "digits", "--model", "mlp", "--num-clients", "3", "--rounds", "4", "--quiet"]


def test_huge_lr_diverges_cleanly(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["run", "--algo", "fedavg", *TINY, "--lr", "1e6", "--out", str(tmp_path)])
    assert result.exit_code == 1, result.output
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("Error: run diverged at round"), result.stderr
    assert "Traceback" not in result.output
    (folder,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    assert not folder.name.startswith(".")  # the partial run was moved into place, whole
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "diverged"
    diverged = summary["diverged"]
    assert set(diverged) == {"round", "client", "term"} and diverged["round"] >= 1
    rounds = (folder / "rounds.jsonl").read_text().splitlines()
    assert len(rounds) == diverged["round"] - 1  # every round before the diverged one is kept
    assert summary["rounds"] == len(rounds)
    assert not list((tmp_path / "runs").glob("*.claim"))
    assert not list((tmp_path / "runs").glob(".tmp-*"))
    # a rerun refuses like any finished run; the sweep would skip it
    again = CliRunner().invoke(cli, ["run", "--algo", "fedavg", *TINY, "--lr", "1e6", "--out", str(tmp_path)])
    assert again.exit_code == 2 and "status diverged" in again.stderr


def test_library_raises_run_diverged_with_summary(tmp_path: Path) -> None:
    config = RunConfig(
        algo="fedprox", dataset="digits", model="mlp", num_clients=3, rounds=3, lr=1e6, out=str(tmp_path)
    )
    with pytest.raises(RunDiverged) as caught:
        run_experiment(config, {"mu": 0.1})
    assert caught.value.summary["status"] == "diverged"
    assert caught.value.summary["diverged"]["client"] is not None


def test_completed_run_has_status_completed(tmp_path: Path) -> None:
    config = RunConfig(dataset="digits", model="mlp", num_clients=3, rounds=1, out=str(tmp_path))
    assert run_experiment(config)["status"] == "completed"
    (folder,) = list((tmp_path / "runs").iterdir())
    assert json.loads((folder / "summary.json").read_text())["status"] == "completed"


def update(k: int, loss: float, terms: dict[str, float], private: dict | None = None) -> ClientUpdate:
    return ClientUpdate(k, 10, {"w": torch.zeros(2)}, terms, loss, private or {})


def test_check_finite_names_round_client_and_term() -> None:
    check_finite(1, [update(0, 0.5, {"task": 0.5})])
    check_finite(1, [update(0, float("nan"), {})])  # no local step (--local-epochs 0): not a divergence
    with pytest.raises(Diverged) as caught:
        check_finite(7, [update(0, 0.5, {"task": 0.5}), update(4, 1.0, {"task": 0.5, "prox": float("inf")})])
    assert caught.value.to_json() == {"round": 7, "client": 4, "term": "prox"}
    with pytest.raises(Diverged) as caught:
        check_finite(2, [update(1, 0.5, {"task": 0.5}, {"head.w": torch.tensor([1.0, float("nan")])})])
    assert caught.value.to_json() == {"round": 2, "client": 1, "term": "private head.w"}
