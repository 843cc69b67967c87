"""Experiment trackers (``--log NAME``): run observers registered as plugins.

A tracker is a class registered with ``@register_tracker("name")`` (entry-point group
``pflbench.trackers``, or a ``--plugin`` file), built once per run with a ``TrackedRun``. The
built-ins use the same path: ``tensorboard``, ``mlflow`` and ``wandb`` (modules beside this
one). Each receives the same per-round records as ``rounds.jsonl`` and the final summary:

* ``start()``: the run starts (or resumes): log ``self.run.params()``, the flattened
  ``RunConfig`` plus ``algo_hparams.<name>``;
* ``log_round(record)``: one round record; trackers log every finite number of it (not
  ``round`` itself, not ``None``, lists or strings: ``numeric_items``) at step ``record["round"]``;
* ``finish(summary)``: the run completed; then ``close()``.
* ``close(failed=False)``: end the tracker's run (``failed``: the run stopped early); safe to
  call twice.

**Resume.** A resumed run (``--resume``, sweeps) builds its trackers again with
``run.earlier_rounds``, the round records done before the resume (rounds.jsonl up to the
checkpoint); after ``start()`` each of them is passed to ``log_round``, and then the rounds
after the checkpoint follow, some of which a killed run may already have logged. A tracker
ends with every round exactly once: it starts a fresh log (TensorBoard, W&B offline) or
continues its recorded run and skips what that already holds (MLflow, W&B online). What a
tracker needs to find its run again (an id) it keeps with ``run.remember(key, value)`` /
``run.recall(key)`` in ``RUN_DIR/trackers.json``.

Library imports happen only when a tracker is made; ``check_trackers`` (before any work) turns
an unknown name or a missing library into one ``ConfigError`` line. This module imports neither
torch nor any tracker library.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import numbers
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

from pflbench.errors import ConfigError
from pflbench.registry import TRACKERS, register_tracker
from pflbench.store.layout import ROUNDS_FILE, WORK_PREFIX
from pflbench.store.writer import without_local_paths
from pflbench.util.atomic import atomic_write_json

TRACKERS_FILE = "trackers.json"  # RUN_DIR/trackers.json: what trackers keep across a resume
EXPERIMENT = "pflbench"  # the MLflow experiment / W&B project unless told otherwise

# --------------------------------------------------------------------------- helpers


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts → ``{"a.b": value}``; lists/tuples become JSON text, None the text ``None``."""
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        data = dataclasses.asdict(data)
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    key = prefix[:-1]
    if isinstance(data, (list, tuple)):
        return {key: json.dumps(list(data), default=str)}
    if data is None:
        return {key: "None"}
    if isinstance(data, (bool, int, float, str)):
        return {key: data}
    return {key: str(data)}


def run_params(run: Any) -> dict[str, Any]:
    """The parameters a tracker logs: the flattened config + ``algo_hparams.*``."""
    params = flatten(run.config)
    hparams = getattr(run, "hparams", None)
    if hparams is not None:
        params.update(flatten(hparams, "algo_hparams."))
    return params


def numeric_items(record: dict[str, Any], skip: Iterable[str] = ()) -> dict[str, float]:
    """The finite real numbers of a record (bools, None, NaN, lists and strings left out)."""
    skipped = set(skip)
    out = {}
    for key, value in record.items():
        if key in skipped or isinstance(value, bool) or not isinstance(value, numbers.Real):
            continue
        value = float(value)
        if math.isfinite(value):
            out[str(key)] = value
    return out


# --------------------------------------------------------------------------- the interface


@dataclasses.dataclass
class TrackedRun:
    """What a tracker is built with.

    ``folder``: the folder the run is written to (its work folder, moved into place as
    ``OUT/runs/<name>`` when the run completes): a tracker's own files go under it.
    ``earlier_rounds``: a resumed run's round records from before the resume, else empty.
    ``options``: tracker settings given on the command line (``mlflow_uri``, ``mlflow_experiment``).
    """

    config: Any  # the resolved RunConfig
    folder: Path
    name: str
    hparams: Any = None
    earlier_rounds: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    options: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def resumed(self) -> bool:
        return bool(self.earlier_rounds)

    @property
    def portable(self) -> bool:
        """``--portable``: what a tracker writes must name no local absolute path or host."""
        return bool(getattr(self.config, "portable", False))

    @property
    def final_dir(self) -> Path:
        """Where the finished run will be: ``OUT/runs/<name>``."""
        return self.folder.parent / self.name

    def local(self, value: Any) -> Any:
        """``value`` as a shared result may show it: without local paths under ``--portable``."""
        return without_local_paths(value) if self.portable else value

    def params(self) -> dict[str, Any]:
        """The flattened config + ``algo_hparams.*`` (``run_params``), local paths cleaned."""
        return self.local(run_params(self))

    def recall(self, key: str) -> Any:
        """What ``remember(key, ...)`` kept for this run folder (None if nothing)."""
        try:
            kept = json.loads((self.folder / TRACKERS_FILE).read_text())
        except (OSError, ValueError):
            return None
        return kept.get(key) if isinstance(kept, dict) else None

    def remember(self, key: str, value: Any) -> None:
        """Keep a JSON value in ``RUN_DIR/trackers.json`` (e.g. the tracker's run id), so that a
        resumed run finds the tracker's run again."""
        path = self.folder / TRACKERS_FILE
        try:
            kept = json.loads(path.read_text())
        except (OSError, ValueError):
            kept = {}
        atomic_write_json(path, {**(kept if isinstance(kept, dict) else {}), key: value})


