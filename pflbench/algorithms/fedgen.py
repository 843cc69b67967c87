"""FedGen — Zhu, Hong & Zhou, "Data-Free Knowledge Distillation for Heterogeneous Federated
Learning", ICML 2021 (arXiv:2105.10056).

FedAvg plus a server-side generator G_w(z | y) of *feature representations* — vectors of the
dimension of the model's final classifier input — learnt without data from the ensemble of the
clients' classifier heads h(·; θ_k) and sent to the clients, whose local loss gains a
distillation term on generated features.

Server, after each round's uploads (``train_generator``): w is trained for ``--generator-steps``
Adam steps, each on a batch of ``--generator-batch-size`` labels y ~ p̂(y) with noise ε ~ N(0, I):

    J(w) = E_y [ Σ_k c_k(y)·CE(h(G_w(ε, y); θ_k), y) ] + η·L_div(ε, G_w(ε, y))      (``teacher_loss``)

    c_k(y) = n_{k,y} / Σ_j n_{j,y}    (client k's share of label y among the round's clients,
                                       from the label counts each client uploads; ``label_weights``)
    L_div = exp(−mean_{i,j}[ d₁(G_i, G_j)·d₂(ε_i, ε_j) ])   d₁ = mean |·|, d₂ = mean (·)²
                                                                                (``diversity_loss``)

    p̂(y) = Σ_k n_{k,y} / Σ_k n_k  (the round's clients' label distribution; ``label_distribution``)

Client k, from the second round on (once a generator exists), minimises per minibatch (x, y)

    CE(f(x; θ_k), y) + (B̂/B)·α_t·CE(h(G(ε̂, ŷ); θ_k), ŷ) + β_t·KL(softmax(h(G(ε, y); θ_k)) ‖ softmax(f(x; θ_k)))

with ŷ ~ p̂(y) a batch of ``--gen-batch-size`` B̂ labels, B the ``--batch-size``, the generator in
eval mode and fixed, the KL's target detached, and α_t = max(10⁻⁴, α·0.98^(t−1)), β_t likewise
(``decayed_weight``, t the round, 0.98 the ``--generative-decay``).

Choices the paper leaves open, and what the authors' code (zhuangdizhu/FedGen) does:

- The teacher objective. The paper's Eq. 4 scores the *average* of the heads' logits; the
  authors' code minimises the label-share-weighted sum of each head's cross-entropy (above), with
  ``ensemble_alpha`` = 1, the adversarial student term off (``ensemble_beta`` = 0) and the
  diversity term on (``ensemble_eta`` = 1). We implement the authors' objective; ``--diversity-weight``
  η = 1 (0 switches the term off).
- The generator (authors' MNIST ``GENERATORCONFIGS``): [ε (32 dims) ‖ one-hot(y)] → Linear(256) →
  BatchNorm → ReLU → Linear(D), D the classifier's input dimension (the authors' network has a
  32-dim latent layer; here it is the zoo model's). Adam, lr 3·10⁻⁴, weight decay 10⁻², the lr
  decayed by 0.98 after every round; 50 steps per round (``ensemble_epochs`` 50 = 10 × 5 teacher
  iterations) on batches of the clients' batch size. Initialisation: PyTorch's ``nn.Linear``
  default, drawn from a stream of the run's seed. The authors' code draws ε ~ U[0, 1) although the
  paper (and the code's comment) says Gaussian; we draw ε ~ N(0, I).
- Label sampling. Paper: y ~ p̂(y). Code: uniform over the labels some client of the round holds
  (generator) or over all the dataset's labels (clients). We follow the paper for both, with p̂
  estimated from the round's uploaded label counts.
- The clients' weights: α = β = 10 at lr 0.01 (the authors' MNIST ``generative_alpha``/
  ``generative_beta``; moved to the run's lr, below), decay 0.98 per round, floor 10⁻⁴,
  ``--gen-batch-size`` 32: the authors' values. The β term is in
  the authors' code, not in the paper; ``--generative-beta 0`` removes it. Regularisation starts in
  round 2 as in the code (``regularization = glob_iter > 0``). The code also stops it after 20 local
  epochs of a round (``early_stop``), which no run with fewer local epochs reaches; we do not.
- α, β and the learning rate. The authors pair α = β = 10 with SGD at lr 0.01 (their MNIST runs).
  The regulariser's step on the head scales with α·lr: at this suite's rates (0.05 in the
  reference sweeps, 0.1 the small models' default) α = 10 is five to ten times theirs, and the
  early rounds are unstable (measured, digits, 10 clients, Dir(0.1), 10 rounds, mlp, seed 0,
  pers_acc: FedAvg 0.656 vs FedGen 0.435 at lr 0.1, FedGen 0.681 with α = β = 1; at lr 0.01
  FedAvg 0.292 vs FedGen 0.594; digits, Dir(0.1), 20 clients, cnn_bn, 20 rounds, lr 0.05, seeds
  0–2, one machine: α = β = 10: 83.6%, the default α = β = 2: 92.7%, Local 95.7%). Default (this suite's rule, ``fedcp.lr_matched_weight``): under SGD
  α = β = 10·0.01/lr — the authors' α·lr = 0.1 (α = β = 2 at lr 0.05, exactly 10 at their
  0.01); under Adam, whose steps do not scale with the loss's weight, the authors' 10.
  ``--generative-alpha 10 --generative-beta 10`` restores the earlier default.
- Label counts: the code counts the labels a client saw while training this round (+1 smoothing);
  we upload the exact per-class counts of its train split (C floats).

State and bytes: the whole model is shared and averaged FedAvg-style. Down: the global model plus,
once trained, the generator's parameters and BatchNorm statistics and p̂ (``fedgen.generator.*``,
``fedgen.label_distribution``). Up: the trained model plus the client's label counts
(``fedgen.label_counts``). The generator, its Adam moments, p̂ and the number of generator
trainings are server state (``checkpoint_attributes``); the server's random draws come from a stream
keyed by the number of generator trainings, so a resumed run continues exactly.

Evaluation: FedGen learns one global model and the paper evaluates it on every client's test data:
``pers_acc`` is the global model's (``personal_model_is_received``); new clients are served by the
global model as it is. The local update is the engine's batch loop with extra loss terms, but it
draws random labels and noise per job, so it overrides ``local_update`` (``--executor vmap`` and
``--dp`` refuse it); ``--head-layers`` must stay 1 (the generator imitates the final layer's input).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pflbench import (
    Algorithm,
    Capabilities,
    ClientProgram,
    ClientUpdate,
    ConfigError,
    LocalResult,
    ProgramCapabilities,
    RunConfig,
    Tensors,
    option,
    register_algorithm,
)
from pflbench.algorithms.fedcp import lr_matched_weight
from pflbench.config.groups import LocalSpec
from pflbench.engine import LocalTrainer, standard_local_update
from pflbench.engine.types import Forward, sample_weights, weighted_average
from pflbench.models.zoo import head_module_names
from pflbench.util.seeding import derive_seed

PREFIX = "fedgen."
GENERATOR = "fedgen.generator."  # the generator's tensors, sent down once trained
LABEL_DISTRIBUTION = "fedgen.label_distribution"  # p̂(y), sent down with the generator
LABEL_COUNTS = "fedgen.label_counts"  # a client's train samples per class, uploaded
GENERATOR_BUFFERS = ("bn.running_mean", "bn.running_var")
WEIGHT_FLOOR = 1e-4  # α_t, β_t never decay below this (the authors' ``exp_lr_scheduler``)
BATCH_NORM_EPS, BATCH_NORM_MOMENTUM = 1e-5, 0.1  # nn.BatchNorm1d's defaults
ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8


# ---- the math ----------------------------------------------------------------------------
def decayed_weight(initial: float, decay: float, round_index: int) -> float:
    """α_t = max(10⁻⁴, α·decay^(t−1)) for round t = 1, 2, ... (the authors' schedule)."""
    return max(WEIGHT_FLOOR, initial * decay ** (round_index - 1))


def label_weights(counts: torch.Tensor) -> torch.Tensor:
    """c_k(y) = n_{k,y} / Σ_j n_{j,y} from counts [K × C]; returns [C × K] (0 where no client
    of the round holds y)."""
    totals = counts.sum(dim=0, keepdim=True)
    return (counts / totals.clamp(min=1e-12)).t()


def label_distribution(counts: torch.Tensor) -> torch.Tensor:
    """p̂(y) = Σ_k n_{k,y} / Σ_{k,y} n_{k,y} from counts [K × C]."""
    totals = counts.sum(dim=0)
    return totals / totals.sum()


def diversity_loss(noise: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """exp(−mean_{i,j}[ mean_f |G_i − G_j| · mean_f (ε_i − ε_j)² ]) over all pairs (i, j) of the
    batch (the authors' ``DiversityLoss('l1')``): small when different noise gives different output."""
    feature_distance = (features.unsqueeze(0) - features.unsqueeze(1)).abs().mean(dim=2)
    noise_distance = (noise.unsqueeze(0) - noise.unsqueeze(1)).pow(2).mean(dim=2)
    return torch.exp(-(feature_distance * noise_distance).mean())


def teacher_loss(logits: list[torch.Tensor], labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """mean_i Σ_k c_k(y_i)·CE(logits_k[i], y_i); ``weights`` [C × K] from ``label_weights``."""
    per_client = torch.stack([F.cross_entropy(z, labels, reduction="none") for z in logits], dim=1)  # B × K
    return (per_client * weights[labels]).sum(dim=1).mean()


def generate(
    generator: Tensors, noise: torch.Tensor, labels: torch.Tensor, num_classes: int, training: bool
) -> torch.Tensor:
    """G(ε, y) = Linear(ReLU(BatchNorm(Linear([ε ‖ one-hot(y)])))). Training mode uses the
    batch's statistics and updates the running ones in place; eval mode uses the running ones."""
    inputs = torch.cat([noise, F.one_hot(labels, num_classes).to(noise.dtype)], dim=1)
    hidden = F.linear(inputs, generator["fc.weight"], generator["fc.bias"])
    hidden = F.batch_norm(
        hidden,
        generator["bn.running_mean"],
        generator["bn.running_var"],
        generator["bn.weight"],
        generator["bn.bias"],
        training=training,
        momentum=BATCH_NORM_MOMENTUM,
        eps=BATCH_NORM_EPS,
    )
    return F.linear(torch.relu(hidden), generator["out.weight"], generator["out.bias"])


def initial_generator(
    noise_dim: int, num_classes: int, hidden: int, feature_dim: int, seed: int, device: Any = None
) -> Tensors:
    """The generator's tensors with ``nn.Linear``'s default init (U(±1/√fan_in) for weight and
    bias) and ``nn.BatchNorm1d``'s (γ = 1, β = 0, mean 0, var 1), drawn from ``seed``."""
    stream = torch.Generator().manual_seed(seed)

    def uniform(shape: tuple[int, ...], fan_in: int) -> torch.Tensor:
        return ((torch.rand(shape, generator=stream) * 2 - 1) / math.sqrt(fan_in)).to(device)

    fan_in = noise_dim + num_classes
    return {
        "fc.weight": uniform((hidden, fan_in), fan_in),
        "fc.bias": uniform((hidden,), fan_in),
        "bn.weight": torch.ones(hidden, device=device),
        "bn.bias": torch.zeros(hidden, device=device),
        "bn.running_mean": torch.zeros(hidden, device=device),
        "bn.running_var": torch.ones(hidden, device=device),
        "out.weight": uniform((feature_dim, hidden), hidden),
        "out.bias": uniform((feature_dim,), hidden),
    }


@torch.no_grad()
def adam_step(params: Tensors, gradients: Tensors, moments: Tensors, step: int, lr: float, weight_decay: float) -> None:
    """One step of ``torch.optim.Adam`` (L2 weight decay added to the gradient, bias-corrected
    moments) on ``params`` in place; ``moments`` holds ``m/<name>`` and ``v/<name>``; ``step`` ≥ 1."""
    beta1, beta2 = ADAM_BETAS
    for name, param in params.items():
        gradient = gradients[name] + weight_decay * param
        first, second = moments[f"m/{name}"], moments[f"v/{name}"]
        first.mul_(beta1).add_(gradient, alpha=1 - beta1)
        second.mul_(beta2).addcmul_(gradient, gradient, value=1 - beta2)
        denominator = (second.sqrt() / math.sqrt(1 - beta2**step)).add_(ADAM_EPS)
        param.addcdiv_(first, denominator, value=-lr / (1 - beta1**step))


def head_logits(head: tuple[torch.Tensor, torch.Tensor | None], features: torch.Tensor) -> torch.Tensor:
    return F.linear(features, head[0], head[1])


# ---- defaults ----------------------------------------------------------------------------
AUTHORS_GENERATIVE_WEIGHT, AUTHORS_LR = 10.0, 0.01  # the authors' MNIST α = β = 10 with SGD lr 0.01


def resolved_generative_weights(hparams: FedGenHyperparameters, local: LocalSpec) -> tuple[float, float]:
    """(α, β) as given, or the authors' α·lr and β·lr at the run's learning rate."""
    default = lr_matched_weight(AUTHORS_GENERATIVE_WEIGHT, AUTHORS_LR, local)
    alpha = default if hparams.generative_alpha is None else hparams.generative_alpha
    beta = default if hparams.generative_beta is None else hparams.generative_beta
    return alpha, beta


# ---- client ------------------------------------------------------------------------------
@dataclass(frozen=True)
class FedGenHyperparameters:
    generative_alpha: float | None = option(
        None,
        "α: weight of the CE of the client's head on generated features [default: SGD 0.1/--lr, the authors' "
        "α·lr = 10 × 0.01 on MNIST; Adam 10].",
    )
    generative_beta: float | None = option(
        None,
        "β: weight of the KL towards the head's prediction on generated features of the batch's labels "
        "[default: as --generative-alpha, the authors' β = 10 at lr 0.01].",
    )
    generative_decay: float = option(
        0.98, "α and β are multiplied by this every round (floor 1e-4; the authors' 0.98)."
    )
    gen_batch_size: int = option(32, "B̂: generated features per client minibatch (the authors' 32).")
    generator_steps: int = option(
        50, "Adam steps of the generator per round (the authors' 50 = 10 epochs × 5 iterations)."
    )
    generator_batch_size: int | None = option(
        None, "Labels per generator step [default: --batch-size, as in the authors' code]."
    )
    generator_lr: float = option(
        3e-4, "Generator learning rate (the authors' 3e-4 on MNIST), decayed by 0.98 per round."
    )
    generator_weight_decay: float = option(1e-2, "Generator Adam weight decay (the authors' 1e-2).")
    diversity_weight: float = option(1.0, "η: weight of the diversity loss in the generator's objective (0: off).")
    noise_dim: int = option(32, "Dimension of the generator's noise ε (the authors' 32 on MNIST).")
    generator_hidden: int = option(256, "Width of the generator's hidden layer (the authors' 256 on MNIST).")

    def validate(self) -> None:
        for name in ("generative_alpha", "generative_beta", "diversity_weight", "generator_weight_decay"):
            if getattr(self, name) is not None and not getattr(self, name) >= 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be ≥ 0, got {getattr(self, name)}")
        if not 0 < self.generative_decay <= 1:
            raise ConfigError(f"--generative-decay must be in (0, 1], got {self.generative_decay}")
        if not self.generator_lr > 0:
            raise ConfigError(f"--generator-lr must be > 0, got {self.generator_lr}")
        for name in ("gen_batch_size", "generator_steps", "noise_dim", "generator_hidden"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be ≥ 1, got {getattr(self, name)}")
        if self.generator_batch_size is not None and self.generator_batch_size < 2:
            raise ConfigError(f"--generator-batch-size must be ≥ 2 (BatchNorm), got {self.generator_batch_size}")


class FedGenProgram(ClientProgram[FedGenHyperparameters]):
    capabilities = ProgramCapabilities(model_upload=True)
    head_module: str = ""  # the final classifier layer (make_program); the generator imitates its input
    num_classes: int = 0
    # per job (set on a copy in local_update): the generator, p̂ and the random stream
    generator: Tensors = {}
    labels: torch.Tensor | None = None
    stream: torch.Generator | None = None

    def assemble(self, received: Tensors, private: Tensors) -> Tensors:
        return {n: t for n, t in {**received, **private}.items() if not n.startswith(PREFIX)}

    def head(self, params: Tensors) -> tuple[torch.Tensor, torch.Tensor | None]:
        return params[f"{self.head_module}.weight"], params.get(f"{self.head_module}.bias")

    def generated(self, labels: torch.Tensor) -> torch.Tensor:
        """G(ε, y) for ``labels`` with fresh noise from the job's stream (generator fixed, eval mode)."""
        noise = torch.randn(len(labels), self.hparams.noise_dim, generator=self.stream).to(labels.device)
        with torch.no_grad():
            return generate(self.generator, noise, labels, self.num_classes, training=False)

    def loss_terms(
        self, forward: Forward, params: Tensors, inputs: torch.Tensor, targets: torch.Tensor, received: Tensors
    ) -> dict[str, torch.Tensor]:
        logits = forward(params, inputs)
        terms = {"task": F.cross_entropy(logits, targets)}
        if not self.generator or self.labels is None:  # round 1: no generator yet
            return terms
        head = self.head(params)
        sampled = torch.multinomial(self.labels, self.hparams.gen_batch_size, True, generator=self.stream)
        sampled = sampled.to(targets.device)
        terms["generated"] = F.cross_entropy(head_logits(head, self.generated(sampled)), sampled)
        target = F.softmax(head_logits(head, self.generated(targets)), dim=1).detach()
        terms["latent"] = F.kl_div(F.log_softmax(logits, dim=1), target, reduction="batchmean")
        return terms

    def local_update(self, trainer: LocalTrainer) -> LocalResult:
        """The engine's batch loop on a per-job copy holding the generator, p̂, the round's α_t, β_t
        and a random stream of the job's seed; uploads the model and the label counts."""
        job, hparams = trainer.job, self.hparams
        job_program = copy.copy(self)
        job_program.stream = torch.Generator().manual_seed(derive_seed(job.seed, "fedgen.samples"))
        job_program.generator = {n[len(GENERATOR) :]: t for n, t in job.received.items() if n.startswith(GENERATOR)}
        job_program.labels = job.received[LABEL_DISTRIBUTION].cpu() if job_program.generator else None
        initial_alpha, initial_beta = resolved_generative_weights(hparams, self.local)
        alpha = decayed_weight(initial_alpha, hparams.generative_decay, job.round)
        beta = decayed_weight(initial_beta, hparams.generative_decay, job.round)
        ratio = hparams.gen_batch_size / self.local.batch_size
        job_program.loss_weights = {"generated": ratio * alpha, "latent": beta}
        result = standard_local_update(job_program, trainer)
        targets = trainer.data.labels[trainer.data.train_indices[job.client_id]]
        counts = torch.bincount(targets, minlength=self.num_classes).to(torch.float32)
        result.upload = {**self.upload(trainer.state, job.received), LABEL_COUNTS: counts}
        return result


# ---- server ------------------------------------------------------------------------------
@register_algorithm("fedgen")
class FedGen(Algorithm[FedGenHyperparameters]):
    """FedAvg + a server generator of features, trained on the clients' heads, regularising clients."""

    display_name = "FedGen"
    paper = "Zhu et al., ICML 2021"
    method_family = "distillation"
    hyperparameters = FedGenHyperparameters
    program_class = FedGenProgram
    personal_model_is_received = True  # the paper evaluates the global model
    # the upload carries label counts; the local update is its own
    capabilities = Capabilities(received_personal_model=True, averaged_upload=False)
    checkpoint_attributes = ("generator", "generator_moments", "label_distribution", "generator_trainings")
    transient_attributes = ("last_generator_losses",)

    @classmethod
    def check_config(cls, config: RunConfig, hparams: FedGenHyperparameters) -> None:
        if config.head_layers != 1:
            raise ConfigError(
                f"fedgen's generator imitates the final layer's input; --head-layers {config.head_layers} "
                "would be ignored (leave it at 1)"
            )
        if (hparams.generator_batch_size or config.batch_size) < 2:
            raise ConfigError(
                f"fedgen's generator trains with BatchNorm on batches of --batch-size {config.batch_size}; "
                "set --generator-batch-size 2 or more"
            )

    def __init__(
        self, config: RunConfig, hparams: FedGenHyperparameters, model: nn.Module, num_train: list[int]
    ) -> None:
        self.head_module = head_module_names(model, 1)[0]
        head = model.get_submodule(self.head_module)
        if not isinstance(head, nn.Linear):
            raise ConfigError(f"fedgen needs a linear final layer, {self.head_module!r} is a {type(head).__name__}")
        self.num_classes, self.feature_dim = head.out_features, head.in_features
        device = head.weight.device
        self.generator = initial_generator(
            hparams.noise_dim,
            self.num_classes,
            hparams.generator_hidden,
            self.feature_dim,
            derive_seed(config.seed, "fedgen.generator"),
            device,
        )
        self.generator_moments = {
            f"{kind}/{n}": torch.zeros_like(t)
            for n, t in self.generator.items()
            if n not in GENERATOR_BUFFERS
            for kind in ("m", "v")
        }
        self.label_distribution = torch.full((self.num_classes,), 1.0 / self.num_classes, device=device)
        self.generator_trainings = 0
        self.last_generator_losses: dict[str, float] = {}
        super().__init__(config, hparams, model, num_train)

    def make_program(self) -> ClientProgram:
        program = super().make_program()
        program.head_module, program.num_classes = self.head_module, self.num_classes  # type: ignore[attr-defined]
        return program

    def broadcast(self, client_id: int) -> Tensors:
        """The global model, plus the generator and p̂ once the generator has been trained."""
        if not self.generator_trainings:
            return self.global_state
        extra = {GENERATOR + n: t for n, t in self.generator.items()}
        return {**self.global_state, **extra, LABEL_DISTRIBUTION: self.label_distribution}

    def aggregate(self, updates: list[ClientUpdate]) -> None:
        if not updates:
            return
        models = [{n: u.params[n] for n in self.layout.shared} for u in updates]
        average = weighted_average(models, sample_weights(updates))
        heads = [(u.params[f"{self.head_module}.weight"], u.params.get(f"{self.head_module}.bias")) for u in updates]
        counts = torch.stack([u.params[LABEL_COUNTS] for u in updates])
        self.train_generator(heads, counts)
        torch._foreach_copy_([self.global_state[n] for n in average], list(average.values()))

    def train_generator(self, heads: list[tuple[torch.Tensor, torch.Tensor | None]], counts: torch.Tensor) -> None:
        """``--generator-steps`` Adam steps on J(w) against the uploaded heads (see the docstring)."""
        hparams = self.hparams
        self.generator_trainings += 1
        weights = label_weights(counts)
        self.label_distribution = label_distribution(counts).to(self.label_distribution.device)
        stream = torch.Generator().manual_seed(derive_seed(self.config.seed, "fedgen.server", self.generator_trainings))
        batch = hparams.generator_batch_size or self.config.batch_size
        lr = hparams.generator_lr * 0.98 ** (self.generator_trainings - 1)  # the authors' ExponentialLR(0.98)
        trained = [n for n in self.generator if n not in GENERATOR_BUFFERS]
        steps_before = (self.generator_trainings - 1) * hparams.generator_steps
        sums = {"teacher": 0.0, "diversity": 0.0}
        device = self.label_distribution.device
        for step in range(1, hparams.generator_steps + 1):
            labels = torch.multinomial(self.label_distribution.cpu(), batch, True, generator=stream).to(device)
            noise = torch.randn(batch, hparams.noise_dim, generator=stream).to(device)
            leaves = {n: self.generator[n].detach().requires_grad_(True) for n in trained}
            features = generate({**self.generator, **leaves}, noise, labels, self.num_classes, training=True)
            teacher = teacher_loss([head_logits(h, features) for h in heads], labels, weights)
            diversity = diversity_loss(noise, features)
            loss = teacher + hparams.diversity_weight * diversity
            gradients = dict(zip(trained, torch.autograd.grad(loss, [leaves[n] for n in trained])))
            adam_step(
                {n: self.generator[n] for n in trained},
                gradients,
                self.generator_moments,
                steps_before + step,
                lr,
                hparams.generator_weight_decay,
            )
            sums["teacher"] += float(teacher.detach())
            sums["diversity"] += float(diversity.detach())
        self.last_generator_losses = {f"generator_{k}_loss": v / hparams.generator_steps for k, v in sums.items()}

    def round_diagnostics(self, updates: list[ClientUpdate]) -> dict[str, Any]:
        return dict(self.last_generator_losses)

    def run_info(self) -> dict[str, Any]:
        size = sum(t.numel() for t in self.generator.values())
        alpha, beta = resolved_generative_weights(self.hparams, self.config.local_spec)
        return {
            "fedgen_generative_alpha": alpha,
            "fedgen_generative_beta": beta,
            "fedgen_generator": f"{size} tensors' elements, output = input of {self.head_module} ({self.feature_dim})",
        }
