"""FedEM — Marfoq, Neglia, Bellet, Kameni & Vidal, "Federated Multi-Task Learning under a Mixture
of Distributions", NeurIPS 2021 (arXiv:2108.10252; authors' code: omarfoq/FedEM).

Each client's data distribution is assumed to be a mixture of M shared underlying distributions:
D_t = Σ_m π_tm·D̃_m. The server holds M component models θ_1..θ_M (``--components``); client t
holds its mixture weights π_t (on the simplex, π_t⁰ = 1/M) and predicts with the mixture

    p_t(y|x) = Σ_m π_tm·softmax(h_{θ_m}(x))_y                              (``mixture_prediction``)

Each round a sampled client runs one EM step of the federated surrogate (Alg. 1/2 of the paper):

    E-step:  q_t(z_i = m) = π_tm·exp(−ℓ(h_{θ_m}(x_i), y_i)) / Σ_m' π_tm'·exp(−ℓ(h_{θ_m'}(x_i), y_i))
             over its train samples i (``responsibilities``: a softmax of log π − ℓ)
    M-step:  π_tm ← (1/n_t)·Σ_i q_t(z_i = m)                                (``mixture_weights``)
             θ_m ← ``--local-epochs`` epochs of the run's optimizer on (1/B)·Σ_{i ∈ batch} q_t(z_i = m)·ℓ(h_{θ_m}(x_i), y_i)

and uploads the M trained components; the server averages each component over the round's
clients, θ_m ← Σ_t n_t·θ_m^t / Σ_t n_t (the FedAvg rule per component, the authors' centralized
aggregator).

Defaults: M = 3 (``--components``: the authors' ``--n_learners`` in every paper experiment). The
E-step losses are computed in eval mode over the whole train split, before any training (the
authors' ``gather_losses``); the weighted batch loss divides by the batch size (their
``(loss · weights).sum() / len(loss)``); the components train one after the other, each from the
received θ_m, with a fresh optimizer (theirs keep one optimizer per learner across rounds: the
same for SGD without momentum).

Choices the paper leaves open, and what this file does:

- Initialisation: component 1 is the run's initial model; component m ≥ 2 re-initialises every
  module whose own parameters are all trainable (``reset_parameters``) from the seed
  ``derive_seed(seed, "fedem.init", m)`` (the authors seed each learner differently).
- Implementation: ``configure_model`` adds components 2..M as submodules ``fedem_2``, ... and the
  buffer ``fedem_pi`` (π, private: it never travels) to the model, and a forward hook that in eval
  mode returns log p_t(y|x) (argmax = the mixture's prediction; cross-entropy of it = the mixture's
  negative log-likelihood). The model's own parameters are component 1. In train mode the hook is
  off (each component trains on its own outputs).
- Evaluation: ``pers_acc`` uses the client's π_t with the current components (a client never
  trained: π = 1/M); ``global_acc`` the uniform mixture π = 1/M.
- New clients (``--new-clients``): the paper's procedure for unseen clients — π learned by EM on
  the client's train split with the components frozen (``FedEMNewClientProgram``), here
  ``--local-epochs`` EM iterations from π = 1/M (this suite's count; the paper does not fix one).

What travels: down and up, the M components (M models); π stays on the client. Refused:
``--executor vmap``, ``--dp``, model poisoning and ``--robust-agg`` (the EM step is a custom local
update, which the engine refuses for them).
"""

from __future__ import annotations

import copy
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
    ConfigError,
    Dimension,
    LocalResult,
    ProgramCapabilities,
    RunConfig,
    option,
    register_algorithm,
)
from pflbench.engine import LocalTrainer
from pflbench.util.seeding import derive_seed

PI = "fedem_pi"  # the model buffer holding the client's mixture weights π_t (private)
COMPONENT = "fedem_"  # components 2..M are the submodules fedem_2, ..., fedem_M
MIXING = "fedem_mixing"  # model attribute: False turns the eval-mode mixture off (the E-step)
LOSS_CHUNK = 1024  # samples per forward pass of the E-step


