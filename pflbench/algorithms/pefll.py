"""PeFLL — Scott, Zakerinia & Lampert, "PeFLL: Personalized Federated Learning by Learning to
Learn", ICLR 2024 (arXiv:2306.05515).

Two server networks are learned: an embedding network E(·; ψ) that maps a client's data to a
descriptor, and a hypernetwork h(·; φ) that maps the descriptor to the client's whole model. For
client i with train samples S_i:

    v_i = std( (1/|B|)·Σ_{(x,y) ∈ B} E(x, y; ψ) ),   B ⊆ S_i        (``client_embedding``)
    θ_i = h(v_i; φ)                                                   (``generate_weights``)

(std(u) = (u − mean(u))/sd(u) over the descriptor's entries.) The client trains θ_i on S_i to θ̃_i
with the run's local optimizer and returns Δθ_i = θ_i − θ̃_i; the chain rule through v_i and θ_i
gives the gradient of both networks (a vector–Jacobian product, ``joint_gradient``):

    g_i = (∂θ_i/∂(ψ, φ))ᵀ·Δθ_i

The server averages g_i over the round's M clients (uniformly, as the authors), clips the mean's
total norm to ``--hn-max-grad-norm`` and takes one Adam step on (ψ, φ) (``adam_step``).

Evaluation (pers_acc) and new clients (``--new-clients``) are PeFLL's own inference: the client
computes v_i with the current ψ from its whole train split and is tested with h(v_i; φ) — no
training, a single forward pass of the two networks (``personalization_program``; the paper's
point is that unseen clients get their model this way).

Networks. h: v → Linear(e, H) → ``--hn-hidden-layers`` × [ReLU, Linear(H, H)] → one linear head
per trainable tensor of the target model (H → numel); PyTorch's default initialisation drawn from
the run's seed (stream ``pefll.init``). Float buffers (BatchNorm statistics) are not generated:
they stay with each client. E: [flatten(pool(x)) ‖ one-hot(y)] → Linear(·, 120) → ReLU → Linear(120, 84)
→ ReLU → Linear(84, e), pool an adaptive average to 8 × 8 for images (identity for feature
vectors).

Defaults (the authors' ``train.py``, FL-bench's PeFLL agrees): e = int(1 + K/4) (``--embed-dim
-1``; at least 2 here, as the descriptor is standardised over its entries), H = 100 (``--hn-hidden``), 3 hidden layers, Adam with lr 2e-4 (``--hn-lr``) on ψ and φ
together, server clipping at norm 50, the training embedding from one minibatch
(``--embed-batches 1``), the evaluation embedding from the whole train split.

Departures, each for a stated reason:
- The embedding network: the authors use a CNN on 32 × 32 images with the labels as extra input
  planes (FL-bench resizes smaller images to 32 × 32); we use an MLP on the image average-pooled
  to 8 × 8 (or the feature vector) and the one-hot label, with the CNN's fully-connected widths
  (120, 84): it serves every input shape of the suite without knowing it in advance (the
  algorithm sees the model, not the data: the input width comes from the model's first layer,
  a Conv2d's channels or a Linear's inputs; other first layers, e.g. char_lstm's Embedding, are
  refused).
- Standardisation of v: the authors divide by the mean and standard deviation of the very first
  embedding ever computed (then frozen); FL-bench standardises each embedding by its own — which
  we do: it is the same for every client and needs no state shared across clients' parallel jobs.
- Local training: the authors take 50 SGD steps (lr 2e-3, momentum 0.9, weight decay 5e-5,
  clipped to norm 50); here ``--local-epochs`` epochs of the run's optimizer (``--max-grad-norm``
  50 gives their clipping), as every algorithm of this suite.
- The authors' evaluation masks the logits of classes absent from the client's train split; the
  suite evaluates every algorithm's raw predictions.
- What travels: the paper's protocol exchanges v_i, θ_i, Δθ_i and the gradient of v_i in several
  messages; this simulation sends (ψ, φ) down and g_i up (as FL-bench does), so the recorded
  bytes are those of (ψ, φ), not of the paper's protocol — the numbers are identical.

No global model (``global_acc`` null). Refused: ``--executor vmap`` (custom local update),
``--dp``, ``--attack`` model poisoning and ``--robust-agg`` (the upload is a gradient of the server
networks, not an averaged model update; the engine's predicate refuses them), ``--holdout-domain``
(ood_acc evaluates ``personal_model(k)`` without the client's data, which PeFLL needs to generate
a model), a model with no trainable parameter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pflbench import (
    Algorithm,
    Capabilities,
    Choice,
    ClientProgram,
    ClientUpdate,
    ConfigError,
    Dimension,
    LocalResult,
    ParamLayout,
    ProgramCapabilities,
    RunConfig,
    Tensors,
    option,
    register_algorithm,
    standard_local_update,
)
from pflbench.models.zoo import final_linear_layer, layer_order
from pflbench.util.seeding import derive_seed

PSI = "pefll.psi."  # broadcast: the embedding network's tensors
PHI = "pefll.phi."  # broadcast: the hypernetwork's tensors
GRAD = "pefll.grad."  # upload: g_i, keyed like (ψ, φ) with their prefixes
EMBED_WIDTHS = (120, 84)  # the authors' embedding CNN's fully-connected widths
POOLED = (8, 8)  # images enter the embedding network average-pooled to 8 × 8 (any input size)
ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8  # torch.optim.Adam's defaults (the authors' optimizer)


# ---- the networks, as pure functions of their tensors --------------------------------------
def linear_init(fan_in: int, fan_out: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """nn.Linear's default initialisation: weight and bias U(±1/√fan_in)."""
    bound = 1.0 / math.sqrt(fan_in)
    weight = torch.empty(fan_out, fan_in).uniform_(-bound, bound, generator=generator)
    return weight, torch.empty(fan_out).uniform_(-bound, bound, generator=generator)


