"""Compare every run's rounds.jsonl / clients.csv under two folders, timings aside.

    python benchmarks/compare_rounds.py BEFORE AFTER

Prints one line per run (identical / which keys differ) and exits 1 if any differ.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TIMING = {"round_time_s", "eval_time_s", "peak_mem_mb", "server_svd_time_s", "wall_time_s", "run_dir"}


def load(folder: Path) -> tuple[list[dict], str]:
    (run,) = [p for p in folder.glob("runs/*") if (p / "rounds.jsonl").is_file()]
    records = [
        {k: v for k, v in json.loads(line).items() if k not in TIMING}
        for line in (run / "rounds.jsonl").read_text().splitlines()
    ]
    return records, (run / "clients.csv").read_text()


def main(before: Path, after: Path) -> int:
    failed = 0
    for case in sorted(p for p in before.iterdir() if (p / "runs").is_dir()):
        old, old_clients = load(case)
        new, new_clients = load(after / case.name)
        if old == new and old_clients == new_clients:
            print(f"{case.name}: identical ({len(old)} rounds)")
            continue
        failed += 1
        diff = sorted({k for a, b in zip(old, new) for k in set(a) | set(b) if a.get(k) != b.get(k)})
        print(f"{case.name}: DIFFERENT keys {diff}" + ("" if old_clients == new_clients else " + clients.csv"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
