"""--log wandb: a W&B run written offline (no network), read back with W&B's own reader of the
offline transaction log (``wandb leet inspect --json``). Skipped when wandb is not installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pflbench.config.run_config import RunConfig
from pflbench.runs.trackers import make_trackers

pytest.importorskip("wandb")


@pytest.fixture(autouse=True)
def wandb_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """W&B's own folders (cache, config, data) in the test's temporary folder; offline mode."""
    for name in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home" / name.lower()))
    for name in ("WANDB_MODE", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_DIR"):
        monkeypatch.delenv(name, raising=False)


def inspect_wandb(folder: Path, summary: bool = False) -> Any:
    """``wandb leet inspect --json`` of the one offline run under ``folder``: the records (a list)
    or, with ``summary``, W&B's own summary of the run (config, summary, state, name, id)."""
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
    """(step, value) of ``key`` in the history records, in the order they were written."""
    items = [r["history"] for r in records if r["type"] == "history"]
    return [(int(h["step"]["num"]), h["item"][key]) for h in items if key in h["item"]]


RECORDS = [
    {"round": 1, "train_loss": 2.0, "pers_acc": None, "client_ids": [0, 3], "note": "x", "flag": True},
    {"round": 2, "train_loss": 1.5, "pers_acc": 0.25, "bytes_up": 1000, "diverged": float("nan")},
    {"round": 3, "train_loss": 1.0, "pers_acc": 0.75, "bytes_up": 2000},
]


def test_wandb_offline_run_reads_back(tmp_path: Path) -> None:
    config = RunConfig(algo="fedprox", rounds=3, lr=0.05, out=str(tmp_path / "out"))
    work = tmp_path / "out" / "runs" / ".tmp-fedprox-digits-abc"
    work.mkdir(parents=True)
    hparams = SimpleNamespace()
    (tracker,) = make_trackers(["wandb"], SimpleNamespace(config=config, run_dir=work, hparams=None))
    tracker.on_run_start(hparams)
    for record in RECORDS:
        tracker.on_round_end(record)
    tracker.on_run_end({"pers_acc": 0.75, "rounds": 3, "bytes_up_total": 3000, "peak_mem_mb": None, "algo": "x"})
    tracker.close(failed=True)  # after the end: nothing more happens

    run = inspect_wandb(work / "wandb", summary=True)
    assert run["state"] == "finished" and run["exit_code"] == 0
    assert run["name"] == "fedprox-digits-abc" and run["project"] == "pflbench"
    assert run["run_id"] == json.loads((work / "trackers.json").read_text())["wandb"]["id"]
    assert run["config"]["algo"] == "fedprox" and run["config"]["lr"] == 0.05 and run["config"]["rounds"] == 3
    assert run["summary"]["pers_acc"] == 0.75 and run["summary"]["bytes_up_total"] == 3000
    assert "peak_mem_mb" not in run["summary"] and "algo" not in run["summary"]
    records = inspect_wandb(work / "wandb")
    assert history(records, "train_loss") == [(1, 2.0), (2, 1.5), (3, 1.0)]
    assert history(records, "pers_acc") == [(2, 0.25), (3, 0.75)]
    logged = {key for r in records if r["type"] == "history" for key in r["history"]["item"]}
    assert not {"round", "client_ids", "note", "flag", "diverged"} & logged


def test_wandb_through_the_cli_and_portable(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from pflbench.cli import cli

    args = ["run", "--dataset", "digits", "--model", "mlp", "--num-clients", "3", "--rounds", "2", "--quiet"]
    result = CliRunner().invoke(cli, [*args, "--log", "wandb", "--portable", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    (folder,) = (tmp_path / "out" / "runs").iterdir()
    rounds = [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines()]
    records = inspect_wandb(folder / "wandb")
    assert history(records, "pers_acc") == [(r["round"], r["pers_acc"]) for r in rounds]
    (run_record,) = [r["run"] for r in records if r["type"] == "run"]
    assert run_record.get("host", "") in ("", "<local>") and run_record["display_name"] == folder.name
    # a shared run folder names neither this machine nor its folders (W&B's debug logs are gone)
    for path in (folder / "wandb").rglob("*"):
        assert not path.is_symlink() and "debug" not in path.name, path
        if path.is_file():
            assert str(tmp_path).encode() not in path.read_bytes(), path
