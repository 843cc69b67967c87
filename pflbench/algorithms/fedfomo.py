"""FedFomo — Zhang, Sapra, Fidler, Yeung & Alvarez, "Personalized Federated Learning with First
Order Model Optimization", ICLR 2021 (arXiv:2012.08565).

No global model: the server keeps the latest model every client uploaded, and each client builds
its own federated update from the models of other clients that help it. Client i, holding its
model θ_i (its model after its last local training), downloads M other clients' models θ_n and
weighs each by how much it lowers i's validation loss per unit of distance (a first-order
estimate of the best step towards θ_n):

    w_n = (L_i(θ_i) − L_i(θ_n)) / ‖θ_n − θ_i‖                               (``fomo_weights``)
    w̃_n = max(w_n, 0) / Σ_m max(w_m, 0)        (all zero when no download beats θ_i)
    θ_i ← θ_i + Σ_n w̃_n·(θ_n − θ_i)                                       (``fomo_update``)

then trains θ_i for ``--local-epochs`` epochs (the run's optimizer) and uploads it with the raw
weights w_n. The server adds them to an affinity matrix P (P_{i,n} += w_n) and chooses next
round's downloads ε-greedily: with probability ε, M clients drawn uniformly from the others
that have a model; otherwise the M with the largest P_{i,n} (ties to the lower id); ε decays
linearly per round, ε_t = max(0, ε₀ − (t − 1)·δ) (``fomo_epsilon``).

Defaults: M = 5 (``--downloads``, PFLlib's M), ε₀ = 0.3 decayed by δ = 0.05 per round
(``--epsilon``, ``--epsilon-decay``: our reading of the paper's ε-greedy setup; PFLlib does not
explore and always takes the top M of P, which is ``--epsilon 0``). Where fewer than M other
clients have a model (round 1: none), the client downloads them all.

Choices the paper leaves open, and what this file does:

- Validation data L_i: the client's own validation split when the run has one (``--val-frac``,
  default 0.1); without one, a fixed 20 % of its train split (a seeded permutation per client;
  PFLlib holds out the last 20 % of the train split and trains on the rest, here those samples
  still train). The loss is the mean cross-entropy in eval mode.
- ‖θ_n − θ_i‖ is over the trainable parameters, plus 1e-5 in the denominator (PFLlib's guard
  against identical models); the combination covers every float model tensor (BatchNorm
  statistics too).
- With the normalised weights summing to 1, θ_i's own weight is 0 whenever some download is
  better (as in PFLlib, which rebuilds the model as Σ w̃_n·θ_n).
- θ_i is the client's model after its last local training, as in the paper (PFLlib keeps the
  model from before its last training).
- ε-greedy: one draw per client and round decides exploring vs exploiting, from the seed
  ``derive_seed(seed, "fedfomo.select", round, client)`` (no random state to checkpoint).

What travels: down, the M downloaded models (bytes_down); up, θ_i and the M raw weights as
float32 scalars (bytes_up). Private (ClientStateStore, never counted): θ_i. Evaluation:
``pers_acc`` uses θ_i; there is no global model (``global_acc`` null).

New clients (``--new-clients``): a new client has no affinities, so it downloads M random client
models (ε = 1) and runs one FedFomo update from the initial model (weights on its validation data
or the train fallback, then ``--local-epochs`` of training); that model is tested.

Executors: the combination step is a custom local update, so ``--executor vmap`` refuses it; the
sequential and Ray executors give identical numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from pflbench import (
    Algorithm,
    Capabilities,
    ClientProgram,
    ClientUpdate,
    ConfigError,
    ProgramCapabilities,
    Tensors,
    option,
    register_algorithm,
)
from pflbench.engine import LocalResult, LocalTrainer, standard_local_update
from pflbench.util.seeding import derive_seed

PREFIX = "fedfomo."
WEIGHT = "fedfomo.w."  # uploaded: the raw weight w_n of downloaded client n
DISTANCE_EPSILON = 1e-5  # PFLlib's guard in ‖θ_n − θ_i‖ + ε
FALLBACK_VAL_FRACTION = 0.2  # of the train split, when the run has no validation split
LOSS_CHUNK = 1024


def download_prefix(client_id: int) -> str:
    return f"{PREFIX}{client_id}."


def fomo_epsilon(epsilon: float, decay: float, round_index: int) -> float:
    """ε_t = max(0, ε₀ − (t − 1)·δ)."""
    return max(0.0, epsilon - (round_index - 1) * decay)


def fomo_weights(
    own_loss: float, losses: Sequence[float], distances: Sequence[float]
) -> tuple[list[float], list[float]]:
    """(raw w_n, normalised w̃_n): w_n = (L(θ_i) − L(θ_n)) / (‖θ_n − θ_i‖ + 1e-5);
    w̃_n = max(w_n, 0) / Σ max(w_m, 0), all zero when no w_n is positive."""
    raw = [(own_loss - loss) / (distance + DISTANCE_EPSILON) for loss, distance in zip(losses, distances)]
    positive = [max(w, 0.0) for w in raw]
    total = sum(positive)
    return raw, ([w / total for w in positive] if total > 0 else [0.0] * len(raw))


def fomo_update(own: Tensors, models: list[Tensors], weights: Sequence[float]) -> Tensors:
    """θ_i + Σ_n w̃_n·(θ_n − θ_i), per tensor of ``own``."""
    result = {}
    for name, tensor in own.items():
        update = tensor.clone()
        for model, weight in zip(models, weights):
            if weight:
                update += weight * (model[name] - tensor)
        result[name] = update
    return result


def choose_downloads(
    affinity_row: Sequence[float], candidates: Sequence[int], count: int, explore: bool, rng: np.random.Generator
) -> list[int]:
    """ε-greedy: ``count`` candidates drawn uniformly (``explore``), else the ``count`` with the
    largest affinity (ties to the lower id); sorted."""
    count = min(count, len(candidates))
    if explore:
        return sorted(int(j) for j in rng.choice(np.asarray(candidates), size=count, replace=False))
    return sorted(sorted(candidates, key=lambda j: (-affinity_row[j], j))[:count])


@dataclass(frozen=True)
class FedFomoHyperparameters:
    downloads: int = option(5, "M: other clients' models each client downloads per round (PFLlib: 5).")
    epsilon: float = option(0.3, "ε₀ of the ε-greedy choice of downloads (random with probability ε).")
    epsilon_decay: float = option(0.05, "δ: ε decays linearly, ε_t = max(0, ε₀ − (t − 1)·δ).")

    def validate(self) -> None:
        if self.downloads < 1:
            raise ConfigError(f"--downloads must be ≥ 1, got {self.downloads}")
        if not 0 <= self.epsilon <= 1:
            raise ConfigError(f"--epsilon must be in [0, 1], got {self.epsilon}")
        if not self.epsilon_decay >= 0:
            raise ConfigError(f"--epsilon-decay must be ≥ 0, got {self.epsilon_decay}")


class FedFomoProgram(ClientProgram[FedFomoHyperparameters]):
    capabilities = ProgramCapabilities(model_upload=True)
    seed: int = 0  # the run's seed (set by the server side): the fallback validation sample

    def model_names(self) -> tuple[str, ...]:
        return self.layout.shared + self.layout.private

    def assemble(self, received: Tensors, private: Tensors) -> Tensors:
        """θ_i (the downloads are only combined in ``local_update``)."""
        return {n: t for n, t in {**received, **private}.items() if not n.startswith(PREFIX)}

    def validation_indices(self, trainer: LocalTrainer) -> torch.Tensor:
        client = trainer.job.client_id
        val = trainer.data.val_indices[client]
        if len(val):
            return val
        train = trainer.data.train_indices[client]
        generator = torch.Generator().manual_seed(derive_seed(self.seed, "fedfomo.val", client))
        count = max(1, math.ceil(len(train) * FALLBACK_VAL_FRACTION))
        return train[torch.randperm(len(train), generator=generator)[:count].to(train.device)]

    @torch.no_grad()
    def loss(self, trainer: LocalTrainer, params: Tensors, indices: torch.Tensor) -> float:
        total = 0.0  # a Python float: exact enough, and no float64 on devices without it
        for start in range(0, len(indices), LOSS_CHUNK):
            inputs, targets = trainer.data.gather(indices[start : start + LOSS_CHUNK])
            total += F.cross_entropy(trainer.forward(params, inputs), targets, reduction="sum").item()
        return float(total) / max(len(indices), 1)

    def downloads(self, received: Tensors) -> dict[int, Tensors]:
        ids = sorted({int(n[len(PREFIX) :].partition(".")[0]) for n in received if n.startswith(PREFIX)})
        return {j: {n: received[download_prefix(j) + n] for n in self.model_names()} for j in ids}

    def combine(self, trainer: LocalTrainer) -> dict[int, float]:
        """The FedFomo update of the working model from the downloads; returns the raw weights."""
        models = self.downloads(trainer.job.received)
        if not models:
            return {}
        own = {n: trainer.state[n].detach().clone() for n in self.model_names()}
        indices = self.validation_indices(trainer)
        trainer.model.eval()
        own_loss = self.loss(trainer, own, indices)
        losses = [self.loss(trainer, model, indices) for model in models.values()]
        trainer.model.train()
        distances = [
            math.sqrt(sum(float((model[n] - own[n]).pow(2).sum()) for n in self.layout.trainable))
            for model in models.values()
        ]
        raw, weights = fomo_weights(own_loss, losses, distances)
        trainer.load(fomo_update(own, list(models.values()), weights))
        return dict(zip(models, raw))

    def local_update(self, trainer: LocalTrainer) -> LocalResult:
        raw = self.combine(trainer)
        result = standard_local_update(self, trainer)
        upload = {n: trainer.state[n].detach().clone() for n in self.model_names()}
        upload.update(
            {f"{WEIGHT}{j}": torch.tensor(w, dtype=torch.float32, device=trainer.device) for j, w in raw.items()}
        )
        result.upload = upload
        result.private = {n: trainer.state[n].detach().clone() for n in self.model_names()}
        return result


class FedFomoNewClientProgram(FedFomoProgram):
    """A new client: one FedFomo update from the initial model; the model is uploaded (tested)."""

    def local_update(self, trainer: LocalTrainer) -> LocalResult:
        self.combine(trainer)
        result = standard_local_update(self, trainer)
        result.upload = {n: trainer.state[n].detach().clone() for n in self.model_names()}
        result.private = {}
        return result


@register_algorithm("fedfomo")
class FedFomo(Algorithm[FedFomoHyperparameters]):
    """Each client combines downloaded client models weighted by their first-order benefit."""

    capabilities = Capabilities()

    display_name = "FedFomo"
    paper = "Zhang et al., ICLR 2021"
    method_family = "model_combination"
    hyperparameters = FedFomoHyperparameters
    program_class = FedFomoProgram
    has_global_model = False
    checkpoint_attributes = ("uploaded", "affinity", "rounds_done")

    def __init__(self, config, hparams: FedFomoHyperparameters, model, num_train) -> None:
        super().__init__(config, hparams, model, num_train)
        self.uploaded: dict[str, torch.Tensor] = {}  # "k/name": client k's latest model
        self.affinity = torch.zeros(len(num_train), len(num_train), dtype=torch.float64)  # P
        self.rounds_done = 0

    def select_shared(self, names: list[str]) -> list[str]:
        return []  # each client keeps its own model; downloads and uploads travel explicitly

    def make_program(self) -> ClientProgram:
        program = super().make_program()
        program.seed = self.config.seed  # type: ignore[attr-defined]
        return program

    def uploaders(self) -> list[int]:
        return sorted({int(key.partition("/")[0]) for key in self.uploaded})

    def model_of(self, client_id: int) -> Tensors:
        return {n: self.uploaded[f"{client_id}/{n}"] for n in self.program.model_names()}  # type: ignore[attr-defined]

    def downloads_for(self, client_id: int, explore: bool, rng: np.random.Generator) -> Tensors:
        candidates = [j for j in self.uploaders() if j != client_id]
        chosen = choose_downloads(self.affinity[client_id].tolist(), candidates, self.hparams.downloads, explore, rng)
        return {download_prefix(j) + n: t for j in chosen for n, t in self.model_of(j).items()}

    def broadcast(self, client_id: int) -> Tensors:
        """The M models chosen ε-greedily for this round."""
        round_index = self.rounds_done + 1
        rng = np.random.default_rng(derive_seed(self.config.seed, "fedfomo.select", round_index, client_id))
        epsilon = fomo_epsilon(self.hparams.epsilon, self.hparams.epsilon_decay, round_index)
        return self.downloads_for(client_id, bool(rng.random() < epsilon), rng)

    @torch.no_grad()
    def aggregate(self, updates: list[ClientUpdate]) -> None:
        for update in updates:
            for name, tensor in update.params.items():
                if name.startswith(WEIGHT):
                    self.affinity[update.client_id, int(name[len(WEIGHT) :])] += float(tensor)
                else:
                    self.uploaded[f"{update.client_id}/{name}"] = tensor.detach().clone()
        self.rounds_done += 1

    def round_diagnostics(self, updates: list[ClientUpdate]) -> dict[str, Any]:
        weights = [float(t) for u in updates for n, t in u.params.items() if n.startswith(WEIGHT)]
        return {"fedfomo_downloads": len(weights), "fedfomo_positive_weights": sum(w > 0 for w in weights)}

    def personal_model(self, client_id: int) -> Tensors:
        return self.model_state(self.store.get(client_id))

    def new_client_model(self, client_id: int) -> Tensors:
        """The initial model and M random client models (a new client has no affinities)."""
        rng = np.random.default_rng(derive_seed(self.config.seed, "fedfomo.new", client_id))
        return {**self.model_state(dict(self.store.initial)), **self.downloads_for(client_id, True, rng)}

    def new_client_program(self) -> ClientProgram:
        program = FedFomoNewClientProgram(self.layout, self.hparams, self.config.local_spec)
        program.seed = self.config.seed
        return program
