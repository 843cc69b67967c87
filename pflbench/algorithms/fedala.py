"""FedALA — Zhang et al., "FedALA: Adaptive Local Aggregation for Personalized Federated
Learning", AAAI 2023 (arXiv:2212.01197).

Before local training, client k initialises its model by adaptive local aggregation (ALA) of the
received global model θ_g into its old local model θ_l:

- the top ``--layer-idx`` p layers (of the model's declared layer order): element-wise
  θ̂ = θ_l + (θ_g − θ_l) ⊙ W with weights W ∈ [0, 1] (``ala_combine``);
- every lower layer (and every buffer): θ̂ = θ_g.

W (init 1, kept by the client) is learned on a random ``--rand-percent`` s% sample of the
client's train data, minimising the CE of θ̂(W), by

    W ← clip(W − η·(∇_θ̂ L ⊙ (θ_g − θ_l)), 0, 1)                   (``ala_weight_step``, ``--eta``)

once per minibatch: the first time ALA runs on a client, epochs over the sample until the
epoch losses converge (standard deviation of the last ``--num-pre-loss`` epoch mean losses below
``--threshold``, at most ``--ala-max-epochs`` epochs, a safety cap that is not in the paper);
afterwards one epoch per round. Then ordinary local training from θ̂; the trained model is the
new θ_l and is uploaded; the server averages FedAvg-style (sample-weighted).

A client's first participation has no local model yet: it starts from θ_g (ALA starts on its
next participation, as the paper's ALA is idle while θ_l = θ_g).

Defaults: η = 1.0, s = 80 and p = 1 as in the paper; threshold 0.1 and 10 losses as in the
authors' released code. The random sample is drawn from the job's seed.

State and bytes: the full model travels both ways (counted). Private, in the ClientStateStore
and never counted: the client's local model θ_l (``fedala.local.<name>``) and W
(``fedala.weight.<param>``). Evaluation: a client's personalized model is its ALA aggregate
θ̂ of the current global model with its stored θ_l and W (learning W needs the client's data,
so the evaluation uses the W of its last round); a client that never trained evaluates θ_g.
The global model is the FedAvg average.

New clients (``--new-clients``): a new client has no local model θ_l, so ALA has nothing to
aggregate into (as on a client's first participation): it is served by the global model θ_g (with
``--finetune-epochs E`` also fine-tuned: ``new_acc_ft``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from pflbench import (
    Algorithm,
    Capabilities,
    ClientProgram,
    ConfigError,
    LocalResult,
    ProgramCapabilities,
    Tensors,
    option,
    register_algorithm,
)
from pflbench.engine import standard_local_update
from pflbench.models.zoo import layer_order
from pflbench.util.seeding import derive_seed

LOCAL = "fedala.local."  # θ_l, private
WEIGHT = "fedala.weight."  # W, private
PREFIX = "fedala."


def ala_combine(local: torch.Tensor, received: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """θ̂ = θ_l + (θ_g − θ_l) ⊙ W."""
    return local + (received - local) * weight


def ala_weight_step(
    weight: torch.Tensor, gradient: torch.Tensor, local: torch.Tensor, received: torch.Tensor, eta: float
) -> torch.Tensor:
    """W ← clip(W − η·∇_θ̂L ⊙ (θ_g − θ_l), 0, 1) (the chain rule through ``ala_combine``)."""
    return (weight - eta * gradient * (received - local)).clamp(0, 1)


def converged(losses: list[float], window: int, threshold: float) -> bool:
    """Whether the last ``window`` losses have a (population) standard deviation < threshold."""
    if len(losses) < window:
        return False
    recent = losses[-window:]
    mean = sum(recent) / window
    return math.sqrt(sum((x - mean) ** 2 for x in recent) / window) < threshold


def sample_batches(sample: torch.Tensor, batch_size: int) -> list[torch.Tensor]:
    """``sample`` in order, in batches of ``batch_size``; as in the engine's epochs, no batch
    holds a single sample (BatchNorm cannot take its statistics): a trailing one joins the
    previous batch and a one-sample ``sample`` is doubled."""
    if batch_size > 1 and len(sample) == 1:
        sample = sample.repeat(2)
    starts = list(range(0, len(sample), batch_size))
    if batch_size > 1 and len(starts) > 1 and len(sample) - starts[-1] == 1:
        starts.pop()
    return [sample[a:b] for a, b in zip(starts, starts[1:] + [len(sample)])]


@dataclass(frozen=True)
class FedALAHyperparameters:
    eta: float = option(1.0, "Learning rate η of the ALA weights W (the paper's 1.0).")
    rand_percent: float = option(80.0, "s: percent of the client's train data sampled to learn W (the paper's 80).")
    layer_idx: int = option(
        1, "p: number of top layers aggregated element-wise by ALA; lower layers take the global model (the paper's 1)."
    )
    threshold: float = option(
        0.1,
        "W converges at a client's first ALA when the std of the last "
        "--num-pre-loss epoch losses is below this (authors' code: 0.1).",
    )
    num_pre_loss: int = option(10, "Number of epoch losses in the convergence test (authors' code: 10).")
    ala_max_epochs: int = option(100, "Cap on the epochs of the first W learning (a safety bound, not in the paper).")

    def validate(self) -> None:
        if not self.eta > 0:
            raise ConfigError(f"--eta must be > 0, got {self.eta}")
        if not 0 < self.rand_percent <= 100:
            raise ConfigError(f"--rand-percent must be in (0, 100], got {self.rand_percent}")
        if self.layer_idx < 1:
            raise ConfigError(f"--layer-idx must be ≥ 1, got {self.layer_idx}")
        if self.threshold < 0 or self.num_pre_loss < 1 or self.ala_max_epochs < 1:
            raise ConfigError("--threshold must be ≥ 0, --num-pre-loss and --ala-max-epochs ≥ 1")


class FedALAProgram(ClientProgram[FedALAHyperparameters]):
    capabilities = ProgramCapabilities(model_upload=True)

    def model_names(self) -> tuple[str, ...]:
        return self.layout.shared + self.layout.private

    def assemble(self, received: Tensors, private: Tensors) -> Tensors:
        """θ̂ with the stored W (1 where none yet); θ_g when the client has no local model."""
        state = {n: t for n, t in {**received, **private}.items() if not n.startswith(PREFIX)}
        if LOCAL + self.model_names()[0] not in private:
            return state
        for n in self.layout.groups["ala"]:
            weight = private.get(WEIGHT + n)
            state[n] = received[n] if weight is None else ala_combine(private[LOCAL + n], received[n], weight)
        return state

    def learn_weights(self, trainer, start_phase: bool) -> tuple[Tensors, int]:
        """W after one epoch (or, in the start phase, epochs until convergence) of
        ``ala_weight_step`` over a random s% sample; returns (W, epochs)."""
        job, hparams = trainer.job, self.hparams
        received, private = job.received, job.private
        names = self.layout.groups["ala"]
        local = {n: private[LOCAL + n] for n in names}
        weights = {n: private.get(WEIGHT + n, torch.ones_like(received[n])).clone() for n in names}
        base = {n: trainer.state[n].detach().clone() for n in self.model_names()}  # θ̂, lower layers θ_g
        indices = trainer.data.train_indices[job.client_id]
        generator = torch.Generator().manual_seed(derive_seed(job.seed, "fedala.sample"))
        count = max(1, int(len(indices) * hparams.rand_percent / 100))
        sample = indices[torch.randperm(len(indices), generator=generator)[:count].to(indices.device)]
        losses: list[float] = []
        epochs = hparams.ala_max_epochs if start_phase else 1
        for _ in range(epochs):
            total, batches = torch.zeros(()), 0
            for chunk in sample_batches(sample, self.local.batch_size):
                inputs, targets = trainer.data.gather(chunk)
                top = {n: ala_combine(local[n], received[n], weights[n]).requires_grad_() for n in names}
                loss = F.cross_entropy(trainer.forward({**base, **top}, inputs), targets)
                gradients = torch.autograd.grad(loss, [top[n] for n in names])
                with torch.no_grad():
                    for n, gradient in zip(names, gradients):
                        weights[n] = ala_weight_step(weights[n], gradient, local[n], received[n], hparams.eta)
                total, batches = total + loss.detach().cpu(), batches + 1
            losses.append(float(total) / max(batches, 1))
            if start_phase and converged(losses, hparams.num_pre_loss, hparams.threshold):
                break
        return weights, len(losses)

    def local_update(self, trainer) -> LocalResult:
        """ALA (when the client has a local model), then the engine's batch loop from θ̂."""
        private, received = trainer.job.private, trainer.job.received
        names = self.layout.groups["ala"]
        has_local = LOCAL + self.model_names()[0] in private
        weights: Tensors = {}
        if has_local and names:
            trainer.model.train()
            weights, _ = self.learn_weights(trainer, start_phase=WEIGHT + names[0] not in private)
            trainer.load({n: ala_combine(private[LOCAL + n], received[n], weights[n]) for n in names})
        result = standard_local_update(self, trainer)
        state = trainer.state
        result.private = {n: state[n].detach().clone() for n in self.layout.private}
        result.private.update({LOCAL + n: state[n].detach().clone() for n in self.model_names()})
        result.private.update({WEIGHT + n: w for n, w in weights.items()})
        return result


