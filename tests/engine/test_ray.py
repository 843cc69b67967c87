"""Ray: ``--executor ray`` gives the sequential numbers for every built-in algorithm,
survives a killed worker; ``sweep --ray`` writes what a local sweep writes, resumes, redoes a run
whose worker died; without Ray both are one ``Error:`` line.

The Ray tests share one local instance with 2 CPUs (module fixture) and skip when Ray is absent.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pflbench.cli import cli
from pflbench.config.run_config import RunConfig
from pflbench.registry import ALGORITHMS
from pflbench.runs.execute import execute
from pflbench.runs.prepare import prepare

try:
    import ray
except ImportError:  # the Ray tests skip; the missing-Ray tests still run
    ray = None

needs_ray = pytest.mark.skipif(ray is None, reason='Ray is not installed (pip install "pflbench[ray]")')
BUILT_IN = ("fedavg", "fedper", "fedrep", "fedprox", "local", "flexlora", "fedsdg")
TIMES = (
    "round_time_s",
    "eval_time_s",
    "peak_mem_mb",
    "wall_time_s",
    "run_dir",
    "server_svd_time_s",
    "round_time_s_mean",
)
# as tests/algorithms/test_every_algorithm.py: LoRA algorithms adapt the mlp's hidden layers on a random body
TINY = dict(
    dataset="digits",
    model="mlp",
    num_clients=4,
    rounds=2,
    alpha=0.5,
    optimizer="adam",
    lr=0.01,
    lora_targets="fc1,fc2",
    backbone="random",
)
TINY_ARGS = ["--model", "mlp", "--num-clients", "4", "--rounds", "2", "--quiet"]


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


# ---- without Ray ---------------------------------------------------------------------------
def test_executor_ray_without_ray_is_one_error_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    for args in (["run", "--executor", "ray"], ["sweep", "--ray"], ["sweep", "--ray-address", "auto"]):
        code, output = invoke(*args, *TINY_ARGS, "--out", str(tmp_path))
        assert code == 2, output
        expected = 'Error: Ray is not installed; install the extra: pip install "pflbench[ray]"'
        assert output.strip().splitlines() == [expected], output
    assert not (tmp_path / "runs").exists()


def test_sweep_ray_refuses_nested_ray_executor(tmp_path: Path) -> None:
    code, output = invoke("sweep", "--ray", "--executor", "ray", *TINY_ARGS, "--out", str(tmp_path))
    assert code == 2 and "sweep --ray runs whole runs as Ray tasks" in output, output


def test_tensors_shared_by_jobs_travel_once() -> None:
    import torch

    from pflbench.engine.ray_executor import SharedRef, pack, unpack

    shared, own = torch.ones(3), torch.zeros(2)
    store, packed = pack([{"w": shared, "b": own}, {"w": shared}, {"v": torch.full((1,), 2.0)}])
    assert list(store.values())[0] is not None and len(store) == 1
    assert isinstance(packed[0]["w"], SharedRef) and packed[1]["w"] == packed[0]["w"]
    assert isinstance(packed[0]["b"], torch.Tensor)
    back = unpack(packed[0], store, torch.device("cpu"))
    assert torch.equal(back["w"], shared) and torch.equal(back["b"], own)


# ---- with Ray ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def local_ray():
    if ray is None:
        pytest.skip("Ray is not installed")
    from pflbench.engine import ray_executor

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
    yield ray
    ray_executor.release_pool()
    if started:
        ray.shutdown()


def comparable(run_dir: Path) -> dict[str, Any]:
    """Every number of a run folder except timings and memory (and where it was written)."""
    rounds = [
        {k: v for k, v in json.loads(line).items() if k not in TIMES}
        for line in (run_dir / "rounds.jsonl").read_text().splitlines()
    ]
    summary = {k: v for k, v in json.loads((run_dir / "summary.json").read_text()).items() if k not in TIMES}
    with open(run_dir / "clients.csv") as handle:
        clients = list(csv.DictReader(handle))
    return {
        "rounds": rounds,
        "summary": summary,
        "clients": clients,
        "partition": json.loads((run_dir / "partition.json").read_text()),
    }


def run_folder(out: Path) -> Path:
    (folder,) = (out / "runs").iterdir()
    return folder


@needs_ray
@pytest.mark.parametrize("algo", BUILT_IN)
def test_ray_executor_gives_the_sequential_numbers(algo: str, local_ray, tmp_path: Path) -> None:
    assert algo in ALGORITHMS.names()
    sequential = RunConfig(algo=algo, out=str(tmp_path / "seq"), **TINY)
    on_ray = RunConfig(algo=algo, out=str(tmp_path / "ray"), executor="ray", ray_workers=2, **TINY)
    execute(prepare(sequential))
    prepared = prepare(on_ray)
    assert prepared.executor.name == "ray" and len(prepared.executor.actors) == 2
    execute(prepared)
    seq_dir, ray_dir = run_folder(tmp_path / "seq"), run_folder(tmp_path / "ray")
    assert seq_dir.name == ray_dir.name  # the same run: --executor ray is not part of the identity
    assert comparable(ray_dir) == comparable(seq_dir)


@needs_ray
@pytest.mark.parametrize("dp", ["client", "sample"])
def test_ray_executor_gives_the_sequential_numbers_with_dp(dp: str, local_ray, tmp_path: Path) -> None:
    """--dp (engine.privacy): the server's noise is drawn in the driver, DP-SGD's from each job's
    seed on the actor: the same numbers and ε as the sequential executor."""
    pytest.importorskip("opacus")
    settings = {**TINY, "dp": dp, "dp_noise": 0.8, "batch_size": 64}
    execute(prepare(RunConfig(out=str(tmp_path / "seq"), **settings)))
    execute(prepare(RunConfig(out=str(tmp_path / "ray"), executor="ray", ray_workers=2, **settings)))
    on_ray = comparable(run_folder(tmp_path / "ray"))
    assert on_ray == comparable(run_folder(tmp_path / "seq"))
    assert on_ray["summary"]["dp_epsilon"] > 0


@needs_ray
@pytest.mark.parametrize(
    "attack",
    [
        {"attack": "gaussian", "attackers": 0.25, "attack_scale": 0.1, "robust_agg": "trimmed-mean", "trim_frac": 0.25},
        {"attack": "backdoor", "attackers": 0.25, "robust_agg": "krum"},
    ],
    ids=["gaussian-trimmed-mean", "backdoor-krum"],
)
def test_ray_executor_gives_the_sequential_numbers_under_attack(attack: dict, local_ray, tmp_path: Path) -> None:
    """engine.attacks / engine.robust: the poisoned data travels with the run's data, the poisoned
    uploads and the robust rule are the driver's: the sequential numbers, attackers and asr."""
    settings = {**TINY, "num_clients": 5, **attack}
    execute(prepare(RunConfig(out=str(tmp_path / "seq"), **settings)))
    execute(prepare(RunConfig(out=str(tmp_path / "ray"), executor="ray", ray_workers=2, **settings)))
    on_ray = comparable(run_folder(tmp_path / "ray"))
    assert on_ray == comparable(run_folder(tmp_path / "seq"))
    assert on_ray["rounds"][-1]["attackers"]


