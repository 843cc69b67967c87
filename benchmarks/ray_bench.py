"""Ray measurements (issue 12): sweep throughput, round time, per-job overhead and its growth.

  OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ray_bench.py all --out bench-ray.json
  OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ray_bench.py all --tiny      # a quick check

- ``sweep``: the same grid of ≥ 8 small runs (~17 s each; ``--rounds 15``: ~6 s) as ``pflbench
  sweep`` (one process, one run after another) and as ``pflbench sweep --ray`` (local Ray instance with every core, one CPU per run),
  both as fresh CLI processes, so start-up (Python, torch, Ray) counts. Reports runs/s and the ratio;
  then the same sweep joining an already running instance (``ray start --head``, then
  ``--ray-address auto``: how a cluster is used), whose start-up is reported separately.
- ``round``: one run with 20 clients (all sampled) under ``--executor sequential`` and ``ray``;
  the median round time (training + aggregation; evaluation excluded) over rounds 3..R, after a
  warm-up run that starts the actors (runs in one process reuse them).
- ``overhead``: an empty actor call (Ray's floor), then the same run with ``--local-epochs 0`` (a job does no training: load, upload, ship),
  for 20, 50, 100 and 200 clients per round; ``ms/job`` = (ray − sequential) round time / clients,
  the cost of one job's round trip through Ray on top of what the sequential executor does.

Results print as a table and go to ``--out`` as JSON. Timings mean nothing on a busy machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PFLBENCH = [str(Path(sys.executable).parent / "pflbench")]


def sweep_args(tiny: bool, seeds: int = 4, rounds: int = 45) -> list[str]:
    """2 × ``seeds`` runs (2 algorithms; default 8 runs); each ~17 s on one core at 45 rounds, ~6 s at 15
    (tiny: well under one)."""
    size = (
        ["--num-clients", "6", "--rounds", "2", "--model", "mlp"]
        if tiny
        else ["--num-clients", "20", "--rounds", str(rounds), "--model", "cnn"]
    )
    return [
        "sweep",
        "--algos",
        "fedavg,fedprox",
        "--seeds",
        ",".join(str(seed) for seed in range(seeds)),
        "--alphas",
        "0.5",
        "--datasets",
        "digits",
        "--quiet",
        *size,
    ]


def timed(command: list[str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}")
    return time.perf_counter() - started


def run_times(out: str) -> list[float]:
    """Each finished run's own wall time (summary.json), in seconds."""
    return [json.loads(p.read_text())["wall_time_s"] for p in sorted(Path(out).glob("runs/*/summary.json"))]


def bench_sweep(tiny: bool, seeds: int = 4, rounds: int = 45) -> dict[str, Any]:
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as folder:
        args = sweep_args(tiny, seeds, rounds)
        runs = 2 * seeds
        local = timed([*PFLBENCH, *args, "--out", f"{folder}/local"])
        sequential_runs = run_times(f"{folder}/local")
        on_ray = timed([*PFLBENCH, *args, "--ray", "--cpus-per-run", "1", "--out", f"{folder}/ray"])
        ray_runs = run_times(f"{folder}/ray")
        # a cluster's usual state: Ray already running (`ray start --head`), the sweep joins it
        ray_cli = str(Path(sys.executable).parent / "ray")
        head_cpus = str(cores)
        head = timed(
            [ray_cli, "start", "--head", "--num-cpus", head_cpus, "--include-dashboard=false", "--disable-usage-stats"]
        )
        try:
            joined = timed(
                [*PFLBENCH, *args, "--ray-address", "auto", "--cpus-per-run", "1", "--out", f"{folder}/join"]
            )
        finally:
            subprocess.run([ray_cli, "stop", "--force"], capture_output=True)
    return {
        "runs": runs,
        "cores": cores,
        "rounds_per_run": rounds,
        "mean_run_s_sequential": statistics.mean(sequential_runs),
        "mean_run_s_ray": statistics.mean(ray_runs),
        # what the Ray sweep spends beyond its runs' own time spread over the cores:
        # start-up (instance, worker imports), the last run's tail, shutdown
        "ray_fixed_s": on_ray - sum(ray_runs) / cores,
        "sequential_fixed_s": local - sum(sequential_runs),
        "sequential_s": local,
        "ray_s": on_ray,
        "sequential_runs_per_s": runs / local,
        "ray_runs_per_s": runs / on_ray,
        "throughput_ratio": local / on_ray,
        "ray_start_head_s": head,
        "running_instance_s": joined,
        "running_instance_throughput_ratio": local / joined,
    }


def round_times(executor: str, clients: int, epochs: int, rounds: int, tiny: bool) -> list[float]:
    from pflbench.config.run_config import RunConfig
    from pflbench.runs.execute import execute
    from pflbench.runs.prepare import prepare

    dataset = dict(
        dataset="synthetic",
        dataset_option=(f"num_samples={max(2000, 30 * clients)}", "shape=1x16x16"),
        model="mlp" if tiny else "cnn",
    )
    with tempfile.TemporaryDirectory() as folder:
        config = RunConfig(
            algo="fedavg",
            num_clients=clients,
            rounds=rounds,
            local_epochs=epochs,
            eval_every=rounds,
            alpha=1.0,
            executor=executor,
            out=folder,
            **dataset,
        )
        records: list[dict[str, Any]] = []
        execute(prepare(config), on_round=records.append)
    return [r["round_time_s"] for r in records]


