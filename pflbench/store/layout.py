"""The run-folder format's one owner: file names, and run folders that are always whole (a
temporary work folder, a claim per run, one move at the end).

``OUT/runs/NAME/`` holds ``CONFIG_FILE``, ``PARTITION_FILE``, ``ROUNDS_FILE``, ``CLIENTS_FILE``,
``SUMMARY_FILE`` (a finished run), or ``ERROR_FILE`` (a failed one), ``PLUGINS_DIR`` (a copy of
each ``--plugin`` file's source), and ``MODELS_DIR`` with ``--save-model``; ``CHECKPOINT_FILE``
lives only in the work folder. Every module names these files through the constants below;
``store.reader`` reads them, ``store.writer`` writes them.

A run named NAME is built in ``OUT/runs/.tmp-NAME/`` (config.json, partition.json, rounds.jsonl,
the checkpoint) and moved to ``OUT/runs/NAME/`` with ``os.replace`` only when clients.csv and
summary.json are written, so a folder with summary.json is always complete. An earlier result
in ``NAME/`` is moved aside (``.old-NAME-<pid>``) just before, and deleted only after the new
folder is in place: a rerun (``--force``) that dies leaves the earlier result untouched.

At most one process works on a run: ``OUT/runs/NAME.claim`` (JSON: pid, host, start time, the
process's start time in ``/proc`` against pid reuse; its mtime is the heartbeat)
is created atomically (a hard link of a fully written file, which fails if the claim exists).
A claim is stale when its pid is not alive on this host, or, for another host, when its file was
not touched for ``CLAIM_STALE_S`` (the owner touches it every round); a stale claim is taken over.
Only the claim holder writes into ``.tmp-NAME``, so its name is fixed and a later process (with
``--resume``, or a sweep) finds the checkpoint there.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pflbench.errors import ConfigError
from pflbench.util.atomic import atomic_write_text, fsync_folder

# the files of a run folder
RUNS_DIR = "runs"  # OUT/runs/NAME
CONFIG_FILE = "config.json"  # every resolved setting, the run's identity, the environment
PARTITION_FILE = "partition.json"  # which samples each client holds
ROUNDS_FILE = "rounds.jsonl"  # one JSON record per round
CLIENTS_FILE = "clients.csv"  # one row per client at the end
SUMMARY_FILE = "summary.json"  # written last: a folder with it is a whole run
ERROR_FILE = "error.json"  # a failed run (a sweep's record of why)
CHECKPOINT_FILE = "checkpoint.pt"  # in the work folder only, removed when the run completes
MODELS_DIR = "models"  # --save-model: the final weights
PLUGINS_DIR = "plugins"  # a copy of the source of each --plugin file the run was given
WORK_PREFIX = ".tmp-"  # OUT/runs/.tmp-NAME: the run being written
OLD_PREFIX = ".old-"  # OUT/runs/.old-NAME-<pid>: a finished result being replaced

CLAIM_STALE_S = 3600.0  # a claim from another host untouched this long is stale
CLAIM_SUFFIX = ".claim"


class OutputError(ConfigError):
    """A path that cannot be written: ``cannot write PATH: reason`` (the CLI's exit code 2)."""

    def __init__(self, path: Any, reason: str) -> None:
        super().__init__(f"cannot write {path}: {reason}")


class RunFinished(ConfigError):
    """The run's folder already holds a finished result."""


class RunClaimed(ConfigError):
    """Another live process is running this run."""


def runs_folder(out: str | Path) -> Path:
    """``OUT/runs``: where the run folders of output folder ``out`` live."""
    return Path(out) / RUNS_DIR


def run_folder(out: str | Path, name: str) -> Path:
    """``OUT/runs/NAME``: the (finished) folder of run ``name`` under output folder ``out``."""
    return runs_folder(out) / name


def os_reason(error: OSError) -> str:
    return error.strerror or str(error)


def check_writable(path: str | Path, kind: str = "folder") -> None:
    """Raise ``OutputError`` unless ``path`` (a folder, or a file when ``kind="file"``) could be
    created or written: not a file where a folder is needed (or the reverse), not under a file,
    not read-only, not on a full disk. Leaves nothing behind."""
    target = Path(path).expanduser()
    if kind == "folder" and target.exists() and not target.is_dir():
        raise OutputError(path, "it is a file, not a folder")
    if kind == "file" and target.is_dir():
        raise OutputError(path, "it is a folder, not a file")
    existing = target if (kind == "folder" and target.is_dir()) else target.parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise OutputError(path, f"{existing} is a file, not a folder")
    if kind == "file" and target.exists():
        if not os.access(target, os.W_OK):
            raise OutputError(path, "permission denied (read-only)")
        if target.is_char_device():  # /dev/null, /dev/full: tried when written
            return
    try:
        with tempfile.TemporaryFile(dir=existing, prefix=".pflbench-probe-") as probe:
            probe.write(b"0" * 4096)
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as error:
        raise OutputError(path, os_reason(error)) from error
    try:
        stats = os.statvfs(existing)
    except OSError:
        return
    if stats.f_bavail * stats.f_frsize < 1 << 20:
        raise OutputError(path, "no space left on device (less than 1 MB free)")


@contextlib.contextmanager
def writing(path: str | Path) -> Iterator[None]:
    """Turn an ``OSError`` while writing ``path`` into ``OutputError`` (one ``Error:`` line)."""
    try:
        yield
    except OSError as error:
        raise OutputError(error.filename or path, os_reason(error)) from error


@dataclass
class RunPaths:
    final: Path  # OUT/runs/NAME

    @property
    def name(self) -> str:
        return self.final.name

    @property
    def work(self) -> Path:
        return self.final.with_name(WORK_PREFIX + self.name)

    @property
    def claim(self) -> Path:
        return self.final.with_name(self.name + CLAIM_SUFFIX)

    def finished(self) -> dict[str, Any] | None:
        """The finished run's summary (a folder with a readable summary.json), else None."""
        return _read_protocol_json(self.final / SUMMARY_FILE)


def _read_protocol_json(path: Path) -> Any:
    """A claim file, or the summary that tells whether a run is finished; None when missing or
    unreadable. (The protocol's own read: ``store.reader`` reads run folders and imports this
    module's names, so this module cannot import it.)"""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, ValueError):
        return False
    return True


