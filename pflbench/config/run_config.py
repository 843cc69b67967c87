"""Run configuration: one flat frozen dataclass (the namespace of the command line, config files
and sweep axes) with grouped views, one per stage that reads a group: ``partition_spec``,
``init_spec``, ``local_spec``, ``federation_spec``, ``executor_spec``.

Settings that depend on the algorithm (model, public fraction, optimizer, lr, gradient clipping)
default to ``None`` = unset; ``resolve`` fills them once, the same way for ``run``, ``sweep`` and
library calls. ``run_identity`` hashes exactly the settings a resolved run reads.

Each field carries its help text in ``metadata``; the CLI's options and the saved
``config.json`` are generated from the dataclasses (this one and each algorithm's own).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import Any

from pflbench.config.defaults import AUTO_FIELDS, BASE_DEFAULTS, family_defaults
from pflbench.config.groups import (
    AttackSpec,
    AvailabilitySpec,
    ExecutorSpec,
    FederationSpec,
    InitSpec,
    LocalSpec,
    PartitionSpec,
    PrivacySpec,
    RobustSpec,
)
from pflbench.errors import ConfigError

MAX_THREADS = 1024  # torch's thread pool crashes far above any machine's cores (100000: a segfault)
# Settings added after runs were recorded whose default changes the numbers: the value that
# reproduces a run whose config.json predates them (a rerun fills a missing setting with it).
VALUE_BEFORE_ADDED: dict[str, Any] = {"val_frac": 0.0}
QUANTITY_SKEWS = ("none", "powerlaw", "lognormal", "dirichlet")  # --sizes (data.quantity)
AVAILABILITY_TRACES = ("always", "bernoulli", "cyclic")  # --availability (engine.availability)
STRAGGLER_MODELS = ("none", "lognormal")  # --straggler-model
DEADLINE_POLICIES = ("drop", "partial")  # --deadline-policy
DP_MODES = ("off", "client", "sample")  # --dp (engine.privacy)
ATTACKS = ("none", "label-flip", "sign-flip", "scale", "gaussian", "backdoor")  # --attack (engine.attacks)
MODEL_POISONING = ("sign-flip", "scale", "gaussian")  # attacks on the uploads (the rest poison the data)
ROBUST_AGGREGATORS = ("none", "median", "trimmed-mean", "krum", "multi-krum", "norm-bound")  # engine.robust
FEATURE_SHIFTS = ("rotate", "contrast", "color", "noise", "blur", "invert")  # --feature-shift (data.feature_shift)
PRECISIONS = ("fp32", "bf16")  # --precision (util.precision)


def option(default: Any, help: str, **metadata: Any) -> Any:
    """A dataclass field with a default and the help text the CLI shows."""
    if isinstance(default, (list, dict)):
        raise TypeError("use a tuple for sequence defaults")
    return field(default=default, metadata={"help": help, **metadata})


@dataclass(frozen=True)
class RunConfig:
    """Everything that determines a run's numbers (plus where to write them)."""

    algo: str = option("fedavg", "Algorithm (see `pflbench list algorithms`).")
    dataset: str = option("digits", "Dataset (see `pflbench list datasets`).")
    dataset_option: tuple[str, ...] = option(
        (), "Dataset option KEY=VALUE, repeatable (e.g. num_samples=2000 for synthetic)."
    )
    data_dir: str | None = option(None, "Local copy of a hub dataset, or a path for local data.")
    partition: str = option("dirichlet", "Partitioner (see `pflbench list partitioners`).")
    alpha: float = option(0.5, "Dirichlet concentration: 0.1 strong skew, 1 mild, 100 ≈ IID.")
    shards_per_client: int = option(2, "Shards per client for --partition shards.")
    min_size: int = option(10, "Minimum samples per client (dirichlet redraws until met).")
    dirichlet_cut: str = option(
        "unbiased",
        "How dirichlet turns class proportions into counts: unbiased = largest-remainder "
        "rounding, no client favoured; floor = PFLlib's cumsum cut (the last client gets every "
        "class's rounding leftovers); flower = the floor cut with flwr-datasets' self-balancing "
        "rule.",
        choices=("unbiased", "floor", "flower"),
    )
    sizes: str = option(
        "none",
        "Quantity skew: client sizes drawn from a size distribution (data.quantity) instead of "
        "as the partitioner makes them: powerlaw (n_k ∝ rank^-β, ranks shuffled), lognormal "
        "(weights e^{σ·z}), dirichlet (weights ~ Dir(β·1_K)), with the parameter --size-param; "
        "each client gets at least --min-size. Read by iid (quantity skew only) and "
        "dirichlet-client (with label skew). none = off.",
        choices=QUANTITY_SKEWS,
    )
    size_param: float = option(
        1.0,
        "Parameter of --sizes: β of powerlaw (≥ 0, larger: more skew), σ of lognormal (≥ 0, larger: "
        "more skew), β of dirichlet (> 0, smaller: more skew).",
    )
    feature_shift: str = option(
        "",
        "Feature shift: comma-separated transforms (rotate, contrast, color, noise, blur, invert) "
        "applied once at load to each client's samples, at its domain's strength "
        "(data.feature_shift; seeded, recorded in partition.json as client_domains). Image "
        "datasets only; empty = off.",
    )
    shift_groups: int = option(
        0, "Domains of --feature-shift: client k is in domain k mod G; 0 = one domain per client."
    )
    holdout_domain: str | None = option(
        None,
        "Domain kept out of training by --partition domain / domain-dirichlet (e.g. sketch for "
        "pacs): no client holds it, and its samples give the out-of-domain accuracy ood_acc.",
    )
    partition_file: str | None = option(
        None,
        "Use exactly this partition (a `pflbench partition --export` JSON or a run's "
        "partition.json); it sets --num-clients. flwr:<Partitioner>[:key=value,...] runs a "
        "flwr-datasets partitioner instead (pip install 'pflbench[flwr]').",
    )
    test_frac: float = option(0.25, "Fraction of each client's samples held out for its test split.")
    val_frac: float = option(
        0.1,
        "Fraction of each client's samples carved out of its training part as its validation split "
        "(stratified by label; the test split is unchanged): val_* metrics, for tuning on validation, "
        "never on test. 0 = none.",
    )
    num_clients: int | None = option(
        None,
        "Number of clients K [default: a partition file's K, else 20; given with a partition file, it must agree].",
    )
    frac: float = option(1.0, "Fraction of the training clients sampled per round, M = max(1, round(K_train·frac)).")
    new_clients: float = option(
        0.0,
        "Fraction of the K clients held out of training entirely (new, unseen clients; a seeded "
        "choice, at least 1 when > 0): never sampled, served after training by the algorithm's "
        "adaptation and reported as new_acc at every evaluation. 0 = none.",
    )
    rounds: int = option(50, "Communication rounds.")
    dropout: float = option(
        0.0,
        "Client dropout: the probability that a sampled client fails to report in a round (it "
        "received the model, sends nothing, its state does not change; seeded per round). 0 = off.",
    )
    availability: str = option(
        "always",
        "Which clients are online to be sampled each round: always; bernoulli (client k with its "
        "own probability, drawn once uniformly around --availability-rate); cyclic (a diurnal trace: "
        "online a share --availability-rate of every --availability-period rounds, at its own phase).",
        choices=AVAILABILITY_TRACES,
    )
    availability_rate: float = option(
        0.5, "Mean share of rounds a client is online (--availability bernoulli, cyclic)."
    )
    availability_period: int = option(24, "Rounds in one cycle of --availability cyclic (a simulated day).")
    straggler_model: str = option(
        "none",
        "System model of client speeds, drawn once per run: none (every device the median one) or "
        "lognormal (compute time and bandwidth factors e^(σ·z), σ = --straggler-sigma). Simulated "
        "client time = samples · --sample-time · compute factor + bytes / (--bandwidth · bandwidth factor).",
        choices=STRAGGLER_MODELS,
    )
    straggler_sigma: float = option(1.0, "σ of --straggler-model lognormal (0 = everyone the median device).")
    sample_time: float = option(
        0.01, "Simulated seconds one training sample takes on the median device (simulated time only)."
    )
    bandwidth: float = option(1.0, "Simulated network bandwidth of the median client, MB/s (2^20 bytes).")
    deadline: float | None = option(
        None,
        "Round deadline in simulated seconds: clients that would report later are dropped, or with "
        "--deadline-policy partial do the local steps that fit (FedProx's variable local work). Unset = none.",
    )
    deadline_policy: str = option(
        "drop", "What --deadline does to a late client: drop it, or partial work.", choices=DEADLINE_POLICIES
    )
    over_select: float = option(
        0.0,
        "Over-selection: sample ceil(M·(1 + FRAC)) clients and keep the first M to report "
        "(by simulated time). 0 = off.",
    )
    dp: str = option(
        "off",
        "Differential privacy (engine.privacy): client = DP-FedAvg (each client's model update "
        "clipped to --dp-clip, Gaussian noise on the server's mean; McMahan et al. 2018); sample = "
        "DP-SGD on the clients (per-sample gradients clipped to --dp-clip, noised; Abadi et al. "
        "2016). ε at --dp-delta per round and in the summary (pip install 'pflbench[dp]'). off = none.",
        choices=DP_MODES,
    )
    dp_clip: float = option(1.0, "Clip norm C of --dp: of each client update (client) or per-sample gradient (sample).")
    dp_noise: float = option(
        1.0, "Noise multiplier z of --dp: Gaussian noise of std z·C (on the sum; client: z·C/m on the mean of m)."
    )
    dp_delta: float = option(1e-5, "δ at which --dp reports ε (dp_epsilon).")
    dp_adaptive_quantile: float = option(
        0.0,
        "--dp client adaptive clipping (Andrew et al. 2021): the clip norm follows this quantile γ "
        "of the update norms, starting at --dp-clip. 0 = fixed clipping.",
    )
    dp_clip_lr: float = option(0.2, "Learning rate η_C of --dp-adaptive-quantile's geometric clip update.")
    dp_count_noise: float = option(
        0.0, "Noise σ_b of --dp-adaptive-quantile's clipped count; 0 = m/20 (the paper's choice)."
    )
    attack: str = option(
        "none",
        "Malicious clients (engine.attacks; a fraction --attackers of the training clients, a seeded "
        "choice fixed for the run): label-flip (their train labels y → C−1−y), sign-flip (they upload "
        "received − Δ), scale (received + λ·Δ), gaussian (received + N(0, λ²) per entry; λ = "
        "--attack-scale), backdoor (a 3×3 white patch in the bottom-right corner and label "
        "--backdoor-target on a share --backdoor-frac of their train images; asr measured). none = off.",
        choices=ATTACKS,
    )
    attackers: float = option(0.0, "Fraction of the training clients that are malicious (--attack), in [0, 1).")
    attack_scale: float = option(
        10.0, "λ of --attack scale (Δ → λ·Δ) and the std of --attack gaussian (Δ ~ N(0, λ²) per entry)."
    )
    backdoor_target: int = option(0, "The label --attack backdoor teaches for the trigger.")
    backdoor_frac: float = option(
        0.5, "Share of each attacker's train samples that --attack backdoor poisons, in (0, 1]."
    )
    robust_agg: str = option(
        "none",
        "Robust aggregation of the model updates (engine.robust), for algorithms whose aggregation is "
        "FedAvg's average: median (coordinate-wise), trimmed-mean (--trim-frac per side), krum / "
        "multi-krum (--krum-f, --krum-select), norm-bound (each update clipped to --norm-bound, then "
        "averaged). none = the algorithm's own rule.",
        choices=ROBUST_AGGREGATORS,
    )
    trim_frac: float = option(0.1, "β of --robust-agg trimmed-mean: the fraction trimmed on each side, in [0, 0.5).")
    krum_f: int = option(1, "f of --robust-agg krum / multi-krum: the Byzantine clients tolerated (needs M > 2f + 2).")
    krum_select: int = option(0, "Updates --robust-agg multi-krum averages; 0 = m − f (m: the reports of the round).")
    norm_bound: float = option(1.0, "M of --robust-agg norm-bound: each model update is clipped to norm M.")
    local_epochs: int = option(1, "Local epochs per round.")
    batch_size: int = option(32, "Local minibatch size.")
    lr: float | None = option(
        None, "Local learning rate [default: 0.1 for the zoo's mlp/cnn/lenet/cnn_bn, else 0.01; LoRA runs 1e-3]."
    )
    optimizer: str | None = option(None, "Local optimizer [default: sgd; LoRA runs adam].", choices=("sgd", "adam"))
    momentum: float = option(0.0, "SGD momentum (optimizer state is fresh each round).")
    weight_decay: float = option(0.0, "Weight decay of the local optimizer.")
    max_grad_norm: float | None = option(
        None, "Clip each local step's gradient to this norm; 0 = no clipping [default: 0; fedsdg 1.0]."
    )
    model: str | None = option(
        None,
        "Model: a zoo name (`pflbench list models`) or a timm model "
        "name [default: cnn; LoRA runs a 6-block ViT, see config.lora.RUN_DEFAULTS].",
    )
    head_layers: int = option(1, "Layers (from the output) that form the private head.")
    model_option: tuple[str, ...] = option(
        (), "Model option KEY=VALUE, repeatable (ViTs: depth=6, embed_dim=192, num_heads=3, patch_size=2)."
    )
    pretrained: bool = option(False, "Start from timm's hub weights (network or a filled HF cache).")
    weights: str | None = option(None, "Start from a local state dict file (a head of another shape is skipped).")
    public_frac: float | None = option(
        None,
        "Fraction of the pooled data held out as public, given "
        "to no client (pretrains the backbone; keep it equal across "
        "compared runs) [default: 0; LoRA runs 0.2].",
    )
    backbone: str = option(
        "auto",
        "Initial weights: auto = --weights/--pretrained if given, else LoRA runs pretrain on the "
        "public fraction and other runs start at random; public = pretrain on the public fraction "
        "(cached); random = random init.",
        choices=("auto", "public", "random"),
    )
    pretrain_epochs: int = option(60, "Epochs of central pretraining on the public fraction.")
    pretrain_lr: float = option(1e-3, "AdamW learning rate of the public pretraining.")
    lora_rank: int | None = option(
        None, "LoRA rank r: freeze the backbone and train LoRA on --lora-targets plus the head (any algorithm)."
    )
    lora_alpha: float = option(16.0, "LoRA α; the low-rank update is scaled by α/r.")
    lora_targets: str = option(
        "attn.proj,mlp.fc2", "Comma-separated name suffixes of the linear layers LoRA adapts (e.g. qkv,proj,fc1,fc2)."
    )
    seed: int = option(0, "Seed of the partition, client sampling, init and local training.")
    eval_every: int | None = option(
        None,
        "Evaluate every N rounds [default: 1 up to 100 rounds, else rounds/100]; the last round is always evaluated.",
    )
    finetune_epochs: int = option(
        0,
        "Evaluation protocol (FedAvg-FT): after the last round, fine-tune the global model for E "
        "epochs on each client's train split (the local optimizer settings) and report it as "
        "pers_acc_ft; 0 = off. Only for algorithms with a global model.",
    )
    device: str = option("cpu", "Torch device: cpu, cuda, cuda:1, ...")
    precision: str = option(
        "fp32",
        "Arithmetic of the model's forward passes and losses (local training, evaluation, "
        "pretraining): fp32, or bf16 autocast (parameters, gradients and optimizer state stay "
        "fp32; faster on GPUs with bf16 units; a device without bf16 is refused). bf16 is part "
        "of the run identity.",
        choices=PRECISIONS,
    )
    executor: str = option(
        "sequential",
        "How clients train: sequential (one after another); vmap "
        "(together, vectorized with torch.func; same numbers to floating-point "
        "tolerance); ray (on Ray actors in parallel, same numbers).",
        choices=("sequential", "vmap", "ray"),
    )
    ray_address: str | None = option(None, "Ray cluster to join (auto or HOST:PORT); unset: a local Ray instance.")
    ray_workers: int | None = option(None, "Ray actors training clients [default: cluster CPUs, ≤ clients/round].")
    threads: int = option(
        1,
        "CPU threads of torch's operations; 0 = every usable core. 1 suits the "
        "small models of FL benchmarks and never collapses on a busy or shared machine "
        "(many threads spin-wait on each other there). On the CPU the count changes the "
        "numbers in the last bits, so a count other than 1 is part of the run identity.",
    )
    out: str = option("results", "Output folder; the run goes to OUT/runs/<name>/.")
    portable: bool = option(
        False,
        "Share-safe results: config.json and summary.json name no local absolute path (each becomes "
        "<local>/NAME). Not part of the run identity.",
    )
    checkpoint_every: int = option(10, "Checkpoint every N rounds (run --resume; sweeps resume); 0 = never.")
    save_model: bool = option(
        False,
        "After the last round, write the global model and each client's "
        "private state to RUN_DIR/models/ (safetensors; LoRA runs also a peft adapter).",
    )
    log: tuple[str, ...] = option(
        (),
        "Experiment tracker(s): tensorboard, mlflow, wandb (offline unless WANDB_MODE=online) or a "
        "plugin's (comma-separated or repeatable; pip install 'pflbench[tensorboard]' / '[mlflow]' "
        "/ '[wandb]'; `pflbench list trackers`).",
    )
    mlflow_uri: str | None = option(None, "MLflow tracking URI for --log mlflow [default: sqlite:///OUT/mlflow.db].")

    @property
    def num_training_clients(self) -> int:
        """K_train: the clients that take part in training (K less the new clients)."""
        num_clients = _resolved(self.num_clients, "num_clients")
        return num_clients - new_client_count(num_clients, self.new_clients)

    @property
    def sampled_per_round(self) -> int:
        return max(1, round(self.num_training_clients * self.frac))

    @property
    def resolved_eval_every(self) -> int:
        if self.eval_every is not None:
            return self.eval_every
        return 1 if self.rounds <= 100 else math.ceil(self.rounds / 100)

    def dataset_options(self) -> dict[str, Any]:
        options = _key_values(self.dataset_option, "--dataset-option")
        if self.data_dir is not None:
            options["data_dir"] = self.data_dir
        return options

    def model_options(self) -> dict[str, Any]:
        return _key_values(self.model_option, "--model-option")

    # ---- the groups each stage receives ---------------------------------------------------
    @property
    def partition_spec(self) -> PartitionSpec:
        return PartitionSpec(
            self.dataset,
            self.partition,
            self.num_clients,
            self.alpha,
            self.shards_per_client,
            self.min_size,
            self.test_frac,
            _resolved(self.public_frac, "public_frac"),
            self.seed,
            self.dirichlet_cut,
            self.partition_file,
            self.val_frac,
            self.new_clients,
            self.sizes,
            self.size_param,
            self.feature_shift,
            self.shift_groups,
            holdout_domain=self.holdout_domain,
        )

    @property
    def init_spec(self) -> InitSpec:
        return InitSpec(self.pretrained, self.weights, self.backbone, self.pretrain_epochs, self.pretrain_lr)

    @property
    def federation_spec(self) -> FederationSpec:
        return FederationSpec(
            _resolved(self.num_clients, "num_clients"),
            self.sampled_per_round,
            self.rounds,
            self.resolved_eval_every,
            self.seed,
            self.finetune_epochs,
            self.local_spec,
            self.availability_spec,
            self.privacy_spec,
            self.attack_spec,
            self.robust_spec,
        )

    @property
    def attack_spec(self) -> AttackSpec | None:
        if self.attack == "none":
            return None
        return AttackSpec(self.attack, self.attackers, self.attack_scale, self.backdoor_target, self.backdoor_frac)

    @property
    def robust_spec(self) -> RobustSpec | None:
        if self.robust_agg == "none":
            return None
        return RobustSpec(self.robust_agg, self.trim_frac, self.krum_f, self.krum_select, self.norm_bound)

    @property
    def privacy_spec(self) -> PrivacySpec | None:
        if self.dp == "off":
            return None
        return PrivacySpec(
            self.dp,
            self.dp_clip,
            self.dp_noise,
            self.dp_delta,
            self.dp_adaptive_quantile,
            self.dp_clip_lr,
            self.dp_count_noise,
        )

    @property
    def availability_spec(self) -> AvailabilitySpec:
        return AvailabilitySpec(
            self.dropout,
            self.availability,
            self.availability_rate,
            self.availability_period,
            self.straggler_model,
            self.straggler_sigma,
            self.sample_time,
            self.bandwidth,
            self.deadline,
            self.deadline_policy,
            self.over_select,
        )

    @property
    def executor_spec(self) -> ExecutorSpec:
        return ExecutorSpec(self.executor, self.device, self.sampled_per_round, self.ray_address, self.ray_workers)

    @property
    def local_spec(self) -> LocalSpec:
        return LocalSpec(
            self.local_epochs,
            self.batch_size,
            _resolved(self.lr, "lr"),
            _resolved(self.optimizer, "optimizer"),
            self.momentum,
            self.weight_decay,
            _resolved(self.max_grad_norm, "max_grad_norm"),
            self.precision,
        )


