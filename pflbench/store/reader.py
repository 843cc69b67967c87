"""Reading run folders (the one reader of their files: ``read_json``, ``load_json``,
``read_rounds``, ``read_run``), and the leaderboard's tidy frame, each run counted once.

A run is identified by what determines its numbers — ``config.json`` without the keys that
only say where, when, how and with which versions it ran (``RUN_IDENTITY_EXCLUDED``) — not by
its folder name: a copied or renamed folder is the same run, listed in a warning and counted
once. Folders that are unfinished (no ``summary.json``), failed (``error.json``), not normal
(``summary.json`` ``status`` other than ``completed``/``ok``, e.g. ``diverged``) or malformed
(unreadable, truncated, absurd or deeply nested JSON, wrong types) are left out, each with one
warning naming the folder; ``include_abnormal=True`` keeps the not-normal ones, flagged in the
``status`` column so that tables show them on rows of their own.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pflbench.errors import ConfigError
from pflbench.store.layout import CONFIG_FILE, ERROR_FILE, OLD_PREFIX, ROUNDS_FILE, RUNS_DIR, SUMMARY_FILE
from pflbench.util.hashing import settings_hash

if TYPE_CHECKING:
    import pandas as pd

# A leaderboard's grid: algorithm × dataset × partition × seed. The partition is named by the
# settings the run's partitioner read (``partition_of``), so no run is shown under a setting it
# never read (an iid run has no α). Everything else a run read goes into ``config_key``.
GRID_AXES = ("algo", "dataset", "partition", "seed")
COLUMNS = ("run", "algo", "dataset", "partition", "seed", "round", "metric", "value", "config_key", "status")
# Partition settings a partition's name shows (``RunConfig`` field → symbol); the others a
# partitioner reads (min_size, the Dirichlet cut) stay in ``config_key``.
PARTITION_SHOWN = {"alpha": "α", "shards_per_client": "shards"}
PARTITION_KEYS = (
    "partition",
    "partition_file",
    *PARTITION_SHOWN,
    "sizes",
    "size_param",
    "feature_shift",
    "shift_groups",
    "holdout_domain",
)
SUMMARY_NON_METRICS = {"alpha", "seed", "num_clients", "rounds", "evaluations"}
ROUND_NON_METRICS = {"round", "clients"}
NORMAL_STATUS = (None, "completed", "ok")
RUN_IDENTITY_EXCLUDED = {
    "out",
    "command",
    "plugins",
    "resolved",
    "versions",
    "git_commit",
    "code",
    "started",
    "finished",
    "started_at",
    "finished_at",
    "wall_time_s",
    "hostname",
}
MAX_JSON_BYTES = 16 * 2**20
MAX_ROUNDS_BYTES = 256 * 2**20


class RunFolderWarning(UserWarning):
    """A run folder that is unfinished, failed, not normal, a duplicate or unreadable."""


def find_run_folders(paths: Iterable[str | Path], warn: Callable[[str], None] | None = None) -> list[Path]:
    """Run folders under each path: ``PATH/runs/*`` for an output folder, else ``PATH/*``."""
    folders = []
    for path in map(Path, paths):
        if not path.is_dir():
            raise ConfigError(f"{path} is not a folder")
        if (path / CONFIG_FILE).is_file() or (path / ERROR_FILE).is_file():
            folders.append(path)
            continue
        parent = path / RUNS_DIR if (path / RUNS_DIR).is_dir() else path
        try:
            # .old-*: a finished run being replaced by --force (the runner restores or deletes it);
            # .tmp-*: a run in progress or killed, reported as unfinished
            folders.extend(sorted(p for p in parent.iterdir() if p.is_dir() and not p.name.startswith(OLD_PREFIX)))
        except OSError as error:
            if warn is None:
                raise ConfigError(f"cannot read {parent}: {error.strerror or error}") from None
            warn(f"skipped {parent}: cannot list it ({error.strerror or error})")
    return folders


def read_json(path: Path) -> Any:
    """The JSON in ``path``; None when it is missing or unreadable (e.g. a summary.json that a
    killed run left half written, or none yet)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def load_json(path: Path) -> Any:
    """The JSON in ``path``; ValueError saying what is wrong (missing, too large, unreadable,
    nested too deeply), for a reader that reports each bad folder."""
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            raise ValueError(f"{path.name} is larger than {MAX_JSON_BYTES // 2**20} MiB")
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"no {path.name}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path.name} is unreadable ({error})") from None
    except RecursionError:
        raise ValueError(f"{path.name} is nested too deeply") from None


def read_rounds(folder: Path, count: int | None = None) -> list[dict[str, Any]]:
    """The records of ``folder``'s rounds.jsonl (blank lines skipped); ``count``: its first
    ``count`` lines (a resumed run's earlier rounds), ValueError if it holds fewer."""
    path = Path(folder) / ROUNDS_FILE
    lines = path.read_text().splitlines()
    if count is None:
        return [json.loads(line) for line in lines if line.strip()]
    lines = lines[:count]
    if len(lines) < count:
        raise ValueError(f"{path} has {len(lines)} complete rounds, the checkpoint counts {count}")
    return [json.loads(line) for line in lines]


def _failure(folder: Path) -> str:
    """Why a folder has no summary.json: its error.json, or unfinished."""
    try:
        error = load_json(folder / ERROR_FILE)
        return f"failed run ({str(error.get('error_type'))[:200]}: {str(error.get('message'))[:500]})"
    except (ValueError, AttributeError):
        return UNFINISHED_REASON


def flat_config(config: dict[str, Any]) -> dict[str, Any]:
    """``config.json`` as one flat mapping: settings kept in groups (``{"data": {...}}``) are
    lifted to the top level (top-level keys win); ``algo_hparams`` and the excluded keys stay."""
    flat: dict[str, Any] = {}
    groups = [
        k for k, v in config.items() if isinstance(v, dict) and k != "algo_hparams" and k not in RUN_IDENTITY_EXCLUDED
    ]
    for group in groups:
        flat.update(config[group])
    flat.update({k: v for k, v in config.items() if k not in groups})
    return flat


def setting_of(config: dict[str, Any]) -> dict[str, Any]:
    """The run's settings minus the grid axes (the partition's shown settings included) and what
    does not determine the numbers (output location, command, versions, ...):
    ``{"run": {...}, "algo_hparams": {...}}``."""
    axes = (*GRID_AXES, *PARTITION_KEYS, "algo_hparams")
    if isinstance(config.get("identity"), dict):  # the settings the run read (config.identity.identity_settings)
        identity = config["identity"]
        run = {k: v for k, v in identity.items() if k not in axes}
        return {"run": run, "algo_hparams": dict(identity.get("algo_hparams") or {})}
    flat = flat_config(config)
    run = {k: v for k, v in flat.items() if k not in axes and k not in RUN_IDENTITY_EXCLUDED}
    return {"run": run, "algo_hparams": dict(flat.get("algo_hparams") or {})}


def partition_of(config: dict[str, Any]) -> str:
    """The partition a run used, named by what its partitioner read: ``α=0.1`` (Dirichlet label
    skew), ``dirichlet-client α=0.5``, ``shards shards=2``, ``iid``, ``natural``, ``file NAME``.

    From ``config.json``'s ``identity`` (exactly the settings the run read); a folder written
    before the identity was recorded is read by the rule of its time (α for dirichlet*, shards
    for shards)."""
    if isinstance(config.get("identity"), dict):
        read = config["identity"]
    else:
        flat = flat_config(config)
        partition = str(flat.get("partition", "dirichlet"))
        read = {"partition": partition, "partition_file": flat.get("partition_file")}
        if partition.startswith("dirichlet"):
            read["alpha"] = flat.get("alpha")
        if partition == "shards":
            read["shards_per_client"] = flat.get("shards_per_client")
    if read.get("partition_file"):
        return f"file {Path(str(read['partition_file'])).name}"
    partition = read.get("partition", "dirichlet")
    if not isinstance(partition, str) or not partition:
        raise ValueError("config.json: partition must be a non-empty string")
    shown = []
    for key, symbol in PARTITION_SHOWN.items():
        if key in read:
            value = read[key]
            if not _is_number(value) or value is None or not math.isfinite(value) or value < 0:
                raise ValueError(f"config.json: {key} must be a finite number ≥ 0, got {str(value)[:50]}")
            shown.append(f"{symbol}={value:g}")
    shown += _skew_labels(read)
    if isinstance(read.get("holdout_domain"), str):  # --holdout-domain: one column per held-out domain
        shown.append(f"holdout={read['holdout_domain']}")
    return " ".join(shown) if partition == "dirichlet" and shown else " ".join([partition, *shown])


def _skew_labels(read: dict[str, Any]) -> list[str]:
    """Quantity skew and feature shift as a partition's name shows them: ``sizes=powerlaw(β=1.5)``,
    ``shift=rotate,noise×4`` (×G: G domains; none shown: one per client). Absent when off."""
    shown = []
    sizes, param = read.get("sizes"), read.get("size_param")
    if isinstance(sizes, str) and sizes != "none" and _is_number(param) and param is not None:
        shown.append(f"sizes={sizes}({'σ' if sizes == 'lognormal' else 'β'}={param:g})")
    shift, groups = read.get("feature_shift"), read.get("shift_groups")
    if isinstance(shift, str) and shift:
        shown.append(f"shift={shift}" + (f"×{groups}" if isinstance(groups, int) and groups > 0 else ""))
    return shown


def partition_sort_key(label: str) -> tuple[Any, ...]:
    """Partitions in a readable order: by name, then by their numbers (α=0.1 before α=1 before α=10)."""
    parts = label.replace("=", " ").split()
    return tuple((0, float(p), "") if _is_float(p) else (1, 0.0, p) for p in parts)


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def recorded_identity_hash(config: dict[str, Any]) -> str:
    """A hash of everything in a recorded ``config.json`` that determines the run's numbers
    (settings and seed): two folders with the same identity hold the same run. (The run-folder
    hash of a config being run is ``config.identity.identity_hash``.)"""
    if isinstance(config.get("identity"), dict):  # written by the runner: the settings it read
        return settings_hash(config["identity"])
    kept = {k: v for k, v in config.items() if k not in RUN_IDENTITY_EXCLUDED}
    return settings_hash(kept)


def _is_number(value: Any) -> bool:
    """None (no value) or a real number a float can hold (not a bool, not a 400-digit int)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return abs(value) < 2**1000
    return value is None or isinstance(value, float)


def _grid_values(config: dict[str, Any]) -> tuple[str, str, str, int]:
    """(algo, dataset, partition, seed) with their types checked."""
    flat = flat_config(config)
    missing = [k for k in ("algo", "dataset", "seed") if k not in flat]
    if missing:
        raise ValueError(f"config.json lacks {', '.join(missing)}")
    algo, dataset, seed = flat["algo"], flat["dataset"], flat["seed"]
    if not isinstance(algo, str) or not isinstance(dataset, str) or not algo or not dataset:
        raise ValueError("config.json: algo and dataset must be non-empty strings")
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63:
        raise ValueError(f"config.json: seed must be an integer ≥ 0, got {str(seed)[:50]}")
    return algo, dataset, partition_of(config), seed


def run_status(summary: dict[str, Any]) -> str | None:
    """The run's status: None for a normal run, else the (non-normal) ``status`` text."""
    status = summary.get("status")
    return None if status in NORMAL_STATUS else str(status)[:40]


def read_run(
    folder: Path, check: Callable[[dict[str, Any]], None] | None = None
) -> tuple[str, str | None, list[tuple[Any, ...]]]:
    """(identity, status, tidy rows) of one finished run folder; ValueError if unfinished or
    malformed (``check``: a further test of config.json, raising ValueError)."""
    if not (folder / SUMMARY_FILE).is_file():
        raise ValueError(_failure(folder))
    config, summary = load_json(folder / CONFIG_FILE), load_json(folder / SUMMARY_FILE)
    if not isinstance(config, dict) or not isinstance(summary, dict):
        raise ValueError("config.json or summary.json is not a JSON object")
    if not isinstance(config.get("algo_hparams", {}), (dict, type(None))):
        raise ValueError("config.json: algo_hparams is not an object")
    head_values = _grid_values(config)
    if check is not None:
        check(config)
    try:
        if (folder / ROUNDS_FILE).stat().st_size > MAX_ROUNDS_BYTES:
            raise ValueError(f"rounds.jsonl is larger than {MAX_ROUNDS_BYTES // 2**20} MiB")
        records = read_rounds(folder)
        key = json.dumps(setting_of(config), sort_keys=True, default=str)
        identity = recorded_identity_hash(config)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"rounds.jsonl is unreadable ({error})") from None
    except RecursionError:
        raise ValueError("config.json or rounds.jsonl is nested too deeply") from None
    status = run_status(summary)
    head = (folder.name, *head_values)
    rows = [
        (*head, None, k, v, key, status) for k, v in summary.items() if k not in SUMMARY_NON_METRICS and _is_number(v)
    ]
    for record in records:
        number = record.get("round") if isinstance(record, dict) else None
        if not isinstance(number, int) or isinstance(number, bool) or not 0 <= number < 2**53:
            raise ValueError("rounds.jsonl has a record without a round number")
        rows += [
            (*head, record["round"], k, v, key, status)
            for k, v in record.items()
            if k not in ROUND_NON_METRICS and isinstance(k, str) and _is_number(v)
        ]
    return identity, status, rows


UNFINISHED_REASON = "unfinished run (no summary.json)"  # the warning's wording (leaderboard groups them)


def _warn(message: str) -> None:
    warnings.warn(message, RunFolderWarning, stacklevel=3)


def load_runs(
    paths: str | Path | Iterable[str | Path],
    warn: Callable[[str], None] = _warn,
    include_abnormal: bool = False,
    check: Callable[[dict[str, Any]], None] | None = None,
) -> pd.DataFrame:
    """Every finished run under ``paths``, each once, as one tidy frame; the others are skipped
    with a warning (``include_abnormal``: runs whose status is not normal are kept, flagged;
    ``check``: a further test of each config.json, e.g. ``report.recorded.check_recorded_types``)."""
    import pandas as pd  # here, not above: a run reads its own folder without loading pandas

    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    readable: list[tuple[Path, str, str | None, list[tuple[Any, ...]]]] = []
    for folder in find_run_folders(paths, warn):
        try:
            readable.append((folder, *read_run(folder, check)))
        except (ValueError, TypeError, KeyError, OverflowError, RecursionError, MemoryError) as error:
            warn(f"skipped {folder}: {error}")
    # of several copies of one run, keep the folder the runner named (its name ends in the hash)
    readable.sort(key=lambda item: not item[0].name.endswith("__" + item[1][:8]))
    rows: list[tuple[Any, ...]] = []
    seen: dict[str, Path] = {}
    names: set[str] = set()
    for folder, identity, status, run_rows in readable:
        if identity in seen:
            warn(f"skipped {folder}: same run (settings and seed) as {seen[identity]}; counted once")
            continue
        seen[identity] = folder
        if status is not None and not include_abnormal:
            warn(f"skipped {folder}: {status} run (status {status!r}); --include-diverged shows it flagged")
            continue
        if folder.name in names:  # same folder name, different settings: keep both apart
            run_rows = [(str(folder), *row[1:]) for row in run_rows]
        names.add(folder.name)
        rows += run_rows
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    frame["value"] = pd.to_numeric(frame["value"], errors="coerce")
    return frame.astype(
        {"round": "Int64", "value": "float64", "partition": "object", "seed": "int64", "status": "object"}
    )
