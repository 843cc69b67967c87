"""kNN-Per — Marfoq, Neglia, Vidal & Kameni, "Personalized Federated Learning through Local
Memorization", ICML 2022 (arXiv:2111.09360; authors' code: omarfoq/knn-per).

Training is FedAvg: the clients train one shared model h = g ∘ φ (φ the representation, the input
of the final linear layer g) and the server averages it. Each client then personalizes by local
memorization: it stores its train samples' representations in a datastore
S_m = {(φ(x_i), y_i) : i ∈ train split of m} (``build_datastore``, computed with the current
global model) and predicts with the interpolation

    p_m(y|x) = λ·p_kNN(y | x; S_m) + (1 − λ)·softmax(h(x))_y            (``interpolate``)

    p_kNN(y | x; S_m) = Σ_{j ∈ N_k(x)} exp(−d(φ(x), φ_j)/(D·s))·[y_j = y] / Σ_{j ∈ N_k(x)} exp(−d(φ(x), φ_j)/(D·s))
                                                                          (``knn_probabilities``)

with N_k(x) the k stored representations nearest to φ(x) in squared Euclidean distance d (the
authors' FAISS ``IndexFlatL2``), D the representation's dimension and s the kernel scale.

Defaults: k = 10 (``--neighbors``), s = 1 (``--kernel-scale``: the authors' ``--kernel_length_scale``
default), λ = 0.5 (``--knn-weight``: this suite's fixed value; the paper tunes λ per client on a
grid over [0, 1], which ``pflbench tune`` can do for the whole federation), capacity 4096
(``--capacity``: the largest datastore; a client with more train samples stores a random subset
of that size drawn from ``derive_seed(seed, "knnper.datastore", client)``, the authors' ``random``
strategy with an absolute rather than a fractional capacity).

Departures from the authors' code: their evaluation script's ``--interpolate_logits`` defaults to
the string ``"store_true"`` (truthy), so it mixes p_kNN with raw logits; we mix probabilities, as
the paper's equation does. The kernel is computed as a softmax over the k neighbours of
−d/(D·s), the same ratio without the underflow of exp(−d/(D·s)) for far neighbours.

Implementation: ``configure_model`` adds the datastore as float buffers of the model
(``knnper_keys`` capacity × D, ``knnper_labels``, ``knnper_size``), private (they never travel),
a forward pre-hook on the final linear layer that keeps its input in eval mode, and a forward hook
that, in eval mode with a non-empty datastore, turns the output into log p_m(y|x) (argmax = the
interpolation's prediction). A model whose final layer is not an ``nn.Linear`` is refused.

Evaluation: ``pers_acc`` is kNN-Per — each client builds its datastore from its train split with
the current global model (``DatastoreProgram``, the algorithm's test-time personalization) and is
tested with the interpolation; ``global_acc`` is the global model alone (empty datastore). New
clients (``--new-clients``) are served exactly so: the paper's point is that a client that never
trained only needs its own datastore.

Executors and defences: training is FedAvg's batch loop and upload, so ``--dp``, attacks and
``--robust-agg`` apply to the shared model as for FedAvg, and Ray runs it. Refused:
``--executor vmap`` (it would run the datastore construction as a training loop).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pflbench import (
    Capabilities,
    Choice,
    ClientProgram,
    ConfigError,
    Dimension,
    LocalResult,
    ParamLayout,
    ProgramCapabilities,
    Range,
    RunConfig,
    Tensors,
    option,
    register_algorithm,
)
from pflbench.algorithms.fedavg import FedAvg
from pflbench.engine import LocalTrainer
from pflbench.models.zoo import head_module_names
from pflbench.util.seeding import derive_seed

KEYS = "knnper_keys"  # capacity × D: the stored representations φ(x_i)
LABELS = "knnper_labels"  # capacity: their labels (float: only float buffers are model state)
SIZE = "knnper_size"  # 1: how many rows of the datastore are filled
DATASTORE = (KEYS, LABELS, SIZE)
FEATURE_CHUNK = 1024


# ---- the math ----------------------------------------------------------------------------
def knn_probabilities(
    features: torch.Tensor, keys: torch.Tensor, labels: torch.Tensor, k: int, scale: float, num_classes: int
) -> torch.Tensor:
    """p_kNN(y|x) per row of ``features`` (batch × D) from the datastore (keys n × D, labels n):
    the k nearest keys by squared distance d, weighted by exp(−d/(D·s)) (as a softmax over the k)."""
    distances = torch.cdist(features.float(), keys.float()).pow(2)
    nearest, index = torch.topk(distances, min(k, keys.shape[0]), dim=1, largest=False)
    weights = torch.softmax(-nearest / (features.shape[1] * scale), dim=1)
    one_hot = F.one_hot(labels[index].long(), num_classes).to(weights.dtype)
    return (weights.unsqueeze(2) * one_hot).sum(dim=1)


def interpolate(knn: torch.Tensor, logits: torch.Tensor, weight: float) -> torch.Tensor:
    """λ·p_kNN + (1 − λ)·softmax(logits)."""
    return weight * knn + (1 - weight) * torch.softmax(logits.float(), dim=1)


class FeatureCapture:
    """Forward pre-hook of the final linear layer: keeps its input (φ(x)) in eval mode."""

    def __init__(self) -> None:
        self.features: torch.Tensor | None = None

    def __call__(self, module: nn.Module, args: tuple) -> None:
        self.features = None if module.training else args[0]


class KNNInterpolation:
    """Forward hook of the configured model: in eval mode, with a non-empty datastore, the output
    becomes log(λ·p_kNN + (1 − λ)·softmax(h(x)))."""

    def __init__(self, capture: FeatureCapture, k: int, scale: float, weight: float) -> None:
        self.capture, self.k, self.scale, self.weight = capture, k, scale, weight

    def __call__(self, module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        size = int(getattr(module, SIZE).item())
        features, self.capture.features = self.capture.features, None
        if module.training or size == 0 or features is None:
            return output
        keys, labels = getattr(module, KEYS)[:size], getattr(module, LABELS)[:size]
        knn = knn_probabilities(features.flatten(1), keys, labels, self.k, self.scale, output.shape[1])
        return torch.log(interpolate(knn, output, self.weight).clamp(min=1e-30))


# ---- client ------------------------------------------------------------------------------
@dataclass(frozen=True)
class KNNPerHyperparameters:
    knn_weight: float = option(0.5, "λ: weight of the kNN distribution in the interpolation (this suite's 0.5).")
    neighbors: int = option(10, "k: neighbours retrieved from the datastore (the authors' 10).")
    kernel_scale: float = option(1.0, "s: the kernel exp(−d/(D·s)) (the authors' default 1).")
    capacity: int = option(4096, "Largest datastore; a client with more train samples stores a random subset.")

    def validate(self) -> None:
        if not 0 <= self.knn_weight <= 1:
            raise ConfigError(f"--knn-weight must be in [0, 1], got {self.knn_weight}")
        if self.neighbors < 1:
            raise ConfigError(f"--neighbors must be ≥ 1, got {self.neighbors}")
        if not self.kernel_scale > 0:
            raise ConfigError(f"--kernel-scale must be > 0, got {self.kernel_scale}")
        if self.capacity < 1:
            raise ConfigError(f"--capacity must be ≥ 1, got {self.capacity}")


class KNNPerProgram(ClientProgram[KNNPerHyperparameters]):
    """FedAvg's local training; the (empty) datastore is not kept per client."""

    capabilities = ProgramCapabilities(batch_loop=True, model_upload=True)

    def private_state(self, state: Tensors, job_private: Tensors) -> Tensors:
        return {}