def embedding_input_features(model: nn.Module) -> int:
    """The width of the embedding network's input without the label: C·8·8 for a model whose
    first layer is a Conv2d (images pooled to 8 × 8), D for a first Linear (the flattened input)."""
    first = model.get_submodule(layer_order(model)[0])
    if isinstance(first, nn.Conv2d):
        return first.in_channels * POOLED[0] * POOLED[1]
    if isinstance(first, nn.Linear):
        return first.in_features
    raise ConfigError(
        f"pefll's embedding network reads the model's input through its first layer, which must be a "
        f"Conv2d or a Linear; {layer_order(model)[0]!r} is a {type(first).__name__}"
    )


def init_embedding_network(in_features: int, embed_dim: int, generator: torch.Generator) -> Tensors:
    widths = (in_features, *EMBED_WIDTHS, embed_dim)
    psi: Tensors = {}
    for index, (fan_in, fan_out) in enumerate(zip(widths, widths[1:])):
        psi[f"fc{index}.weight"], psi[f"fc{index}.bias"] = linear_init(fan_in, fan_out, generator)
    return psi


def init_hypernetwork(
    embed_dim: int, hidden: int, hidden_layers: int, targets: dict[str, torch.Size], generator: torch.Generator
) -> Tensors:
    phi: Tensors = {}
    for index in range(hidden_layers + 1):
        phi[f"mlp{index}.weight"], phi[f"mlp{index}.bias"] = linear_init(
            embed_dim if index == 0 else hidden, hidden, generator
        )
    for target, shape in targets.items():
        phi[f"out[{target}].weight"], phi[f"out[{target}].bias"] = linear_init(hidden, math.prod(shape), generator)
    return phi


