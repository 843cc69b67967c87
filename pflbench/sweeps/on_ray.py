"""``pflbench sweep --ray``: whole runs as Ray tasks, results written by the driver.

The driver expands the grid and skips finished runs exactly as a local sweep does
(``sweep.run_sweep``); every unfinished run becomes one Ray task declaring ``--cpus-per-run``
CPUs and ``--gpus-per-run`` GPUs, so Ray runs as many at once as the cluster holds.

A task runs the run into a temporary folder on its worker (workers need not share the driver's
filesystem: plugin files travel as their source) and returns the run folder's files as bytes;
the driver writes them into ``OUT/runs/<name>/``, ``summary.json`` last, so the folder is the one
a local sweep writes (the summary's ``run_dir`` and config.json's ``command`` are the driver's).
The sweep record names the node each run ran on (``worker``).

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
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pflbench.config.run_config import RunConfig
from pflbench.errors import ConfigError
from pflbench.store.writer import write_json

TASK_RETRIES = 3  # re-executions of a run whose worker died
STALE_FILES = ("error.json", "summary.json", "rounds.jsonl", "clients.csv")
_LOADED_PLUGINS: dict[str, str] = {}  # source sha256 -> path loaded in this worker process


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


def _load_plugins(plugin_sources: list[tuple[str, bytes]]) -> None:
    """Write each shipped plugin file under this worker's temp folder and load it (once)."""
    from pflbench.registry import load_plugin_file

    for name, source in plugin_sources:
        digest = hashlib.sha256(source).hexdigest()
        if digest in _LOADED_PLUGINS:
            continue
        folder = Path(tempfile.gettempdir()) / "pflbench-plugins" / digest[:16]
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / name
        path.write_bytes(source)
        load_plugin_file(path)
        _LOADED_PLUGINS[digest] = str(path)


def run_task(
    config: RunConfig,
    algo_options: dict[str, Any],
    name: str,
    plugin_sources: list[tuple[str, bytes]],
    plugins: tuple[str, ...],
    argv: list[str],
    threads: int,
) -> dict[str, Any]:
    """One run on a worker (the body of the Ray task). Returns status, summary, error and files."""
    import socket

    import ray
    import torch

    from pflbench.runs.execute import execute
    from pflbench.runs.prepare import prepare

    torch.set_num_threads(max(1, threads))
    out_run_dir = Path(config.out) / "runs" / name  # where the driver will put it
    node = ray.get_runtime_context().get_node_id()
    worker = f"{socket.gethostname()} (node {node[:8]})"
    result: dict[str, Any] = {"status": "done", "summary": None, "error": None, "files": {}, "worker": worker}
    with tempfile.TemporaryDirectory(prefix="pflbench-run-") as temporary:
        run_dir = Path(temporary) / name
        saved_argv, sys.argv = sys.argv, list(argv)  # config.json records the driver's command
        try:
            _load_plugins(plugin_sources)
            prepared = prepare(config, algo_options)
            prepared.run_dir = run_dir
            summary = execute(prepared, plugins=plugins)
            summary["run_dir"] = str(out_run_dir)
            write_json(run_dir / "summary.json", summary)
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


def write_run_files(run_dir: Path, files: dict[str, bytes]) -> None:
    """The worker's run folder into ``run_dir``; summary.json last and atomically."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for stale in STALE_FILES:
        (run_dir / stale).unlink(missing_ok=True)
    for relative, content in sorted(files.items(), key=lambda item: item[0] == "summary.json"):
        target = run_dir / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(target.name + ".tmp")
        temporary.write_bytes(content)
        os.replace(temporary, target)


def accept(run: Any, result: dict[str, Any]) -> dict[str, Any] | None:
    """Write one task's result into the driver's ``--out``; returns the summary (None if failed)."""
    write_run_files(run.run_dir, result["files"])
    run.worker = result.get("worker")
    if result["status"] == "done":
        run.status = "done"
        return result["summary"]
    error = result["error"]
    run.status, run.error = "failed", f"{error['error_type']}: {error['message']}"
    write_json(
        run.run_dir / "error.json",
        {**error, "config": {**dataclasses.asdict(run.config), "algo_options": run.algo_options}},
    )
    return None


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
) -> None:
    """``sweep.run_sweep`` with every unfinished run as a Ray task (see the module docstring);
    ``disconnect``: leave Ray at the end (the CLI; a library caller may keep its instance)."""
    from pflbench.sweeps.record import _write_record
    from pflbench.util.ray_cluster import connect

    check_resources(base, cpus_per_run, gpus_per_run)
    ray = connect(base.ray_address)
    from ray.exceptions import RayError

    from pflbench.engine.ray_executor import release_pool
    from pflbench.sweeps.parallel import dispatch_order

    release_pool()  # idle client actors of earlier --executor ray runs would hold CPUs

    sources = [(Path(p).name, Path(p).read_bytes()) for p in plugins]
    task = ray.remote(run_task).options(
        num_cpus=cpus_per_run, num_gpus=gpus_per_run, max_retries=TASK_RETRIES, retry_exceptions=False
    )
    record.parent.mkdir(parents=True, exist_ok=True)
    pending: dict[Any, int] = {}
    todo = []
    for index, run in enumerate(runs):
        if (run.run_dir / "summary.json").is_file():
            run.status = "skipped"
            if report is not None:
                report(index, run, None)
        else:
            todo.append((index, run))
    for index, run in dispatch_order(todo):  # Ray starts queued tasks in submission order
        pending[
            task.remote(run.config, run.algo_options, run.name, sources, plugins, sys.argv, max(1, int(cpus_per_run)))
        ] = index
    _write_record(record, grid, base, runs)
    try:
        while pending:
            (ref,), _ = ray.wait(list(pending), num_returns=1)
            run = runs[pending.pop(ref)]
            try:
                summary = accept(run, ray.get(ref))
            except RayError as error:  # the task's retries are spent (worker or node lost)
                summary, run.status, run.error = None, "failed", f"{type(error).__name__}: {error}"
                run.run_dir.mkdir(parents=True, exist_ok=True)
                write_json(
                    run.run_dir / "error.json",
                    {
                        "error_type": type(error).__name__,
                        "message": str(error),
                        "traceback": "",
                        "config": {**dataclasses.asdict(run.config), "algo_options": run.algo_options},
                    },
                )
            _write_record(record, grid, base, runs)
            if report is not None:
                report(runs.index(run), run, summary)
    except KeyboardInterrupt:
        for ref, index in pending.items():
            ray.cancel(ref, force=True)
            runs[index].status = "interrupted"
        _write_record(record, grid, base, runs)
        raise
    finally:
        if disconnect:  # explicitly: 0.3 s, where Ray's exit handler takes ~1.5 s
            ray.shutdown()