class DatastoreProgram(ClientProgram[KNNPerHyperparameters]):
    """Test-time personalization (and new clients): the client's train representations under the
    received model written into the datastore; uploads the whole state (evaluated)."""

    head_module: str = ""
    run_seed: int = 0

    def __init__(self, layout, hparams, local, head_module: str, run_seed: int) -> None:
        super().__init__(ParamLayout(trainable=layout.trainable, shared=(), private=()), hparams, local)
        self.head_module, self.run_seed = head_module, run_seed

    def stored_indices(self, trainer: LocalTrainer) -> torch.Tensor:
        indices = trainer.data.train_indices[trainer.job.client_id]
        if len(indices) <= self.hparams.capacity:
            return indices
        generator = torch.Generator().manual_seed(derive_seed(self.run_seed, "knnper.datastore", trainer.job.client_id))
        chosen = torch.randperm(len(indices), generator=generator)[: self.hparams.capacity]
        return indices[chosen.sort().values.to(indices.device)]

    @torch.no_grad()
    def local_update(self, trainer: LocalTrainer) -> LocalResult:
        model = trainer.model
        model.eval()
        captured: list[torch.Tensor] = []
        handle = model.get_submodule(self.head_module).register_forward_pre_hook(
            lambda module, args: captured.append(args[0].flatten(1))
        )
        indices = self.stored_indices(trainer)
        features, labels = [], []
        try:
            for start in range(0, len(indices), FEATURE_CHUNK):
                inputs, targets = trainer.data.gather(indices[start : start + FEATURE_CHUNK])
                with trainer.autocast():
                    model(inputs)
                features.append(captured.pop().float())
                labels.append(targets)
        finally:
            handle.remove()
            model.train()
        stored = torch.cat(features)
        keys = torch.zeros_like(trainer.state[KEYS])
        keys[: len(stored)] = stored.to(keys.dtype)
        label_row = torch.zeros_like(trainer.state[LABELS])
        label_row[: len(stored)] = torch.cat(labels).to(label_row.dtype)
        size = torch.full_like(trainer.state[SIZE], float(len(stored)))
        state = {n: trainer.state[n].detach().clone() for n in trainer.job.received}
        state.update({KEYS: keys, LABELS: label_row, SIZE: size})
        return LocalResult(float("nan"), {}, upload=state, private={})


