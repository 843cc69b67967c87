"""The thread policy (``--threads``) and parallel sweeps (``pflbench sweep --jobs N``)."""

from __future__ import annotations

import dataclasses
import json
import textwrap
from pathlib import Path

import torch

from pflbench.config.identity import identity_settings
from pflbench.config.run_config import RunConfig, resolve
from pflbench.registry import ALGORITHMS, load_plugin_file
from pflbench.runs.prepare import prepare
from pflbench.runs.start import config_record
from pflbench.sweeps.grid import Grid, expand_grid
from pflbench.sweeps.local import run_sweep
from pflbench.util.threads import threads_per_job, usable_cores

TIMING = {"round_time_s", "eval_time_s", "peak_mem_mb", "wall_time_s", "run_dir"}


def test_threads_default_is_one_recorded_and_part_of_the_identity_on_the_cpu(tmp_path) -> None:
    """The thread count changes the numbers in the last bits (issue 25), so a run with 2
    threads is another run than one with 1: another folder (1 is left out of the identity,
    so older folders keep their names); on an accelerator the CPU threads do not count."""
    assert RunConfig.threads == 1
    config = RunConfig(model="mlp", num_clients=3, rounds=1, out=str(tmp_path), threads=2)
    algorithm = ALGORITHMS.get("fedavg")
    hparams = algorithm.hyperparameters()
    config, _ = resolve(config, algorithm, hparams)
    one = identity_settings(dataclasses.replace(config, threads=1), algorithm, hparams)
    assert identity_settings(config, algorithm, hparams) == {**one, "threads": 2} and "threads" not in one
    on_gpu = dataclasses.replace(config, device="cuda")
    assert identity_settings(on_gpu, algorithm, hparams) == identity_settings(
        dataclasses.replace(on_gpu, threads=1), algorithm, hparams
    )
    try:
        prepared = prepare(config)
        assert torch.get_num_threads() == 2 and prepared.resolved["threads"] == 2
        assert config_record(prepared)["threads"] == 2 and config_record(prepared)["identity"]["threads"] == 2
    finally:
        torch.set_num_threads(1)


def test_threads_0_is_recorded_as_the_count_it_meant(tmp_path) -> None:
    """``rerun`` reads config.json's ``threads``: it must be the count that shaped the numbers,
    not 0 (every core of whichever machine reruns it)."""
    from pflbench.runs.prepare import plan_run

    plan = plan_run(RunConfig(model="mlp", num_clients=3, rounds=1, out=str(tmp_path), threads=0))
    assert plan.config.threads == usable_cores()


def test_a_parallel_sweep_names_its_runs_by_the_threads_each_gets(tmp_path) -> None:
    """--jobs 2 --threads 2 runs each run with 1 thread: the folders of --jobs 1 --threads 1;
    --jobs 1 --threads 2 runs with 2 threads: other folders."""
    grid = Grid(("fedavg", "fedper"), ("digits",), (0.5,), (0,))

    def names(threads: int, jobs: int) -> list[str]:
        base = RunConfig(model="mlp", num_clients=3, rounds=1, out=str(tmp_path), threads=threads)
        runs = expand_grid(base, grid, jobs)
        assert all(run.config.threads == threads_per_job(threads, jobs) for run in runs)
        return [run.name for run in runs]

    assert names(2, 2) == names(1, 1) and names(4, 2) == names(2, 1)
    assert set(names(2, 1)).isdisjoint(names(1, 1))


def test_threads_per_job_splits_the_total() -> None:
    assert threads_per_job(4, 2) == 2
    assert threads_per_job(1, 2) == 1
    assert threads_per_job(0, 1) == usable_cores()


def finished(out: Path) -> dict[str, list[dict]]:
    result = {}
    for run in sorted((out / "runs").iterdir()):
        if (run / "summary.json").is_file():
            result[run.name] = [
                {k: v for k, v in json.loads(line).items() if k not in TIMING}
                for line in (run / "rounds.jsonl").read_text().splitlines()
            ]
    return result


def test_sweep_jobs_2_gives_the_metrics_of_jobs_1_and_keeps_skip_and_errors(tmp_path) -> None:
    plugin = tmp_path / "boom.py"
    plugin.write_text(
        textwrap.dedent("""
        from pflbench import register_algorithm
        from pflbench.algorithms.fedavg import FedAvg

        @register_algorithm("test_jobs_boom")
        class Boom(FedAvg):
            def aggregate(self, updates):
                raise RuntimeError("boom on purpose")
    """)
    )
    load_plugin_file(plugin)
    grid = Grid(("fedavg", "fedper", "test_jobs_boom"), ("digits",), (0.5,), (0,))
    outputs = {}
    for jobs in (1, 2):
        base = RunConfig(model="mlp", num_clients=3, rounds=1, lr=0.05, out=str(tmp_path / f"jobs{jobs}"))
        runs = expand_grid(base, grid)
        reported = []
        run_sweep(
            runs,
            tmp_path / f"record{jobs}.json",
            grid,
            base,
            (str(plugin),),
            lambda index, run, summary, seen=reported: seen.append(index),
            jobs=jobs,
        )
        assert sorted(reported) == list(range(len(runs)))
        statuses = {r.config.algo: r.status for r in runs}
        assert statuses == {"fedavg": "done", "fedper": "done", "test_jobs_boom": "failed"}
        failed = [r for r in runs if r.status == "failed"]
        assert all("boom on purpose" in r.error and (r.run_dir / "error.json").is_file() for r in failed)
        outputs[jobs] = finished(Path(base.out))
        record = json.loads((tmp_path / f"record{jobs}.json").read_text())
        assert record["counts"]["done"] == 2 and record["counts"]["failed"] == 1
    assert outputs[1] == outputs[2] and len(outputs[1]) == 2
    again = Grid(("fedavg", "fedper"), ("digits",), (0.5,), (0,))
    runs = expand_grid(base, again)  # rerun: finished runs are skipped (no worker is started)
    run_sweep(runs, tmp_path / "again.json", again, base, (), jobs=2)
    assert [r.status for r in runs] == ["skipped", "skipped"]


