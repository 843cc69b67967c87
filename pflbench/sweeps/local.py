"""A sweep's runs, one by one in this process (or handed to ``sweeps.parallel`` for ``--jobs N``).

The grid is expanded and checked in ``sweeps.grid``; ``run_sweep`` executes the runs (each through
``sweeps.one.run_one``) and keeps the sweep record (``sweeps.record``) up to date. A run whose
folder already holds ``summary.json`` is skipped unless its code changed since (stale, see
``sweeps.one``; ``force``: every run is redone), and an unfinished one resumes from its
checkpoint, so rerunning a sweep resumes it; a
run claimed by another live process (a concurrent sweep) is skipped and reported; a run that
diverges keeps its partial results (status ``diverged``); a run that raises gets an
``error.json`` in its folder and the sweep goes on. Every algorithm sees the same partition and
client sequence for a given seed because both are drawn from the seed's own random streams.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pflbench.config.run_config import (
    RunConfig,
)
from pflbench.store.layout import SUMMARY_FILE
from pflbench.sweeps.grid import (
    Grid,
    SweepRun,
)
from pflbench.sweeps.one import mark_redo, outcome_of, run_one
from pflbench.sweeps.parallel import run_parallel
from pflbench.sweeps.record import SweepRecord


def run_sweep(
    runs: list[SweepRun],
    record: Path,
    grid: Grid,
    base: RunConfig,
    plugins: tuple[str, ...] = (),
    report: Callable[[int, SweepRun, dict[str, Any] | None], None] | None = None,
    jobs: int = 1,
    force: bool = False,
) -> None:
    """Run (or skip) each run, keeping the sweep record ``record`` up to date (``SweepRecord``).
    A finished run is skipped unless it is stale or ``force`` (``sweeps.one.mark_redo``).

    ``jobs`` > 1 runs that many at once in worker processes (``sweeps.parallel``), each with the
    threads its config holds (``expand_grid(base, grid, jobs)`` gives each ``max(1, threads //
    jobs)``); ``report`` then comes in completion order. A
    KeyboardInterrupt marks the current run(s) ``interrupted`` (their folders lack summary.json,
    so the next sweep redoes them), writes the record and propagates.
    """
    record.parent.mkdir(parents=True, exist_ok=True)
    mark_redo(runs, force)
    sweep_record = SweepRecord(record, grid, base, runs)
    sweep_record.update(force=True)

    def finished(index: int, run: SweepRun, summary: dict[str, Any] | None) -> None:
        sweep_record.update()
        if report is not None:
            report(index, run, summary)

    todo = []
    for index, run in enumerate(runs):
        if (run.run_dir / SUMMARY_FILE).is_file() and run.redo is None:
            run.status = "skipped"
            finished(index, run, None)
        elif jobs > 1:
            todo.append((index, run))
        else:
            finished(index, run, _run_here(run, plugins, lambda: sweep_record.update(force=True)))
    if todo:
        try:
            run_parallel(todo, jobs, plugins, finished)
        except KeyboardInterrupt:
            sweep_record.update(force=True)
            raise
    sweep_record.update(force=True)


def _run_here(run: SweepRun, plugins: tuple[str, ...], write_record: Callable[[], None]) -> dict[str, Any] | None:
    """One run in this process: its summary, or None with ``run.status`` failed (error.json)."""
    try:
        summary = run_one(run, plugins)
        run.status = "done"
        return summary
    except KeyboardInterrupt:
        run.status = "interrupted"
        write_record()
        raise
    except Exception as error:  # one broken run must not stop the sweep
        run.status, run.error = outcome_of(run, error)
        return None
