"""``pflbench rerun RUN_DIR``: the run again, from its ``config.json``, into a new folder.

``config.json`` holds every resolved ``RunConfig`` setting, ``algo_hparams`` and ``plugins``, so
nothing is resolved again: the rerun reads exactly the settings the run read (its identity hash
is checked against the recorded one). The result never overwrites the original: by default it
goes to ``OUT/reruns/<run name>-<YYYYmmdd-HHMMSS>/runs/<run name>/`` beside the original's
``OUT/runs/`` (so ``pflbench leaderboard OUT`` does not count it twice), or under ``--out``.
``compare_rounds`` then checks the metrics against the original's ``rounds.jsonl`` (timings
aside): on the CPU they are identical.
"""

from __future__ import annotations

import dataclasses
import math
import time
import typing
from pathlib import Path
from typing import Any

from pflbench.config.run_config import RunConfig, field_types
from pflbench.errors import ConfigError
from pflbench.registry import load_plugin_file
from pflbench.runs.prepare import prepare
from pflbench.store.layout import CONFIG_FILE, RUNS_DIR
from pflbench.store.reader import load_json, read_rounds

# Keys of rounds.jsonl that measure the machine, not the run.
TIMING_KEYS = ("peak_mem_mb",)  # besides every ``*_time_s`` key (``is_timing``)


def is_timing(key: str) -> bool:
    """Whether a round record's key measures the machine, not the run (never compared)."""
    return key.endswith("_time_s") or key in TIMING_KEYS


@dataclasses.dataclass
class RecordedRun:
    run_dir: Path
    config: RunConfig
    algo_options: dict[str, Any]
    plugins: tuple[str, ...]
    identity_hash: str | None


def _tuples(value: Any) -> Any:
    """JSON lists back to the tuples the dataclasses hold."""
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


def read_recorded_run(run_dir: str | Path) -> RecordedRun:
    """The run's settings from ``RUN_DIR/config.json``."""
    run_dir = Path(run_dir)
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        raise ConfigError(f"{run_dir} is not a run folder: {path.name} is missing")
    try:
        record = load_json(path)
    except ValueError as error:
        raise ConfigError(f"cannot read {path}: {error}") from None
    hints = field_types(RunConfig)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(RunConfig):
        if f.name in record:
            value = record[f.name]
            if typing.get_origin(hints[f.name]) is tuple and value is not None:
                value = tuple(value)
            values[f.name] = value
    # settings added after the run was made keep their defaults (e.g. save_model, log)
    try:
        config = RunConfig(**values)
    except TypeError as error:
        raise ConfigError(f"{path}: {error}") from None
    options = {k: _tuples(v) for k, v in (record.get("algo_hparams") or {}).items()}
    return RecordedRun(run_dir, config, options, tuple(record.get("plugins") or ()), record.get("identity_hash"))


def default_rerun_out(run_dir: Path) -> Path:
    """``OUT/reruns/<run name>-<time>`` for a run folder ``OUT/runs/<run name>``."""
    run_dir = run_dir.resolve()
    out = run_dir.parent.parent if run_dir.parent.name == RUNS_DIR else run_dir.parent
    stem = out / "reruns" / f"{run_dir.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    path, attempt = stem, 1
    while path.exists():
        attempt += 1
        path = stem.with_name(f"{stem.name}-{attempt}")
    return path


def prepare_rerun(
    run_dir: str | Path,
    out: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    plugins: tuple[str, ...] = (),
) -> tuple[Any, RecordedRun]:
    """Rebuild the run into ``out`` (default ``default_rerun_out``) and check that its folder is
    not the original and is still empty. ``overrides``: RunConfig settings that do not change
    the numbers (``save_model``, ``log``, ``mlflow_uri``, ``device``).

    A run folder may come from anyone, so nothing in it is executed or contacted: plugin code
    runs only from the files given in ``plugins`` (``--plugin FILE``; one per plugin the run
    used), and trackers only as ``overrides`` ask (never the recorded ``log``/``mlflow_uri``)."""
    recorded = read_recorded_run(run_dir)
    if len(plugins) < len(recorded.plugins):
        used = ", ".join(Path(p).name for p in recorded.plugins)
        raise ConfigError(
            f"the run used plugin code ({used}); rerun runs no code named in a run folder: "
            "read the file(s) and pass each with --plugin FILE"
        )
    for plugin in plugins:
        load_plugin_file(plugin)
    target = Path(out) if out is not None else default_rerun_out(recorded.run_dir)
    untracked = {"log": (), "mlflow_uri": None}  # the recorded tracker address is never used unasked
    config = dataclasses.replace(recorded.config, out=str(target), **{**untracked, **(overrides or {})})
    prepared = prepare(config, recorded.algo_options)
    prepared.resolved["rerun_of"] = {
        "run_dir": str(recorded.run_dir.resolve()),
        "identity_hash": recorded.identity_hash,
    }
    if prepared.run_dir.resolve() == recorded.run_dir.resolve():
        raise ConfigError(f"--out {target} would overwrite the original run {recorded.run_dir}; choose another --out")
    if (prepared.run_dir / CONFIG_FILE).exists():
        raise ConfigError(f"{prepared.run_dir} already holds a run; choose another --out")
    return prepared, recorded


def _untimed_rounds(run_dir: str | Path) -> list[dict[str, Any]]:
    """The run's rounds.jsonl records without the keys that measure the machine."""
    return [{k: v for k, v in record.items() if not is_timing(k)} for record in read_rounds(Path(run_dir))]


def compare_rounds(original: str | Path, rerun: str | Path) -> list[str]:
    """Differences between two runs' ``rounds.jsonl`` (timing keys aside): ``[]`` = identical."""
    try:
        old, new = _untimed_rounds(original), _untimed_rounds(rerun)
    except FileNotFoundError as error:
        return [f"missing {error.filename}"]
    problems = []
    if len(old) != len(new):
        problems.append(f"{len(old)} rounds recorded, {len(new)} rerun")
    for a, b in zip(old, new):
        keys = sorted(k for k in set(a) | set(b) if not _same(a.get(k), b.get(k)))
        if keys:
            problems.append(f"round {a.get('round')}: {', '.join(keys)} differ")
    return problems


def _same(a: Any, b: Any) -> bool:
    """Equal, with NaN equal to NaN (a diverged run reruns as diverged)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b
