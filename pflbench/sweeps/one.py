"""One cell of a sweep: whether a finished cell is run again (stale or ``--force``), prepare and
execute one run, and name its outcome.

A finished run is *current* when its ``config.json`` records the code identity the run would
record now (``config.provenance``), *stale* when it records another one (a plugin file, a
built-in plugin module or pflbench's version changed since), and *unrecorded* when it predates
code records. A sweep re-runs stale runs, keeps current and unrecorded ones (an unrecorded run
cannot be shown stale; ``--force`` redoes it), and with ``--force`` redoes every run. A re-run
goes through the run folders' claim and publish protocol (``store.layout``): the earlier result
stays in place until the new run completes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pflbench.config.provenance import current_code_identity, recorded_code_identity
from pflbench.engine.observers import RunObserver
from pflbench.runs.execute import RunDiverged, execute
from pflbench.runs.prepare import prepare
from pflbench.store.layout import (
    CONFIG_FILE,
    ERROR_FILE,
    SUMMARY_FILE,
    RunClaimed,
    RunFinished,
    RunPaths,
    guard_run,
)
from pflbench.store.reader import read_json
from pflbench.sweeps.grid import (
    SweepRun,
)
from pflbench.sweeps.record import write_error

FINISHED_STATES = ("unfinished", "current", "stale", "unrecorded")


def finished_state(run: SweepRun, run_dir: Path | None = None) -> str:
    """``unfinished`` (no summary.json), or, for a finished run, ``current``, ``stale`` or
    ``unrecorded`` (see the module docstring)."""
    folder = run.run_dir if run_dir is None else run_dir
    if not (folder / SUMMARY_FILE).is_file():
        return "unfinished"
    config = read_json(folder / CONFIG_FILE)
    recorded = recorded_code_identity(config) if isinstance(config, dict) else None
    if recorded is None:
        return "unrecorded"
    if run.code is None:
        run.code = current_code_identity(run.config)
    return "current" if recorded == run.code else "stale"


def mark_redo(runs: list[SweepRun], force: bool = False) -> dict[str, list[SweepRun]]:
    """Sort the runs by ``finished_state`` and set ``run.redo`` on the finished runs that are to
    run again: ``"stale"``, or ``"forced"`` (``force``). Returns the runs by state."""
    states: dict[str, list[SweepRun]] = {state: [] for state in FINISHED_STATES}
    identities: dict[tuple[Any, ...], str] = {}  # runs of one algorithm, dataset, ... share their code
    for run in runs:
        c = run.config
        key = (c.algo, c.dataset, c.partition if c.partition_file is None else None, c.model)
        if key not in identities:
            identities[key] = current_code_identity(c)
        run.code = identities[key]
        state = finished_state(run)
        states[state].append(run)
        run.redo = None if state == "unfinished" else "forced" if force else "stale" if state == "stale" else None
    return states


def replaces_result(run: SweepRun) -> Any:
    """``guard_run``'s ``replaces``: whether the finished result in the run's folder is replaced
    (asked again just before the run starts: a concurrent sweep may have re-run it meanwhile)."""
    return lambda folder: run.redo == "forced" or finished_state(run, folder) == "stale"


def run_one(run: SweepRun, plugins: tuple[str, ...], observers: Sequence[RunObserver] = ()) -> dict[str, Any]:
    """Run (or resume from its checkpoint) one cell of the grid; a finished one only when it is
    to be replaced (``run.redo``). ``observers`` watch the rounds (``pflbench tune``'s reporter)."""
    (run.run_dir / ERROR_FILE).unlink(missing_ok=True)
    paths = RunPaths(run.run_dir)
    replaces = replaces_result(run) if run.redo else None
    guard = lambda run_dir: guard_run(RunPaths(run_dir), force=False, replaces=replaces)  # noqa: E731
    prepared = prepare(run.planned(), guard=guard)
    # past the guard, a finished result here is one to replace (published only once the new run completes)
    return execute(prepared, plugins=plugins, observers=observers, resume=True, force=paths.finished() is not None)


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
