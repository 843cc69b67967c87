"""The one pipeline from a RunConfig to a built run, used by ``run``, ``sweep`` and the library:
``plan_run`` (resolve → validate: no data needed), then ``prepare`` (data → number of clients →
partition → initial weights → model → algorithm → executor). A sweep checks its whole grid first
with ``preflight`` (data, partitions and models built once each, no training). Running a built
run is ``runs.execute.execute``; ``runs.api.run_experiment`` does both."""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pflbench.config import lora
from pflbench.config.defaults import model_family
from pflbench.config.identity import partition_identity
from pflbench.config.run_config import RunConfig, check_run, hyperparameters_from, resolve, validate
from pflbench.config.settings import DataFacts, RunFacts, UploadFacts
from pflbench.data.dataset import FederatedData, TensorDataset, load_dataset
from pflbench.data.partition import fit_num_clients, make_partition
from pflbench.engine import EXECUTORS, Algorithm
from pflbench.engine.attacks import choose_attackers, poison_data
from pflbench.engine.capabilities import algorithm_facts
from pflbench.engine.executor import check_executor, make_executor
from pflbench.engine.privacy import opacus_accountant
from pflbench.engine.vmap import unsupported_reason
from pflbench.errors import ConfigError
from pflbench.models.pretrain import initial_weights, load_initial_weights
from pflbench.models.zoo import build_model, check_model_name
from pflbench.registry import ALGORITHMS
from pflbench.runs.prepared import PreparedRun, RunIdentity
from pflbench.runs.trackers import check_trackers
from pflbench.store.layout import run_folder
from pflbench.util import progress
from pflbench.util.precision import check_precision
from pflbench.util.seeding import derive_seed
from pflbench.util.threads import apply_threads, resolved_threads


def resolve_device(name: str) -> torch.device:
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise ConfigError(f"--device {name!r} is not a torch device (cpu, cuda, cuda:1, ...)") from error
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {name!r}: CUDA is not available on this machine; use --device cpu")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"--device {name!r}: MPS (Apple GPU) is not available on this machine; use --device cpu")
    if device.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"--device {name!r} is not supported; use cpu or cuda")
    return device


def check_model(config: RunConfig, algorithm_class: type[Algorithm], hparams: Any, dataset: TensorDataset) -> None:
    """Build and transform a throwaway model, so that bad model options, LoRA targets or ranks
    fail before any expensive stage (pretraining)."""
    with torch.random.fork_rng(devices=[]):
        model = build_model(config.model, dataset.input_shape, dataset.num_classes, **config.model_options())
        algorithm_class.configure_model(model, config, hparams)


@dataclass(frozen=True)
class RunPlan:
    """A run resolved and validated against everything that needs no data: what ``prepare``
    builds. ``config`` has every unset setting filled (``applied``: the values filled in).

    Planned once per run and passed along (a sweep's cell is planned when the grid is expanded;
    its preflight and its preparation take that plan); ``identity`` is computed once, on the
    fitted plan (``fitted``: the number of clients is part of it)."""

    config: RunConfig
    algorithm_class: type[Algorithm]
    hparams: Any
    applied: dict[str, Any]

    @property
    def uses_lora(self) -> bool:
        return lora.is_lora_run(self.algorithm_class, self.config, self.hparams)

    @functools.cached_property
    def identity(self) -> RunIdentity:
        """The run's identity (``num_clients`` fitted first: K is part of it), computed once."""
        return RunIdentity.of(self.config, self.algorithm_class, self.hparams)

    @property
    def run_dir(self) -> Path:
        """The run's folder (``num_clients`` fitted first: K is part of the name's hash)."""
        return run_folder(self.config.out, self.identity.name)

    def fitted(self, dataset: TensorDataset | Callable[[], TensorDataset]) -> RunPlan:
        """This plan with the number of clients set by the one rule (``data.partition.fit_num_clients``),
        checked against what needs K now that it is known (``check_run``: planning checked it when K
        was given); this very plan (its identity kept) when it was fitted already."""
        config = fit_num_clients(self.config, dataset)
        if config == self.config:
            return self
        check_run(config, RunFacts(clients=config.client_counts))
        return dataclasses.replace(self, config=config)