@needs_ray
def test_ray_executor_gives_the_sequential_numbers_with_stragglers(local_ray, tmp_path: Path) -> None:
    """engine.availability: dropouts, partial work (each job's step cap travels to the actor)
    and over-selection give the sequential executor's numbers, who reported and simulated time."""
    settings = {
        **TINY,
        "num_clients": 6,
        "frac": 0.5,
        "dropout": 0.3,
        "straggler_model": "lognormal",
        "deadline": 0.5,
        "deadline_policy": "partial",
        "batch_size": 8,
        "over_select": 0.34,
    }
    execute(prepare(RunConfig(out=str(tmp_path / "seq"), **settings)))
    execute(prepare(RunConfig(out=str(tmp_path / "ray"), executor="ray", ray_workers=2, **settings)))
    on_ray = comparable(run_folder(tmp_path / "ray"))
    assert on_ray == comparable(run_folder(tmp_path / "seq"))
    assert on_ray["summary"]["sim_time_total"] > 0 and "reported" in on_ray["rounds"][-1]


@needs_ray
def test_program_and_data_are_shipped_once(local_ray, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pflbench.engine import ClientProgram

    config = RunConfig(algo="fedprox", out=str(tmp_path), executor="ray", ray_workers=2, **{**TINY, "rounds": 3})
    prepared = prepare(config)
    put, shipped = local_ray.put, []
    monkeypatch.setattr(
        local_ray, "put", lambda value, **kw: (shipped.append(type(value).__name__), put(value, **kw))[1]
    )
    execute(prepared)
    program = type(prepared.algorithm.program).__name__
    assert isinstance(prepared.algorithm.program, ClientProgram)
    assert shipped.count(program) == 1, shipped  # the program once per run
    # per call only the tensors several jobs share (the broadcast); model and data went at setup
    assert set(shipped) == {program, "dict"}, shipped


SMOOTH = """
import torch.nn.functional as F
from pflbench import ClientProgram, register_algorithm
from pflbench.algorithms.fedavg import FedAvg


class Smooth(ClientProgram):
    def loss_terms(self, forward, params, inputs, targets, received):
        return {"task": F.cross_entropy(forward(params, inputs), targets, label_smoothing=0.2)}


@register_algorithm("smoothavg_ray")
class SmoothAvg(FedAvg):
    program_class = Smooth
"""


@needs_ray
def test_plugin_algorithm_from_a_file_runs_on_ray_actors(local_ray, tmp_path: Path) -> None:
    from pflbench.registry import load_plugin_file

    plugin = tmp_path / "smooth_plugin.py"
    plugin.write_text(SMOOTH)
    load_plugin_file(plugin)  # a module the actors cannot import: its classes travel by value
    execute(prepare(RunConfig(algo="smoothavg_ray", out=str(tmp_path / "seq"), **TINY)))
    execute(prepare(RunConfig(algo="smoothavg_ray", out=str(tmp_path / "ray"), executor="ray", **TINY)))
    assert comparable(run_folder(tmp_path / "ray")) == comparable(run_folder(tmp_path / "seq"))


@needs_ray
def test_worker_killed_mid_round_is_replaced_and_numbers_are_unchanged(local_ray, tmp_path: Path) -> None:
    settings = {**TINY, "rounds": 3}
    execute(prepare(RunConfig(algo="fedper", out=str(tmp_path / "seq"), **settings)))
    prepared = prepare(RunConfig(algo="fedper", out=str(tmp_path / "ray"), executor="ray", ray_workers=2, **settings))
    executor = prepared.executor
    pids = executor.pids()
    killed: list[int] = []

    def kill_once(slot: int, chunk: list[tuple]) -> None:  # right after round-2 jobs went to `slot`
        if chunk[0][1] == 2 and not killed:
            os.kill(pids[slot], signal.SIGKILL)
            killed.append(pids[slot])

    executor.after_submit = kill_once
    execute(prepared)
    assert killed and executor.replaced >= 1
    assert comparable(run_folder(tmp_path / "ray")) == comparable(run_folder(tmp_path / "seq"))


def read_record(out: Path) -> dict[str, Any]:
    (path,) = (out / "sweeps").iterdir()
    return json.loads(path.read_text())


SWEEP = ["sweep", "--algos", "fedavg,fedprox", "--seeds", "0", "--alphas", "0.5", "--set", "mu=0.1", *TINY_ARGS]


@needs_ray
def test_sweep_on_ray_writes_what_a_local_sweep_writes_and_resumes(local_ray, tmp_path: Path) -> None:
    code, output = invoke(*SWEEP, "--out", str(tmp_path / "local"))
    assert code == 0 and "2 done" in output, output
    code, output = invoke(*SWEEP, "--ray", "--cpus-per-run", "1", "--out", str(tmp_path / "ray"))
    assert code == 0 and "2 done, 0 skipped" in output, output
    local_runs = sorted((tmp_path / "local" / "runs").iterdir())
    ray_runs = sorted((tmp_path / "ray" / "runs").iterdir())
    assert [p.name for p in ray_runs] == [p.name for p in local_runs]
    for local_dir, ray_dir in zip(local_runs, ray_runs):
        assert sorted(p.name for p in ray_dir.iterdir()) == sorted(p.name for p in local_dir.iterdir())
        assert comparable(ray_dir) == comparable(local_dir)
        config = json.loads((ray_dir / "config.json").read_text())
        assert config["out"] == str(tmp_path / "ray") and config["command"] == sys.argv
        summary = json.loads((ray_dir / "summary.json").read_text())
        assert summary["run_dir"] == str(ray_dir)
    assert read_record(tmp_path / "ray")["counts"]["done"] == 2
    (ray_runs[0] / "summary.json").unlink()  # an unfinished run: the rerun redoes only it
    code, output = invoke(*SWEEP, "--ray", "--out", str(tmp_path / "ray"))
    assert code == 0 and "1 done, 1 skipped" in output, output


@needs_ray
def test_sweep_on_ray_publishes_through_the_run_claims(local_ray, tmp_path: Path, monkeypatch) -> None:
    """The Ray driver claims runs as a local run does: a run that another live process holds is
    left to it (not run, not written); the others are written into ``.tmp-NAME`` under the
    driver's claim, while no ``OUT/runs/NAME`` exists, and moved into place in one step."""
    from pflbench.store.layout import RunPaths, claim_owner
    from pflbench.sweeps import on_ray
    from pflbench.sweeps.grid import Grid, expand_grid
    from pflbench.sweeps.record import sweep_record_path

    base = RunConfig(out=str(tmp_path), **{**TINY, "rounds": 1})
    grid = Grid(("fedavg",), ("digits",), (0.5,), (0, 1))
    runs = expand_grid(base, grid)
    held = RunPaths(runs[1].run_dir)  # claimed by another live process (a local sweep, say)
    held.claim.parent.mkdir(parents=True)
    seen: list[tuple[str, bool, Any]] = []
    write_run_files = on_ray.write_run_files

    def watched(folder: Path, files: dict[str, bytes]) -> None:
        final = RunPaths(folder.with_name(folder.name.removeprefix(".tmp-")))
        seen.append((folder.name, final.final.exists(), (claim_owner(final) or {}).get("pid")))
        write_run_files(folder, files)

    monkeypatch.setattr(on_ray, "write_run_files", watched)
    sleeper = subprocess.Popen(["sleep", "120"])
    try:
        owner = {"pid": sleeper.pid, "host": socket.gethostname(), "started": time.time()}
        held.claim.write_text(json.dumps(owner))
        on_ray.run_sweep_on_ray(runs, sweep_record_path(base.out, grid, base), grid, base)
        assert claim_owner(held) == owner  # still its owner's
    finally:
        sleeper.kill()
        sleeper.wait()
    assert [r.status for r in runs] == ["done", "claimed"]
    assert f"pid {sleeper.pid}" in runs[1].error
    assert seen == [(f".tmp-{runs[0].name}", False, os.getpid())]  # under the driver's claim, no NAME yet
    assert (runs[0].run_dir / "summary.json").is_file() and not held.final.exists()
    names = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert names == sorted([runs[0].name, held.claim.name])  # the driver's claim released, no .tmp-


CRASHY = """
import os, signal
from pathlib import Path
from pflbench import register_algorithm
from pflbench.algorithms.fedavg import FedAvg
from pflbench.engine import ClientProgram
from pflbench.engine.local import standard_local_update

MARKER = Path({marker!r})


class CrashOnce(ClientProgram):
    def local_update(self, trainer):
        if trainer.job.round == 2 and not MARKER.exists():  # the first attempt dies mid-run
            MARKER.write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return standard_local_update(self, trainer)


@register_algorithm("crashonce")
class CrashOnceAvg(FedAvg):
    program_class = CrashOnce
"""


@needs_ray
def test_sweep_run_whose_worker_died_is_redone_once(local_ray, tmp_path: Path) -> None:
    marker = tmp_path / "killed"
    plugin = tmp_path / "crashonce.py"
    plugin.write_text(CRASHY.format(marker=str(marker)))
    args = ["sweep", "--algos", "fedavg,crashonce", "--plugin", str(plugin), *TINY_ARGS, "--rounds", "3"]
    code, output = invoke(*args, "--ray", "--out", str(tmp_path / "ray"))
    assert code == 0 and "2 done, 0 skipped (already finished)" in output and "0 failed" in output, output
    assert marker.is_file(), "the crashing attempt never ran"
    record = read_record(tmp_path / "ray")
    assert record["counts"]["done"] == 2 and len(record["runs"]) == 2
    folders = {p.name.split("__")[0]: p for p in (tmp_path / "ray" / "runs").iterdir()}
    assert sorted(folders) == ["crashonce", "fedavg"]
    rounds = [comparable(folders[a])["rounds"] for a in ("crashonce", "fedavg")]
    assert rounds[0] == rounds[1]  # the redone run's numbers are those of an undisturbed FedAvg


NEW_ALGORITHMS = (
    "ditto",
    "apfl",
    "pfedme",
    "perfedavg",
    "fedbabu",
    "lgfedavg",
    "fedbn",
    "fedrod",
    "fedala",
    "scaffold",
    "moon",
    "feddyn",
    "fedavgm",
    "fedadam",
    "fedyogi",
    "fedadagrad",
    "fednova",
    "fedproto",
    "fedpac",
    "feddbe",
    "ifca",
    "fedfomo",
    "fedamp",
    "fedas",
    "fedgen",
    "fedkd",
    "fedcp",
    "gpfl",
    "fedmtl",
    "pflmoe",
    "pfedhn",
)


@needs_ray
@pytest.mark.parametrize("algo", NEW_ALGORITHMS)
def test_ray_hosts_every_added_algorithm_with_the_sequential_numbers(algo: str, local_ray, tmp_path: Path) -> None:
    """Extra per-client state (SCAFFOLD, Ditto, ...), personalization programs (FedBABU, Per-FedAvg)
    and BatchNorm models travel to the actors and back like the built-ins' state."""
    settings = {**TINY, "optimizer": "sgd", "lr": 0.05, **({"model": "cnn_bn"} if algo == "fedbn" else {})}
    execute(prepare(RunConfig(algo=algo, out=str(tmp_path / "seq"), **settings)))
    execute(prepare(RunConfig(algo=algo, out=str(tmp_path / "ray"), executor="ray", ray_workers=2, **settings)))
    assert comparable(run_folder(tmp_path / "ray")) == comparable(run_folder(tmp_path / "seq"))


@needs_ray
def test_local_instance_starts_without_a_warning_line_and_with_ray_s_auth_default(tmp_path: Path) -> None:
    """A new user's `sweep --ray` shows no Ray WARNING line; token authentication stays as Ray sets
    it for a new local instance (on when RAY_AUTH_MODE is unset), the user's mode is kept."""
    script = (
        "import os, ray\n"
        "from pflbench.util.ray_cluster import connect\n"
        "connect(None, 1)\n"
        "from ray._private.authentication import authentication_token_setup as auth\n"
        "print('mode', os.environ.get('RAY_AUTH_MODE'), auth.get_authentication_mode() == auth.AuthenticationMode.TOKEN)\n"
        "ray.shutdown()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "mode token True" in done.stdout
    assert "WARNING" not in done.stderr, done.stderr[-2000:]
    disabled = subprocess.run(
        [sys.executable, "-c", script],
        env={**env, "RAY_AUTH_MODE": "disabled"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "mode disabled False" in disabled.stdout, disabled.stderr[-2000:]


@needs_ray
@pytest.mark.parametrize("algo", ["fedper", "fedbabu", "pfedme"])
def test_ray_gives_the_sequential_numbers_with_validation_and_new_clients(algo: str, local_ray, tmp_path: Path) -> None:
    """Validation splits and new clients' adaptation (a fresh head, a personalization program, a
    custom new-client program) travel to the actors like everything else."""
    settings = {**TINY, "optimizer": "sgd", "lr": 0.05, "val_frac": 0.2, "new_clients": 0.25}
    execute(prepare(RunConfig(algo=algo, out=str(tmp_path / "seq"), **settings)))
    execute(prepare(RunConfig(algo=algo, out=str(tmp_path / "ray"), executor="ray", ray_workers=2, **settings)))
    on_ray = comparable(run_folder(tmp_path / "ray"))
    assert on_ray == comparable(run_folder(tmp_path / "seq"))
    assert "new_acc" in on_ray["rounds"][-1] and "val_pers_acc" in on_ray["rounds"][-1]