def new_client_count(num_clients: int, fraction: float) -> int:
    """How many of ``num_clients`` clients ``--new-clients fraction`` holds out of training:
    floor(fraction·K + 0.5), at least 1 when fraction > 0; ConfigError when none would train."""
    check_new_clients_fraction(fraction)
    if fraction == 0:
        return 0
    count = max(1, math.floor(fraction * num_clients + 0.5))
    if count >= num_clients:
        fix = (
            "it needs at least 2 clients"
            if num_clients < 2
            else f"use a fraction below {(num_clients - 0.5) / num_clients:.3g} or more clients"
        )
        raise ConfigError(
            f"--new-clients {fraction:g} holds out {count} of {num_clients} clients, leaving none to train; {fix}"
        )
    return count


def check_new_clients_fraction(fraction: float) -> None:
    if not (math.isfinite(fraction) and 0 <= fraction < 1):
        raise ConfigError(f"--new-clients must be a fraction in [0, 1) (0 = none), got {fraction}")


def with_base_defaults(config: RunConfig) -> RunConfig:
    """``config`` with its unset settings at ``BASE_DEFAULTS`` (stages used without an algorithm:
    ``pflbench partition``, ``pflbench pretrain``, ``make_partition``)."""
    unset = {k: v for k, v in BASE_DEFAULTS.items() if getattr(config, k) is None}
    return dataclasses.replace(config, **unset) if unset else config


