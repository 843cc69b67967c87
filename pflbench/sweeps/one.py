"""One cell of a sweep: prepare and execute one run, and name its outcome."""

from __future__ import annotations

from typing import Any

from pflbench.runs.execute import RunDiverged, execute
from pflbench.runs.prepare import prepare
from pflbench.store.layout import ERROR_FILE, RunClaimed, RunFinished, RunPaths, guard_run
from pflbench.sweeps.grid import (
    SweepRun,
)
from pflbench.sweeps.record import write_error


def run_one(run: SweepRun, plugins: tuple[str, ...]) -> dict[str, Any]:
    """Run (or resume from its checkpoint) one cell of the grid."""
    (run.run_dir / ERROR_FILE).unlink(missing_ok=True)
    guard = lambda run_dir: guard_run(RunPaths(run_dir), force=False)  # noqa: E731
    return execute(prepare(run.config, run.algo_options, guard=guard), plugins=plugins, resume=True)


def outcome_of(run: SweepRun, error: Exception) -> tuple[str, str | None]:
    """(status, error) of a run that raised: finished or claimed by a concurrent sweep, diverged,
    or failed (error.json written)."""
    if isinstance(error, RunFinished):  # finished by a concurrent sweep meanwhile
        return "skipped", None
    if isinstance(error, RunClaimed):  # a concurrent sweep is running it now
        return "claimed", str(error)
    if isinstance(error, RunDiverged):
        return "diverged", str(error)
    write_error(run, error)
    return "failed", f"{type(error).__name__}: {error}"
