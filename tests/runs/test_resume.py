"""Checkpoint and resume: a run SIGKILLed after a checkpoint and resumed ends
with the same rounds.jsonl, summary.json and clients.csv (timings aside) as an uninterrupted run,
for every built-in algorithm.

The kill: ``pflbench.testing.kill_after_round(3)`` makes the process SIGKILL itself after round 3
(the checkpoint is at round 2, so round 3's rounds.jsonl line must be dropped on resume). The
killed process is a fork of the test process (no second torch import); one test goes through
the CLI in a fresh subprocess.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pflbench.config.run_config import RunConfig
from pflbench.runs.api import run_experiment
from pflbench.store.layout import CHECKPOINT_FILE
from pflbench.testing import killed_after_round, killed_and_resumed

TIMING = {
    "round_time_s",
    "eval_time_s",
    "finetune_time_s",
    "peak_mem_mb",
    "server_svd_time_s",
    "wall_time_s",
    "run_dir",
    "round_time_s_mean",
    "checkpoints_written",
    "checkpoint_time_s",
}
BUILT_IN = ("fedavg", "fedprox", "local", "fedper", "fedrep", "flexlora", "fedsdg")
LORA = ("flexlora", "fedsdg")


def tiny(algo: str, out: Path) -> RunConfig:
    return RunConfig(
        algo=algo,
        dataset="digits",
        model="mlp",
        num_clients=3,
        rounds=4,
        alpha=0.5,
        optimizer="adam",
        lr=0.01,
        out=str(out),
        backbone="random",
        checkpoint_every=2,
        frac=0.67,
        **({"lora_targets": "fc1,fc2"} if algo in LORA else {}),
    )


def cli_args(config: RunConfig) -> list[str]:
    args = [
        "run",
        "--algo",
        config.algo,
        "--dataset",
        config.dataset,
        "--model",
        config.model,
        "--num-clients",
        str(config.num_clients),
        "--rounds",
        str(config.rounds),
        "--alpha",
        "0.5",
        "--optimizer",
        "adam",
        "--lr",
        "0.01",
        "--out",
        config.out,
        "--backbone",
        "random",
        "--checkpoint-every",
        "2",
        "--frac",
        "0.67",
        "--quiet",
    ]
    if config.algo in LORA:
        args += ["--lora-targets", "fc1,fc2"]
    return args


def run_cli(args: list[str], kill_after: int | None = None, **env: str) -> subprocess.CompletedProcess:
    code = "import sys; from pflbench.cli import main; sys.argv[0] = 'pflbench'; main()"
    if kill_after is not None:  # the test hook, installed in the fresh interpreter
        code = f"from pflbench.testing import kill_after_round; kill_after_round({kill_after}); {code}"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", **env},
        timeout=300,
        check=False,
    )


def contents(folder: Path) -> tuple[list[dict], dict, str]:
    (run,) = [p for p in (folder / "runs").iterdir() if not p.name.startswith(".") and p.is_dir()]
    rounds = [
        {k: v for k, v in json.loads(line).items() if k not in TIMING}
        for line in (run / "rounds.jsonl").read_text().splitlines()
    ]
    summary = {k: v for k, v in json.loads((run / "summary.json").read_text()).items() if k not in TIMING}
    return rounds, summary, (run / "clients.csv").read_text()


@pytest.mark.parametrize("algo", BUILT_IN)
def test_sigkilled_run_resumes_to_identical_results(algo: str, tmp_path: Path) -> None:
    killed_out, whole_out = tmp_path / "killed", tmp_path / "whole"
    config = tiny(algo, killed_out)
    if algo == "fedavg":  # through the CLI, in a fresh interpreter
        killed = run_cli(cli_args(config), kill_after=3)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
    else:
        killed_after_round(3, lambda: run_experiment(config))
    runs = killed_out / "runs"
    (work,) = [p for p in runs.iterdir() if p.name.startswith(".tmp-")]
    assert (work / CHECKPOINT_FILE).is_file()
    assert len((work / "rounds.jsonl").read_text().splitlines()) == 3  # round 3 is past the checkpoint
    assert not any((p / "summary.json").exists() for p in runs.iterdir() if p.is_dir())
    assert list(runs.glob("*.claim")), "a SIGKILLed run leaves its (now stale) claim"

    summary = run_experiment(config, resume=True)  # takes over the stale claim
    assert summary["status"] == "completed" and summary["checkpoints_written"] == 0
    assert not list(runs.glob(".tmp-*")) and not list(runs.glob("*.claim"))
    run_experiment(tiny(algo, whole_out))
    resumed, whole = contents(killed_out), contents(whole_out)
    assert resumed[0] == whole[0], "rounds.jsonl differs"
    assert resumed[1] == whole[1], "summary.json differs"
    assert resumed[2] == whole[2], "clients.csv differs"
    assert [r["round"] for r in resumed[0]] == [1, 2, 3, 4]


def test_resume_without_checkpoint_starts_over_and_corrupt_checkpoint_is_discarded(tmp_path: Path, capsys) -> None:
    config = tiny("fedavg", tmp_path)
    run_experiment(config, resume=True)  # nothing to resume: a normal run
    first = contents(tmp_path)
    # an unfinished run whose checkpoint is corrupt: warned, deleted, run from the start
    run_dir = next(p for p in (tmp_path / "runs").iterdir() if p.is_dir())
    work = run_dir.with_name(".tmp-" + run_dir.name)
    run_dir.rename(work)
    (work / "summary.json").unlink()
    (work / CHECKPOINT_FILE).write_bytes(b"PK\x03\x04 truncated")
    run_experiment(config, resume=True)
    assert "checkpoint.pt" in capsys.readouterr().err
    assert contents(tmp_path) == first


def test_checkpoint_of_other_settings_is_not_resumed(tmp_path: Path) -> None:
    """A checkpoint whose identity differs (e.g. written by another version of the settings)
    is refused by its expected identity hash."""
    import torch

    from pflbench.runs.checkpoint import load_checkpoint
    from pflbench.util.cache import save_entry

    path = tmp_path / CHECKPOINT_FILE
    save_entry(path, {"global/w": torch.zeros(2)}, {"kind": "pflbench-checkpoint-v1", "identity_hash": "aaaa"})
    assert load_checkpoint(path, "bbbb") is None


STATEFUL = ("scaffold", "feddyn", "moon", "ditto", "apfl", "fedala", "pfedme")
STATEFUL += ("fedproto", "fedpac", "feddbe")  # prototypes, combined heads, z̄_g and PRBMs
STATEFUL += ("ifca", "fedfomo", "fedamp", "fedas")  # assignments, affinity + uploads, uploads, bodies
STATEFUL += ("fedcp", "gpfl")  # personalized heads + client vectors, heads + conditional inputs
STATEFUL += ("fedgen", "fedkd")  # generator + its Adam moments + p̂; mentors
STATEFUL += ("fedmtl", "pflmoe", "pfedhn")  # W's columns; personal experts + gates; hypernetwork + momentum


@pytest.mark.parametrize("algo", STATEFUL)
def test_stateful_clients_survive_a_kill_and_resume(algo: str, tmp_path: Path) -> None:
    """Control variates, dynamic-regulariser state, previous/personal models and mixing weights
    live in the client store or declared server attributes, so a resumed run is identical."""
    import dataclasses

    def config(out: Path) -> RunConfig:
        return dataclasses.replace(tiny(algo, out), optimizer="sgd", lr=0.05)

    killed_and_resumed(run_experiment, config, tmp_path, after_round=3)
    assert contents(tmp_path / "killed") == contents(tmp_path / "whole")


# A FedAvgM-like plugin whose server momentum lives in an attribute no checkpoint saves (the
# undeclared variant) or in a dict created lazily in aggregate and declared (the declared one).
MOMENTUM_PLUGIN = '''
import torch
from pflbench import Algorithm, register_algorithm, sample_weights, weighted_average


class _Momentum(Algorithm):
    def aggregate(self, updates):
        average = weighted_average([u.params for u in updates], sample_weights(updates))
        if getattr(self, "velocity", None) is None:
            self.velocity = {n: torch.zeros_like(t) for n, t in self.global_state.items()}
        for name, tensor in self.global_state.items():
            self.velocity[name].mul_(0.9).add_(average[name] - tensor)
            tensor.add_(self.velocity[name])


@register_algorithm("momentum-undeclared")
class Undeclared(_Momentum):
    """Server momentum kept in an attribute no checkpoint saves."""


@register_algorithm("momentum-declared")
class Declared(_Momentum):
    """Server momentum in a lazily created dict named in checkpoint_attributes."""

    checkpoint_attributes = ("velocity",)
'''


@pytest.fixture(scope="module")
def momentum_plugin(tmp_path_factory: pytest.TempPathFactory) -> str:
    from pflbench.registry import load_plugin_file

    path = tmp_path_factory.mktemp("plugin") / "momentum.py"
    path.write_text(MOMENTUM_PLUGIN)
    load_plugin_file(path)
    return str(path)


def test_undeclared_server_state_stops_checkpoints_so_a_resume_cannot_differ(
    momentum_plugin: str, tmp_path: Path, capfd: pytest.CaptureFixture
) -> None:
    import dataclasses

    def config(out: Path) -> RunConfig:
        return dataclasses.replace(tiny("momentum-undeclared", out), optimizer="sgd", lr=0.05)

    killed_after_round(3, lambda: run_experiment(config(tmp_path / "killed")))
    assert "changed velocity across rounds" in capfd.readouterr().err
    (work,) = (tmp_path / "killed" / "runs").glob(".tmp-*")
    assert not (work / CHECKPOINT_FILE).exists()  # nothing to resume from that would lose the momentum
    run_experiment(config(tmp_path / "killed"), resume=True)
    run_experiment(config(tmp_path / "whole"))
    assert contents(tmp_path / "killed") == contents(tmp_path / "whole")


def test_declared_state_created_lazily_survives_a_kill_and_resume(momentum_plugin: str, tmp_path: Path) -> None:
    import dataclasses

    def config(out: Path) -> RunConfig:
        return dataclasses.replace(tiny("momentum-declared", out), optimizer="sgd", lr=0.05)

    killed_after_round(3, lambda: run_experiment(config(tmp_path / "killed")))
    (work,) = (tmp_path / "killed" / "runs").glob(".tmp-*")
    assert (work / CHECKPOINT_FILE).is_file()
    run_experiment(config(tmp_path / "killed"), resume=True)  # restore_state creates the dict
    run_experiment(config(tmp_path / "whole"))
    assert contents(tmp_path / "killed") == contents(tmp_path / "whole")


def test_no_built_in_algorithm_keeps_state_a_checkpoint_misses(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    import dataclasses
    from importlib.metadata import entry_points

    for algo in sorted(entry.name for entry in entry_points(group="pflbench.algorithms")):  # the built-ins
        config = dataclasses.replace(tiny(algo, tmp_path / algo), rounds=3, checkpoint_every=1)
        if algo not in LORA:
            config = dataclasses.replace(config, model="cnn_bn", optimizer="sgd", lr=0.05)
        summary = run_experiment(config)
        assert summary["checkpoints_written"] == 2, algo
    assert "checkpoints do not save" not in capfd.readouterr().err


def test_a_resumed_work_folder_that_lost_its_records_is_made_whole(tmp_path: Path) -> None:
    """config.json and partition.json deleted from a killed run's work folder are written again
    on resume: the published run reads in leaderboards and reruns like an uninterrupted one."""
    from pflbench.store.layout import CONFIG_FILE, PARTITION_FILE
    from pflbench.store.reader import load_runs

    killed_after_round(3, lambda: run_experiment(tiny("fedavg", tmp_path / "killed")))
    (work,) = (tmp_path / "killed" / "runs").glob(".tmp-*")
    (work / CONFIG_FILE).unlink()
    (work / PARTITION_FILE).unlink()
    run_experiment(tiny("fedavg", tmp_path / "killed"), resume=True)
    run_experiment(tiny("fedavg", tmp_path / "whole"))
    assert contents(tmp_path / "killed") == contents(tmp_path / "whole")
    (run,) = [p for p in (tmp_path / "killed" / "runs").iterdir() if p.is_dir()]
    whole = next(p for p in (tmp_path / "whole" / "runs").iterdir() if p.is_dir())
    assert (run / PARTITION_FILE).read_text() == (whole / PARTITION_FILE).read_text()
    assert (
        json.loads((run / CONFIG_FILE).read_text())["identity"]
        == json.loads((whole / CONFIG_FILE).read_text())["identity"]
    )
    assert load_runs(tmp_path / "killed")["run"].nunique() == 1


@pytest.mark.parametrize("algo", ["fedper", "fedavg"])
def test_validation_and_new_clients_survive_a_kill_and_resume(algo: str, tmp_path: Path) -> None:
    """A run with a validation split and a new client (FedPer: a fresh head trained at every
    evaluation; FedAvg with --finetune-epochs: new_acc_ft) resumes to the same files."""
    import dataclasses

    def config(out: Path) -> RunConfig:
        extra = {"finetune_epochs": 1} if algo == "fedavg" else {}
        return dataclasses.replace(tiny(algo, out), val_frac=0.2, new_clients=0.34, **extra)

    killed_and_resumed(run_experiment, config, tmp_path, after_round=3)
    resumed = contents(tmp_path / "killed")
    assert resumed == contents(tmp_path / "whole")
    assert "new_acc" in resumed[1] and "val_pers_acc" in resumed[1] and "new_client" in resumed[2]