def _resolved(value: Any, name: str) -> Any:
    if value is None:
        raise RuntimeError(f"{name} is unset: resolve the config first (config.resolve)")
    return value


def resolve(
    config: RunConfig, algorithm: Any, hparams: Any, shared_defaults: dict[str, Any] | None = None
) -> tuple[RunConfig, dict[str, Any]]:
    """Fill the unset (None) settings: the algorithm's ``run_defaults`` first, then
    ``shared_defaults`` (a sweep gives every run of a LoRA grid the same model and data), then
    the defaults of the model's family (``defaults.DEFAULTS_BY_FAMILY``), then ``BASE_DEFAULTS``. Returns the resolved config and the values filled in. The same function
    serves ``run``, ``sweep`` and library calls."""
    chosen = {**(shared_defaults or {}), **algorithm.run_defaults(config, hparams)}
    model = config.model if config.model is not None else chosen.get("model", BASE_DEFAULTS["model"])
    defaults = {**BASE_DEFAULTS, **family_defaults(model, getattr(algorithm, "defaults_by_family", None)), **chosen}
    applied = {name: defaults[name] for name in AUTO_FIELDS if getattr(config, name) is None}
    if config.model is None and not config.model_option and "model_option" in defaults:
        applied["model_option"] = tuple(defaults["model_option"])
    return dataclasses.replace(config, **applied), applied


