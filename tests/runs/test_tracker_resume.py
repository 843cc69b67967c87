"""Trackers across a resume: a run SIGKILLed after round 3 (checkpoint at round 2, so round 3 was
logged and is then recomputed) and resumed ends with one tracker run holding every round exactly
once, with the values of rounds.jsonl: TensorBoard (one event file), MLflow (the same MLflow run,
FINISHED), W&B offline (the same run id, one offline run)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pflbench.config.run_config import RunConfig
from pflbench.runs.api import run_experiment

pytest.importorskip("tensorboard")
pytest.importorskip("mlflow")
pytest.importorskip("wandb")

ROUNDS = [1, 2, 3, 4]


def tiny(out: Path) -> RunConfig:
    return RunConfig(
        algo="fedavg",
        dataset="digits",
        model="mlp",
        num_clients=3,
        rounds=4,
        lr=0.05,
        checkpoint_every=2,
        log=("tensorboard", "mlflow", "wandb"),
        out=str(out),
    )


def killed_after_round_3(out: Path) -> subprocess.CompletedProcess:
    args = ["run", "--dataset", "digits", "--model", "mlp", "--num-clients", "3", "--rounds", "4", "--lr", "0.05"]
    args += ["--checkpoint-every", "2", "--log", "tensorboard,mlflow,wandb", "--out", str(out), "--quiet"]
    code = "from pflbench.testing import kill_after_round; kill_after_round(3)"
    code += "; import sys; from pflbench.cli import main; sys.argv[0] = 'pflbench'; main()"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # A separate command, as a user runs it: its own W&B service, not the one an earlier test of
    # this process started (wandb passes its service to children in WANDB_SERVICE); a shared
    # service would still hold the killed run's id when the resume asks for it ("in use").
    env.pop("WANDB_SERVICE", None)
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=300)


def inspect_wandb(folder: Path, summary: bool = False) -> Any:
    """``wandb leet inspect --json`` (W&B's reader of its offline log) of the one offline run
    under ``folder``: its records, or with ``summary`` W&B's summary of the run."""
    (offline,) = folder.glob("offline-run-*")
    (log,) = offline.glob("run-*.wandb")
    args = [sys.executable, "-m", "wandb", "leet", "inspect", "--json", *(["--summary"] if summary else []), str(log)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=120, env=os.environ.copy())
    if result.returncode != 0 and "No such command" in result.stderr:
        pytest.skip("this wandb has no `wandb leet inspect` (W&B's reader of its offline log)")
    assert result.returncode == 0, result.stderr
    if summary:
        return json.loads(result.stdout)
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


def history(records: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    items = [r["history"] for r in records if r["type"] == "history"]
    return [(int(h["step"]["num"]), h["item"][key]) for h in items if key in h["item"]]


@pytest.fixture(autouse=True)
def wandb_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home" / name.lower()))
    for name in ("WANDB_MODE", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_DIR"):
        monkeypatch.delenv(name, raising=False)


def test_a_resumed_run_continues_each_tracker_run_with_every_round_once(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "out"
    killed = killed_after_round_3(out)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    (work,) = (out / "runs").glob(".tmp-*")
    before = json.loads((work / "trackers.json").read_text())
    uri = f"sqlite:///{out / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("pflbench").experiment_id
    (killed_run,) = client.search_runs([experiment])
    assert killed_run.info.status == "RUNNING" and killed_run.info.run_id == before["mlflow"]["run_id"]
    steps = sorted(m.step for m in client.get_metric_history(killed_run.info.run_id, "train_loss"))
    assert steps == [1, 2, 3]  # round 3 logged before the kill, past the checkpoint

    summary = run_experiment(tiny(out), resume=True)
    assert summary["status"] == "completed"
    (folder,) = [p for p in (out / "runs").iterdir() if p.is_dir()]
    rounds = [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == ROUNDS
    assert json.loads((folder / "trackers.json").read_text()) == before  # the same tracker runs

    # MLflow: the killed run continued (no second run), every round once, FINISHED
    (found,) = client.search_runs([experiment])
    assert found.info.run_id == before["mlflow"]["run_id"] and found.info.status == "FINISHED"
    for key in ("train_loss", "pers_acc", "bytes_up"):
        logged = sorted((m.step, m.value) for m in client.get_metric_history(found.info.run_id, key))
        assert logged == [(r["round"], pytest.approx(r[key])) for r in rounds], key
    assert found.data.metrics["summary/pers_acc"] == pytest.approx(summary["pers_acc"])

    # TensorBoard: one event file with every round once
    assert len(list((folder / "tensorboard").glob("events.out.tfevents.*"))) == 1
    events = EventAccumulator(str(folder / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    for key in ("train_loss", "pers_acc", "bytes_up"):
        logged = [(e.step, e.value) for e in events.Scalars(key)]
        assert logged == [(r["round"], pytest.approx(r[key], rel=1e-6)) for r in rounds], key

    # W&B offline: one offline run (the killed attempt's folder replaced), same id, every round once
    assert len(list((folder / "wandb").glob("offline-run-*"))) == 1
    run = inspect_wandb(folder / "wandb", summary=True)
    assert run["run_id"] == before["wandb"]["id"] and run["state"] == "finished"
    records = inspect_wandb(folder / "wandb")
    for key in ("train_loss", "pers_acc", "bytes_up"):
        assert history(records, key) == [(r["round"], pytest.approx(r[key])) for r in rounds], key