def process_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux ``/proc``), else None: tells a
    live owner from an unrelated process that reuses a dead owner's pid."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _owner_alive(info: dict[str, Any]) -> bool:
    pid = info.get("pid")
    if not isinstance(pid, int) or not _alive(pid):
        return False
    recorded = info.get("proc_start")
    return recorded is None or process_start(pid) in (None, recorded)


def claim_owner(paths: RunPaths) -> dict[str, Any] | None:
    """The live owner of the run's claim (its JSON), or None when unclaimed or stale."""
    info = _read_protocol_json(paths.claim)
    try:
        age = time.time() - paths.claim.stat().st_mtime
    except FileNotFoundError:
        return None
    if not isinstance(info, dict):  # half-written by a very old writer, or garbage
        return None if age > 60 else {"pid": "?", "host": "?", "started": "?"}
    if info.get("host") == socket.gethostname():
        return info if _owner_alive(info) else None
    return info if age < CLAIM_STALE_S else None


def describe_owner(info: dict[str, Any]) -> str:
    started = info.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) else "?"
    return f"pid {info.get('pid')} on {info.get('host')} since {when}"


class Claim:
    """This process's claim on a run (a context manager; ``touch`` each round)."""

    def __init__(self, paths: RunPaths) -> None:
        self.paths, self.held = paths, False

    def acquire(self) -> None:
        path = self.paths.claim
        path.parent.mkdir(parents=True, exist_ok=True)
        body = json.dumps(
            {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started": time.time(),
                "proc_start": process_start(os.getpid()),
                "run": self.paths.name,
            }
        )
        for _ in range(5):
            try:
                atomic_write_text(path, body, exclusive=True)  # fails if a claim exists
                self.held = True
                return
            except FileExistsError:
                pass
            owner = claim_owner(self.paths)
            if owner is not None:
                raise RunClaimed(
                    f"run {self.paths.name} is being run by {describe_owner(owner)} "
                    f"(claim {path}); wait for it, or delete the claim if that process is gone"
                )
            self._take_over_stale()
        raise RunClaimed(f"could not claim run {self.paths.name} ({path} keeps changing)")

    def _take_over_stale(self) -> None:
        """Move a stale claim aside; if another process replaced it meanwhile, put theirs back."""
        stale = _read_protocol_json(self.paths.claim)
        aside = self.paths.claim.with_name(f".{self.paths.claim.name}.stale-{os.getpid()}")
        try:
            os.replace(self.paths.claim, aside)
        except FileNotFoundError:
            return
        if _read_protocol_json(aside) != stale:  # we moved a fresh claim: give it back
            try:
                os.link(aside, self.paths.claim)
            except FileExistsError:
                pass
        aside.unlink(missing_ok=True)

    def touch(self) -> None:
        if self.held:
            try:
                os.utime(self.paths.claim)
            except OSError:
                pass

    def release(self) -> None:
        if self.held:
            info = _read_protocol_json(self.paths.claim)
            if isinstance(info, dict) and info.get("pid") == os.getpid():
                self.paths.claim.unlink(missing_ok=True)
            self.held = False

    def __enter__(self) -> Claim:  # noqa: PYI034
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def guard_run(
    paths: RunPaths, force: bool, check_claim: bool = True, replaces: Callable[[Path], bool] | None = None
) -> None:
    """Refuse (ConfigError) a run whose folder holds a finished result (unless ``force``, or
    ``replaces(folder)`` says that result is to be replaced: a sweep's stale run) or that another
    live process is running. Call before any expensive work."""
    recover(paths)
    if paths.final.exists() and not paths.final.is_dir():
        raise OutputError(paths.final, "it is a file, not a folder")
    summary = paths.finished()
    if summary is not None and not force and not (replaces is not None and replaces(paths.final)):
        status = summary.get("status", "completed") if isinstance(summary, dict) else "completed"
        raise RunFinished(
            f"{paths.final} already holds a finished run (status {status}); "
            "use --force to redo it (the result is replaced only when the new run completes)"
        )
    owner = claim_owner(paths) if check_claim else None
    if owner is not None:
        raise RunClaimed(
            f"run {paths.name} is being run by {describe_owner(owner)}; "
            f"wait for it, or delete {paths.claim} if that process is gone"
        )


