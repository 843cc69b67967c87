"""Build a run from a RunConfig and execute it, as a straight pipeline of named stages:
resolve → validate → data → partition → initial weights → model → algorithm → executor; then the
federation's rounds with the result writer (and any other observers) watching."""
from __future__ import annotations

import dataclasses
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from . import __version__
from .config import (RunConfig, hyperparameters_from, identity_hash, resolve, run_identity,
                     run_name, validate, with_base_defaults)
from .data import FederatedData, TensorDataset, load_dataset
from .defaults import model_family
from .engine import EXECUTORS, Algorithm, Executor, Federation, Observer, RunObserver
from .engine.observers import RoundCallback
from .errors import ConfigError
from .metrics import summarize
from .models import build_model
from .partition import partition, partition_stats, split_train_test
from .partition_io import fit_num_clients, preset_partition
from .pretrain import initial_weights, load_initial_weights, public_split
from .registry import ALGORITHMS
from .results import RunWriter
from .seeding import derive_seed, rng_stream
from .trackers import check_trackers, make_trackers


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
    config = with_base_defaults(config)
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
    config: RunConfig  # resolved
    algorithm: Algorithm
    executor: Executor
    partition: Partition
    dataset: TensorDataset
    data: FederatedData
    run_dir: Path
    resolved: dict[str, Any]  # how the run was resolved (defaults filled, backbone, LoRA)

    @property
    def server(self) -> Algorithm:  # the name before the executor seam
        return self.algorithm

    @property
    def hparams(self) -> Any:  # what the trackers log as algo_hparams.*
        return self.algorithm.hparams


def check_model(config: RunConfig, algorithm_class: type[Algorithm], hparams: Any,
                dataset: TensorDataset) -> None:
    """Build and transform a throwaway model, so that bad model options, LoRA targets or ranks
    fail before any expensive stage (pretraining)."""
    with torch.random.fork_rng(devices=[]):
        model = build_model(config.model, dataset.input_shape, dataset.num_classes, **config.model_options())
        algorithm_class.configure_model(model, config, hparams)


def prepare(config: RunConfig, algo_options: dict[str, Any] | None = None,
            shared_defaults: dict[str, Any] | None = None) -> PreparedRun:
    """Resolve, validate and build everything; nothing is written yet.

    Unset settings (``None``) take the algorithm's run defaults (``Algorithm.run_defaults``), then
    ``shared_defaults`` (a sweep's), then ``config.BASE_DEFAULTS`` — identically for the CLI,
    sweeps and library calls."""
    algorithm_class = ALGORITHMS.get(config.algo)
    hparams = hyperparameters_from(algorithm_class.hyperparameters, dict(algo_options or {}), config.algo)
    config, applied = resolve(config, algorithm_class, hparams, shared_defaults)
    validate(config)
    algorithm_class.check_config(config, hparams)
    if config.executor not in EXECUTORS:
        raise ConfigError(f"--executor {config.executor!r} is not one of: {', '.join(EXECUTORS)}")
    lora_rank = algorithm_class.lora_rank(config, hparams)
    resolved: dict[str, Any] = {"run_defaults": applied, "defaults_family": model_family(config.model)}
    if config.log:
        check_trackers(config.log)  # an unknown tracker or a missing library fails before any work
    device = resolve_device(config.device)
    dataset = load_dataset(config.dataset, config.dataset_options())
    # a preset partition sets K; a --num-clients other than the default must agree with it
    explicit = {"num_clients"} if config.num_clients != RunConfig.num_clients else set()
    config = fit_num_clients(config, dataset, explicit)
    split = make_partition(config, dataset)
    if config.init_spec.pretrains(lora_rank is not None):
        check_model(config, algorithm_class, hparams, dataset)
    weights, backbone = initial_weights(config, dataset, split.public, device, lora_rank is not None)
    torch.manual_seed(derive_seed(config.seed, "init"))
    model = build_model(config.model, dataset.input_shape, dataset.num_classes,
                        pretrained=config.pretrained, **config.model_options())
    resolved["backbone"] = load_initial_weights(model, weights, backbone, config, split.public)
    resolved.update(algorithm_class.configure_model(model, config, hparams))
    model.to(device)
    data = FederatedData(dataset, split.train, split.test, device)
    algorithm = algorithm_class(config, hparams, model, data.num_train)
    executor = EXECUTORS[config.executor](model, data)
    run_dir = Path(config.out) / "runs" / run_name(config, algorithm_class, hparams)
    return PreparedRun(config, algorithm, executor, split, dataset, data, run_dir, resolved)


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
        "versions": {"pflbench": __version__, "python": platform.python_version(),
                     "torch": torch.__version__, "numpy": np.__version__},
        "git_commit": git_commit(),
        "command": sys.argv,
    }