# ---- server ------------------------------------------------------------------------------
@register_algorithm("knnper")
class KNNPer(FedAvg):
    """FedAvg's model interpolated with a kNN over each client's own train representations."""

    capabilities = Capabilities.of_defaults()

    display_name = "kNN-Per"
    paper = "Marfoq et al., ICML 2022"
    method_family = "memorization"
    hyperparameters = KNNPerHyperparameters
    program_class = KNNPerProgram

    @classmethod
    def search_space(cls, config: RunConfig, hparams: KNNPerHyperparameters) -> dict[str, Dimension]:
        """lr around its default; λ over [0, 1] (the paper's grid) and k over its neighbour study."""
        return {
            **super().search_space(config, hparams),
            "knn_weight": Range(0.0, 1.0),
            "neighbors": Choice((5, 10, 20, 50)),
        }

    @classmethod
    def check_config(cls, config: RunConfig, hparams: KNNPerHyperparameters) -> None:
        if config.executor == "vmap":
            raise ConfigError(
                "knnper builds each client's datastore in a custom client program, which --executor vmap "
                "cannot host; use --executor sequential or ray"
            )

    @classmethod
    def configure_model(cls, model: nn.Module, config: RunConfig, hparams: KNNPerHyperparameters) -> dict[str, Any]:
        record = super().configure_model(model, config, hparams)
        head = head_module_names(model, 1)[0]
        final = model.get_submodule(head)
        if not isinstance(final, nn.Linear):
            raise ConfigError(
                f"knnper's datastore holds the input of a linear final layer; {head!r} is a {type(final).__name__}"
            )
        weight = final.weight
        model.register_buffer(KEYS, torch.zeros(hparams.capacity, final.in_features, device=weight.device))
        model.register_buffer(LABELS, torch.zeros(hparams.capacity, device=weight.device))
        model.register_buffer(SIZE, torch.zeros(1, device=weight.device))
        capture = FeatureCapture()
        final.register_forward_pre_hook(capture)
        model.register_forward_hook(
            KNNInterpolation(capture, hparams.neighbors, hparams.kernel_scale, hparams.knn_weight)
        )
        return {
            **record,
            "knnper": f"datastore of the input of {head!r} ({final.in_features} dims, up to {hparams.capacity} rows)",
        }

    def __init__(
        self, config: RunConfig, hparams: KNNPerHyperparameters, model: nn.Module, num_train: list[int]
    ) -> None:
        self.head_module = head_module_names(model, 1)[0]
        super().__init__(config, hparams, model, num_train)

    def select_shared(self, names: list[str]) -> list[str]:
        """FedAvg's model; the datastore stays on the client."""
        if not set(DATASTORE) <= set(names):
            raise ConfigError("knnper: the model has no datastore (configure_model not applied)")
        return [n for n in super().select_shared(names) if n not in DATASTORE]

    def personalization_program(self) -> ClientProgram:
        return DatastoreProgram(self.layout, self.hparams, self.config.local_spec, self.head_module, self.config.seed)

    def run_info(self) -> dict[str, Any]:
        return {"knnper_head": self.head_module}
