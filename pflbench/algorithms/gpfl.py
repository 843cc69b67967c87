"""GPFL — Zhang, Hua, Wang, Song, Xue, Ma, Cao & Guan, "GPFL: Simultaneously Learning Global and
Personalized Feature Information for Personalized Federated Learning", ICCV 2023
(arXiv:2308.10279).

A Conditional Valve (CoV) after the feature extractor turns each sample's feature into a global
feature (guided by a Global Category Embedding layer, GCE) and a personalized feature (fed to the
client's own head). With z = f(x; θ) ∈ R^D the representation (the input of the model's final
classifier layer, as in MOON / FedRoD / FedDBE: ``head_module_names(model, 1)``), W ∈ R^{C×D} the
GCE's category embeddings and α_{k,c} = n_{k,c}/n_k client k's train label shares:

- conditional inputs (``conditional_inputs``): global g = (1/C)·Σ_c W[c], personalized
  p_k = Σ_c α_{k,c}·W[c], from the GCE the client received (constants in its local update);
- CoV (``valve``): γ(c) = LN(ReLU(A_γ·c + a_γ)), β(c) = LN(ReLU(A_β·c + a_β)) (shared),
  CoV(z, c) = ReLU(z ⊙ (γ(c) + 1) + β(c));  f_G = CoV(z, g),  f_P = CoV(z, p_k);
- prediction: ŷ = h(f_P; φ_k), φ_k the client's private head (the model's classifier);
- angle-level guidance (``angle_level_loss``): CE over the cosines cos(f_G, W[c]) (no scale);
- magnitude-level guidance (``magnitude_level_loss``): ‖f_G − W̄[y]‖, the Frobenius norm over the
  batch of the distance to the received embeddings W̄ (frozen);
- local loss: CE(ŷ, y) + L_angle + λ·L_magnitude + μ·½(‖θ_CoV‖² + ‖W‖²) (``squared_norm``);
- θ, the CoV and the GCE are shared and averaged sample-weighted (FedAvg's rule); φ_k and the
  client's conditional inputs never leave it.

Choices the paper leaves open, and what the authors' code (TsingZ0/GPFL = PFLlib's ``clientgpfl``
/ ``servergpfl``) does:

- ``--magnitude-weight`` λ = 0.01 and ``--module-decay`` μ = 0.1: the authors' setting for the
  4-layer CNN and the 3-layer MLP (``run_me.sh``; 1e-4 / 0 for ResNet-18 and fastText).
- μ: the authors apply it as SGD weight decay on the CoV's and the GCE's parameters only (their own
  optimizers); the term μ·½‖·‖² above has exactly that gradient (μ·w) under SGD, and is Adam's
  coupled weight decay under Adam. Their CoV and GCE optimizers use the local lr like the model's;
  here one optimizer (the run's) holds all of them (identical under SGD).
- The magnitude-level loss is their ``torch.norm(f_G − emb, 2)``: the norm of the whole batch's
  difference, not squared and not averaged (its scale grows with √batch size); we keep it.
- Conditional inputs: the authors compute g and p_k after each aggregation, for every client, from
  the client's own GCE *before* the new global one is loaded (a participant's locally trained GCE:
  one round behind), and use zeros before the first aggregation. We compute them at the start of
  each local update from the GCE the client received (the global one, which the paper's
  definition names) and keep them for evaluation until the client trains again.
- The CoV and the GCE are fresh modules (``Linear(D, D)`` ×2 with their LayerNorms; an
  ``Embedding(C, D)``, N(0, 1)) initialised from a stream seeded by the run's seed (``gpfl.modules``),
  so the rest of the model's initialisation is unchanged.

Evaluation: the personal model is θ, the CoV and the GCE from the server with the client's head
φ_k and conditional inputs (``pers_acc``); no global model (the paper reports personalized accuracy
only; ``global_acc`` is null). Bytes: θ, the CoV and the GCE both ways. The local update is custom
(the conditional inputs from the received GCE), so ``--executor vmap`` and ``--dp`` are refused by
the engine; ``--head-layers`` other than 1 is refused (the CoV sits at the final layer's input).

New clients (``--new-clients``): θ, the CoV and the GCE from the server (frozen), the conditional
inputs from the received GCE and the new client's train label shares, and a fresh (the initial)
head trained on its train split for ``--local-epochs`` epochs with the cross-entropy of ŷ — GPFL's
local loss restricted to the head (the guidance terms do not depend on it)
(``GPFLNewClientProgram``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pflbench import (
    Algorithm,
    Capabilities,
    ClientProgram,
    ConfigError,
    LocalPhase,
    LocalResult,
    ParamLayout,
    ProgramCapabilities,
    RunConfig,
    option,
    register_algorithm,
    standard_local_update,
)
from pflbench.models.zoo import final_linear_layer, head_module_names
from pflbench.util.seeding import derive_seed

HEAD, EMBEDDING = "head", "embedding"
PERSONALIZED_INPUT, GLOBAL_INPUT = "personalized_input", "global_input"  # private buffers
VALVE_PARTS = ("gamma", "beta")  # the CoV's two conditional layers


# ---- the math ----------------------------------------------------------------------------
def conditional_inputs(embeddings: torch.Tensor, class_shares: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(g, p): g = (1/C)·Σ_c W[c], p = Σ_c α_c·W[c] (α: the client's label shares)."""
    embeddings = embeddings.detach()
    return embeddings.mean(dim=0), class_shares.to(embeddings.dtype) @ embeddings