class WriterObserver(Observer):
    """Writes config.json and partition.json at the start and one rounds.jsonl line per round."""

    def __init__(self, prepared: PreparedRun, plugins: tuple[str, ...]) -> None:
        self.prepared, self.plugins = prepared, plugins
        self.records: list[dict[str, Any]] = []
        self.writer = RunWriter(prepared.run_dir)

    def on_run_start(self, run: Any) -> None:
        self.writer.write_config(config_record(self.prepared, self.plugins))
        self.writer.write_partition(self.prepared.partition.to_json())

    def on_round_end(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        self.writer.write_round(record)


def execute(prepared: PreparedRun, on_round: Callable[[dict[str, Any]], None] | None = None,
            plugins: tuple[str, ...] = (), observers: Sequence[RunObserver] = ()) -> dict[str, Any]:
    """Run the rounds, writing every file of the run folder; returns the summary."""
    writer = WriterObserver(prepared, plugins)
    trackers = make_trackers(prepared.config.log, prepared, prepared.config.mlflow_uri)
    observers = [writer, *trackers, *observers, *([RoundCallback(on_round)] if on_round else [])]
    try:
        return _execute(prepared, writer, observers)
    except BaseException:
        for tracker in trackers:  # an MLflow run that stopped early is marked FAILED
            tracker.close(failed=True)
        raise


def _execute(prepared: PreparedRun, writer: WriterObserver, observers: list[Any]) -> dict[str, Any]:
    federation = Federation(prepared.algorithm, prepared.executor, prepared.data.num_test, observers)
    for observer in observers:
        observer.on_run_start(prepared)
    before: dict[str, Any] = {}
    if prepared.resolved["backbone"]["source"] != "random init":  # what fine-tuning starts from
        metrics, _ = federation.evaluate()
        before = {"backbone_pers_acc": metrics["pers_acc"], "backbone_global_acc": metrics["global_acc"]}
    started = time.perf_counter()
    try:
        client_accuracy = federation.run()
    finally:
        writer.writer.close()
    config = prepared.config
    stats = prepared.partition.stats
    report, client_columns = prepared.algorithm.final_report()
    writer.writer.write_clients([
        {"client": k, "train_samples": stats["train_samples"][k], "test_samples": stats["test_samples"][k],
         "classes": stats["classes_per_client"][k], "pers_acc": float(client_accuracy[k]),
         **{column: values[k] for column, values in client_columns.items()}}
        for k in range(config.num_clients)])
    summary = {"algo": config.algo, "dataset": config.dataset, "alpha": config.alpha,
               "partition": config.partition, "seed": config.seed, "num_clients": config.num_clients,
               "model": config.model, **summarize(writer.records), **before, **report,
               "wall_time_s": time.perf_counter() - started, "run_dir": str(prepared.run_dir)}
    if config.save_model:  # before summary.json: a finished run folder holds its models
        from .model_export import save_models
        save_models(prepared)
    writer.writer.write_summary(summary)
    for observer in observers:
        observer.on_run_end(summary)
    return summary


def run_experiment(config: RunConfig, algo_options: dict[str, Any] | None = None,
                   on_round: Callable[[dict[str, Any]], None] | None = None,
                   observers: Sequence[RunObserver] = ()) -> dict[str, Any]:
    """Library entry point: prepare (resolving unset settings as the CLI does) and execute."""
    return execute(prepare(config, algo_options), on_round, observers=observers)