def test_dispatch_order_groups_seeds_of_one_setting_and_puts_the_most_work_first(tmp_path) -> None:
    from pflbench.sweeps.parallel import dispatch_order

    base = RunConfig(model="mlp", num_clients=4, rounds=2, out=str(tmp_path))
    grid = Grid(algos=("fedavg", "fedprox"), datasets=("digits",), alphas=(0.5,), seeds=(0, 1, 2, 3))
    runs = expand_grid(base, grid)
    # grid order: seeds outer, algorithms inner — on 2 workers each would get one algorithm only
    assert [(r.config.algo, r.config.seed) for r in runs][:4] == [
        ("fedavg", 0),
        ("fedprox", 0),
        ("fedavg", 1),
        ("fedprox", 1),
    ]
    order = dispatch_order(list(enumerate(runs)))
    assert [(r.config.algo, r.config.seed) for _, r in order] == [
        ("fedavg", 0),
        ("fedavg", 1),
        ("fedavg", 2),
        ("fedavg", 3),
        ("fedprox", 0),
        ("fedprox", 1),
        ("fedprox", 2),
        ("fedprox", 3),
    ]
    assert sorted(index for index, _ in order) == list(range(8))  # every run once, grid index kept
    # a run with more rounds goes first, wherever it sits in the grid
    longer = dataclasses.replace(runs[5].config, rounds=10)
    runs[5] = dataclasses.replace(runs[5], config=longer)
    assert dispatch_order(list(enumerate(runs)))[0] == (5, runs[5])


def test_one_dead_worker_fails_only_its_own_run(tmp_path) -> None:
    """SIGKILL of one worker (what the OOM killer does) breaks the pool; only the run that was on
    it is recorded failed (with an error.json), every other run of the sweep finishes."""
    plugin = tmp_path / "oom.py"
    plugin.write_text(
        textwrap.dedent("""
        import os
        import signal

        from pflbench import register_algorithm
        from pflbench.algorithms.fedavg import FedAvg

        @register_algorithm("test_jobs_oom")
        class OutOfMemory(FedAvg):
            def aggregate(self, updates):
                if self.config.seed == 1:
                    os.kill(os.getpid(), signal.SIGKILL)
                return super().aggregate(updates)
    """)
    )
    load_plugin_file(plugin)
    grid = Grid(("fedavg", "test_jobs_oom"), ("digits",), (0.5,), (0, 1, 2))
    base = RunConfig(model="mlp", num_clients=3, rounds=2, lr=0.05, out=str(tmp_path / "out"))
    runs = expand_grid(base, grid)
    run_sweep(runs, tmp_path / "record.json", grid, base, (str(plugin),), jobs=2)
    statuses = {(r.config.algo, r.config.seed): r.status for r in runs}
    assert statuses.pop(("test_jobs_oom", 1)) == "failed"
    assert set(statuses.values()) == {"done"}, statuses
    (dead,) = [r for r in runs if r.status == "failed"]
    assert "worker process died" in dead.error and (dead.run_dir / "error.json").is_file()
    record = json.loads((tmp_path / "record.json").read_text())
    assert record["counts"]["done"] == 5 and record["counts"]["failed"] == 1


def test_workers_die_with_a_killed_driver(tmp_path) -> None:
    """SIGKILL the driver of ``sweep --jobs 2``: its workers end too instead of running on."""
    import os
    import signal
    import subprocess
    import sys
    import time

    command = [
        sys.executable, "-c", "import sys; from pflbench.cli import main; sys.argv[0] = 'pflbench'; main()",
        "sweep", "--algos", "fedavg", "--datasets", "digits", "--seeds", "0,1,2,3", "--model", "mlp",
        "--rounds", "200", "--num-clients", "3", "--jobs", "2", "--quiet", "--out", str(tmp_path),
    ]  # fmt: skip
    driver = subprocess.Popen(command, env={**os.environ, "OMP_NUM_THREADS": "1"})

    def children() -> list[int]:
        found = []
        for status in Path("/proc").glob("[0-9]*/status"):
            try:
                fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
            except OSError:
                continue
            if fields.get("PPid", "").strip() == str(driver.pid):
                found.append(int(status.parent.name))
        return found

    deadline = time.time() + 60
    while (
        time.time() < deadline
        and len(list((tmp_path / "runs").glob(".tmp-*")) if (tmp_path / "runs").exists() else []) < 2
    ):
        time.sleep(0.5)  # both workers have started a run
    workers = children()
    assert workers, "no worker processes found"
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    deadline = time.time() + 15
    alive = workers
    while alive and time.time() < deadline:
        time.sleep(0.5)
        alive = [
            pid
            for pid in workers
            if Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text()
        ]
    for pid in alive:  # do not leave them behind if the test fails
        os.kill(pid, signal.SIGKILL)
    assert not alive, f"workers {alive} outlived their driver"
