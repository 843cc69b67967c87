"""Build a run from a RunConfig and execute it: data → partition → model → server → results."""
from __future__ import annotations

import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from . import __version__
from .config import (RunConfig, apply_lora_run_defaults, hyperparameters_from, run_identity,
                     run_name, validate)
from .data import FederatedData, TensorDataset, load_dataset
from .engine import Server
from .errors import ConfigError
from .metrics import summarize
from .lora import apply_lora, parse_targets
from .models import build_model
from .partition import partition, partition_stats, split_train_test
from .partition_io import fit_num_clients, preset_partition
from .pretrain import initial_weights, load_initial_weights, public_split
from .registry import ALGORITHMS
from .results import RunWriter
from .seeding import derive_seed, rng_stream


@dataclass
class Partition:
    train: list[np.ndarray]
    test: list[np.ndarray]
    stats: dict[str, Any]
    public: np.ndarray  # held out for pretraining, given to no client (--public-frac)

    def to_json(self) -> dict[str, Any]:
        return {"train_indices": [s.tolist() for s in self.train],
                "test_indices": [s.tolist() for s in self.test],
                "public_indices": self.public.tolist(), "stats": self.stats}


def make_partition(config: RunConfig, dataset: TensorDataset) -> Partition:
    """Hold out the public fraction (public stream), partition the rest over clients
    (partition stream), then split each client (split stream)."""
    labels = dataset.labels.numpy()
    preset = preset_partition(config, dataset)  # --partition-file, or a dataset's own client split
    if preset is not None:
        stats = partition_stats(labels, preset.train, preset.test, dataset.num_classes)
        return Partition(preset.train, preset.test, {**stats, "public_samples": len(preset.public)},
                         preset.public)
    pool, public = public_split(labels, config.public_frac, config.seed)
    groups = None if dataset.groups is None else np.asarray(dataset.groups)[pool]
    clients = partition(config.partition, labels[pool], config.num_clients,
                        rng_stream(config.seed, "partition"), alpha=config.alpha,
                        min_size=config.min_size, shards_per_client=config.shards_per_client,
                        groups=groups, cut=config.dirichlet_cut)
    clients = [pool[indices] for indices in clients]
    train, test = split_train_test(labels, clients, config.test_frac, rng_stream(config.seed, "split"))
    stats = {**partition_stats(labels, train, test, dataset.num_classes), "public_samples": len(public)}
    return Partition(train, test, stats, public)


def resolve_device(name: str) -> torch.device:
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise ConfigError(f"--device {name!r} is not a torch device (cpu, cuda, cuda:1, ...)") from error
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {name!r}: CUDA is not available on this machine; use --device cpu")
    if device.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"--device {name!r} is not supported; use cpu or cuda")
    return device


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


@dataclass
class PreparedRun:
    config: RunConfig
    server: Server
    partition: Partition
    dataset: TensorDataset
    run_dir: Path
    resolved: dict[str, Any]  # how the model was obtained (backbone, LoRA, defaults applied)


def prepare(config: RunConfig, algo_options: dict[str, Any] | None = None,
            explicit: set[str] | None = None) -> PreparedRun:
    """Validate everything and build the server; nothing is written yet.

    ``explicit``: the RunConfig fields the user set (the CLI passes them); a LoRA run takes
    ``LORA_RUN_DEFAULTS`` for the others. ``None`` (library use): ``config`` is taken as is.
    """
    server_class = ALGORITHMS.get(config.algo)
    hparams = hyperparameters_from(server_class.hyperparameters, dict(algo_options or {}), config.algo)
    lora_rank = server_class.lora_rank(config, hparams)
    resolved: dict[str, Any] = {}
    if lora_rank is not None and explicit is not None:
        config, resolved["lora_run_defaults"] = apply_lora_run_defaults(config, explicit)
    validate(config)
    device = resolve_device(config.device)
    dataset = load_dataset(config.dataset, config.dataset_options())
    config = fit_num_clients(config, dataset, explicit)  # a preset partition sets K
    split = make_partition(config, dataset)
    weights, backbone = initial_weights(config, dataset, split.public, device, lora_rank is not None)
    torch.manual_seed(derive_seed(config.seed, "init"))
    model = build_model(config.model, dataset.input_shape, dataset.num_classes,
                        pretrained=config.pretrained, **config.model_options())
    resolved["backbone"] = load_initial_weights(model, weights, backbone, config, split.public)
    if lora_rank is not None:
        adapted = apply_lora(model, lora_rank, config.lora_alpha, parse_targets(config.lora_targets),
                             server_class.lora_layer_class)
        resolved["lora"] = {"rank": lora_rank, "alpha": config.lora_alpha, "adapted_layers": adapted}
    model.to(device)
    data = FederatedData(dataset, split.train, split.test, device)
    server = server_class(config, hparams, model, data)
    torch.manual_seed(derive_seed(config.seed, "train"))  # dropout and friends during training
    run_dir = Path(config.out) / "runs" / run_name(config, hparams)
    return PreparedRun(config, server, split, dataset, run_dir, resolved)


