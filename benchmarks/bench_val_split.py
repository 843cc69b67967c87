"""What the validation split and new clients cost per round: CPU time of training, of the
evaluation of the training clients (test, + validation) and of the new clients' adaptation.

    OMP_NUM_THREADS=1 python benchmarks/bench_val_split.py --algos fedavg,fedrep --rounds 10

The variants run interleaved, round by round, in one process and are timed in CPU time (one
thread), so the load of a shared machine shifts them alike; medians over the rounds.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from pflbench.config.run_config import RunConfig
from pflbench.engine import Federation
from pflbench.engine.federation import federation_of
from pflbench.runs.prepare import prepare

VARIANTS = {
    "--val-frac 0": {"val_frac": 0.0},
    "--val-frac 0.1": {"val_frac": 0.1},
    "--val-frac 0.1 --new-clients 0.2": {"val_frac": 0.1, "new_clients": 0.2},
}


def one_round(federation: Federation, round_index: int) -> tuple[float, float, float]:
    """CPU seconds of (training + aggregation, evaluation, new clients' adaptation + test)."""
    started = time.process_time()
    federation.train_round(round_index, federation.sample_clients())
    trained = time.process_time()
    federation.evaluator.evaluate_clients(round_index)
    evaluated = time.process_time()
    for protocol in federation.evaluator.protocols[1:]:  # the new clients' (the only other one here)
        protocol.measure(round_index)
    return trained - started, evaluated - trained, time.process_time() - evaluated


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algos", default="fedavg,fedrep")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--dataset", default="digits")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as out:
        for algo in args.algos.split(","):
            federations = {
                name: federation_of(
                    prepare(RunConfig(algo=algo, dataset=args.dataset, rounds=args.rounds, out=out, **settings))
                )
                for name, settings in VARIANTS.items()
            }
            times: dict[str, list[tuple[float, float, float]]] = {name: [] for name in VARIANTS}
            for round_index in range(1, args.rounds + 1):
                for name, federation in federations.items():
                    times[name].append(one_round(federation, round_index))
            for name, measured in times.items():
                train, evaluation, new = (statistics.median(column) for column in zip(*measured))
                print(
                    f"{algo:8s} {name:34s} train {train:.3f} s  evaluation {evaluation:.3f} s  new clients {new:.3f} s"
                )


if __name__ == "__main__":
    main()
