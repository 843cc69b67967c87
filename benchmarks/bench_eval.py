"""Evaluation time vs number of clients for FedAvg and FedRep (issue 11, item 2).

    python benchmarks/bench_eval.py [--clients 20,100,1000] [--num-samples 60000]

Every client gets its own head (a distinct copy of the initial private state, as after a round
in which every client trained), then ``Evaluator.evaluate_clients`` is timed (median of ``--repeats``).
For FedRep the time of today's per-client evaluation (each client's whole model on its own test
split) is printed alongside: the ratio is what running the shared body once saves.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from pflbench.config.run_config import RunConfig
from pflbench.engine import EvalJob
from pflbench.engine.federation import federation_of
from pflbench.runs.prepare import prepare


def median_time(function, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="20,100,1000")
    parser.add_argument("--algos", default="fedavg,fedrep")
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--num-samples", type=int, default=60000)
    parser.add_argument("--shape", default="1x28x28")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--partition", default="iid", help="iid: 1,000 clients always get samples")
    parser.add_argument("--executor", default="sequential", help="vmap: personal models evaluated together")
    args = parser.parse_args()
    rows = []
    for algo in args.algos.split(","):
        for clients in (int(c) for c in args.clients.split(",")):
            config = RunConfig(
                algo=algo,
                dataset="synthetic",
                model=args.model,
                num_clients=clients,
                dataset_option=(f"num_samples={args.num_samples}", f"shape={args.shape}"),
                partition=args.partition,
                threads=args.threads,
                executor=args.executor,
                out="/tmp/pflbench_bench_eval",
            )
            prepared = prepare(config)
            algorithm, executor = prepared.algorithm, prepared.executor
            for k in range(clients):  # a head of its own per client
                algorithm.store.put(k, {n: t.clone() for n, t in algorithm.store.initial.items()})
            federation = federation_of(prepared)
            now = median_time(federation.evaluator.evaluate_clients, args.repeats)
            row = {"algo": algo, "clients": clients, "eval_s": now}
            if not algorithm.clients_share_one_model():

                def per_client(algorithm=algorithm, executor=executor, clients=clients) -> np.ndarray:
                    jobs = [EvalJob(algorithm.personal_model(k), (k,)) for k in range(clients)]
                    return np.concatenate(executor.evaluate(algorithm.program, jobs))

                row["per_client_eval_s"] = median_time(per_client, args.repeats)
                row["speedup"] = row["per_client_eval_s"] / now
            rows.append(row)
            extra = f", per-client {row['per_client_eval_s']:.3f}s ({row['speedup']:.1f}x)" if "speedup" in row else ""
            row["executor"] = args.executor
            print(f"{algo:>7} {clients:>5} clients ({args.executor}): evaluate {now:.3f}s{extra}", flush=True)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
