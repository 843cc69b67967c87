"""Peak RSS and s/round of FedRep with every client sampled (issue 11, item 4).

    python benchmarks/bench_memory.py [--clients 100,1000] [--num-samples 60000] [--rounds 2]

Each run is a separate ``pflbench run`` process (``--dataset synthetic``, the given number of
samples, ``--frac 1``); its peak RSS (``peak_mem_mb`` of the last round, ru_maxrss) and median
``round_time_s`` are printed. Target: 1,000 clients within 2 GB. Run the same command on the base
commit to compare (it holds every upload of a round until aggregation).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

PFLBENCH = [sys.executable, "-c", "from pflbench.cli import main; main()"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="100,1000")
    parser.add_argument("--num-samples", type=int, default=60000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--algo", default="fedrep")
    parser.add_argument(
        "--extra",
        default="--partition iid",
        help="more pflbench run options (default: iid, so that 1,000 clients all get "
        "samples; e.g. '--partition iid --head-epochs 1 --model mlp')",
    )
    parser.add_argument("--out", type=Path, default=Path("/tmp/pflbench_bench_memory"))
    args = parser.parse_args()
    rows = []
    for clients in (int(c) for c in args.clients.split(",")):
        out = args.out / f"k{clients}"
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run(
            [
                *PFLBENCH,
                "run",
                "--algo",
                args.algo,
                "--dataset",
                "synthetic",
                "--dataset-option",
                f"num_samples={args.num_samples}",
                "--num-clients",
                str(clients),
                "--frac",
                "1",
                "--rounds",
                str(args.rounds),
                "--quiet",
                "--out",
                str(out),
                *args.extra.split(),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        (run,) = (out / "runs").iterdir()
        records = [json.loads(line) for line in (run / "rounds.jsonl").read_text().splitlines()]
        row = {
            "algo": args.algo,
            "clients": clients,
            "peak_rss_mb": records[-1]["peak_mem_mb"],
            "s_per_round": statistics.median(r["round_time_s"] for r in records),
        }
        rows.append(row)
        print(
            f"{args.algo} {clients:>5} clients (all sampled): peak RSS {row['peak_rss_mb']:.0f} MB, "
            f"{row['s_per_round']:.1f} s/round",
            flush=True,
        )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