@register_algorithm("fedala")
class FedALA(Algorithm[FedALAHyperparameters]):
    """FedAvg whose clients initialise by adaptive local aggregation (learned W on top layers)."""

    capabilities = Capabilities(same_broadcast=True, fedavg_aggregate=True, diagnostics_without_uploads=True)

    display_name = "FedALA"
    paper = "Zhang et al., AAAI 2023"
    method_family = "model_combination"
    hyperparameters = FedALAHyperparameters
    program_class = FedALAProgram

    def param_groups(self) -> dict[str, tuple[str, ...]]:
        """``ala``: the trainable parameters of the top ``--layer-idx`` layers."""
        order = layer_order(self.model)
        if self.hparams.layer_idx > len(order):
            raise ConfigError(
                f"--layer-idx {self.hparams.layer_idx} exceeds this model's {len(order)} layers ({', '.join(order)})"
            )
        prefixes = tuple(f"{name}." for name in order[-self.hparams.layer_idx :])
        return {"ala": tuple(n for n, p in self.model.named_parameters() if p.requires_grad and n.startswith(prefixes))}

    def personal_model(self, client_id: int) -> Tensors:
        """The ALA aggregate θ̂ of the current global model with the client's θ_l and last W."""
        return self.model_state(self.program.assemble(self.broadcast(client_id), self.store.get(client_id)))

    def run_info(self) -> dict[str, Any]:
        return {"fedala_layers": sorted({n.rsplit(".", 1)[0] for n in self.layout.groups["ala"]})}
