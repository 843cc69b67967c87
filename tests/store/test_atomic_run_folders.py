"""A finished result is never destroyed; runs are atomic and claimed."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from pflbench.cli import cli
from pflbench.config.run_config import RunConfig
from pflbench.runs.api import run_experiment
from pflbench.store.layout import (
    Claim,
    RunClaimed,
    RunFinished,
    RunPaths,
    claim_owner,
    guard_run,
    publish,
)
from pflbench.testing import kill_after_round, killed_after_round

TINY = ["--dataset", "digits", "--model", "mlp", "--num-clients", "3", "--rounds", "3", "--quiet"]


def config(out: Path, **changes) -> RunConfig:
    settings = {"dataset": "digits", "model": "mlp", "num_clients": 3, "rounds": 3, "out": str(out)}
    return RunConfig(**{**settings, **changes})


def the_run(out: Path) -> Path:
    (folder,) = [p for p in (out / "runs").iterdir() if p.is_dir() and not p.name.startswith(".")]
    return folder


def fork_run(cfg: RunConfig, kill_after: int | None = None, **flags) -> int:
    """Run in a forked child; exit status (0 trained, 10 refused as finished/claimed)."""
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            import torch

            torch.set_num_threads(1)
            if kill_after is not None:
                kill_after_round(kill_after)
            run_experiment(cfg, **flags)
            code = 0
        except (RunFinished, RunClaimed):
            code = 10
        finally:
            os._exit(code)
    return os.waitpid(pid, 0)[1]


def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def write_claim(paths: RunPaths, pid: int, host: str | None = None, age_s: float = 0.0) -> None:
    paths.claim.parent.mkdir(parents=True, exist_ok=True)
    paths.claim.write_text(
        json.dumps({"pid": pid, "host": host or socket.gethostname(), "started": time.time() - age_s})
    )
    if age_s:
        stamp = time.time() - age_s
        os.utime(paths.claim, (stamp, stamp))


def test_rerun_refuses_and_force_redoes_atomically(tmp_path: Path) -> None:
    args = ["run", "--algo", "fedavg", *TINY, "--out", str(tmp_path)]
    assert CliRunner().invoke(cli, args).exit_code == 0
    folder = the_run(tmp_path)
    before = (folder / "summary.json").read_bytes()
    again = CliRunner().invoke(cli, args)
    errors = again.stderr.strip().splitlines()
    assert again.exit_code == 2 and len(errors) == 1 and errors[0].startswith("Error: ")
    assert "already holds a finished run" in errors[0] and "--force" in errors[0]
    assert (folder / "summary.json").read_bytes() == before

    # a --force rerun killed in round 2 leaves the earlier result whole
    status = fork_run(config(tmp_path), kill_after=2, force=True)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert (folder / "summary.json").read_bytes() == before
    assert len((folder / "rounds.jsonl").read_text().splitlines()) == 3
    assert (tmp_path / "runs" / f".tmp-{folder.name}").is_dir()  # the dead rerun's work, not the result

    forced = CliRunner().invoke(cli, [*args, "--force"])
    assert forced.exit_code == 0, forced.output
    after = json.loads((folder / "summary.json").read_text())
    assert after["status"] == "completed" and (folder / "summary.json").read_bytes() != before  # wall time
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [folder.name]


def test_two_identical_runs_at_once_train_it_once(tmp_path: Path) -> None:
    cfg = config(tmp_path, rounds=4)
    pids = []
    for _ in range(2):
        pid = os.fork()
        if pid == 0:
            code = 3
            try:
                import torch

                torch.set_num_threads(1)
                run_experiment(cfg)
                code = 0
            except (RunFinished, RunClaimed):
                code = 10
            finally:
                os._exit(code)
        pids.append(pid)
    codes = sorted(os.WEXITSTATUS(os.waitpid(pid, 0)[1]) for pid in pids)
    assert codes == [0, 10], codes
    folder = the_run(tmp_path)
    assert len((folder / "rounds.jsonl").read_text().splitlines()) == 4
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [folder.name]


def test_claims_live_stale_and_other_hosts(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "runs" / "r1")
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        write_claim(paths, sleeper.pid)
        assert claim_owner(paths)["pid"] == sleeper.pid
        with pytest.raises(RunClaimed, match=f"pid {sleeper.pid}"):
            guard_run(paths, force=False)
        with pytest.raises(RunClaimed):
            Claim(paths).acquire()
    finally:
        sleeper.kill()
        sleeper.wait()
    write_claim(paths, dead_pid())  # the owner died: stale, taken over
    assert claim_owner(paths) is None
    paths.claim.write_text(
        json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(), "proc_start": 1})
    )
    assert claim_owner(paths) is None  # its pid now belongs to another process (started later)
    with Claim(paths):
        assert json.loads(paths.claim.read_text())["pid"] == os.getpid()
    assert not paths.claim.exists()
    write_claim(paths, 1, host="elsewhere")  # another host, fresh: respected
    assert claim_owner(paths) is not None
    write_claim(paths, 1, host="elsewhere", age_s=2 * 3600)  # untouched for 2 h: stale
    assert claim_owner(paths) is None
    with Claim(paths):
        pass
    assert not paths.claim.exists()


def test_sweep_skips_a_run_claimed_by_a_live_process(tmp_path: Path) -> None:
    args = ["sweep", "--algos", "fedavg", "--seeds", "0,1", "--datasets", *TINY[1:], "--out", str(tmp_path)]
    from pflbench.sweeps.grid import Grid, expand_grid

    runs = expand_grid(config(tmp_path), Grid(("fedavg",), ("digits",), (0.5,), (0, 1)))
    claimed = RunPaths(runs[1].run_dir)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        write_claim(claimed, sleeper.pid)
        result = CliRunner().invoke(cli, args)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert result.exit_code == 0, result.output
    assert "1 done" in result.output and "1 skipped (running elsewhere)" in result.output
    assert f"pid {sleeper.pid}" in result.output
    assert not (runs[1].run_dir / "summary.json").exists()


def test_publish_interrupted_between_moves_is_recovered(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "runs" / "r1")
    old = paths.final.with_name(".old-r1-12345")
    old.mkdir(parents=True)
    (old / "summary.json").write_text("{}")
    with pytest.raises(RunFinished):  # put back, then seen as finished
        guard_run(paths, force=False)
    assert (paths.final / "summary.json").is_file() and not old.exists()
    paths.work.mkdir()
    (paths.work / "summary.json").write_text('{"new": 1}')
    publish(paths)
    assert json.loads((paths.final / "summary.json").read_text()) == {"new": 1}
    assert sorted(p.name for p in paths.final.parent.iterdir()) == ["r1"]


def test_resume_publishes_a_run_killed_just_before_its_move(tmp_path: Path) -> None:
    cfg = config(tmp_path, rounds=1)
    first = run_experiment(cfg)
    folder = the_run(tmp_path)
    folder.rename(folder.with_name(".tmp-" + folder.name))  # summary written, not yet moved
    again = run_experiment(cfg, resume=True)
    assert again == first and (folder / "summary.json").is_file()
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [folder.name]


def test_two_identical_sweeps_at_once_train_each_run_once(tmp_path: Path) -> None:
    from pflbench.sweeps.grid import Grid, expand_grid
    from pflbench.sweeps.local import run_sweep
    from pflbench.sweeps.record import sweep_record_path

    base = config(tmp_path, rounds=2)
    grid = Grid(("fedavg",), ("digits",), (0.5,), (0, 1, 2))
    pids = []
    for _ in range(2):
        pid = os.fork()
        if pid == 0:
            code = 99
            try:
                import torch

                torch.set_num_threads(1)
                runs = expand_grid(base, grid)
                run_sweep(runs, sweep_record_path(base.out, grid, base), grid, base)
                code = sum(r.status == "done" for r in runs)
                code += 10 * sum(r.status == "failed" for r in runs)
            finally:
                os._exit(code)
        pids.append(pid)
    done = [os.WEXITSTATUS(os.waitpid(pid, 0)[1]) for pid in pids]
    assert sum(done) == 3, done  # 3 runs, each trained by exactly one of the two sweeps
    runs = tmp_path / "runs"
    assert sorted(p.name.split("__")[3] for p in runs.iterdir()) == ["s0", "s1", "s2"]
    for folder in runs.iterdir():
        assert len((folder / "rounds.jsonl").read_text().splitlines()) == 2
    assert len(list((tmp_path / "sweeps").iterdir())) == 2  # one record each, never shared


def test_sigkilled_sweep_resumes_its_unfinished_run(tmp_path: Path) -> None:
    from pflbench.sweeps.grid import Grid, expand_grid
    from pflbench.sweeps.local import run_sweep
    from pflbench.sweeps.record import sweep_record_path

    base = config(tmp_path, rounds=4, checkpoint_every=2)
    grid = Grid(("fedavg",), ("digits",), (0.5,), (0,))
    killed_after_round(
        3, lambda: run_sweep(expand_grid(base, grid), sweep_record_path(base.out, grid, base), grid, base)
    )
    runs = expand_grid(base, grid)
    run_sweep(runs, sweep_record_path(base.out, grid, base), grid, base)
    assert [r.status for r in runs] == ["done"]
    summary = json.loads((runs[0].run_dir / "summary.json").read_text())
    assert summary["checkpoints_written"] == 0  # resumed after the checkpoint of round 2
    assert len((runs[0].run_dir / "rounds.jsonl").read_text().splitlines()) == 4


def test_a_ray_driver_killed_while_writing_a_result_leaves_no_run_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sweep --ray``'s driver publishes a task's result as a local run does: into ``.tmp-NAME``,
    then one move. Killed while writing the files, it leaves no ``OUT/runs/NAME`` (only an
    unfinished work folder, which the next attempt starts afresh)."""
    from types import SimpleNamespace

    from pflbench.sweeps import on_ray

    run = SimpleNamespace(run_dir=tmp_path / "runs" / "r1", worker=None, status="pending", error=None)
    files = {
        "config.json": b"{}\n",
        "partition.json": b"{}\n",
        "rounds.jsonl": b'{"round": 1}\n',
        "clients.csv": b"client\n0\n",
        "summary.json": b'{"status": "completed"}\n',
    }
    result = {"status": "done", "summary": {"status": "completed"}, "files": files, "worker": "node"}
    write_bytes = Path.write_bytes

    def killed_at_the_summary(self: Path, data: bytes) -> int:
        if self.name.startswith("summary.json"):
            raise KeyboardInterrupt  # as a Ctrl-C or SIGKILL mid-write would stop the driver
        return write_bytes(self, data)

    monkeypatch.setattr(Path, "write_bytes", killed_at_the_summary)
    with pytest.raises(KeyboardInterrupt):
        on_ray.accept(run, result)
    monkeypatch.undo()
    assert not run.run_dir.exists()  # never a half-written run folder
    assert on_ray.accept(run, result) == {"status": "completed"}
    assert {p.name: p.read_bytes() for p in run.run_dir.iterdir()} == files
    assert [p.name for p in run.run_dir.parent.iterdir()] == ["r1"]  # no work folder left


def test_guard_replaces_a_finished_result_only_when_asked(tmp_path: Path) -> None:
    """A sweep's stale run: ``replaces(folder)`` decides, after an interrupted publish is recovered."""
    paths = RunPaths(tmp_path / "runs" / "r")
    paths.final.mkdir(parents=True)
    (paths.final / "summary.json").write_text('{"status": "completed"}')
    asked: list[Path] = []
    with pytest.raises(RunFinished):
        guard_run(paths, force=False, replaces=lambda folder: asked.append(folder) or False)
    guard_run(paths, force=False, replaces=lambda folder: asked.append(folder) or True)
    assert asked == [paths.final, paths.final]
    os.replace(paths.final, paths.final.with_name(".old-r-1"))  # killed between publish's two moves
    guard_run(paths, force=False, replaces=lambda folder: (folder / "summary.json").is_file())
    assert (paths.final / "summary.json").is_file()