def config_record(prepared: PreparedRun, plugins: tuple[str, ...] = ()) -> dict[str, Any]:
    server, config = prepared.server, prepared.config
    return {
        **run_identity(config, server.hparams),
        "out": config.out,
        "plugins": list(plugins),
        "resolved": {
            "eval_every": config.resolved_eval_every,
            "clients_per_round": config.sampled_per_round,
            "dataset_source": prepared.dataset.source,
            "dataset_size": len(prepared.dataset.labels),
            "input_shape": list(prepared.dataset.input_shape),
            "num_classes": prepared.dataset.num_classes,
            "model_parameters": sum(p.numel() for p in server.model.parameters()),
            "shared_parameters": sum(server.state[n].numel() for n in server.shared_names),
            "private_parameters": sum(server.state[n].numel() for n in server.private_names),
            **prepared.resolved,
            **server.run_info(),
        },
        "versions": {"pflbench": __version__, "python": platform.python_version(),
                     "torch": torch.__version__, "numpy": np.__version__},
        "git_commit": git_commit(),
        "command": sys.argv,
    }


def execute(prepared: PreparedRun, on_round: Callable[[dict[str, Any]], None] | None = None,
            plugins: tuple[str, ...] = ()) -> dict[str, Any]:
    """Run the rounds, writing every file of the run folder; returns the summary."""
    writer = RunWriter(prepared.run_dir)
    writer.write_config(config_record(prepared, plugins))
    writer.write_partition(prepared.partition.to_json())
    records: list[dict[str, Any]] = []

    def record_round(record: dict[str, Any]) -> None:
        records.append(record)
        writer.write_round(record)
        if on_round is not None:
            on_round(record)

    before: dict[str, Any] = {}
    if prepared.resolved["backbone"]["source"] != "random init":  # what fine-tuning starts from
        metrics, _ = prepared.server.evaluate()
        before = {"backbone_pers_acc": metrics["pers_acc"], "backbone_global_acc": metrics["global_acc"]}
    started = time.perf_counter()
    try:
        client_accuracy = prepared.server.run(record_round)
    finally:
        writer.close()
    config = prepared.config
    stats = prepared.partition.stats
    report, client_columns = prepared.server.final_report()
    writer.write_clients([
        {"client": k, "train_samples": stats["train_samples"][k], "test_samples": stats["test_samples"][k],
         "classes": stats["classes_per_client"][k], "pers_acc": float(client_accuracy[k]),
         **{column: values[k] for column, values in client_columns.items()}}
        for k in range(config.num_clients)])
    summary = {"algo": config.algo, "dataset": config.dataset, "alpha": config.alpha,
               "partition": config.partition, "seed": config.seed, "num_clients": config.num_clients,
               "model": config.model, **summarize(records), **before, **report,
               "wall_time_s": time.perf_counter() - started, "run_dir": str(prepared.run_dir)}
    writer.write_summary(summary)
    return summary


def run_experiment(config: RunConfig, algo_options: dict[str, Any] | None = None,
                   on_round: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    return execute(prepare(config, algo_options), on_round)
