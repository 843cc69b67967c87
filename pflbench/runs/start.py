"""The start of a run's work folder: fresh (config.json with ``config_record``, partition.json,
the backbone's accuracy before training) or resumed from its checkpoint (``--resume``)."""

from __future__ import annotations

import dataclasses
import platform
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from pflbench._version import __version__
from pflbench.config.identity import identity_hash, run_identity
from pflbench.engine import Federation
from pflbench.runs.checkpoint import load_checkpoint, restore_checkpoint
from pflbench.store.layout import CHECKPOINT_FILE, CONFIG_FILE, PARTITION_FILE, RunPaths, fresh_work_folder
from pflbench.store.reader import read_rounds
from pflbench.store.writer import RunWriter
from pflbench.util.cache import warn

if TYPE_CHECKING:
    from pflbench.runs.prepared import PreparedRun


def git_commit() -> str | None:
    try:
        return (
            subprocess.run(
                ["git", "rev-parse", "HEAD"],
                capture_output=True,
                text=True,
                cwd=Path(__file__).resolve().parent,
                timeout=5,
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        return None


def config_record(prepared: PreparedRun, plugins: tuple[str, ...] = ()) -> dict[str, Any]:
    """config.json: every resolved setting, the identity (the settings the run reads), how the
    run was resolved, and the environment."""
    algorithm, config = prepared.algorithm, prepared.config
    identity = run_identity(config, type(algorithm), algorithm.hparams)
    model = prepared.executor.model
    sizes = {n: t.numel() for n, t in model.named_parameters()}
    buffers = {n: t.numel() for n, t in model.named_buffers()}
    count = {**buffers, **sizes}
    return {
        **dataclasses.asdict(config),
        "algo_hparams": dataclasses.asdict(algorithm.hparams),
        "identity": identity,
        "identity_hash": identity_hash(identity),
        "plugins": list(plugins),
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
        "git_commit": git_commit(),
        "command": sys.argv,
    }


def start_or_resume(
    prepared: PreparedRun,
    federation: Federation,
    paths: RunPaths,
    identity: str,
    resume: bool,
    plugins: tuple[str, ...],
) -> tuple[RunWriter, list[dict[str, Any]], dict[str, Any]]:
    """Resume from the work folder's checkpoint (``resume``), else start an empty work folder."""
    checkpoint = paths.work / CHECKPOINT_FILE
    if not resume and checkpoint.is_file():
        warn(f"{paths.work} holds an unfinished run with a checkpoint; starting it over (--resume continues it)")
    entry = load_checkpoint(checkpoint, identity) if resume and paths.work.is_dir() else None
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
                writer.write_config(config_record(prepared, plugins))
            if not (paths.work / PARTITION_FILE).is_file():
                writer.write_partition(prepared.partition.to_json())
            return writer, records, meta["before"]
    writer = RunWriter(fresh_work_folder(paths), portable=prepared.config.portable)
    writer.write_config(config_record(prepared, plugins))
    writer.write_partition(prepared.partition.to_json())
    before: dict[str, Any] = {}
    if prepared.resolved["backbone"]["source"] != "random init":  # what fine-tuning starts from
        metrics, _ = federation.evaluate()
        before = {"backbone_pers_acc": metrics["pers_acc"], "backbone_global_acc": metrics["global_acc"]}
    return writer, [], before
