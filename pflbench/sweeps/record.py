"""The sweep record (``OUT/sweeps/<hash>.json``): every run of a grid with its status, rewritten as
runs finish (with ``--portable``, like a run's files, without local absolute paths)."""

from __future__ import annotations

import dataclasses
import math
import time
import traceback
from pathlib import Path

from pflbench.config.run_config import (
    RunConfig,
)
from pflbench.store.layout import ERROR_FILE
from pflbench.store.writer import without_local_paths, write_json
from pflbench.sweeps.grid import (
    GRID_FIELDS,
    Grid,
    SweepRun,
)
from pflbench.util.hashing import settings_hash


def sweep_record_path(out: str | Path, grid: Grid, base: RunConfig) -> Path:
    """``OUT/sweeps/<YYYYmmdd-HHMMSS>-<hash of grid and shared options>[-n].json`` (a new file)."""
    digest = settings_hash([grid.to_json(), dataclasses.asdict(base)], 8)
    stem = Path(out) / "sweeps" / f"{time.strftime('%Y%m%d-%H%M%S')}-{digest}"
    path, attempt = stem.with_suffix(".json"), 1
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:  # reserve the name: two sweeps of the same grid within one second get two files
        try:
            with open(path, "x"):
                return path
        except FileExistsError:
            attempt += 1
            path = stem.with_name(f"{stem.name}-{attempt}.json")


class SweepRecord:
    """The sweep record file, kept up to date as runs finish: at once on ``update(force=True)``
    (start, end, interruption), otherwise at most every ``max(5 s, 0.05 s × runs)``. A rewrite
    costs the whole file (~0.25 kB per run), so rewriting it after every run made a 2,000-run
    sweep write ~1 GB for 87 MB of results; at this rate the bytes written stay proportional to
    the sweep's length, not to its square (and resuming a finished sweep writes it twice)."""

    def __init__(self, path: Path, grid: Grid, base: RunConfig, runs: list[SweepRun]) -> None:
        self.path, self.grid, self.base, self.runs = path, grid, base, runs
        self.min_interval_s = max(5.0, 0.05 * len(runs))
        self.written_at = -math.inf
        self.writes = 0

    def update(self, force: bool = False) -> None:
        if not force and time.monotonic() - self.written_at < self.min_interval_s:
            return
        shared = {k: v for k, v in dataclasses.asdict(self.base).items() if k not in GRID_FIELDS}
        runs = self.runs
        record = {
            "grid": self.grid.to_json(),
            "shared": shared,
            "counts": count_statuses(runs),
            "runs": [r.to_json() for r in runs],
        }
        write_json(self.path, without_local_paths(record) if self.base.portable else record)
        self.written_at, self.writes = time.monotonic(), self.writes + 1


def count_statuses(runs: list[SweepRun]) -> dict[str, int]:
    counts = {s: 0 for s in ("done", "skipped", "claimed", "diverged", "failed", "interrupted", "pending")}
    for run in runs:
        counts[run.status] += 1
    return counts


def write_error(run: SweepRun, error: BaseException) -> None:
    """``error.json`` in the run folder: type, message, traceback and the run's settings."""
    run.run_dir.mkdir(parents=True, exist_ok=True)
    failure = {
        "error_type": type(error).__name__,
        "message": str(error),
        "traceback": "".join(traceback.format_exception(error)),
        "config": {**dataclasses.asdict(run.config), "algo_options": run.algo_options},
    }
    write_json(run.run_dir / ERROR_FILE, without_local_paths(failure) if run.config.portable else failure)
