"""``pflbench rerun RUN_DIR``: the run again, from its ``config.json``, into a new folder.

``config.json`` holds every resolved ``RunConfig`` setting, ``algo_hparams`` and ``plugins``, so
nothing is resolved again: the rerun reads exactly the settings the run read (its identity hash
is checked against the recorded one). The result never overwrites the original: by default it
goes to ``OUT/reruns/<run name>-<YYYYmmdd-HHMMSS>/runs/<run name>/`` beside the original's
``OUT/runs/`` (so ``pflbench leaderboard OUT`` does not count it twice), or under ``--out``.
``compare_rounds`` then checks the metrics against the original's ``rounds.jsonl`` (timings
aside): on the CPU they are identical.

A run folder may come from anyone, so plugin code runs only when asked: from the files given
(``plugins``, ``--plugin FILE``), or with ``trust_plugins`` (``--trust-plugins``) from the files the
run recorded (``config.json`` → ``code.plugin_files``): the recorded absolute path when its content
still has the recorded sha256, else the run folder's copy of the source (``plugins/NAME.py``), so
a rerun works from any folder and after the original file moved or changed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from pathlib import Path
from typing import Any

from pflbench.config.run_config import VALUE_BEFORE_ADDED, RunConfig, field_types, recorded_fields, recorded_options
from pflbench.config.value_types import json_kind, type_error
from pflbench.errors import ConfigError
from pflbench.registry import ALGORITHMS, load_plugin_file
from pflbench.runs.prepare import prepare
from pflbench.store.layout import CONFIG_FILE, PLUGINS_DIR, RUNS_DIR
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
    code: dict[str, Any] | None = None  # config.json's code block (None: recorded before code records)
    loaded_plugins: tuple[str, ...] = ()  # the plugin files the rerun loaded (set by prepare_rerun)
    plugin_notes: tuple[str, ...] = ()  # one line per recorded plugin file: which file was loaded
    raw_hyperparameters: dict[str, Any] = dataclasses.field(default_factory=dict)  # as in config.json

    @property
    def plugin_files(self) -> list[dict[str, Any]]:
        """The recorded ``{"path", "sha256", "copy"}`` of each plugin file ([] before code records)."""
        files = (self.code or {}).get("plugin_files")
        return [f for f in files if isinstance(f, dict)] if isinstance(files, list) else []


# Settings naming a host or service to contact, with the value a rerun gives them unless the
# command line does (--log, --mlflow-uri, --ray-address): a received folder chooses no address.
UNTRACKED: dict[str, Any] = {"log": (), "mlflow_uri": None, "ray_address": None}

# Settings every config.json has recorded since the first: a file without one is damaged (a
# setting added later is filled in, ``VALUE_BEFORE_ADDED``, but these were never missing).
ALWAYS_RECORDED = ("algo", "dataset", "partition", "rounds", "seed")


def check_recorded(record: Any, path: Path) -> None:
    """ConfigError (one line naming the file and the key) unless ``record`` is a config.json
    object whose settings have their types (``config.value_types``: no value is converted, so
    ``"rounds": 2.7`` or ``"lr": "0.1"`` is refused, not truncated or parsed) and whose
    ``algo_hparams``, ``plugins``, ``code`` and ``identity_hash`` have their shapes."""
    if not isinstance(record, dict):
        raise ConfigError(f"{path}: holds {json_kind(record)}, not a run's settings object")
    missing = [name for name in ALWAYS_RECORDED if name not in record]
    if missing:
        raise ConfigError(f"{path}: setting {missing[0]!r} is missing (every run records it)")
    hints = field_types(RunConfig)
    for f in dataclasses.fields(RunConfig):
        if f.name in record:
            problem = type_error(record[f.name], hints[f.name])
            if problem:
                raise ConfigError(f"{path}: {f.name!r} {problem}")
    shapes = {
        "algo_hparams": (dict, "an object of hyperparameters"),
        "plugins": (list, "a list of plugin files"),
        "code": (dict, "an object"),
        "identity_hash": (str, "a string"),
    }
    for key, (kind, wanted) in shapes.items():
        if record.get(key) is not None and not isinstance(record[key], kind):
            raise ConfigError(f"{path}: {key!r} must be {wanted}, not {json_kind(record[key])}")
    if not all(isinstance(p, str) for p in record.get("plugins") or ()):
        raise ConfigError(f"{path}: 'plugins' must be a list of plugin files (strings)")
    files = (record.get("code") or {}).get("plugin_files", [])
    if not isinstance(files, list) or not all(isinstance(f, dict) for f in files):
        raise ConfigError(f"{path}: code.plugin_files must be a list of {{path, sha256, copy}} objects")


def check_recorded_hyperparameters(recorded: RecordedRun, path: Path) -> None:
    """ConfigError unless each recorded hyperparameter has its field's type (after plugins load:
    a plugin algorithm's fields are known only then). Unknown names are refused later, by
    ``hyperparameters_from``."""
    cls = getattr(ALGORITHMS.get(recorded.config.algo), "hyperparameters", None)
    if cls is None or not dataclasses.is_dataclass(cls):
        return
    hints = field_types(cls)
    for name, value in recorded.raw_hyperparameters.items():
        problem = type_error(value, hints[name]) if name in hints else None
        if problem:
            raise ConfigError(f"{path}: algo_hparams {name!r} {problem}")


def read_recorded_run(run_dir: str | Path) -> RecordedRun:
    """The run's settings from ``RUN_DIR/config.json`` (``check_recorded``)."""
    run_dir = Path(run_dir)
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        raise ConfigError(f"{run_dir} is not a run folder: {path.name} is missing")
    try:
        record = load_json(path)
    except ValueError as error:
        raise ConfigError(f"cannot read {path}: {error}") from None
    check_recorded(record, path)
    values = recorded_fields(record)
    # settings added after the run was made keep their defaults (e.g. save_model, log), except
    # those whose default differs from what runs before them did (no validation split then)
    for name, value in VALUE_BEFORE_ADDED.items():
        values.setdefault(name, value)
    try:
        config = RunConfig(**values)
    except TypeError as error:
        raise ConfigError(f"{path}: {error}") from None
    hyperparameters = record.get("algo_hparams") or {}
    options = recorded_options(hyperparameters)
    code = record.get("code")
    plugins = tuple(record.get("plugins") or ())
    recorded = RecordedRun(run_dir, config, options, plugins, record.get("identity_hash"), code)
    recorded.raw_hyperparameters = dict(hyperparameters)
    return recorded


