"""``pflbench sweep --ray``: whole runs as Ray tasks, results written by the driver.

The driver expands the grid and skips finished runs exactly as a local sweep does
(``sweeps.local.run_sweep``: a stale run, or every run with ``force``, is run again, see
``sweeps.one``); every run to do becomes one Ray task declaring ``--cpus-per-run``
CPUs and ``--gpus-per-run`` GPUs, so Ray runs as many at once as the cluster holds.

A task runs the run into a temporary folder on its worker (workers need not share the driver's
filesystem: plugin files travel as their source, and the run records them under the driver's
absolute paths with the content the driver loaded) and returns the run folder's files as bytes;
the driver publishes them as a local run does (``store.layout``): it claims each run
(``OUT/runs/NAME.claim``) before submitting its task and holds the claim (touched while it waits)
until the result is in place, writes the files into the work folder ``OUT/runs/.tmp-NAME``
(``summary.json`` last) and moves it to ``OUT/runs/NAME`` in one ``os.replace``. So the folder is
the one a local sweep writes (the summary's ``run_dir`` and config.json's ``command`` are the
driver's), a driver killed while writing leaves no half-written ``OUT/runs/NAME``, a concurrent
local sweep or run skips the runs the driver holds, and the driver skips (status ``claimed``)
the runs another live process holds. The sweep record names the node each run ran on (``worker``).

Exactly once: each run is submitted once, by the one driver that owns the sweep record. A task
whose worker dies (process killed, node lost) is re-executed by Ray (``max_retries``); a lost
attempt left nothing in ``--out`` (its files were only on the worker), so a run is written and
counted once. A run that raises gets ``error.json`` as in a local sweep; Ctrl-C cancels the
tasks in flight and marks them ``interrupted`` (rerun the command to resume).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pflbench.config.run_config import RunConfig
from pflbench.engine.ray_executor import release_pool
from pflbench.errors import ConfigError
from pflbench.registry import load_plugin_file, loaded_plugin_file
from pflbench.runs.execute import execute
from pflbench.runs.prepare import prepare
from pflbench.store.layout import (
    ERROR_FILE,
    SUMMARY_FILE,
    Claim,
    RunClaimed,
    RunFinished,
    RunPaths,
    fresh_work_folder,
    guard_run,
    publish,
    writing,
)
from pflbench.store.writer import without_local_paths, write_json
from pflbench.sweeps.grid import SweepRun
from pflbench.sweeps.one import mark_redo, replaces_result
from pflbench.sweeps.parallel import dispatch_order
from pflbench.sweeps.record import SweepRecord
from pflbench.util.ray_cluster import connect

TASK_RETRIES = 3  # re-executions of a run whose worker died
CLAIM_TOUCH_S = 60.0  # the driver touches the claims it holds at least this often
_LOADED_PLUGINS: dict[tuple[str, str], str] = {}  # (source sha256, driver path) -> path loaded in this worker


def check_resources(base: RunConfig, cpus_per_run: float, gpus_per_run: float) -> None:
    if base.executor == "ray":
        raise ConfigError(
            "sweep --ray runs whole runs as Ray tasks; inside them use the default "
            "--executor sequential (or drop --ray to run each run's clients on Ray)"
        )
    if cpus_per_run <= 0 or gpus_per_run < 0:
        raise ConfigError("--cpus-per-run must be > 0 and --gpus-per-run ≥ 0")
    if base.device.startswith("cuda") and gpus_per_run == 0:
        raise ConfigError(f"--device {base.device} in a Ray sweep needs --gpus-per-run (e.g. 1 or 0.5)")


def plugin_sources(plugins: tuple[str, ...]) -> list[tuple[str, bytes]]:
    """(absolute path on the driver, source) of each plugin file: the content the driver loaded
    (``registry.loaded_plugin_file``), so every task runs and records the same code."""
    sources = []
    for path in plugins:
        loaded = loaded_plugin_file(path)
        if loaded is not None:
            sources.append((loaded.recorded_as, loaded.source))
        else:
            sources.append((os.path.abspath(path), Path(path).read_bytes()))
    return sources


def _load_plugins(plugin_sources: list[tuple[str, bytes]]) -> None:
    """Write each shipped plugin file under this worker's temp folder and load it (once),
    recorded under its path on the driver."""

    for driver_path, source in plugin_sources:
        digest = hashlib.sha256(source).hexdigest()
        if (digest, driver_path) in _LOADED_PLUGINS:
            continue
        folder = Path(tempfile.gettempdir()) / "pflbench-plugins" / digest[:16]
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / Path(driver_path).name
        path.write_bytes(source)
        load_plugin_file(path, recorded_as=driver_path)
        _LOADED_PLUGINS[digest, driver_path] = str(path)


RUN_FOLDER_PREFIX = "pflbench-run-"  # + the worker's pid: a folder whose process is gone is an orphan


def remove_orphaned_run_folders(root: Path | None = None) -> list[Path]:
    """Delete the temporary run folders of workers that died mid-run (a SIGTERM'd or killed Ray
    worker skips the ``TemporaryDirectory`` clean-up): those whose pid no longer runs on this
    machine. Called by every task before it starts, so a machine holds at most the live ones."""
    removed = []
    for folder in Path(root or tempfile.gettempdir()).glob(f"{RUN_FOLDER_PREFIX}*-*"):
        pid = folder.name[len(RUN_FOLDER_PREFIX) :].split("-", 1)[0]
        if not pid.isdigit() or _process_alive(int(pid)):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def run_task(
    run: SweepRun,
    plugin_sources: list[tuple[str, bytes]],
    plugins: tuple[str, ...],
    argv: list[str],
    threads: int,
) -> dict[str, Any]:
    """One run on a worker (the body of the Ray task). Returns status, summary, error and files."""
    import socket

    import ray
    import torch

    torch.set_num_threads(max(1, threads))
    out_run_dir = run.run_dir  # where the driver will put it
    node = ray.get_runtime_context().get_node_id()
    worker = f"{socket.gethostname()} (node {node[:8]})"
    result: dict[str, Any] = {"status": "done", "summary": None, "error": None, "files": {}, "worker": worker}
    remove_orphaned_run_folders()
    with tempfile.TemporaryDirectory(prefix=f"{RUN_FOLDER_PREFIX}{os.getpid()}-") as temporary:
        run_dir = Path(temporary) / run.name
        saved_argv, sys.argv = sys.argv, list(argv)  # config.json records the driver's command
        try:
            _load_plugins(plugin_sources)
            prepared = prepare(run.planned())
            prepared.run_dir = run_dir
            summary = execute(prepared, plugins=plugins)
            summary["run_dir"] = str(out_run_dir)
            write_json(run_dir / SUMMARY_FILE, summary)
            result["summary"] = summary
        except Exception as error:  # as a local sweep: recorded, the sweep goes on
            result.update(
                status="failed",
                error={
                    "error_type": type(error).__name__,
                    "message": str(error),
                    "traceback": "".join(traceback.format_exception(error)),
                },
            )
        finally:
            sys.argv = saved_argv
        if run_dir.is_dir():
            result["files"] = {
                str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()
            }
    return result


def write_run_files(folder: Path, files: dict[str, bytes]) -> None:
    """The worker's run folder's files into ``folder`` (the claimed work folder), summary.json
    last: a work folder with summary.json holds the whole run."""
    for relative, content in sorted(files.items(), key=lambda item: item[0] == SUMMARY_FILE):
        target = folder / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)


def accept(run: Any, result: dict[str, Any]) -> dict[str, Any] | None:
    """Publish one task's result as ``OUT/runs/NAME`` (the caller holds the run's claim): its
    files, and ``error.json`` for a failed run, into a fresh work folder ``.tmp-NAME``, then one
    move into place. Returns the summary (None if failed)."""
    paths = RunPaths(run.run_dir)
    with writing(paths.work):  # a full disk: "cannot write FILE: reason"
        work = fresh_work_folder(paths)
        write_run_files(work, result["files"])
        run.worker = result.get("worker")
        if result["status"] == "done":
            run.status = "done"
            publish(paths)
            return result["summary"]
        error = result["error"]
        run.status, run.error = "failed", f"{error['error_type']}: {error['message']}"
        failure = {**error, "config": {**dataclasses.asdict(run.config), "algo_options": run.algo_options}}
        write_json(work / ERROR_FILE, without_local_paths(failure) if run.config.portable else failure)
        publish(paths)
    return None


def claim_runs(runs: list[Any], report: Callable[[int, Any, dict[str, Any] | None], None] | None) -> dict[int, Claim]:
    """This driver's claims on the runs to do, by grid index (as ``execute`` claims a local
    run): a finished run that is not to be redone (``run.redo``, ``sweeps.one.mark_redo``) is
    ``skipped``, one that another live process holds is ``claimed``."""
    claims: dict[int, Claim] = {}
    try:
        for index, run in enumerate(runs):
            paths = RunPaths(run.run_dir)
            claim = Claim(paths)
            replaces = replaces_result(run) if run.redo else None
            try:
                if (paths.final / SUMMARY_FILE).is_file() and run.redo is None:  # as a local sweep skips it
                    raise RunFinished(f"{paths.final} is finished")
                guard_run(paths, force=False, replaces=replaces)
                claim.acquire()
                claims[index] = claim
                # finished (with today's code) by another process meanwhile?
                guard_run(paths, force=False, check_claim=False, replaces=replaces)
                continue
            except RunFinished:
                claims.pop(index, claim).release()
                run.status = "skipped"
            except RunClaimed as error:
                run.status, run.error = "claimed", str(error)
            if report is not None:
                report(index, run, None)
    except BaseException:
        release_all(claims)
        raise
    return claims


def release_all(claims: dict[int, Claim]) -> None:
    for claim in claims.values():
        claim.release()
    claims.clear()


def run_sweep_on_ray(
    runs: list[Any],
    record: Path,
    grid: Any,
    base: RunConfig,
    plugins: tuple[str, ...] = (),
    report: Callable[[int, Any, dict[str, Any] | None], None] | None = None,
    cpus_per_run: float = 1,
    gpus_per_run: float = 0,
    disconnect: bool = False,
    force: bool = False,
) -> None:
    """``sweeps.local.run_sweep`` with every run to do as a Ray task (see the module docstring);
    ``disconnect``: leave Ray at the end (the CLI; a library caller may keep its instance)."""

    check_resources(base, cpus_per_run, gpus_per_run)
    ray = connect(base.ray_address)
    from ray.exceptions import RayError

    release_pool()  # idle client actors of earlier --executor ray runs would hold CPUs

    sources = plugin_sources(plugins)
    plugins = tuple(path for path, _ in sources)  # absolute: what every run records
    mark_redo(runs, force)
    task = ray.remote(run_task).options(
        num_cpus=cpus_per_run, num_gpus=gpus_per_run, max_retries=TASK_RETRIES, retry_exceptions=False
    )
    record.parent.mkdir(parents=True, exist_ok=True)
    pending: dict[Any, int] = {}
    claims: dict[int, Claim] = {}
    try:
        claims = claim_runs(runs, report)
        for index, run in dispatch_order([(i, runs[i]) for i in claims]):  # Ray starts tasks in submission order
            pending[task.remote(run, sources, plugins, sys.argv, max(1, int(cpus_per_run)))] = index
        sweep_record = SweepRecord(record, grid, base, runs)
        sweep_record.update(force=True)
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=CLAIM_TOUCH_S)
            for claim in claims.values():  # the heartbeat that keeps other hosts off these runs
                claim.touch()
            if not ready:
                continue
            index = pending.pop(ready[0])
            run = runs[index]
            try:
                result = ray.get(ready[0])
            except RayError as error:  # the task's retries are spent (worker or node lost)
                problem = {"error_type": type(error).__name__, "message": str(error), "traceback": ""}
                result = {"status": "failed", "error": problem, "files": {}, "worker": None}
            summary = accept(run, result)
            claims.pop(index).release()
            sweep_record.update(force=not pending)
            if report is not None:
                report(index, run, summary)
    except KeyboardInterrupt:
        for ref, index in pending.items():
            ray.cancel(ref, force=True)
            runs[index].status = "interrupted"
        SweepRecord(record, grid, base, runs).update(force=True)
        raise
    finally:
        release_all(claims)
        if disconnect:  # explicitly: 0.3 s, where Ray's exit handler takes ~1.5 s
            ray.shutdown()