def data_facts(name: str, dataset: TensorDataset) -> DataFacts:
    return DataFacts(name, dataset.is_image, tuple(dataset.input_shape), dataset.num_classes)


def upload_facts(algorithm: Algorithm) -> UploadFacts:
    """What the built ``algorithm`` uploads: anything at all, the untrained buffers among it
    (BatchNorm's running statistics) and its model's BatchNorm layers (no per-sample gradients)."""
    shared, trainable = algorithm.layout.shared, set(algorithm.layout.trainable)
    norms = (n for n, m in algorithm.model.named_modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm))
    return UploadFacts(bool(shared), tuple(n for n in shared if n not in trainable), tuple(norms))


def plan_run(
    config: RunConfig,
    algo_options: dict[str, Any] | None = None,
    shared_defaults: dict[str, Any] | None = None,
) -> RunPlan:
    """Resolve and validate (stage 1 of every run: ``run``, each cell of a ``sweep``, library calls).

    Unset settings (``None``) take the algorithm's run defaults (``Algorithm.run_defaults``), then
    ``shared_defaults`` (a sweep's), then the model family's, then ``config.BASE_DEFAULTS``. Every
    check that needs no data happens here, so a bad value fails before anything is loaded."""
    algorithm_class = ALGORITHMS.get(config.algo)
    hparams = hyperparameters_from(algorithm_class.hyperparameters, dict(algo_options or {}), config.algo)
    config, applied = resolve(config, algorithm_class, hparams, shared_defaults)
    can_serve = algorithm_facts(algorithm_class)  # its declared capabilities, read once
    validate(config)  # each setting group its values; then what this algorithm and, when K is given
    # (else once it is fitted: ``RunPlan.fitted``), the clients can serve: --dp, --attack, ...
    check_run(config, RunFacts(algorithm=can_serve, clients=config.client_counts))
    # --threads 0 becomes the count it means here: recorded, it is what shaped the numbers and
    # what ``rerun`` uses on another machine (the count is part of the identity on the CPU)
    config = dataclasses.replace(config, threads=resolved_threads(config.threads))
    algorithm_class.check_config(config, hparams)
    check_model_name(str(config.model))  # before any data is prepared (a typo costs no download)
    if config.privacy_spec is not None:
        opacus_accountant()  # --dp's accountant: Opacus installed
    if config.executor not in EXECUTORS:
        raise ConfigError(f"--executor {config.executor!r} is not one of: {', '.join(EXECUTORS)}")
    check_executor(config.executor)  # e.g. Ray installed
    if config.log:
        check_trackers(config.log)  # an unknown tracker or a missing library fails before any work
    check_precision(config.precision, resolve_device(config.device))  # bf16 on a device without it: refused
    return RunPlan(config, algorithm_class, hparams, applied)


def preflight(plans: list[RunPlan]) -> None:
    """A sweep's cheap check before any run starts: each distinct dataset, partition and
    (configured) model of ``plans`` is built once, without training, so a bad dataset or model
    option or an impossible partition refuses the whole grid before any folder is created."""
    datasets: dict[str, TensorDataset] = {}
    seen: set[str] = set()
    for plan in plans:
        config = plan.config
        data_key = _key(config.dataset, config.dataset_options())
        if data_key not in datasets:
            datasets[data_key] = load_dataset(config.dataset, config.dataset_options())
        dataset = datasets[data_key]
        plan = plan.fitted(dataset)
        config = plan.config
        partition_key = _key(data_key, partition_identity(config.partition_spec), config.seed)
        if partition_key not in seen:
            seen.add(partition_key)
            make_partition(config.partition_spec, dataset)
        identity = plan.identity.settings
        model_parts = ("algo", "model", "model_options", "head_layers", "algo_hparams")
        model_key = _key(data_key, {k: v for k, v in identity.items() if k in model_parts or k.startswith("lora")})
        if model_key not in seen:
            seen.add(model_key)
            check_model(config, plan.algorithm_class, plan.hparams, dataset)


