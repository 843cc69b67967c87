"""The start of a run's work folder: fresh (config.json with ``config_record``, partition.json,
a copy of each ``--plugin`` file's source, the backbone's accuracy before training) or resumed
from its checkpoint (``--resume``; only when the work folder was started by the same code)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import platform
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from pflbench._version import __version__
from pflbench.config.provenance import code_changes, code_record, recorded_code_identity
from pflbench.engine import Federation
from pflbench.registry import loaded_plugin_file
from pflbench.runs.checkpoint import load_checkpoint, restore_checkpoint
from pflbench.store.layout import (
    CHECKPOINT_FILE,
    CONFIG_FILE,
    PARTITION_FILE,
    PLUGINS_DIR,
    RunPaths,
    fresh_work_folder,
)
from pflbench.store.reader import read_json, read_rounds
from pflbench.store.writer import RunWriter
from pflbench.util.cache import warn

if TYPE_CHECKING:
    from pflbench.runs.prepared import PreparedRun


def plugin_files(plugins: tuple[str, ...]) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
    """Each ``--plugin`` file the run was given: ``{"path", "sha256", "copy"}`` (its absolute
    path, the hash of the content it was loaded with, its copy in the run folder) and the copies'
    sources by file name (two files of one name: ``STEM-<sha256[:8]>.py``)."""
    records: list[dict[str, Any]] = []
    copies: dict[str, bytes] = {}
    for given in plugins:
        loaded = loaded_plugin_file(given)
        if loaded is not None:  # the content that ran, not what the file holds by now
            path, source = loaded.recorded_as, loaded.source
        else:  # a library call that names a file it did not load with load_plugin_file
            path = os.path.abspath(given)
            try:
                source = Path(given).read_bytes()
            except OSError:
                records.append({"path": path, "sha256": None, "copy": None})
                continue
        digest = hashlib.sha256(source).hexdigest()
        name = Path(path).name
        if copies.get(name, source) != source:
            name = f"{Path(path).stem}-{digest[:8]}{Path(path).suffix}"
        copies[name] = source
        records.append({"path": path, "sha256": digest, "copy": f"{PLUGINS_DIR}/{name}"})
    return records, copies


def config_record(prepared: PreparedRun, plugins: tuple[str, ...] = ()) -> dict[str, Any]:
    """config.json: every resolved setting, the identity (the settings the run reads), how the
    run was resolved, the code that computes it (``code``: ``config.provenance``), and the
    environment."""
    algorithm, config = prepared.algorithm, prepared.config
    files, _ = plugin_files(plugins)
    code = code_record(config, files)
    model = prepared.executor.model
    sizes = {n: t.numel() for n, t in model.named_parameters()}
    buffers = {n: t.numel() for n, t in model.named_buffers()}
    count = {**buffers, **sizes}
    return {
        **dataclasses.asdict(config),
        "algo_hparams": dataclasses.asdict(algorithm.hparams),
        "identity": prepared.identity.settings,
        "identity_hash": prepared.identity.hash,
        "plugins": [file["path"] for file in files],  # absolute: a rerun finds them from any folder
        "resolved": {
            "eval_every": config.resolved_eval_every,
            "clients_per_round": config.sampled_per_round,
            "dataset_source": prepared.dataset.source,
            "dataset_size": len(prepared.dataset.labels),
            "input_shape": list(prepared.dataset.input_shape),
            "num_classes": prepared.dataset.num_classes,
            "model_parameters": sum(sizes.values()),
            "shared_parameters": sum(count[n] for n in algorithm.layout.shared),
            "private_parameters": sum(count[n] for n in algorithm.layout.private),
            **prepared.resolved,
            **algorithm.run_info(),
        },
        "versions": {
            "pflbench": __version__,
            "python": platform.python_version(),
            "torch": torch.__version__,
            "numpy": np.__version__,
        },
        "code": code,
        "git_commit": (code["git"] or {}).get("commit"),
        "command": sys.argv,
    }


def start_or_resume(
    prepared: PreparedRun,
    federation: Federation,
    paths: RunPaths,
    resume: bool,
    plugins: tuple[str, ...],
) -> tuple[RunWriter, list[dict[str, Any]], dict[str, Any]]:
    """Resume from the work folder's checkpoint (``resume``, when the same code started it),
    else start an empty work folder."""
    checkpoint = paths.work / CHECKPOINT_FILE
    record = config_record(prepared, plugins)
    _, copies = plugin_files(plugins)
    if resume and checkpoint.is_file():
        started_by = read_json(paths.work / CONFIG_FILE)
        if isinstance(started_by, dict) and recorded_code_identity(started_by) not in (
            None,
            record["code"]["identity"],
        ):
            changes = "; ".join(code_changes(started_by.get("code"), record["code"]))
            warn(f"{paths.work} holds an unfinished run started by other code ({changes}); starting it over")
            resume = False
    elif checkpoint.is_file():
        warn(f"{paths.work} holds an unfinished run with a checkpoint; starting it over (--resume continues it)")
    entry = load_checkpoint(checkpoint, prepared.identity.hash) if resume and paths.work.is_dir() else None
    if entry is not None:
        tensors, meta = entry
        try:
            records = read_rounds(paths.work, meta["records"])
        except (OSError, ValueError) as problem:
            warn(f"cannot resume {paths.work}: {problem}; starting the run again")
        else:
            restore_checkpoint(federation, tensors, meta)
            writer = RunWriter(paths.work, keep_rounds=meta["records"], portable=prepared.config.portable)
            # a work folder that lost its records is made whole again (the checkpoint's identity
            # proves the same settings), so the published run is never one nothing can read
            if not (paths.work / CONFIG_FILE).is_file():
                writer.write_config(record)
            if not (paths.work / PARTITION_FILE).is_file():
                writer.write_partition(prepared.partition.to_json())
            writer.write_plugin_copies(
                {n: c for n, c in copies.items() if not (paths.work / PLUGINS_DIR / n).is_file()}
            )
            return writer, records, meta["before"]
    writer = RunWriter(fresh_work_folder(paths), portable=prepared.config.portable)
    writer.write_config(record)
    writer.write_plugin_copies(copies)
    writer.write_partition(prepared.partition.to_json())
    before: dict[str, Any] = {}
    if prepared.resolved["backbone"]["source"] != "random init":  # what fine-tuning starts from
        metrics, _ = federation.evaluator.evaluate_clients()
        before = {"backbone_pers_acc": metrics["pers_acc"], "backbone_global_acc": metrics["global_acc"]}
    return writer, [], before
