"""Build a run from a RunConfig, as a straight pipeline of named stages: resolve → validate →
data → partition → initial weights → model → algorithm → executor (``prepare``). Running it is
``runs.execute.execute``; ``runs.api.run_experiment`` does both."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from pflbench.config.defaults import model_family
from pflbench.config.run_config import RunConfig, hyperparameters_from, resolve, run_name, validate
from pflbench.data.dataset import FederatedData, TensorDataset, load_dataset
from pflbench.data.partition import fit_num_clients, make_partition
from pflbench.engine import EXECUTORS, Algorithm
from pflbench.engine.executor import make_executor
from pflbench.errors import ConfigError
from pflbench.models.pretrain import initial_weights, load_initial_weights
from pflbench.models.zoo import build_model
from pflbench.registry import ALGORITHMS
from pflbench.runs.prepared import PreparedRun
from pflbench.runs.trackers import check_trackers
from pflbench.util.seeding import derive_seed
from pflbench.util.threads import apply_threads


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


def check_model(config: RunConfig, algorithm_class: type[Algorithm], hparams: Any, dataset: TensorDataset) -> None:
    """Build and transform a throwaway model, so that bad model options, LoRA targets or ranks
    fail before any expensive stage (pretraining)."""
    with torch.random.fork_rng(devices=[]):
        model = build_model(config.model, dataset.input_shape, dataset.num_classes, **config.model_options())
        algorithm_class.configure_model(model, config, hparams)


def prepare(
    config: RunConfig,
    algo_options: dict[str, Any] | None = None,
    shared_defaults: dict[str, Any] | None = None,
    guard: Callable[[Path], None] | None = None,
) -> PreparedRun:
    """Resolve, validate and build everything; nothing is written yet.

    Unset settings (``None``) take the algorithm's run defaults (``Algorithm.run_defaults``), then
    ``shared_defaults`` (a sweep's), then ``config.BASE_DEFAULTS`` — identically for the CLI,
    sweeps and library calls. ``guard(run_dir)`` is called as soon as the run's folder is known,
    before the partition and any pretraining (e.g. ``rundir.guard_run``: refuse a finished run)."""
    algorithm_class = ALGORITHMS.get(config.algo)
    hparams = hyperparameters_from(algorithm_class.hyperparameters, dict(algo_options or {}), config.algo)
    config, applied = resolve(config, algorithm_class, hparams, shared_defaults)
    validate(config)
    algorithm_class.check_config(config, hparams)
    if config.finetune_epochs and not algorithm_class.has_global_model:
        raise ConfigError(
            f"--finetune-epochs fine-tunes the global model, and --algo {config.algo} has none; leave it at 0"
        )
    if config.executor not in EXECUTORS:
        raise ConfigError(f"--executor {config.executor!r} is not one of: {', '.join(EXECUTORS)}")
    getattr(EXECUTORS[config.executor], "check", lambda: None)()  # e.g. Ray installed
    lora_rank = algorithm_class.lora_rank(config, hparams)
    resolved: dict[str, Any] = {
        "run_defaults": applied,
        "defaults_family": model_family(config.model),
        "threads": apply_threads(config.threads),
    }
    if config.log:
        check_trackers(config.log)  # an unknown tracker or a missing library fails before any work
    device = resolve_device(config.device)
    dataset = load_dataset(config.dataset, config.dataset_options())
    # a preset partition sets K; a --num-clients other than the default must agree with it
    explicit = {"num_clients"} if config.num_clients != RunConfig.num_clients else set()
    config = fit_num_clients(config, dataset, explicit)
    run_dir = Path(config.out) / "runs" / run_name(config, algorithm_class, hparams)
    if guard is not None:
        guard(run_dir)
    split = make_partition(config.partition_spec, dataset)
    if config.init_spec.pretrains(lora_rank is not None):
        check_model(config, algorithm_class, hparams, dataset)
    weights, backbone = initial_weights(config, dataset, split.public, device, lora_rank is not None)
    torch.manual_seed(derive_seed(config.seed, "init"))
    model = build_model(
        config.model, dataset.input_shape, dataset.num_classes, pretrained=config.pretrained, **config.model_options()
    )
    resolved["backbone"] = load_initial_weights(model, weights, backbone, config, split.public)
    resolved.update(algorithm_class.configure_model(model, config, hparams))
    model.to(device)
    data = FederatedData(dataset, split.train, split.test, device)
    algorithm = algorithm_class(config, hparams, model, data.num_train)
    executor = make_executor(config.executor, model, data, config)
    check = getattr(executor, "check_algorithm", None)
    if check is not None:  # an executor refuses what it cannot host now, not mid-run
        check(algorithm)
    return PreparedRun(config, algorithm, executor, split, dataset, data, run_dir, resolved)