def _key(*parts: Any) -> str:
    return json.dumps(parts, sort_keys=True, default=str)


def prepare(
    config: RunConfig | RunPlan,
    algo_options: dict[str, Any] | None = None,
    shared_defaults: dict[str, Any] | None = None,
    guard: Callable[[Path], None] | None = None,
) -> PreparedRun:
    """Plan (``plan_run``, unless a plan is given) and build everything; nothing is written yet.

    ``guard(run_dir)`` is called as soon as the run's folder is known, before the partition and
    any pretraining (e.g. ``store.layout.guard_run``: refuse a finished run)."""
    plan = config if isinstance(config, RunPlan) else plan_run(config, algo_options, shared_defaults)
    resolved: dict[str, Any] = {
        "run_defaults": plan.applied,
        "defaults_family": model_family(plan.config.model),
        "threads": apply_threads(plan.config.threads),
    }
    device = resolve_device(plan.config.device)
    dataset = load_dataset(plan.config.dataset, plan.config.dataset_options())
    plan = plan.fitted(dataset)
    config, algorithm_class, hparams, uses_lora = plan.config, plan.algorithm_class, plan.hparams, plan.uses_lora
    run_dir = plan.run_dir
    if guard is not None:
        guard(run_dir)
    check_run(config, RunFacts(data=data_facts(config.dataset, dataset)))  # e.g. --attack backdoor: images
    split = make_partition(config.partition_spec, dataset)
    training_clients = [k for k in range(len(split.train)) if k not in set(split.new_clients)]
    attack = config.attack_spec
    if config.init_spec.pretrains(uses_lora):
        check_model(config, algorithm_class, hparams, dataset)
    weights = initial_weights(config, dataset, split.public, device, uses_lora)
    torch.manual_seed(derive_seed(config.seed, "init"))
    model = build_model(
        config.model, dataset.input_shape, dataset.num_classes, pretrained=config.pretrained, **config.model_options()
    )
    resolved["backbone"] = load_initial_weights(model, weights, config, split.public)
    resolved.update(algorithm_class.configure_model(model, config, hparams))
    model.to(device)
    dataset = split.shifted(dataset)  # --feature-shift: each client's samples in its domain, once, here
    backdoor = None
    if attack is not None:  # --attack: the attackers (recorded) and their poisoned train data, once, here
        attackers = choose_attackers(config.seed, training_clients, attack.fraction)
        resolved["attackers"] = attackers
        dataset, backdoor = poison_data(
            dataset, split.train, split.test, training_clients, attackers, attack, config.seed
        )
    data = FederatedData(dataset, split.train, split.test, device, split.val, split.ood, backdoor)
    algorithm = algorithm_class(config, hparams, model, data.num_train)
    check_run(config, RunFacts(upload=upload_facts(algorithm)))  # --dp: no BatchNorm; Local: nothing to aggregate
    algorithm.client_domains = split.domain_labels  # partition.json's client_domains (IFCA scores its clusters)
    executor = make_executor(config.executor_spec, model, data)
    executor.check_algorithm(algorithm)  # an executor refuses what it cannot host now, not mid-run
    tip = vmap_tip(config, algorithm, model, device)
    if tip is not None:
        progress.note(tip)
    return PreparedRun(config, algorithm, executor, split, dataset, data, run_dir, resolved, plan.identity)


def vmap_tip(config: RunConfig, algorithm: Algorithm, model: torch.nn.Module, device: torch.device) -> str | None:
    """One line for a run on a GPU, one client after another, that ``--executor vmap`` could host:
    there one client's small batches leave the device idle, and batching the clients pays
    (measured on an H200: the headline job's round 5.9× faster). Not a silent switch: vmap's
    numbers match sequential's only to rounding, so it is a different run (folder)."""
    if device.type != "cuda" or config.executor != "sequential" or config.sampled_per_round < 2:
        return None
    if unsupported_reason(algorithm, model) is not None:
        return None
    return (
        f"tip: --executor vmap trains the {config.sampled_per_round} clients of a round together on the GPU "
        "(the headline job: a round 5.9x faster on an H200); the same numbers to rounding, in a run folder of its own"
    )
