"""Local-training steps/s of ``--executor vmap`` vs ``sequential`` (issue 11, item 3).

    python benchmarks/bench_vmap.py [--clients 20,100] [--models mlp,cnn] [--device cpu|cuda]

Every client of a round trains (``--frac 1``, FedAvg, batch 10, 1 local epoch); the time of
``executor.train`` over the round's jobs is measured per executor (median of ``--repeats``
rounds after one warm-up) and steps/s = Σ client steps / time. Target: ≥ 1.5× for the cnn at 20
clients on CPU; on a GPU ≥ 10× at 100 clients. Both executors use ``--threads`` (default 1).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import time

import torch

from pflbench.config import RunConfig
from pflbench.engine import ClientJob
from pflbench.runner import prepare
from pflbench.seeding import derive_seed


def steps_per_second(config: RunConfig, repeats: int) -> tuple[float, int]:
    prepared = prepare(config)
    algorithm, executor, data = prepared.algorithm, prepared.executor, prepared.data
    clients = list(range(config.num_clients))
    steps = sum(config.local_epochs * max(1, math.ceil(data.num_train[k] / config.batch_size)) for k in clients)
    times = []
    for round_index in range(repeats + 1):
        jobs = [
            ClientJob(
                k,
                round_index,
                derive_seed(config.seed, "train", round_index, k),
                algorithm.broadcast(k),
                algorithm.store.get(k),
            )
            for k in clients
        ]
        if data.device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        executor.train(algorithm.program, jobs)
        if data.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return steps / statistics.median(times[1:]), steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="20,100")
    parser.add_argument("--models", default="mlp,cnn")
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--dataset-option", action="append", default=[])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="/tmp/pflbench_bench_vmap")
    args = parser.parse_args()
    rows = []
    for model in args.models.split(","):
        for clients in (int(c) for c in args.clients.split(",")):
            base = RunConfig(
                algo="fedavg",
                dataset=args.dataset,
                dataset_option=tuple(args.dataset_option),
                model=model,
                num_clients=clients,
                alpha=0.5,
                batch_size=args.batch_size,
                lr=0.01,
                device=args.device,
                threads=args.threads,
                out=args.out,
                min_size=2,
            )
            seq, steps = steps_per_second(base, args.repeats)
            vec, _ = steps_per_second(dataclasses.replace(base, executor="vmap"), args.repeats)
            rows.append(
                {
                    "model": model,
                    "clients": clients,
                    "steps": steps,
                    "sequential_steps_s": seq,
                    "vmap_steps_s": vec,
                    "speedup": vec / seq,
                    "device": args.device,
                }
            )
            print(
                f"{model:>4} {clients:>4} clients on {args.device}: sequential {seq:8.1f} steps/s, "
                f"vmap {vec:8.1f} steps/s: {vec / seq:.2f}x",
                flush=True,
            )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