# ---- the math ----------------------------------------------------------------------------
def responsibilities(losses: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """E-step: q[m, i] = π_m·e^{−ℓ[m, i]} / Σ_m' π_m'·e^{−ℓ[m', i]} for losses ℓ (M × n), π (M)."""
    return torch.softmax(torch.log(weights).unsqueeze(1) - losses, dim=0)


def mixture_weights(q: torch.Tensor) -> torch.Tensor:
    """M-step for π: π_m = (1/n)·Σ_i q[m, i]."""
    return q.mean(dim=1)


def mixture_prediction(logits: list[torch.Tensor], weights: torch.Tensor) -> torch.Tensor:
    """p(y|x) = Σ_m π_m·softmax(logits_m) (batch × classes)."""
    return sum(w * torch.softmax(out.float(), dim=1) for w, out in zip(weights, logits))  # type: ignore[return-value]


def component_name(index: int) -> str:
    """The submodule of component ``index`` (0-based; component 0 is the model itself)."""
    return f"{COMPONENT}{index + 1}"


def component_prefix(index: int) -> str:
    return "" if index == 0 else component_name(index) + "."


class MixtureOutput:
    """Forward hook of the configured model: in eval mode (and unless the model's ``fedem_mixing``
    is False) its own output, component 1's, becomes log Σ_m π_m·softmax(h_m(x))."""

    def __init__(self, components: int) -> None:
        self.components = components

    def __call__(self, module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        if module.training or not getattr(module, MIXING, True):
            return output
        logits = [output, *(module.get_submodule(component_name(m))(args[0]) for m in range(1, self.components))]
        probabilities = mixture_prediction(logits, getattr(module, PI).float())
        return torch.log(probabilities.clamp(min=1e-30))


def reinitialised(model: nn.Module, seed: int) -> nn.Module:
    """A copy of ``model`` with every fully trainable module re-initialised from ``seed`` (on the CPU,
    the global random streams untouched), moved back to the model's device."""
    device = next(model.parameters()).device
    fresh = copy.deepcopy(model).cpu()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for module in fresh.modules():
            own = list(module.parameters(recurse=False))
            reset = getattr(module, "reset_parameters", None)
            if own and all(p.requires_grad for p in own) and callable(reset):
                reset()
    return fresh.to(device)


# ---- client ------------------------------------------------------------------------------
@dataclass(frozen=True)
class FedEMHyperparameters:
    components: int = option(3, "M: the shared component models every client mixes (the authors' 3).")

    def validate(self) -> None:
        if self.components < 1:
            raise ConfigError(f"--components must be ≥ 1, got {self.components}")


class FedEMProgram(ClientProgram[FedEMHyperparameters]):
    """One EM step: responsibilities and π from the received components, then each component
    trained on its responsibility-weighted loss."""

    capabilities = ProgramCapabilities(model_upload=True)

    def component_names(self, index: int) -> tuple[str, ...]:
        if index == 0:
            return tuple(n for n in self.layout.trainable if not n.startswith(COMPONENT))
        prefix = component_prefix(index)
        return tuple(n for n in self.layout.trainable if n.startswith(prefix))

    def component(self, trainer: LocalTrainer, index: int) -> nn.Module:
        return trainer.model if index == 0 else trainer.model.get_submodule(component_name(index))

    @torch.no_grad()
    def train_losses(self, trainer: LocalTrainer) -> torch.Tensor:
        """ℓ[m, i]: per-sample cross-entropy of every component on the client's train split, in
        eval mode, in the order of ``train_indices``."""
        indices = trainer.data.train_indices[trainer.job.client_id]
        model = trainer.model
        model.eval()
        setattr(model, MIXING, False)
        try:
            rows = []
            for m in range(self.hparams.components):
                parts = []
                for start in range(0, len(indices), LOSS_CHUNK):
                    inputs, targets = trainer.data.gather(indices[start : start + LOSS_CHUNK])
                    with trainer.autocast():
                        logits = self.component(trainer, m)(inputs)
                    parts.append(F.cross_entropy(logits.float(), targets, reduction="none"))
                rows.append(torch.cat(parts))
        finally:
            setattr(model, MIXING, True)
            model.train()
        return torch.stack(rows)

    def weights(self, trainer: LocalTrainer) -> torch.Tensor:
        return trainer.job.private[PI].float() if PI in trainer.job.private else trainer.state[PI].float()

    def local_update(self, trainer: LocalTrainer) -> LocalResult:
        q = responsibilities(self.train_losses(trainer), self.weights(trainer))
        pi = mixture_weights(q)
        indices = trainer.data.train_indices[trainer.job.client_id]
        position = torch.full((int(indices.max()) + 1,), -1, dtype=torch.long, device=indices.device)
        position[indices] = torch.arange(len(indices), device=indices.device)
        spec = self.optimizer()
        total = torch.zeros((), device=trainer.device)
        steps = 0
        trainer.model.train()
        for m in range(self.hparams.components):
            params = trainer.train_only(frozenset(self.component_names(m)), self.layout.trainable)
            optimizer = trainer.optimizer(spec, params)
            module = self.component(trainer, m)
            for _ in range(self.local.epochs):
                for batch in trainer.data.train_batch_indices(
                    trainer.job.client_id, trainer.batch_size, trainer.generator
                ):
                    inputs, targets = trainer.data.gather(batch)
                    weights = q[m, position[batch]]
                    with trainer.autocast():
                        logits = module(inputs)
                    losses = F.cross_entropy(logits.float(), targets, reduction="none")
                    loss = (weights * losses).sum() / len(losses)
                    trainer.step(optimizer, loss, params, spec.max_grad_norm)
                    total += loss.detach()
                    steps += 1
        trainer.train_only(frozenset(self.layout.trainable), self.layout.trainable)
        trainer.load({PI: pi.to(trainer.state[PI].dtype)})
        mean = float(total) / max(steps, 1)
        return LocalResult(mean if steps else float("nan"), {"task": mean} if steps else {}, steps=steps)


class FedEMNewClientProgram(FedEMProgram):
    """A new client: π by EM with the components frozen (``epochs`` iterations from 1/M); uploads
    the whole model state with that π (evaluated)."""

    def __init__(self, layout, hparams, local, epochs: int) -> None:
        super().__init__(layout, hparams, local)
        self.epochs = epochs

    def local_update(self, trainer: LocalTrainer) -> LocalResult:
        losses = self.train_losses(trainer)
        pi = self.weights(trainer)
        for _ in range(self.epochs):
            pi = mixture_weights(responsibilities(losses, pi))
        trainer.load({PI: pi.to(trainer.state[PI].dtype)})
        state = {n: trainer.state[n].detach().clone() for n in trainer.job.received}
        return LocalResult(float("nan"), {}, upload=state, private={})


# ---- server ------------------------------------------------------------------------------
@register_algorithm("fedem")
class FedEM(Algorithm[FedEMHyperparameters]):
    """M shared component models; each client learns its mixture weights by EM."""

    capabilities = Capabilities.of_defaults()

    display_name = "FedEM"
    paper = "Marfoq et al., NeurIPS 2021"
    method_family = "multi_task"
    hyperparameters = FedEMHyperparameters
    program_class = FedEMProgram

    @classmethod
    def search_space(cls, config: RunConfig, hparams: FedEMHyperparameters) -> dict[str, Dimension]:
        """lr around its default and M over the values the paper's ablation covers (1 is FedAvg)."""
        return {**super().search_space(config, hparams), "components": Choice((2, 3, 4, 5))}

    @classmethod
    def check_config(cls, config: RunConfig, hparams: FedEMHyperparameters) -> None:
        if hparams.components > 32:
            raise ConfigError(
                f"--components {hparams.components}: every client trains and sends that many copies of the "
                "model each round; give --components in [1, 32]"
            )

    @classmethod
    def configure_model(cls, model: nn.Module, config: RunConfig, hparams: FedEMHyperparameters) -> dict[str, Any]:
        record = super().configure_model(model, config, hparams)
        if any(name.startswith(COMPONENT) for name, _ in model.named_children()):
            raise ConfigError(f"fedem: the model already has a submodule named {COMPONENT}*")
        base = copy.deepcopy(model)
        for m in range(1, hparams.components):
            model.add_module(component_name(m), reinitialised(base, derive_seed(config.seed, "fedem.init", m)))
        parameter = next(model.parameters())
        model.register_buffer(PI, torch.full((hparams.components,), 1.0 / hparams.components, device=parameter.device))
        setattr(model, MIXING, True)
        model.register_forward_hook(MixtureOutput(hparams.components))
        return {**record, "fedem": f"{hparams.components} components (the model + fedem_2..), π in {PI} (private)"}

    def select_shared(self, names: list[str]) -> list[str]:
        if PI not in names:
            raise ConfigError("fedem: the model has no mixture weights (configure_model not applied)")
        return [n for n in names if n != PI]

    def new_client_program(self) -> ClientProgram:
        return FedEMNewClientProgram(self.layout, self.hparams, self.config.local_spec, self.config.local_epochs)

    def final_report(self) -> tuple[dict[str, Any], dict[str, list[Any]]]:
        """clients.csv: each client's π (the initial 1/M for clients never sampled)."""
        return {}, {
            "fedem_pi": [
                " ".join(f"{float(w):.4f}" for w in self.store.get(k)[PI]) for k in range(self.config.num_clients)
            ]
        }
