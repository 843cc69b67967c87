"""One folder per run: config.json, partition.json, rounds.jsonl, clients.csv, summary.json.

``summary.json`` is written last and atomically: a folder without it is an unfinished run
that leaderboards skip.
"""
from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path
from typing import Any


def _clean(value: Any) -> Any:
    """JSON-safe: NaN/inf become null, numpy scalars become Python numbers."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_json(path: Path, data: Any) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(_clean(data), indent=2, sort_keys=False) + "\n")
    os.replace(temporary, path)


class RunWriter:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        for stale in ("summary.json", "rounds.jsonl", "clients.csv"):
            (run_dir / stale).unlink(missing_ok=True)
        self._rounds = open(run_dir / "rounds.jsonl", "w")

    def write_config(self, config: dict[str, Any]) -> None:
        write_json(self.run_dir / "config.json", config)

    def write_partition(self, partition: dict[str, Any]) -> None:
        write_json(self.run_dir / "partition.json", partition)

    def write_round(self, record: dict[str, Any]) -> None:
        self._rounds.write(json.dumps(_clean(record)) + "\n")
        self._rounds.flush()

    def write_clients(self, rows: list[dict[str, Any]]) -> None:
        with open(self.run_dir / "clients.csv", "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(_clean(rows))

    def write_summary(self, summary: dict[str, Any]) -> None:
        self._rounds.close()
        write_json(self.run_dir / "summary.json", summary)

    def close(self) -> None:
        if not self._rounds.closed:
            self._rounds.close()