def fresh_work_folder(paths: RunPaths) -> Path:
    """An empty ``.tmp-NAME`` (whatever an earlier unfinished attempt left there is removed)."""
    if paths.work.exists():
        shutil.rmtree(paths.work)
    paths.work.mkdir(parents=True)
    return paths.work


def publish(paths: RunPaths) -> None:
    """Move the finished work folder into place; an earlier folder is deleted only afterwards."""
    old = None
    if paths.final.exists():
        old = paths.final.with_name(f"{OLD_PREFIX}{paths.name}-{os.getpid()}")
        if old.exists():
            shutil.rmtree(old)
        os.replace(paths.final, old)
    try:
        os.replace(paths.work, paths.final)
    except OSError:
        if old is not None:  # put the earlier result back
            os.replace(old, paths.final)
        raise
    fsync_folder(paths.final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def recover(paths: RunPaths) -> None:
    """A process killed between the two moves of ``publish`` left the earlier result aside
    (``.old-NAME-<pid>``) and no ``NAME``: put it back."""
    if paths.final.exists():
        return
    for old in sorted(paths.final.parent.glob(f"{OLD_PREFIX}{paths.name}-*")):
        if (old / SUMMARY_FILE).is_file():
            try:
                os.replace(old, paths.final)
            except OSError:
                continue
            return
