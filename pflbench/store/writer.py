"""Writing a run folder's files (the one writer; their names are ``store.layout``'s): config.json,
partition.json, rounds.jsonl, clients.csv, summary.json, and any JSON file (``write_json``).

The writer fills the run's work folder (``rundir``: ``OUT/runs/.tmp-NAME``), which is moved to
``OUT/runs/NAME`` once summary.json is written: a folder with summary.json is a whole run.
summary.json's ``status`` is ``completed`` or ``diverged``.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
from pathlib import Path
from typing import Any

from pflbench.store.layout import (
    CLIENTS_FILE,
    CONFIG_FILE,
    PARTITION_FILE,
    PLUGINS_DIR,
    ROUNDS_FILE,
    SUMMARY_FILE,
)
from pflbench.util.atomic import atomic_write_bytes, atomic_write_json


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
    """Atomically (a uniquely named temporary file, fsync, ``os.replace``): concurrent writers
    of one file never interleave, a reader never sees half a file."""
    atomic_write_json(Path(path), _clean(data))


_ABSOLUTE_PATH = re.compile(r"(?<![\w.:/])/(?:[^\s/'\"]+/)*[^\s/'\",;)\]]+/?")


def without_local_paths(value: Any) -> Any:
    """``value`` (JSON-like) with every absolute path replaced by ``<local>/NAME`` (its last part),
    for results shared with others (``--portable``): no user names, home or cluster folders."""
    if isinstance(value, str):
        return _ABSOLUTE_PATH.sub(lambda m: "<local>/" + m.group(0).rstrip("/").rsplit("/", 1)[-1], value)
    if isinstance(value, dict):
        return {k: without_local_paths(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [without_local_paths(v) for v in value]
    return value


class RunWriter:
    """Writes the files of one run into ``run_dir`` (a fresh work folder, or a resumed one whose
    rounds.jsonl keeps its first ``keep_rounds`` lines)."""

    def __init__(self, run_dir: Path, keep_rounds: int | None = None, portable: bool = False) -> None:
        self.run_dir, self.portable = run_dir, portable
        run_dir.mkdir(parents=True, exist_ok=True)
        rounds = run_dir / ROUNDS_FILE
        if keep_rounds is None:
            self._rounds = open(rounds, "w")
        else:
            lines = rounds.read_text().splitlines(keepends=True)[:keep_rounds]
            self._rounds = open(rounds, "w")
            self._rounds.writelines(lines)
            self._rounds.flush()

    def write_config(self, config: dict[str, Any]) -> None:
        write_json(self.run_dir / CONFIG_FILE, without_local_paths(config) if self.portable else config)

    def write_plugin_copies(self, sources: dict[str, bytes]) -> None:
        """``PLUGINS_DIR/NAME``: the source of each ``--plugin`` file the run was given (a rerun
        uses it when the original file moved or changed; portable: it names no local path)."""
        for name, source in sources.items():
            atomic_write_bytes(self.run_dir / PLUGINS_DIR / name, source)

    def write_partition(self, partition: dict[str, Any]) -> None:
        write_json(self.run_dir / PARTITION_FILE, partition)

    def write_round(self, record: dict[str, Any]) -> None:
        self._rounds.write(json.dumps(_clean(record)) + "\n")
        self._rounds.flush()

    def sync(self) -> None:
        if not self._rounds.closed:
            self._rounds.flush()
            os.fsync(self._rounds.fileno())

    def write_clients(self, rows: list[dict[str, Any]]) -> None:
        with open(self.run_dir / CLIENTS_FILE, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(_clean(rows))

    def write_summary(self, summary: dict[str, Any]) -> None:
        self.close()
        write_json(self.run_dir / SUMMARY_FILE, without_local_paths(summary) if self.portable else summary)

    def close(self) -> None:
        if not self._rounds.closed:
            self._rounds.close()
