"""A reference scenario's shipped artifacts, and other runs put beside them.

``write_artifacts`` turns a scenario's cells (``WORK/<scenario>/reference.json``, written by
``sweeps.reference``) and their run folders into the files ``results/reference/<scenario>/``
ships, small enough for git (no checkpoints, no per-client files):

- ``summary.csv``: one row per (algorithm, setting ∈ {default, tuned}, seed) — status, run
  folder and a column per metric (final and last-10 accuracy, worst-10%, new-client accuracy,
  MB communicated, rounds and MB to the scenario's target); a cell not finished yet is a row
  with its status (``missing``, ``failed``, ``diverged``) and no values;
- ``curves.csv``: per run and evaluation round, the accuracy and the cumulative bytes;
- ``leaderboard.md/.tex/.csv``: the default and tuned rows of every algorithm, from these two files;
- ``ranking.md``: one short row per algorithm, best tuned accuracy first (``report.ranking``);
- ``hyperparameters.json``: per algorithm, the default setting and the tuned one with its study;
- ``curves_tuned.png``, ``curves_default.png``: accuracy per round, per algorithm;
- ``manifest.json``: every run's identity hash, code identity and git commit, the dataset's
  content hash, the scenario's settings (as the runs recorded them) and its protocol.

A cell whose run folder is gone (another machine ran it) keeps the row the artifacts already
hold for the same run, so artifacts can be completed piecewise. ``reference_frame`` reads
``summary.csv`` and ``curves.csv`` back into the leaderboard's tidy frame, and
``comparison_frame`` checks other runs against the scenario (``pflbench leaderboard --reference``):
same scenario settings, protocol and data, else one error naming the first difference.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd

from pflbench.config.reference import SETTINGS, Scenario, read_scenario, scenario_settings
from pflbench.errors import ConfigError
from pflbench.report.latex import to_latex
from pflbench.report.leaderboard import ALIASES, curve_bands, pivot, row_labels
from pflbench.report.names import display_name, quantity
from pflbench.report.plots import plot_curves
from pflbench.report.ranking import RANKING_FILE, ranking_markdown, ranking_rows
from pflbench.report.render import FORMATS
from pflbench.report.targets import MB, ROUNDS, parse_target, target_values
from pflbench.store.layout import CONFIG_FILE, run_folder
from pflbench.store.reader import COLUMNS, find_run_folders, load_json, partition_of, read_run, recorded_identity_hash
from pflbench.util.atomic import atomic_write_json, atomic_write_text

WORK_RECORD = "reference.json"  # the work folder's record (sweeps.reference writes it)
SUMMARY_METRICS = (
    "pers_acc",
    "pers_acc_last10",
    "pers_acc_worst10",
    "pers_acc_weighted",  # pooled over every test sample (how PFLlib and others report accuracy)
    "new_acc",
    "global_acc",
    "val_pers_acc",
    "val_pers_acc_last10",
    "bytes_up_total",
    "bytes_down_total",
    "wall_time_s",
)
MOVE = "pers_acc_move_last10"  # convergence: how far the accuracy moved over the last 10% of rounds
DERIVED = ("comm_mb", ROUNDS, MB, MOVE)
CURVE_METRICS = ("pers_acc", "val_pers_acc", "global_acc", "bytes_up_cum", "bytes_down_cum")
KEY = ("algo", "setting", "seed")
TABLE_METRIC = "pers_acc"
TABLE_EXTRAS = ("pers_acc_last10", "pers_acc_worst10", "new_acc", "comm")
AS_RUN = "as run"  # the setting label of runs that no reference record describes


# ---- reading cells' run folders -------------------------------------------------------------


def _read_cell(folder: Path) -> tuple[dict[str, Any], dict[str, Any], pd.DataFrame] | None:
    """(config.json, summary values, tidy rows) of a finished normal run folder, else None."""
    try:
        _, status, rows = read_run(folder)
        config = load_json(folder / CONFIG_FILE)
    except (ValueError, TypeError, KeyError, OSError):
        return None
    if status is not None or not isinstance(config, dict):
        return None
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    finals = frame[frame["round"].isna()].set_index("metric")["value"].to_dict()
    return config, finals, frame


def reach(frame: pd.DataFrame, target: str | None) -> tuple[float, float]:
    """(rounds, MB) until the run in ``frame`` first reaches ``target`` (NaN: never, or no target)."""
    if not target:
        return math.nan, math.nan
    goal = parse_target(target, TABLE_METRIC, sorted(set(frame.loc[frame["round"].notna(), "metric"])))
    if goal.relative:
        raise ConfigError(f"scenario target {target!r}: a reference target is absolute (e.g. pers_acc=0.8)")
    runs = frame.drop_duplicates("run").set_index("run")[["dataset", "partition", "seed"]].assign(row="run")
    values, _ = target_values(frame, goal, runs)
    by = values.set_index("quantity")["value"].to_dict() if not values.empty else {}
    return float(by.get(ROUNDS, math.nan)), float(by.get(MB, math.nan))


def _summary_row(
    cell: Mapping[str, Any], status: str, finals: Mapping[str, Any], frame: pd.DataFrame | None, target: str | None
) -> dict[str, Any]:
    row: dict[str, Any] = {k: cell[k] for k in KEY} | {"status": status, "run": cell.get("run") or ""}
    for metric in SUMMARY_METRICS:
        value = finals.get(metric)
        row[metric] = float(value) if value is not None and math.isfinite(value) else math.nan
    up, down = row["bytes_up_total"], row["bytes_down_total"]
    row["comm_mb"] = (up + down) / 2**20
    row[ROUNDS], row[MB] = reach(frame, target) if frame is not None else (math.nan, math.nan)
    row[MOVE] = math.nan
    if frame is not None:
        curve = frame[frame["round"].notna() & (frame["metric"] == TABLE_METRIC)].sort_values("round")
        row[MOVE] = late_move(list(curve["value"]))
    return row


def late_move(values: list[float]) -> float:
    """max − min of a per-round curve over its last 10% of evaluations (at least the last two):
    a converged run moves little there (the issue's bar: < 1 point for tuned FedAvg and FedRep)."""
    if len(values) < 2:
        return math.nan
    tail = values[-max(2, math.ceil(0.1 * len(values))) :]
    return max(tail) - min(tail)


def _curve_rows(cell: Mapping[str, Any], frame: pd.DataFrame) -> pd.DataFrame:
    rounds = frame[frame["round"].notna() & frame["metric"].isin(CURVE_METRICS)]
    wide = rounds.pivot_table(index="round", columns="metric", values="value", aggfunc="first")
    wide = wide.reindex(columns=[m for m in CURVE_METRICS if m in wide.columns]).reset_index()
    wide["round"] = wide["round"].astype("int64")
    for column in ("bytes_up_cum", "bytes_down_cum"):  # whole bytes: exact in the CSV
        if column in wide:
            wide[column] = wide[column].round().astype("Int64")
    for k in KEY:
        wide.insert(KEY.index(k), k, cell[k])
    return wide


def _existing(folder: Path) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    summary = pd.read_csv(folder / "summary.csv") if (folder / "summary.csv").is_file() else pd.DataFrame()
    curves = pd.read_csv(folder / "curves.csv") if (folder / "curves.csv").is_file() else pd.DataFrame()
    manifest = load_json(folder / "manifest.json") if (folder / "manifest.json").is_file() else {}
    return summary, curves, manifest if isinstance(manifest, dict) else {}


# ---- the artifacts --------------------------------------------------------------------------


def write_artifacts(
    scenario: Scenario,
    folder: str | Path,
    record: Mapping[str, Any],
    runs_dir: str | Path,
    report: Callable[[str], None] = lambda line: None,
    plots: bool = True,
) -> dict[str, int]:
    """Write the scenario's artifacts into ``folder`` from the work record's cells and the run
    folders under ``runs_dir`` (``plots``: the PNG curves too); returns the count of cells by status."""
    folder, runs_dir = Path(folder), Path(runs_dir)
    old_summary, old_curves, old_manifest = _existing(folder)
    old_runs = {r["run"]: r for r in old_manifest.get("runs", [])}
    hyper_file = folder / "hyperparameters.json"
    old_hyper = load_json(hyper_file) if hyper_file.is_file() else {}
    summary_rows: list[dict[str, Any]] = []
    curve_parts: list[pd.DataFrame] = []
    manifest_runs: list[dict[str, Any]] = []
    settings: list[dict[str, Any]] = []
    partition = old_manifest.get("partition")
    hyper: dict[str, dict[str, Any]] = {}
    for cell in sorted(record["cells"], key=lambda c: (c["algo"], SETTINGS.index(c["setting"]), c["seed"])):
        read = _read_cell(runs_dir / cell["run"]) if cell.get("run") else None
        if read is not None:
            config, finals, frame = read
            summary_rows.append(_summary_row(cell, "done", finals, frame, scenario.protocol.target))
            curve_parts.append(_curve_rows(cell, frame))
            identity = config.get("identity") or {}
            settings.append(scenario_settings(identity))
            partition = partition_of(config)
            code = config.get("code") or {}
            manifest_runs.append(
                {
                    **{k: cell[k] for k in KEY},
                    "run": cell["run"],
                    "identity": recorded_identity_hash(config),
                    "code": code.get("identity"),
                    "pflbench": code.get("pflbench"),
                    "git": code.get("git"),
                }
            )
            entry = hyper.setdefault(cell["algo"], {})
            if cell["setting"] == "default" and "default" not in entry:
                entry["default"] = _resolved_setting(identity)
            if cell["setting"] == "tuned" and "tuned" not in entry:
                entry["tuned"] = {"params": cell.get("params", {}), **_resolved_setting(identity)}
        elif cell.get("run") in old_runs and not old_summary.empty:  # ran elsewhere: keep what is shipped
            kept = old_summary[(old_summary["run"] == cell["run"]) & (old_summary["status"] == "done")]
            if kept.empty:
                summary_rows.append(_summary_row(cell, cell.get("status", "missing"), {}, None, None))
                continue
            summary_rows += kept.to_dict("records")
            if not old_curves.empty:
                curve_parts.append(old_curves[_key_mask(old_curves, cell)])
            manifest_runs.append(old_runs[cell["run"]])
            shipped = old_hyper.get(cell["algo"], {}).get(cell["setting"]) if isinstance(old_hyper, dict) else None
            if isinstance(shipped, dict):  # its resolved (and tuned) setting, as shipped
                hyper.setdefault(cell["algo"], {}).setdefault(cell["setting"], shipped)
        else:
            status = cell.get("status", "missing")
            summary_rows.append(_summary_row(cell, "missing" if status == "done" else status, {}, None, None))
    for algo, study in (record.get("studies") or {}).items():
        if study is not None:
            hyper.setdefault(algo, {}).setdefault("tuned", {})["study"] = study
    summary = pd.DataFrame(summary_rows, columns=[*KEY, "status", "run", *SUMMARY_METRICS, *DERIVED])
    curves = pd.concat(curve_parts, ignore_index=True) if curve_parts else pd.DataFrame(columns=[*KEY, "round"])
    fixed = _constant(settings) if settings else old_manifest.get("scenario_settings", {})
    manifest = {
        "scenario": scenario.name,
        "scenario_identity": scenario.identity(),
        "dataset_sha256": record.get("dataset_sha256"),
        "partition": partition,
        "scenario_settings": fixed,
        "protocol": scenario.protocol.budget(),
        "runs": manifest_runs,
        "missing": [{k: r[k] for k in (*KEY, "status")} for r in summary_rows if r["status"] != "done"],
    }
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(folder / "summary.csv", summary.to_csv(index=False))
    atomic_write_text(folder / "curves.csv", curves.to_csv(index=False, float_format="%.6g"))
    atomic_write_json(folder / "manifest.json", manifest)
    atomic_write_json(folder / "hyperparameters.json", dict(sorted(hyper.items())))
    ranking = ranking_rows(summary, len(scenario.protocol.seeds), renames=variant_names(scenario))
    atomic_write_text(folder / RANKING_FILE, ranking_markdown(ranking))
    counts = summary["status"].value_counts().to_dict()
    done = summary[summary["status"] == "done"]
    if not done.empty:
        frame = reference_frame(folder)
        table = reference_table(frame, scenario)
        missing = _missing_note(summary)
        renderers: dict[str, tuple[Callable[[pd.DataFrame], str], str]] = {
            **FORMATS,
            "latex": (partial(to_latex, fit="resize"), ".tex"),
        }
        for name, (render, suffix) in renderers.items():
            if name == "html":
                continue
            text = render(table)
            if name == "md" and missing:
                text += "\n" + missing + "\n"
            atomic_write_text(folder / f"leaderboard{suffix}", text)
        for setting in SETTINGS if plots else ():
            write_curves(frame, setting, folder / f"curves_{setting}.png", table.attrs.get("renames"))
    report(
        f"reference {scenario.name}: artifacts in {folder} ({', '.join(f'{n} {s}' for s, n in sorted(counts.items()))})"
    )
    return {str(k): int(v) for k, v in counts.items()}


def _key_mask(frame: pd.DataFrame, cell: Mapping[str, Any]) -> Any:
    return (frame["algo"] == cell["algo"]) & (frame["setting"] == cell["setting"]) & (frame["seed"] == cell["seed"])


def _resolved_setting(identity: Mapping[str, Any]) -> dict[str, Any]:
    """The settings an algorithm chooses itself, as its run read them: optimizer, lr and its
    hyperparameters (the scenario fixes the rest)."""
    keys = ("optimizer", "lr", "momentum", "weight_decay", "max_grad_norm", "local_epochs", "head_layers")
    return {**{k: identity[k] for k in keys if k in identity}, "algo_hparams": identity.get("algo_hparams", {})}


def _constant(settings: list[dict[str, Any]]) -> dict[str, Any]:
    """The scenario settings every reference run shares (one an algorithm tunes is left out)."""
    first = settings[0]
    return {
        k: v
        for k, v in first.items()
        if all(json.dumps(s.get(k), default=str) == json.dumps(v, default=str) for s in settings)
    }


def _missing_note(summary: pd.DataFrame) -> str:
    missing = summary[summary["status"] != "done"]
    if missing.empty:
        return ""
    groups: dict[tuple[str, str, str], list[str]] = {}
    for row in missing.itertuples(index=False):
        groups.setdefault((row.algo, row.setting, row.status), []).append(str(row.seed))
    items = [f"{a} {s} seed {','.join(seeds)} ({status})" for (a, s, status), seeds in sorted(groups.items())]
    return f"Cells not finished ({len(missing)} of {len(summary)}): " + "; ".join(items) + "."


def write_curves(frame: pd.DataFrame, setting: str, path: Path, renames: Mapping[str, str] | None) -> list[Path]:
    """Mean personalized accuracy per round over seeds, one line per algorithm, for one setting."""
    keys = frame["config_key"].map(lambda k: json.loads(k)["algo_hparams"].get("setting"))
    runs = frame[(keys == setting) & frame["round"].notna()]
    if runs.empty:
        return []
    label = quantity(TABLE_METRIC).label
    bands = curve_bands(frame[keys == setting], TABLE_METRIC, "round", renames)
    return plot_curves(
        bands, [path], "Round", label, title=f"{label}, {setting} settings: mean over seeds", integer_x=True
    )


# ---- the tidy frame back from the artifacts ---------------------------------------------------


def config_key(settings: Mapping[str, Any], setting: str, extra: Mapping[str, Any] | None = None) -> str:
    """The leaderboard key of a reference or compared run: the scenario's settings (so the setup
    line reads them) and the row's setting (default, tuned, as run) plus what else tells runs apart."""
    return json.dumps(
        {"run": dict(settings), "algo_hparams": {"setting": setting, **(extra or {})}}, sort_keys=True, default=str
    )


def reference_frame(folder: str | Path) -> pd.DataFrame:
    """The finished cells of ``summary.csv`` and ``curves.csv`` as the leaderboard's tidy frame."""
    folder = Path(folder)
    summary, curves, manifest = _existing(folder)
    if summary.empty or "status" not in summary:
        raise ConfigError(f"{folder} holds no summary.csv (run pflbench reference first)")
    scenario = read_scenario(folder)
    partition = str(manifest.get("partition") or "")
    fixed = manifest.get("scenario_settings", {})
    rows: list[tuple[Any, ...]] = []
    done = summary[summary["status"] == "done"]
    curve_groups = {key: group for key, group in curves.groupby(list(KEY))} if not curves.empty else {}
    for cell in done.to_dict("records"):
        run = f"reference:{scenario.name}:{cell['algo']}:{cell['setting']}:{cell['seed']}"
        key = config_key(fixed, cell["setting"])
        head = (run, cell["algo"], scenario.dataset, partition, int(cell["seed"]))
        rows += [(*head, None, m, float(cell[m]), key, None) for m in SUMMARY_METRICS if pd.notna(cell.get(m))]
        group = curve_groups.get((cell["algo"], cell["setting"], cell["seed"]))
        if group is not None:
            for metric in (m for m in CURVE_METRICS if m in group.columns):
                rows += [
                    (*head, int(r), metric, float(v), key, None)
                    for r, v in zip(group["round"], group[metric])
                    if pd.notna(v)
                ]
    return _frame(rows)


def _frame(rows: list[tuple[Any, ...]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    return frame.astype(
        {"round": "Int64", "value": "float64", "partition": "object", "seed": "int64", "status": "object"}
    )


def setting_renames(frame: pd.DataFrame, renames: Mapping[str, str] | None = None) -> dict[str, str]:
    """Row label → the label with the setting in plain words: ``FedAvg (setting=tuned)`` →
    ``FedAvg (tuned)``; a row of one setting only gets it too (``FedAvg`` → ``FedAvg (tuned)``)."""
    labels = row_labels(frame, renames)
    settings = (
        frame.drop_duplicates("run")
        .set_index("run")["config_key"]
        .map(lambda k: json.loads(k)["algo_hparams"].get("setting"))
    )
    mapped: dict[str, str] = {}
    for run, label in labels.items():
        setting = settings[run]
        mapped[label] = label.replace(f"setting={setting}", setting) if "setting=" in label else f"{label} ({setting})"
    return mapped


def variant_names(scenario: Scenario) -> dict[str, str]:
    """The names of the scenario's variants of an algorithm (``[algo_options]``): ``FedAvg + LoRA``
    for a LoRA rank, else the options in words (``FedAvg (mu=0.1)``), so a table never shows a
    variant under the plain algorithm's name."""
    names = {}
    for algo, options in scenario.algo_options.items():
        rest = {k: v for k, v in options.items() if k != "lora_rank"}
        name = display_name(algo) + (" + LoRA" if "lora_rank" in options else "")
        names[algo] = f"{name} ({', '.join(f'{k}={v}' for k, v in rest.items())})" if rest else name
    return names


def reference_table(frame: pd.DataFrame, scenario: Scenario, **options: Any) -> pd.DataFrame:
    """The scenario's leaderboard: pers_acc, last-10, worst-10%, new clients, MB, and rounds and
    MB to its target; default and tuned rows; significance marks over the seeds."""
    user = {**variant_names(scenario), **(options.pop("renames", None) or {})}
    renames = {**user, **setting_renames(frame, user)}
    options.setdefault("target", scenario.protocol.target)
    options.setdefault("order", "name")
    present = set(frame.loc[frame["round"].isna(), "metric"])
    extras = [m for m in TABLE_EXTRAS if set(ALIASES.get(m, (m,))) <= present]  # e.g. new_acc: with new clients
    table = pivot(frame, TABLE_METRIC, extras, renames=renames, **options)
    table.attrs["renames"] = renames
    return table


# ---- other runs beside the reference ----------------------------------------------------------


def _first_difference(ours: Mapping[str, Any], theirs: Mapping[str, Any]) -> tuple[str, Any, Any] | None:
    for key in sorted(set(ours) | set(theirs)):
        a, b = ours.get(key), theirs.get(key)
        if json.dumps(a, sort_keys=True, default=str) != json.dumps(b, sort_keys=True, default=str):
            return key, a, b
    return None


def _work_records(path: Path) -> list[tuple[Path, dict[str, Any]]]:
    """The reference work records (reference.json) in or right under ``path``."""
    found = []
    for file in [path / WORK_RECORD, *sorted(path.glob(f"*/{WORK_RECORD}"))]:
        if file.is_file():
            data = load_json(file)
            if isinstance(data, dict) and isinstance(data.get("cells"), list):
                found.append((file.parent, data))
    return found


def comparison_frame(
    dirs: Iterable[str | Path], reference: str | Path, warn: Callable[[str], None] = lambda message: None
) -> pd.DataFrame:
    """The reference's rows and the finished runs under ``dirs`` in one tidy frame, after checking
    that those runs share the scenario: its settings (``config.reference.SCENARIO_IDENTITY_KEYS``,
    as the reference's runs recorded them), and, for runs that ``pflbench reference`` made (a work
    record beside them), its protocol (trials, tuning rounds, seeds, objective, sampler) and the
    dataset's content hash. A difference is one ConfigError naming the setting and both values."""
    reference = Path(reference)
    scenario = read_scenario(reference)
    _, _, manifest = _existing(reference)
    ours = reference_frame(reference)
    fixed = manifest.get("scenario_settings", {})
    paths = [Path(d) for d in dirs]
    records = [found for path in paths for found in _work_records(path)]
    for where, record in records:
        difference = _first_difference(manifest.get("protocol", {}), record.get("protocol", {}))
        if difference is not None:
            key, a, b = difference
            raise ConfigError(
                f"--reference {reference}: the runs in {where} followed another protocol: {key} = {_text(b)} "
                f"(reference {scenario.name}: {_text(a)})"
            )
        ref_hash, their_hash = manifest.get("dataset_sha256"), record.get("dataset_sha256")
        if ref_hash and their_hash and ref_hash != their_hash:
            raise ConfigError(
                f"--reference {reference}: the runs in {where} used other data: dataset content sha256 "
                f"{their_hash[:12]}… (reference {scenario.name}: {ref_hash[:12]}…)"
            )
    labelled: dict[Path, str] = {}
    folders: list[Path] = []
    for path in paths:
        found = _work_records(path)
        if not found:  # plain run folders
            folders += find_run_folders([path], warn)
        for where, record in found:  # a work folder: only its cells (not its tuning trials)
            for cell in record["cells"]:
                if cell.get("run") and run_folder(where, cell["run"]).is_dir():
                    folder = run_folder(where, cell["run"])
                    labelled[folder.resolve()] = cell["setting"]
                    folders.append(folder)
    rows: list[tuple[Any, ...]] = []
    for folder in folders:
        read = _read_cell(folder)
        if read is None:
            warn(f"skipped {folder}: not a finished normal run")
            continue
        config, _, frame = read
        identity = config.get("identity") or {}
        theirs = {k: v for k, v in scenario_settings(identity).items() if k in fixed}
        difference = _first_difference(fixed, theirs)
        if difference is not None:
            key, a, b = difference
            raise ConfigError(
                f"--reference {reference}: run {folder.name} differs from scenario {scenario.name} in "
                f"{key}: {_text(b)} (reference: {_text(a)})"
            )
        setting = labelled.get(folder.resolve(), AS_RUN)
        extra = {} if setting != AS_RUN else _own_settings(identity, fixed)
        key = config_key(fixed, setting, extra)
        frame = frame.assign(config_key=key, run=f"{folder}", partition=manifest.get("partition") or frame["partition"])
        rows += list(frame.itertuples(index=False, name=None))
    if not rows:
        raise ConfigError(f"no finished runs to compare under {', '.join(map(str, paths))}")
    theirs_frame = _frame(rows)
    clash = set(ours["algo"]) & set(theirs_frame["algo"])
    if clash:  # their runs of a reference algorithm: a row of their own
        theirs_frame["config_key"] = theirs_frame["config_key"].map(_mark_yours)
    return pd.concat([ours, theirs_frame], ignore_index=True)


def _mark_yours(key: str) -> str:
    data = json.loads(key)
    data["algo_hparams"]["setting"] = f"{data['algo_hparams']['setting']}, yours"
    return json.dumps(data, sort_keys=True)


def _own_settings(identity: Mapping[str, Any], fixed: Mapping[str, Any]) -> dict[str, Any]:
    """What a plain run chose besides the scenario: optimizer, lr, ... and its hyperparameters."""
    skip = {*fixed, "algo", "seed", "algo_hparams", "device"}
    own = {k: v for k, v in identity.items() if k not in skip}
    return {**own, **(identity.get("algo_hparams") or {})}


def _text(value: Any) -> str:
    return json.dumps(value, default=str) if not isinstance(value, str) else value