def embed_samples(psi: Tensors, inputs: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """E(x, y; ψ) per sample: the MLP on [x' ‖ one-hot(y)]. x' is the flattened input when ψ was built
    for it (``embedding_input_features``: a model whose first layer is a Linear, e.g. ``mlp`` on
    images), else the image average-pooled to 8 × 8 (a first Conv2d); for 8 × 8 images both agree."""
    flat = inputs.flatten(1)
    if inputs.dim() == 4 and flat.shape[1] + num_classes != psi["fc0.weight"].shape[1]:
        flat = F.adaptive_avg_pool2d(inputs, POOLED).flatten(1)
    features = torch.cat([flat, F.one_hot(labels, num_classes).to(inputs.dtype)], dim=1)
    layers = len(psi) // 2
    for index in range(layers):
        features = F.linear(features, psi[f"fc{index}.weight"], psi[f"fc{index}.bias"])
        if index < layers - 1:
            features = F.relu(features)
    return features


def client_embedding(per_sample_sum: torch.Tensor, count: int) -> torch.Tensor:
    """v = std(Σ E / count): the mean descriptor, standardised over its entries."""
    mean = per_sample_sum / count
    return (mean - mean.mean()) / mean.std()


def generate_weights(
    phi: Tensors, embedding: torch.Tensor, targets: dict[str, torch.Size], hidden_layers: int
) -> Tensors:
    """θ = h(v; φ): z = L_0(v), z ← L_j(ReLU(z)) for j = 1..hidden_layers, θ[t] = out_t(z)."""
    features = F.linear(embedding, phi["mlp0.weight"], phi["mlp0.bias"])
    for index in range(1, hidden_layers + 1):
        features = F.linear(F.relu(features), phi[f"mlp{index}.weight"], phi[f"mlp{index}.bias"])
    return {
        t: F.linear(features, phi[f"out[{t}].weight"], phi[f"out[{t}].bias"]).reshape(s) for t, s in targets.items()
    }


def joint_gradient(generated: Tensors, leaves: Tensors, delta: Tensors) -> Tensors:
    """(∂θ/∂leaves)ᵀ·Δθ: the VJP of the generated tensors (built from ``leaves``) with Δθ."""
    names = list(generated)
    gradients = torch.autograd.grad(
        [generated[n] for n in names],
        list(leaves.values()),
        [delta[n].to(generated[n].dtype) for n in names],
        allow_unused=True,
    )
    return {n: torch.zeros_like(t) if g is None else g for (n, t), g in zip(leaves.items(), gradients)}


def clip_total_norm(gradients: Tensors, max_norm: float) -> Tensors:
    """torch.nn.utils.clip_grad_norm_'s rule: scale by min(1, max_norm/(‖g‖ + 1e-6))."""
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in gradients.values()]))
    scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    return {n: g * scale for n, g in gradients.items()}


@torch.no_grad()
def adam_step(params: Tensors, gradients: Tensors, first: Tensors, second: Tensors, step: int, lr: float) -> None:
    """torch.optim.Adam's step ``step`` (1-based; no weight decay), in place:
    m ← β1·m + (1 − β1)·g, s ← β2·s + (1 − β2)·g², p ← p − lr·(m/(1 − β1^t)) / (√(s/(1 − β2^t)) + ε)."""
    beta1, beta2 = ADAM_BETAS
    for name, param in params.items():
        g = gradients[name]
        first[name].mul_(beta1).add_(g, alpha=1 - beta1)
        second[name].mul_(beta2).addcmul_(g, g, value=1 - beta2)
        denominator = (second[name] / (1 - beta2**step)).sqrt().add_(ADAM_EPS)
        param.sub_(lr * (first[name] / (1 - beta1**step)) / denominator)


# ---- client ------------------------------------------------------------------------------
@dataclass(frozen=True)
class PeFLLHyperparameters:
    embed_dim: int = option(-1, "Client embedding size; -1: int(1 + K/4), the authors' rule (at least 2).")
    hn_hidden: int = option(100, "Width of the hypernetwork's hidden layers (the authors' 100).")
    hn_hidden_layers: int = option(3, "Hidden Linear layers after the first (the authors' 3).")
    hn_lr: float = option(
        2e-4, "Server Adam learning rate of the embedding network and hypernetwork (the authors' 2e-4)."
    )
    hn_max_grad_norm: float = option(50.0, "Clip the mean server gradient to this norm (the authors' 50).")
    embed_batches: int = option(1, "Minibatches a client embeds in training (the authors' 1); evaluation embeds all.")

    def validate(self) -> None:
        if self.embed_dim < 2 and self.embed_dim != -1:
            raise ConfigError(
                f"--embed-dim must be ≥ 2 (the descriptor is standardised over its entries) or -1 (automatic), "
                f"got {self.embed_dim}"
            )
        for flag, value in (("--hn-hidden", self.hn_hidden), ("--embed-batches", self.embed_batches)):
            if value < 1:
                raise ConfigError(f"{flag} must be ≥ 1, got {value}")
        if self.hn_hidden_layers < 0:
            raise ConfigError(f"--hn-hidden-layers must be ≥ 0, got {self.hn_hidden_layers}")
        for flag, fvalue in (("--hn-lr", self.hn_lr), ("--hn-max-grad-norm", self.hn_max_grad_norm)):
            if not fvalue > 0:
                raise ConfigError(f"{flag} must be > 0, got {fvalue}")


