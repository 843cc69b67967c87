"""A sweep's runs in parallel worker processes (``pflbench sweep --jobs N``).

Each run goes to a fresh ``spawn``-ed process (no state shared with the driver or other runs)
with the threads its config holds: ``threads // N`` when the grid was expanded for N jobs
(``sweeps.grid.expand_grid(..., jobs=N)``, before the runs are named: the count that shapes
the numbers is part of the run identity), so N runs share the cores instead of oversubscribing them. A
run's numbers do not depend on the process it runs in: ``--jobs N`` writes the same metrics as
``--jobs 1`` (at equal threads per run). The driver keeps the sweep record; a worker writes its
run's folder (and ``error.json`` when the run raises), as a sequential sweep does.

Runs are handed out in ``dispatch_order`` (also used by ``sweep --ray``): the most work first and
runs that differ only in their seed next to each other. In grid order (seeds outer, algorithms
inner) two algorithms on two workers alternate, so each worker got every run of *one*
algorithm and the faster one's worker sat idle at the end (8 runs of 16.6 s: 12 s of one core).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from pflbench.registry import load_plugin_file
from pflbench.store.layout import SUMMARY_FILE
from pflbench.store.reader import read_json
from pflbench.sweeps.one import outcome_of, run_one
from pflbench.sweeps.record import write_error

_LOADED_PLUGINS: set[str] = set()


def estimated_work(config: Any) -> int:
    """Local training steps a run does, up to the dataset's size: rounds × sampled clients × epochs."""
    return config.rounds * config.sampled_per_round * max(1, config.local_epochs)


def dispatch_order(todo: list[tuple[int, Any]]) -> list[tuple[int, Any]]:
    """``todo`` ((index, run) pairs) in the order to hand out to parallel workers: most estimated
    work first (a long run started last would finish alone), then grouped by everything but the
    seed (equal-length runs in a row spread evenly over the workers); the grid index breaks ties."""

    def key(item: tuple[int, Any]) -> tuple[Any, ...]:
        index, run = item
        c = run.config
        setting = json.dumps(run.overrides, sort_keys=True, default=str)
        return (-estimated_work(c), c.dataset, c.algo, setting, c.alpha, c.seed, index)

    return sorted(todo, key=key)


def run_in_worker(run: Any, plugins: tuple[str, ...]) -> tuple[str, dict[str, Any] | None, str | None]:
    """(status, summary, error) of one run, in a worker process."""
    load_plugins(plugins)
    try:
        return "done", run_one(run, plugins), None
    except Exception as error:  # recorded like a sequential sweep's failure
        status, message = outcome_of(run, error)
        return status, None, message


def load_plugins(plugins: tuple[str, ...]) -> None:
    """Register the plugin files into this (worker) process's registries, each once."""
    for path in plugins:
        if path not in _LOADED_PLUGINS:
            load_plugin_file(path)
            _LOADED_PLUGINS.add(path)


def die_with_parent(parent: int) -> None:
    """Worker initializer: end this worker when the sweep's driver dies (SIGKILL, the OOM killer),
    instead of running queued runs unasked and idling forever. A watcher thread sees the worker
    reparented (its parent id changes) within a second."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="pflbench-parent-watch", daemon=True).start()


def run_parallel(
    todo: list[tuple[int, Any]],
    jobs: int,
    plugins: tuple[str, ...],
    finished: Callable[[int, Any, dict[str, Any] | None], None],
) -> None:
    """Run ``todo`` ((index, run) pairs) on ``jobs`` processes; ``finished(index, run, summary)``
    after each, in completion order. KeyboardInterrupt marks the runs in flight ``interrupted``,
    cancels the rest (they stay ``pending``) and propagates.

    A worker that dies (SIGKILL, the OOM killer) takes the pool down, and with it the runs in
    flight on the other workers. Those runs are then run again one at a time (they resume from
    their checkpoints): the one whose worker dies alone is recorded ``failed``, the others finish,
    and the runs not started yet go on in a fresh pool."""
    waiting = dispatch_order(todo)
    while waiting:
        suspects, waiting = _run_pool(waiting, jobs, jobs, plugins, finished)
        for suspect in suspects:  # alone: a pool that breaks now names the run that broke it
            index, run = suspect
            summary = read_json(run.run_dir / SUMMARY_FILE) if getattr(run, "redo", None) is None else None
            if isinstance(summary, dict):  # it completed (published) just as the pool broke
                run.status = "done"
                finished(index, run, summary)
                continue
            died_alone, _ = _run_pool([suspect], 1, jobs, plugins, finished)
            for index, run in died_alone:
                run.status, run.error = "failed", "its worker process died (killed: out of memory?)"
                write_error(run, RuntimeError(run.error))
                finished(index, run, None)


def _run_pool(
    items: list[tuple[int, Any]],
    width: int,
    jobs: int,
    plugins: tuple[str, ...],
    finished: Callable[[int, Any, dict[str, Any] | None], None],
) -> tuple[list[Any], list[tuple[int, Any]]]:
    """Run ``items`` on a fresh pool of ``width`` workers, at most ``width`` at a time (so the
    runs in flight are the runs running). Returns ``(in flight when a worker died, not started)``,
    both empty when no worker died."""
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(width, mp_context=context, initializer=die_with_parent, initargs=(os.getpid(),))
    pending = list(items)
    in_flight: dict[Future, tuple[int, Any]] = {}
    try:
        while pending or in_flight:
            while pending and len(in_flight) < width:
                index, run = pending.pop(0)
                in_flight[pool.submit(run_in_worker, run, plugins)] = (index, run)
            done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
            broken = False
            for future in done:
                index, run = in_flight.pop(future)
                try:
                    run.status, summary, run.error = future.result()
                except BrokenProcessPool:
                    broken = True
                    in_flight[future] = (index, run)
                    continue
                finished(index, run, summary)
            if broken:  # every run still in flight died with the pool
                suspects = list(in_flight.values())
                pool.shutdown(wait=True, cancel_futures=True)
                return suspects, pending
    except KeyboardInterrupt:
        for future, (_, run) in in_flight.items():
            if future.running():  # started: its folder lacks summary.json, the next sweep redoes it
                run.status = "interrupted"
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return [], []