def _key_values(items: tuple[str, ...], flag: str) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{flag} {item!r} is not KEY=VALUE")
        options[key.strip()] = _parse_scalar(value.strip())
    return options


def _parse_scalar(text: str) -> Any:
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def validate(config: RunConfig) -> None:
    """Raise ConfigError naming the first bad value and what would be valid (a resolved config)."""
    unset = [name for name in AUTO_FIELDS if getattr(config, name) is None]
    if unset:
        raise RuntimeError(f"validate() needs a resolved config; unset: {', '.join(unset)} (config.resolve)")
    lr, max_grad_norm, public_frac = (
        float(config.lr or 0),
        float(config.max_grad_norm or 0),
        float(config.public_frac or 0),
    )
    checks = [
        (math.isfinite(config.alpha) and config.alpha > 0, f"--alpha must be a finite number > 0, got {config.alpha}"),
        (config.num_clients is None or config.num_clients >= 1, f"--num-clients must be ≥ 1, got {config.num_clients}"),
        (math.isfinite(config.frac) and 0 < config.frac <= 1, f"--frac must be in (0, 1], got {config.frac}"),
        (config.rounds >= 1, f"--rounds must be ≥ 1, got {config.rounds}"),
        (config.local_epochs >= 0, f"--local-epochs must be ≥ 0, got {config.local_epochs}"),
        (config.batch_size >= 1, f"--batch-size must be ≥ 1, got {config.batch_size}"),
        (math.isfinite(lr) and lr > 0, f"--lr must be a finite number > 0, got {config.lr}"),
        (0 < config.test_frac < 1, f"--test-frac must be in (0, 1), got {config.test_frac}"),
        (
            math.isfinite(config.val_frac) and 0 <= config.val_frac < 1,
            f"--val-frac must be in [0, 1) (0 = no validation split), got {config.val_frac}",
        ),
        (
            config.val_frac + config.test_frac < 1,
            f"--val-frac {config.val_frac:g} + --test-frac {config.test_frac:g} = "
            f"{config.val_frac + config.test_frac:g} leaves no training samples; their sum must be < 1",
        ),
        (config.shards_per_client >= 1, f"--shards-per-client must be ≥ 1, got {config.shards_per_client}"),
        (config.min_size >= 2, f"--min-size must be ≥ 2 (a train and a test sample), got {config.min_size}"),
        (config.eval_every is None or config.eval_every >= 1, f"--eval-every must be ≥ 1, got {config.eval_every}"),
        (config.finetune_epochs >= 0, f"--finetune-epochs must be ≥ 0 (0 = off), got {config.finetune_epochs}"),
        (config.head_layers >= 1, f"--head-layers must be ≥ 1, got {config.head_layers}"),
        (
            math.isfinite(max_grad_norm) and max_grad_norm >= 0,
            f"--max-grad-norm must be ≥ 0 (0 = no clipping), got {config.max_grad_norm}",
        ),
        (config.seed >= 0, f"--seed must be ≥ 0, got {config.seed}"),
        (
            config.precision in PRECISIONS,
            f"--precision {config.precision!r} is not one of: {', '.join(PRECISIONS)}",
        ),
        (config.checkpoint_every >= 0, f"--checkpoint-every must be ≥ 0 (0 = never), got {config.checkpoint_every}"),
        (
            0 <= config.threads <= MAX_THREADS,
            f"--threads must be in [0, {MAX_THREADS}] (0 = every usable core), got {config.threads}",
        ),
        (config.momentum >= 0 and config.weight_decay >= 0, "--momentum and --weight-decay must be ≥ 0"),
        (0 <= public_frac < 1, f"--public-frac must be in [0, 1), got {config.public_frac}"),
        (config.lora_rank is None or config.lora_rank >= 1, f"--lora-rank must be ≥ 1, got {config.lora_rank}"),
        (config.lora_alpha > 0, f"--lora-alpha must be > 0, got {config.lora_alpha}"),
        (config.pretrain_epochs >= 1 and config.pretrain_lr > 0, "--pretrain-epochs must be ≥ 1 and --pretrain-lr > 0"),
        (not (config.pretrained and config.weights), "give either --pretrained or --weights, not both"),
        (
            config.backbone == "auto" or not (config.pretrained or config.weights),
            f"--backbone {config.backbone} contradicts --pretrained/--weights; use --backbone auto with them",
        ),
        (
            config.backbone != "public" or public_frac > 0,
            "--backbone public pretrains on the public fraction; give --public-frac (e.g. 0.2)",
        ),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
    check_quantity_and_shift(config)
    check_availability(config)
    check_privacy_settings(config)
    check_attack_settings(config)
    check_new_clients_fraction(config.new_clients)
    if config.num_clients is not None:  # else checked once K is fitted (data.partition.fit_num_clients)
        new_client_count(config.num_clients, config.new_clients)


def validate_given(config: RunConfig) -> None:
    """``validate`` before ``resolve``: the unset settings (``AUTO_FIELDS``, which the
    algorithm's run defaults fill, and the algorithm needs torch) take stand-ins that pass every
    check, so a bad value that was given is refused before torch or any data is loaded
    (``pflbench run --alpha 0``). ``validate`` checks the resolved config again."""
    passing = {"lr": 1.0, "public_frac": 0.5 if config.backbone == "public" else 0.0}  # public: needs one > 0
    stand_ins = {name: passing.get(name, BASE_DEFAULTS[name]) for name in AUTO_FIELDS if getattr(config, name) is None}
    validate(dataclasses.replace(config, **stand_ins))


# σ = 20 already spreads client speeds over e^(±20·z); σ·z past ~709 overflows the factors
MAX_STRAGGLER_SIGMA = 20.0
MAX_OVER_SELECT = 100.0  # sampling 101·M clients: beyond it, every client of any benchmark


def check_availability(config: RunConfig) -> None:
    """The availability and straggler settings (engine.availability): one ConfigError line on a bad value."""

    def finite(value: float) -> bool:
        return isinstance(value, (int, float)) and math.isfinite(value)

    choices = (
        ("availability", AVAILABILITY_TRACES),
        ("straggler_model", STRAGGLER_MODELS),
        ("deadline_policy", DEADLINE_POLICIES),
    )
    for name, valid in choices:
        if getattr(config, name) not in valid:
            raise ConfigError(f"--{name.replace('_', '-')} {getattr(config, name)!r} is not one of: {', '.join(valid)}")
    deadline = config.deadline
    checks = [
        (
            finite(config.dropout) and 0 <= config.dropout < 1,
            f"--dropout must be a probability in [0, 1) (0 = off), got {config.dropout}",
        ),
        (
            finite(config.availability_rate) and 0 < config.availability_rate <= 1,
            f"--availability-rate must be in (0, 1], got {config.availability_rate}",
        ),
        (config.availability_period >= 1, f"--availability-period must be ≥ 1 round, got {config.availability_period}"),
        (  # above MAX_STRAGGLER_SIGMA the factors e^(σ·z) overflow to inf or underflow to 0
            finite(config.straggler_sigma) and 0 <= config.straggler_sigma <= MAX_STRAGGLER_SIGMA,
            f"--straggler-sigma must be in [0, {MAX_STRAGGLER_SIGMA:g}], got {config.straggler_sigma}",
        ),
        (
            finite(config.sample_time) and config.sample_time > 0,
            f"--sample-time must be > 0 seconds, got {config.sample_time}",
        ),
        (finite(config.bandwidth) and config.bandwidth > 0, f"--bandwidth must be > 0 MB/s, got {config.bandwidth}"),
        (
            deadline is None or (finite(deadline) and deadline > 0),
            f"--deadline must be > 0 seconds (unset = none), got {deadline}",
        ),
        (  # ceil(M·(1 + f)) must stay a finite count; past MAX_OVER_SELECT every client is sampled anyway
            finite(config.over_select) and 0 <= config.over_select <= MAX_OVER_SELECT,
            f"--over-select must be ≥ 0 (0 = off) and ≤ {MAX_OVER_SELECT:g}, got {config.over_select}",
        ),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
    if config.deadline_policy == "partial" and deadline is not None and config.executor == "vmap":
        raise ConfigError(
            "--deadline-policy partial caps each client's local steps, which --executor vmap cannot; "
            "use --executor sequential or ray"
        )


def check_privacy_settings(config: RunConfig) -> None:
    """--dp and its settings (engine.privacy): one ConfigError line on a bad value."""
    if config.dp not in DP_MODES:
        raise ConfigError(f"--dp {config.dp!r} is not one of: {', '.join(DP_MODES)}")
    if config.dp == "off":
        return
    q = config.dp_adaptive_quantile
    checks = [
        (
            math.isfinite(config.dp_clip) and config.dp_clip > 0,
            f"--dp-clip must be a finite number > 0, got {config.dp_clip}",
        ),
        (
            math.isfinite(config.dp_noise) and config.dp_noise >= 0,
            f"--dp-noise must be a finite number ≥ 0, got {config.dp_noise}",
        ),
        (0 < config.dp_delta < 1, f"--dp-delta must be in (0, 1), got {config.dp_delta}"),
        (math.isfinite(q) and 0 <= q < 1, f"--dp-adaptive-quantile must be in [0, 1) (0 = fixed clipping), got {q}"),
        (
            q == 0 or config.dp == "client",
            "--dp-adaptive-quantile adapts the clip of client updates: use it with --dp client",
        ),
        (
            math.isfinite(config.dp_clip_lr) and config.dp_clip_lr > 0,
            f"--dp-clip-lr must be a finite number > 0, got {config.dp_clip_lr}",
        ),
        (
            math.isfinite(config.dp_count_noise) and config.dp_count_noise >= 0,
            f"--dp-count-noise must be ≥ 0 (0 = m/20), got {config.dp_count_noise}",
        ),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)


def check_attack_settings(config: RunConfig) -> None:
    """--attack, --robust-agg and their settings (engine.attacks, engine.robust): one ConfigError
    line on a bad value (what needs the number of clients or the algorithm: ``engine.attacks``)."""
    for name, valid in (("attack", ATTACKS), ("robust_agg", ROBUST_AGGREGATORS)):
        if getattr(config, name) not in valid:
            raise ConfigError(f"--{name.replace('_', '-')} {getattr(config, name)!r} is not one of: {', '.join(valid)}")
    fraction = config.attackers
    checks = [
        (
            isinstance(fraction, (int, float)) and math.isfinite(fraction) and 0 <= fraction < 1,
            f"--attackers must be a fraction in [0, 1) of the training clients, got {fraction}",
        ),
        (
            config.attack == "none" or fraction > 0,
            f"--attack {config.attack} needs malicious clients: give --attackers FRAC > 0 (e.g. 0.2)",
        ),
        (
            math.isfinite(config.attack_scale) and config.attack_scale > 0,
            f"--attack-scale must be a finite number > 0, got {config.attack_scale}",
        ),
        (config.backdoor_target >= 0, f"--backdoor-target must be a class label ≥ 0, got {config.backdoor_target}"),
        (
            math.isfinite(config.backdoor_frac) and 0 < config.backdoor_frac <= 1,
            f"--backdoor-frac must be in (0, 1], got {config.backdoor_frac}",
        ),
        (
            math.isfinite(config.trim_frac) and 0 <= config.trim_frac < 0.5,
            f"--trim-frac is the fraction trimmed on each side and must be in [0, 0.5), got {config.trim_frac}",
        ),
        (config.krum_f >= 0, f"--krum-f (Byzantine clients tolerated) must be ≥ 0, got {config.krum_f}"),
        (config.krum_select >= 0, f"--krum-select must be ≥ 0 (0 = m − f), got {config.krum_select}"),
        (
            math.isfinite(config.norm_bound) and config.norm_bound > 0,
            f"--norm-bound must be a finite number > 0, got {config.norm_bound}",
        ),
        (
            config.robust_agg == "none" or config.dp != "client",
            f"--robust-agg {config.robust_agg} replaces the mean whose noise --dp client calibrates; use one of them",
        ),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)


def feature_shift_names(text: str) -> tuple[str, ...]:
    """The transforms of ``--feature-shift`` (comma-separated), checked: ConfigError on an unknown one."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if text.strip() and not names:  # ",," is not the off value "": refuse it rather than run unshifted
        raise ConfigError(f"--feature-shift {text!r} names no transform; valid: {', '.join(FEATURE_SHIFTS)}")
    for name in names:
        if name not in FEATURE_SHIFTS:
            raise ConfigError(f"--feature-shift {name!r} is not a transform; valid: {', '.join(FEATURE_SHIFTS)}")
    if len(set(names)) != len(names):
        raise ConfigError(f"--feature-shift {text!r} names a transform twice")
    return names


def check_quantity_and_shift(config: RunConfig) -> None:
    """--sizes, --size-param, --feature-shift and --shift-groups: one ConfigError line on a bad value."""
    if config.sizes not in QUANTITY_SKEWS:
        raise ConfigError(f"--sizes {config.sizes!r} is not one of: {', '.join(QUANTITY_SKEWS)}")
    zero_allowed = config.sizes in ("powerlaw", "lognormal")  # 0: equal sizes; Dir(0) is undefined
    param = config.size_param
    if config.sizes != "none" and not (math.isfinite(param) and (param >= 0 if zero_allowed else param > 0)):
        wanted = "≥ 0" if zero_allowed else "> 0"
        raise ConfigError(f"--size-param for --sizes {config.sizes} must be a finite number {wanted}, got {param}")
    feature_shift_names(config.feature_shift)
    if config.shift_groups < 0 or config.shift_groups == 1:
        raise ConfigError(f"--shift-groups must be 0 (one domain per client) or ≥ 2 domains, got {config.shift_groups}")


def recorded_fields(record: dict[str, Any]) -> dict[str, Any]:
    """The ``RunConfig`` fields a recorded config (``config.json``, ``models/meta.json``'s build)
    holds, JSON lists back to tuples: fields added since are absent (they keep their defaults,
    or the caller sets what runs before them did), fields removed since are ignored."""
    hints = field_types(RunConfig)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(RunConfig):
        if f.name in record:
            value = record[f.name]
            if typing.get_origin(hints[f.name]) is tuple and value is not None:
                value = tuple(value)
            values[f.name] = value
    return values


def recorded_options(values: dict[str, Any]) -> dict[str, Any]:
    """Recorded algorithm hyperparameters, JSON lists (nested too) back to tuples."""
    return {name: _tuples(value) for name, value in values.items()}


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def field_types(cls: type) -> dict[str, Any]:
    """Resolved type hints of a dataclass's fields (annotations are strings here)."""
    return typing.get_type_hints(cls)


def hyperparameters_from(cls: type, values: dict[str, Any], algo: str) -> Any:
    """Build an algorithm's hyperparameter dataclass, rejecting names it does not have."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        flag = "--" + unknown[0].replace("_", "-")
        valid = ", ".join("--" + n.replace("_", "-") for n in sorted(names)) or "none"
        raise ConfigError(f"{flag} is not an option of --algo {algo}; its options: {valid}")
    hyperparameters = cls(**values)
    for f in dataclasses.fields(cls):
        choices = f.metadata.get("choices")
        value = getattr(hyperparameters, f.name)
        if choices and value not in choices:
            raise ConfigError(f"--{f.name.replace('_', '-')} {value!r} is not one of: {', '.join(choices)}")
    check = getattr(hyperparameters, "validate", None)
    if check is not None:
        check()
    return hyperparameters
