"""The sweep record (``OUT/sweeps/<hash>.json``): every run of a grid with its status, rewritten as runs finish."""

from __future__ import annotations

import dataclasses
import time
import traceback
from pathlib import Path

from pflbench.config.run_config import (
    RunConfig,
)
from pflbench.store.layout import ERROR_FILE
from pflbench.store.writer import write_json
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


def _write_record(path: Path, grid: Grid, base: RunConfig, runs: list[SweepRun]) -> None:
    shared = {k: v for k, v in dataclasses.asdict(base).items() if k not in GRID_FIELDS}
    write_json(
        path,
        {"grid": grid.to_json(), "shared": shared, "counts": count_statuses(runs), "runs": [r.to_json() for r in runs]},
    )


def count_statuses(runs: list[SweepRun]) -> dict[str, int]:
    counts = {s: 0 for s in ("done", "skipped", "claimed", "diverged", "failed", "interrupted", "pending")}
    for run in runs:
        counts[run.status] += 1
    return counts


def write_error(run: SweepRun, error: BaseException) -> None:
    """``error.json`` in the run folder: type, message, traceback and the run's settings."""
    run.run_dir.mkdir(parents=True, exist_ok=True)
    write_json(
        run.run_dir / ERROR_FILE,
        {
            "error_type": type(error).__name__,
            "message": str(error),
            "traceback": "".join(traceback.format_exception(error)),
            "config": {**dataclasses.asdict(run.config), "algo_options": run.algo_options},
        },
    )