class Tracker:
    """Base class of trackers. Subclass, implement ``start``/``log_round``/``finish``/``close``
    and register it with ``@register_tracker("name")``; ``requires`` names the modules it
    imports (checked before any work, with ``install`` as the hint)."""

    requires: ClassVar[tuple[str, ...]] = ()  # importable modules the tracker needs
    install: ClassVar[str] = ""  # how to get them, e.g. "pip install 'pflbench[wandb]'"

    def __init__(self, run: TrackedRun) -> None:
        self.run = run

    @classmethod
    def check(cls) -> None:
        """Refuse a setting the tracker cannot work with (raise ``ConfigError``), before any work."""

    # ---- what a tracker implements
    def start(self) -> None:
        """Open the tracker's run and log ``self.run.params()``."""

    def log_round(self, record: dict[str, Any]) -> None:
        """Log one round record (also each of ``run.earlier_rounds`` on a resume)."""

    def finish(self, summary: dict[str, Any]) -> None:
        """Log the summary of a completed run (``close()`` follows)."""

    def close(self, failed: bool = False) -> None:
        """End the tracker's run; ``failed``: the run stopped early. May be called twice: be idempotent."""

    # ---- the engine's observer protocol (what the federation calls)
    def on_run_start(self, run: Any) -> None:
        self.start()
        for record in self.run.earlier_rounds:
            self.log_round(record)

    def on_client_update(self, job: Any, update: Any) -> None:
        pass

    def on_round_end(self, record: dict[str, Any]) -> None:
        self.log_round(record)

    def on_run_end(self, summary: dict[str, Any]) -> None:
        self.finish(summary)
        self.close()


# --------------------------------------------------------------------------- factory


def tracker_names(names: Iterable[str]) -> list[str]:
    """``--log`` values (repeatable or comma-separated) as de-duplicated lower-case names."""
    wanted: list[str] = []
    for item in names:
        for name in str(item).split(","):
            name = name.strip().lower()
            if name and name not in wanted:
                wanted.append(name)
    return wanted


def check_trackers(names: Iterable[str]) -> list[str]:
    """The tracker names of ``--log``, de-duplicated; raises ``ConfigError`` for an unknown name
    (listing the registered ones) or a library that is not installed (nothing is made)."""
    wanted = tracker_names(names)
    registered = TRACKERS.items
    for name in wanted:
        if name not in registered:
            choices = ", ".join(sorted(registered))
            raise ConfigError(
                f"--log {name!r} is not a tracker; choose from {choices} "
                "(a tracker of your own: load its file with --plugin FILE)"
            )
        tracker = registered[name]
        for module in getattr(tracker, "requires", ()):
            if importlib.util.find_spec(module) is None:
                hint = getattr(tracker, "install", "") or f"pip install {module}"
                raise ConfigError(f"--log {name} needs the {module} package: {hint}")
        getattr(tracker, "check", lambda: None)()
    return wanted


def earlier_rounds(folder: Path) -> list[dict[str, Any]]:
    """The round records already in ``folder``'s rounds.jsonl when the trackers are made: a
    resumed run's rounds up to its checkpoint (the writer has cut the file there); none for a
    fresh run."""
    try:
        lines = (Path(folder) / ROUNDS_FILE).read_text().splitlines()
    except OSError:
        return []
    return [json.loads(line) for line in lines if line.strip()]


def make_trackers(
    names: Iterable[str], run: Any, mlflow_uri: str | None = None, mlflow_experiment: str | None = None
) -> list[Tracker]:
    """Build the trackers for ``--log NAME`` (repeatable or comma-separated).

    ``run`` has ``.config`` (a RunConfig), ``.run_dir`` (the folder being written) and optionally
    ``.hparams`` and ``.earlier_rounds`` (default: the records already in its rounds.jsonl).
    Raises ``ConfigError`` for an unknown name or a library that is not installed.
    """
    wanted = check_trackers(names)
    folder = Path(run.run_dir)
    previous = getattr(run, "earlier_rounds", None)
    tracked = TrackedRun(
        config=run.config,
        folder=folder,
        name=folder.name.removeprefix(WORK_PREFIX),  # the runner's work folder: the run's name
        hparams=getattr(run, "hparams", None),
        earlier_rounds=list(previous) if previous is not None else earlier_rounds(folder) if wanted else [],
        options={
            "mlflow_uri": mlflow_uri or getattr(run.config, "mlflow_uri", None),
            "mlflow_experiment": mlflow_experiment,
        },
    )
    trackers: list[Tracker] = []
    try:
        for name in wanted:
            trackers.append(TRACKERS.get(name)(tracked))
    except BaseException:
        for tracker in trackers:  # the ones already made (open files)
            tracker.close(failed=True)
        raise
    return trackers


__all__ = [
    "EXPERIMENT",
    "TRACKERS_FILE",
    "TrackedRun",
    "Tracker",
    "check_trackers",
    "earlier_rounds",
    "flatten",
    "make_trackers",
    "numeric_items",
    "register_tracker",
    "run_params",
]
