"""Thread policy and parallel sweeps (issue 11, item 1). Run on a quiet machine:

    python benchmarks/bench_threads.py [--rounds 5] [--sweep-rounds 3] [--out /tmp/bench_threads]

1. A run's round time alone vs next to a CPU-bound competitor on every usable core (pure-Python
   busy loops): the median ``round_time_s`` of the README quick start (FedRep, digits), once with
   the default ``--threads 1`` and once with ``--threads 0`` (every core, torch's old default) to
   show the collapse the policy avoids. Target: slowdown ≤ 2.5× with the default.
2. An 8-run sweep (fedavg, fedper × seeds 0-3) with ``--jobs 2`` vs ``--jobs 1``: wall time,
   throughput ratio (target ≥ 1.7× on 2 cores) and whether every run's metrics are identical.

Prints one line per measurement and a JSON summary at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

TIMING = {"round_time_s", "eval_time_s", "peak_mem_mb", "wall_time_s", "run_dir"}
PFLBENCH = [sys.executable, "-c", "from pflbench.cli import main; main()"]


def median_round_time(out: Path, rounds: int, threads: int) -> float:
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run(
        [
            *PFLBENCH,
            "run",
            "--algo",
            "fedrep",
            "--dataset",
            "digits",
            "--rounds",
            str(rounds),
            "--threads",
            str(threads),
            "--quiet",
            "--out",
            str(out),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    (run,) = (out / "runs").iterdir()
    times = [json.loads(line)["round_time_s"] for line in (run / "rounds.jsonl").read_text().splitlines()]
    return statistics.median(times[1:] or times)  # the first round warms up


def with_competitors(function, *args):
    """``function(*args)`` while one busy Python loop per usable core runs."""
    cores = len(os.sched_getaffinity(0))
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
    try:
        return function(*args)
    finally:
        for hog in hogs:  # only the processes started here
            hog.kill()
            hog.wait()


def metrics(out: Path) -> dict[str, list[dict]]:
    result = {}
    for run in sorted((out / "runs").iterdir()):
        lines = (run / "rounds.jsonl").read_text().splitlines()
        result[run.name] = [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in lines]
    return result


def sweep_time(out: Path, jobs: int, rounds: int, extra: str) -> float:
    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    subprocess.run(
        [
            *PFLBENCH,
            "sweep",
            "--algos",
            "fedavg,fedper",
            "--seeds",
            "0,1,2,3",
            *extra.split(),
            "--rounds",
            str(rounds),
            "--jobs",
            str(jobs),
            "--quiet",
            "--out",
            str(out),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sweep-rounds", type=int, default=3)
    parser.add_argument(
        "--sweep-options",
        default="--datasets synthetic --dataset-option num_samples=2000",
        help="options of the 8-run sweep (e.g. '--datasets digits --model mlp' for a quick check)",
    )
    parser.add_argument("--skip-competitor", action="store_true", help="only the sweep part")
    parser.add_argument("--skip-sweep", action="store_true", help="only the competitor part")
    parser.add_argument("--out", type=Path, default=Path("/tmp/pflbench_bench_threads"))
    args = parser.parse_args()
    result = {}
    for threads in () if args.skip_competitor else (1, 0):
        alone = median_round_time(args.out / "alone", args.rounds, threads)
        busy = with_competitors(median_round_time, args.out / "busy", args.rounds, threads)
        result[f"threads={threads}"] = {"alone_s": alone, "busy_s": busy, "slowdown": busy / alone}
        print(
            f"--threads {threads}: round {alone:.3f}s alone, {busy:.3f}s next to a busy loop per core: "
            f"{busy / alone:.2f}x slower (target <= 2.5x for the default --threads 1)",
            flush=True,
        )
    if args.skip_sweep:
        print(json.dumps(result))
        return
    one = sweep_time(args.out / "jobs1", 1, args.sweep_rounds, args.sweep_options)
    two = sweep_time(args.out / "jobs2", 2, args.sweep_rounds, args.sweep_options)
    identical = metrics(args.out / "jobs1") == metrics(args.out / "jobs2")
    result["sweep"] = {"jobs1_s": one, "jobs2_s": two, "throughput_ratio": one / two, "identical": identical}
    print(
        f"8-run sweep: --jobs 1 {one:.1f}s, --jobs 2 {two:.1f}s: {one / two:.2f}x throughput "
        f"(target >= 1.7x on 2 cores); metrics identical: {identical}"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