def _sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def recorded_plugin_file(recorded: RecordedRun, entry: dict[str, Any]) -> tuple[Path, str]:
    """(file to load, one line saying which) for a recorded plugin file: its recorded path when
    that still holds the recorded content (sha256), else the run folder's copy of its source."""
    path, digest, copy = entry.get("path"), entry.get("sha256"), entry.get("copy")
    name = Path(str(path)).name
    if not isinstance(digest, str):
        raise ConfigError(f"plugin {name}: the run recorded no content hash for it; pass the file with --plugin FILE")
    original = Path(str(path))
    if original.is_absolute() and original.is_file() and _sha256(original) == digest:
        return original, f"plugin {name}: loaded {original} (the file the run used, unchanged)"
    copy_path = recorded.run_dir / str(copy)
    copy_parts = Path(str(copy)).parts
    if len(copy_parts) == 2 and copy_parts[0] == PLUGINS_DIR and copy_parts[1] not in ("..", "."):
        if copy_path.is_file() and _sha256(copy_path) == digest:
            why = "changed since the run" if original.is_file() else "not found"
            return copy_path, f"plugin {name}: {path} is {why}; loaded the run folder's copy {copy_path}"
    raise ConfigError(
        f"plugin {name}: neither {path} nor the run folder's copy ({copy}) holds the content the run used "
        f"(sha256 {digest[:12]}…); pass the plugin file with --plugin FILE"
    )


def _plugins_to_load(recorded: RecordedRun, plugins: tuple[str, ...], trust_plugins: bool) -> tuple[str, ...]:
    """The plugin files the rerun loads: ``plugins`` as given, or (``trust_plugins``) the recorded
    ones (``recorded_plugin_file``; ``recorded.plugin_notes`` says which file each is)."""
    if trust_plugins and plugins:
        raise ConfigError("give either --plugin FILE or --trust-plugins, not both")
    if not trust_plugins:
        if len(plugins) < len(recorded.plugins):
            used = ", ".join(Path(p).name for p in recorded.plugins)
            copies = f"; copies in {recorded.run_dir / PLUGINS_DIR}" if recorded.plugin_files else ""
            raise ConfigError(
                f"the run used plugin code ({used}{copies}); rerun runs no code named in a run folder unasked: "
                "read the file(s), then pass --trust-plugins to load them, or each with --plugin FILE"
            )
        return plugins
    if recorded.plugins and not recorded.plugin_files:
        raise ConfigError(
            "the run was recorded before pflbench kept its plugin files' hashes and copies; "
            "pass each plugin file with --plugin FILE"
        )
    chosen = [recorded_plugin_file(recorded, entry) for entry in recorded.plugin_files]
    recorded.plugin_notes = tuple(note for _, note in chosen)
    return tuple(str(path) for path, _ in chosen)


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
    trust_plugins: bool = False,
) -> tuple[Any, RecordedRun]:
    """Rebuild the run into ``out`` (default ``default_rerun_out``) and check that its folder is
    not the original and is still empty. ``overrides``: RunConfig settings that do not change
    the numbers (``save_model``, ``log``, ``mlflow_uri``, ``ray_address``, ``device``).

    A run folder may come from anyone, so nothing in it is executed or contacted unasked: plugin
    code runs only from the files given in ``plugins`` (``--plugin FILE``; one per plugin the run
    used) or, with ``trust_plugins``, from the files the run recorded (``recorded.loaded_plugins``,
    ``recorded.plugin_notes``), and trackers and Ray clusters only as ``overrides`` ask (never the
    recorded ``log``/``mlflow_uri``, nor the recorded ``ray_address``: a Ray head serves the
    driver pickles, so joining one a received folder names would run its code; ``--executor ray``
    without an address starts a local Ray instance)."""
    recorded = read_recorded_run(run_dir)
    if (overrides or {}).get("ray_address") is not None and recorded.config.executor != "ray":
        raise ConfigError(
            f"--ray-address would be ignored: the run used --executor {recorded.config.executor} "
            "(only --executor ray joins a Ray cluster); leave it out"
        )
    recorded.loaded_plugins = _plugins_to_load(recorded, plugins, trust_plugins)
    for plugin in recorded.loaded_plugins:
        load_plugin_file(plugin)
    check_recorded_hyperparameters(recorded, recorded.run_dir / CONFIG_FILE)
    target = Path(out) if out is not None else default_rerun_out(recorded.run_dir)
    # no address the folder records is contacted unasked: trackers, Ray clusters (UNTRACKED)
    untracked = dict(UNTRACKED)
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