def valve(features: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """CoV(z, c) = ReLU(z ⊙ (γ + 1) + β), γ = γ(c), β = β(c)."""
    return torch.relu(features * (gamma + 1) + beta)


def angle_level_loss(features: torch.Tensor, embeddings: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """CE over the cosines between each global feature and each category embedding."""
    return F.cross_entropy(F.linear(F.normalize(features), F.normalize(embeddings)), targets)


def magnitude_level_loss(features: torch.Tensor, embeddings: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """‖f_G − W̄[y]‖: the Frobenius norm over the batch (W̄: the received embeddings, constants)."""
    return torch.linalg.vector_norm(features - embeddings.detach()[targets])


def squared_norm(tensors: list[torch.Tensor]) -> torch.Tensor:
    """½·Σ ‖w‖² (its gradient μ·w under weight μ: SGD weight decay μ)."""
    return 0.5 * sum(t.pow(2).sum() for t in tensors)  # type: ignore[return-value]


def class_shares(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """α_c = n_c / n."""
    counts = torch.bincount(labels, minlength=num_classes).float()
    return counts / counts.sum()


class ConditionalValveHead(nn.Module):
    """The model's final classifier replaced by CoV (shared) + GCE (shared) + the client's head
    φ_k (the original layer, private) + the client's conditional inputs (private buffers).

    Returns ŷ = h(CoV(z, p)) and attaches the global feature CoV(z, g) (``gpfl_global``) and the
    category embeddings in use (``gpfl_embeddings``) for the guidance losses."""

    def __init__(self, head: nn.Linear, num_classes: int, module_seed: int) -> None:
        super().__init__()
        width, device, dtype = head.in_features, head.weight.device, head.weight.dtype
        self.head = head
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(module_seed)  # the new modules' own stream: the model's other weights unchanged
            self.gamma = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.LayerNorm(width)).to(device, dtype)
            self.beta = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.LayerNorm(width)).to(device, dtype)
            self.embedding = nn.Embedding(num_classes, width, device=device, dtype=dtype)
        self.register_buffer(PERSONALIZED_INPUT, torch.zeros(width, device=device, dtype=dtype))
        self.register_buffer(GLOBAL_INPUT, torch.zeros(width, device=device, dtype=dtype))

    def route(self, features: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
        return valve(features, self.gamma(condition), self.beta(condition))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        output = self.head(self.route(features, getattr(self, PERSONALIZED_INPUT)))
        output.gpfl_global = self.route(features, getattr(self, GLOBAL_INPUT))  # read by the guidance losses
        output.gpfl_embeddings = self.embedding.weight
        return output


# ---- client ------------------------------------------------------------------------------
@dataclass(frozen=True)
class GPFLHyperparameters:
    magnitude_weight: float = option(
        0.01, "λ: weight of the magnitude-level guidance ‖f_G − W[y]‖ (the authors' CNN/MLP setting: 0.01)."
    )
    module_decay: float = option(
        0.1, "μ: weight decay of the CoV and the GCE, μ·½‖·‖² (the authors' CNN/MLP setting: 0.1)."
    )

    def validate(self) -> None:
        if not self.magnitude_weight >= 0:
            raise ConfigError(f"--magnitude-weight must be ≥ 0, got {self.magnitude_weight}")
        if not self.module_decay >= 0:
            raise ConfigError(f"--module-decay must be ≥ 0, got {self.module_decay}")


class GPFLProgram(ClientProgram[GPFLHyperparameters]):
    capabilities = ProgramCapabilities(model_upload=True)
    head_module: str = ""  # the final classifier layer (make_program)

    def __init__(self, layout, hparams, local) -> None:
        super().__init__(layout, hparams, local)
        self.loss_weights = {"magnitude": hparams.magnitude_weight, "regularisation": hparams.module_decay}

    def name(self, part: str) -> str:
        return f"{self.head_module}.{part}"

    def regularised(self) -> list[str]:
        """The CoV's and the GCE's parameters (μ's weight decay)."""
        prefixes = tuple(self.name(part) + "." for part in (*VALVE_PARTS, EMBEDDING))
        return [n for n in self.layout.trainable if n.startswith(prefixes)]

    def loss_terms(self, forward, params, inputs, targets, received):
        output = forward(params, inputs)
        global_features = output.gpfl_global
        return {
            "task": F.cross_entropy(output, targets),
            "angle": angle_level_loss(global_features, output.gpfl_embeddings, targets),
            "magnitude": magnitude_level_loss(global_features, received[self.name(EMBEDDING) + ".weight"], targets),
            "regularisation": squared_norm([params[n] for n in self.regularised()]),
        }

    def load_conditional_inputs(self, trainer) -> None:
        """g and p_k from the received GCE and the client's train label shares, into the model."""
        data, client = trainer.data, trainer.job.client_id
        shares = class_shares(data.labels[data.train_indices[client]], data.num_classes)
        embeddings = trainer.job.received[self.name(EMBEDDING) + ".weight"]
        global_input, personalized_input = conditional_inputs(embeddings, shares.to(embeddings.device))
        trainer.load({self.name(GLOBAL_INPUT): global_input, self.name(PERSONALIZED_INPUT): personalized_input})

    def local_update(self, trainer) -> LocalResult:
        """The conditional inputs of this round, then the engine's batch loop."""
        self.load_conditional_inputs(trainer)
        return standard_local_update(self, trainer)


class GPFLNewClientProgram(GPFLProgram):
    """A new client: its conditional inputs, then ``epochs`` epochs of the cross-entropy of ŷ over
    its head alone; uploads the model state (evaluated)."""

    def __init__(self, layout, hparams, local, epochs: int, head_module: str) -> None:
        super().__init__(ParamLayout(trainable=layout.trainable, shared=(), private=()), hparams, local)
        self.epochs, self.head_module = epochs, head_module

    def local_phases(self, client_id: int) -> list[LocalPhase]:
        head = self.name(HEAD) + "."
        return [LocalPhase(self.epochs, frozenset(n for n in self.layout.trainable if n.startswith(head)))]

    def loss_terms(self, forward, params, inputs, targets, received):
        return {"task": F.cross_entropy(forward(params, inputs), targets)}

    def local_update(self, trainer) -> LocalResult:
        result = super().local_update(trainer)
        result.upload = {n: trainer.state[n].detach().clone() for n in trainer.job.received}
        result.private = {}
        return result


# ---- server ------------------------------------------------------------------------------
@register_algorithm("gpfl")
class GPFL(Algorithm[GPFLHyperparameters]):
    """Shared body, CoV and GCE; a private head on the personalized route of the valve."""

    capabilities = Capabilities.of_defaults()

    display_name = "GPFL"
    paper = "Zhang et al., ICCV 2023"
    method_family = "representation"
    hyperparameters = GPFLHyperparameters
    program_class = GPFLProgram
    has_global_model = False  # the paper evaluates the personalized route only

    @classmethod
    def check_config(cls, config: RunConfig, hparams: GPFLHyperparameters) -> None:
        if config.head_layers != 1:
            raise ConfigError(
                f"gpfl's conditional valve sits at the final layer's input; --head-layers {config.head_layers} "
                "would be ignored (leave it at 1)"
            )

    @classmethod
    def configure_model(cls, model: nn.Module, config: RunConfig, hparams: GPFLHyperparameters) -> dict[str, Any]:
        record = super().configure_model(model, config, hparams)
        name, head = final_linear_layer(model, "gpfl")
        valve_head = ConditionalValveHead(head, head.out_features, derive_seed(config.seed, "gpfl.modules"))
        valve_head.train(head.training)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, valve_head)
        return {
            **record,
            "gpfl_valve": f"{name}.gamma/beta (CoV) + {name}.{EMBEDDING} (GCE) shared, {name}.{HEAD} private",
        }

    def __init__(self, config: RunConfig, hparams: GPFLHyperparameters, model: nn.Module, num_train: list[int]) -> None:
        self.head_module = head_module_names(model, 1)[0]
        super().__init__(config, hparams, model, num_train)

    def select_shared(self, names: list[str]) -> list[str]:
        """Everything but the head and the conditional inputs."""
        private = tuple(f"{self.head_module}.{part}" for part in (HEAD + ".", PERSONALIZED_INPUT, GLOBAL_INPUT))
        if f"{self.head_module}.{EMBEDDING}.weight" not in names:
            raise ConfigError("gpfl: the model has no conditional valve (configure_model not applied)")
        return [n for n in names if not n.startswith(private)]

    def make_program(self) -> ClientProgram:
        program = super().make_program()
        program.head_module = self.head_module  # type: ignore[attr-defined]
        return program

    def new_client_program(self) -> ClientProgram | None:
        return GPFLNewClientProgram(
            self.layout, self.hparams, self.config.local_spec, self.new_client_epochs(), self.head_module
        )