def split_networks(received: Tensors) -> tuple[Tensors, Tensors]:
    psi = {n[len(PSI) :]: t for n, t in received.items() if n.startswith(PSI)}
    phi = {n[len(PHI) :]: t for n, t in received.items() if n.startswith(PHI)}
    return psi, phi


class PeFLLProgram(ClientProgram[PeFLLHyperparameters]):
    capabilities = ProgramCapabilities(model_upload=True)
    targets: dict[str, torch.Size] = {}  # the generated (trainable) tensors' shapes (make_program)

    def local_update(self, trainer) -> LocalResult:
        """v_i from ``--embed-batches`` minibatches, θ_i = h(v_i; φ), local training, g_i."""
        hp, data = self.hparams, trainer.data
        psi, phi = split_networks(trainer.job.received)
        leaves = {PSI + n: t.detach().requires_grad_(True) for n, t in psi.items()}
        leaves.update({PHI + n: t.detach().requires_grad_(True) for n, t in phi.items()})
        total, count = None, 0
        for (inputs, labels), _ in zip(trainer.epoch(), range(hp.embed_batches)):
            batch = embed_samples({n: leaves[PSI + n] for n in psi}, inputs, labels, data.num_classes).sum(dim=0)
            total, count = (batch if total is None else total + batch), count + len(labels)
        assert total is not None, "a client without training samples"
        embedding = client_embedding(total, count)
        generated = generate_weights({n: leaves[PHI + n] for n in phi}, embedding, self.targets, hp.hn_hidden_layers)
        trainer.load({n: t.detach() for n, t in generated.items()})
        result = standard_local_update(self, trainer)
        delta = {n: generated[n].detach() - trainer.state[n].detach() for n in generated}
        result.upload = {GRAD + n: g for n, g in joint_gradient(generated, leaves, delta).items()}
        return result


class PeFLLInferenceProgram(ClientProgram[PeFLLHyperparameters]):
    """Evaluation and new clients: v_i from the whole train split with the given ψ, the model
    h(v_i; φ) (no training); uploads the model state to be tested."""

    def __init__(self, layout, hparams, local, psi: Tensors, phi: Tensors, targets: dict[str, torch.Size]) -> None:
        super().__init__(ParamLayout(trainable=layout.trainable, shared=(), private=()), hparams, local)
        self.psi, self.phi, self.targets = psi, phi, targets

    @torch.no_grad()
    def local_update(self, trainer) -> LocalResult:
        data, client = trainer.data, trainer.job.client_id
        device = trainer.device
        psi = {n: t.to(device) for n, t in self.psi.items()}
        phi = {n: t.to(device) for n, t in self.phi.items()}
        total = None
        for batch in data.train_indices[client].split(max(trainer.batch_size, 1)):
            inputs, labels = data.gather(batch)
            part = embed_samples(psi, inputs, labels, data.num_classes).sum(dim=0)
            total = part if total is None else total + part
        assert total is not None, "a client without training samples"
        embedding = client_embedding(total, data.num_train[client])
        trainer.load(generate_weights(phi, embedding, self.targets, self.hparams.hn_hidden_layers))
        upload = {n: trainer.state[n].detach().clone() for n in trainer.job.received}
        return LocalResult(0.0, {}, upload=upload, private={})