def median_round(executor: str, clients: int, epochs: int, rounds: int, tiny: bool) -> float:
    """Median round time without the first two rounds (actor start-up, lazy initialisation)."""
    times = round_times(executor, clients, epochs, rounds, tiny)
    return statistics.median(times[2:] if len(times) > 2 else times)


def bench_round(tiny: bool) -> dict[str, Any]:
    rounds = 5 if tiny else 8
    seq, ray_ = (median_round(e, 20, 1, rounds, tiny) for e in ("sequential", "ray"))
    return {"clients": 20, "sequential_round_s": seq, "ray_round_s": ray_, "speedup": seq / ray_}


def bench_overhead(tiny: bool) -> list[dict[str, Any]]:
    rows = []
    for clients in (20, 50) if tiny else (20, 50, 100, 200):
        seq, ray_ = (median_round(e, clients, 0, 5 if tiny else 8, tiny) for e in ("sequential", "ray"))
        rows.append(
            {
                "clients": clients,
                "sequential_round_ms": 1e3 * seq,
                "ray_round_ms": 1e3 * ray_,
                "ray_ms_per_job": 1e3 * ray_ / clients,
                "overhead_ms_per_job": 1e3 * (ray_ - seq) / clients,
            }
        )
    return rows


def bench_noop(calls: int) -> dict[str, float]:
    """Ray's floor: an actor call carrying nothing, one at a time and pipelined (ms per call)."""
    import ray

    from pflbench.engine.ray_executor import release_pool

    release_pool()  # idle client actors hold the CPUs the echo actor needs

    @ray.remote(num_cpus=1)
    class Echo:
        def echo(self, value: int) -> int:
            return value

    actor = Echo.remote()
    ray.get(actor.echo.remote(0))
    started = time.perf_counter()
    for i in range(calls):
        ray.get(actor.echo.remote(i))
    serial = (time.perf_counter() - started) / calls
    started = time.perf_counter()
    ray.get([actor.echo.remote(i) for i in range(calls)])
    pipelined = (time.perf_counter() - started) / calls
    ray.kill(actor)
    return {"serial_ms_per_call": 1e3 * serial, "pipelined_ms_per_call": 1e3 * pipelined}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("sweep", "round", "overhead", "all"))
    parser.add_argument("--tiny", action="store_true", help="minute-sized check of the scripts")
    parser.add_argument("--out", help="JSON file for the results")
    parser.add_argument("--seeds", type=int, default=4, help="sweep: 2 algorithms × this many seeds (default 8 runs)")
    parser.add_argument(
        "--rounds", type=int, default=45, help="sweep: rounds per run (45: ~17 s per run on one core; 15: ~6 s)"
    )
    options = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    results: dict[str, Any] = {"tiny": options.tiny, "cores": os.cpu_count()}
    if options.what in ("sweep", "all"):
        results["sweep"] = bench_sweep(options.tiny, options.seeds, options.rounds)
        s = results["sweep"]
        print(
            f"sweep of {s['runs']} runs of {s['mean_run_s_sequential']:.1f}s (sequential; "
            f"{s['mean_run_s_ray']:.1f}s in Ray workers): sequential {s['sequential_s']:.1f}s, ray {s['ray_s']:.1f}s, "
            f"throughput ×{s['throughput_ratio']:.2f}; joining a running instance (`ray start --head` "
            f"{s['ray_start_head_s']:.1f}s before) {s['running_instance_s']:.1f}s, "
            f"throughput ×{s['running_instance_throughput_ratio']:.2f}; Ray's fixed cost "
            f"{s['ray_fixed_s']:.1f}s (sequential's {s['sequential_fixed_s']:.1f}s)"
        )
    if options.what in ("round", "overhead", "all"):
        from pflbench.util.ray_cluster import connect

        connect(None)  # one local instance for the in-process measurements
        round_times("ray", 4, 1, 2, options.tiny)  # warm-up: the actors start (and are then reused)
    if options.what in ("round", "all"):
        results["round"] = bench_round(options.tiny)
        r = results["round"]
        print(
            f"round, 20 clients: sequential {r['sequential_round_s'] * 1e3:.0f} ms, ray "
            f"{r['ray_round_s'] * 1e3:.0f} ms, speed-up ×{r['speedup']:.2f}"
        )
    if options.what in ("overhead", "all"):
        results["noop"] = bench_noop(50 if options.tiny else 500)
        print(
            f"empty actor call: {results['noop']['serial_ms_per_call']:.2f} ms one at a time, "
            f"{results['noop']['pipelined_ms_per_call']:.2f} ms pipelined"
        )
        results["overhead"] = bench_overhead(options.tiny)
        print("clients  seq ms/round  ray ms/round  ray ms/job  overhead ms/job  (local epochs 0)")
        for row in results["overhead"]:
            print(
                f"{row['clients']:>7}  {row['sequential_round_ms']:>12.1f}  {row['ray_round_ms']:>12.1f}  "
                f"{row['ray_ms_per_job']:>10.2f}  {row['overhead_ms_per_job']:>15.2f}"
            )
    if options.out:
        Path(options.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