# ---- server ------------------------------------------------------------------------------
@register_algorithm("pefll")
class PeFLL(Algorithm[PeFLLHyperparameters]):
    """An embedding network describes each client's data; a hypernetwork turns the description
    into the client's model; both learned from the clients' local updates."""

    capabilities = Capabilities(diagnostics_without_uploads=True, received_personal_model=True)

    display_name = "PeFLL"
    paper = "Scott et al., ICLR 2024"
    method_family = "hypernetwork"
    hyperparameters = PeFLLHyperparameters
    program_class = PeFLLProgram
    has_global_model = False
    checkpoint_attributes = ("psi", "phi", "adam_first", "adam_second", "adam_steps")

    @classmethod
    def check_config(cls, config: RunConfig, hparams: Any) -> None:
        if config.holdout_domain is not None:
            raise ConfigError(
                "pefll generates a client's model from its data; --holdout-domain's ood_acc evaluates each "
                "client's model without its data (leave --holdout-domain unset)"
            )

    @classmethod
    def search_space(cls, config: RunConfig, hparams: Any) -> dict[str, Dimension]:
        """lr around its default; the server lr a decade either side of the authors' 2e-4."""
        return {**super().search_space(config, hparams), "hn_lr": Choice((2e-5, 2e-4, 2e-3))}

    def __init__(self, config: RunConfig, hparams: Any, model: nn.Module, num_train: list[int]) -> None:
        super().__init__(config, hparams, model, num_train)
        self.targets = {n: self.initial_state[n].shape for n in self.layout.trainable}
        if not self.targets:
            raise ConfigError("pefll generates the model's trainable parameters; this model has none")
        reference = self.initial_state[self.layout.trainable[0]]
        in_features = embedding_input_features(model) + final_linear_layer(model, "pefll")[1].out_features
        embed_dim = hparams.embed_dim if hparams.embed_dim > 0 else max(2, int(1 + len(num_train) / 4))
        generator = torch.Generator().manual_seed(derive_seed(config.seed, "pefll.init"))
        self.psi = {
            n: t.to(reference.device) for n, t in init_embedding_network(in_features, embed_dim, generator).items()
        }
        self.phi = {
            n: t.to(reference.device)
            for n, t in init_hypernetwork(
                embed_dim, hparams.hn_hidden, hparams.hn_hidden_layers, self.targets, generator
            ).items()
        }
        self.adam_first = {PSI + n: torch.zeros_like(t) for n, t in self.psi.items()}
        self.adam_first.update({PHI + n: torch.zeros_like(t) for n, t in self.phi.items()})
        self.adam_second = {n: torch.zeros_like(t) for n, t in self.adam_first.items()}
        self.adam_steps = 0
        self.program.targets = self.targets  # type: ignore[attr-defined]

    def select_shared(self, names: list[str]) -> list[str]:
        """Nothing of the model is averaged: its weights are generated, its buffers private."""
        return []

    def broadcast(self, client_id: int) -> Tensors:
        return {**{PSI + n: t for n, t in self.psi.items()}, **{PHI + n: t for n, t in self.phi.items()}}

    def aggregate(self, updates: list[ClientUpdate]) -> None:
        """The uniform mean of the clients' g_i, clipped, one Adam step on (ψ, φ)."""
        if not updates:
            return
        names = list(self.adam_first)
        mean = {n: sum(u.params[GRAD + n] for u in updates) / len(updates) for n in names}
        clipped = clip_total_norm(mean, self.hparams.hn_max_grad_norm)  # type: ignore[arg-type]
        params = {**{PSI + n: t for n, t in self.psi.items()}, **{PHI + n: t for n, t in self.phi.items()}}
        self.adam_steps += 1
        adam_step(params, clipped, self.adam_first, self.adam_second, self.adam_steps, self.hparams.hn_lr)

    def personalization_program(self) -> ClientProgram | None:
        return PeFLLInferenceProgram(
            self.layout,
            self.hparams,
            self.config.local_spec,
            {n: t.detach().clone() for n, t in self.psi.items()},
            {n: t.detach().clone() for n, t in self.phi.items()},
            self.targets,
        )

    def new_client_program(self) -> ClientProgram | None:
        return self.personalization_program()

    def clients_share_one_model(self) -> bool:
        return False
