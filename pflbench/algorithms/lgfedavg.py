"""LG-FedAvg — Liang et al., "Think Locally, Act Globally: Federated Learning with Local and
Global Representations", 2020 (arXiv:2001.01523).

The reverse of FedPer: each client keeps its own *local representation* (the lower layers) and
the *global* part is the top of the model, trained by every client and averaged FedAvg-style:
g ← Σ_k n_k·g_k / Σ_k n_k. Local training updates both parts jointly on the plain cross-entropy
loss (the paper's auxiliary objectives for the local representations are optional and not
implemented).

Which layers are global (``--global-layers``):

- ``head-layers`` (the default, this suite's choice, unchanged): the last ``--head-layers``
  layers (default 1: the classifier alone).
- ``paper``: the paper's experiments' split, by model family. Its MNIST MLP (5 layers) shares the
  top 3 and keeps the 2 input layers local; its CIFAR-10 CNN (LeNet-5: conv1, conv2, fc1, fc2,
  fc3) shares 2. Here: ``mlp`` (3 layers: fc1, fc2, fc3) shares fc2 and fc3 and keeps its input
  layer fc1 local (the closest split of a 3-layer model: the paper's MLP keeps its input layers
  local); ``cnn`` and ``lenet`` (the same five layers as the paper's CNN) share the top 2, fc2 and
  fc3. Other models are refused (no split of the paper fits them: give ``--head-layers``). Note:
  the authors' released code lists the CIFAR CNN's layers as (fc1, fc2, fc3, conv2, conv1) and
  shares the last ``num_layers_keep`` of that list, so its 2 shared layers are conv1 and conv2 —
  the opposite of the paper's "local representation, global top" (an open question on its issue
  tracker, pliang279/LG-FedAvg#8); the suite follows the paper's text.

Warm start (``--warmup-rounds R``, default 0 = off): the paper's experiments start LG-FedAvg from
a model trained by FedAvg (its scripts load FedAvg checkpoints of 400–800 rounds for MNIST,
800–1800 for CIFAR-10). With R > 0 the first R rounds are FedAvg on the whole model: the server
sends the averaged local part along with the global part, each client trains from it and uploads
both, and both are averaged (sample-weighted; both directions counted in bytes). After round R
every client's local part — and the local part a never-trained or new client starts from — is
that averaged local part; from round R + 1 on only the global part travels. The R rounds count
in ``--rounds``. ``--global-layers paper --warmup-rounds R`` is the paper's setting (R is yours
to choose: the paper's FedAvg runs are far longer than a benchmark's).

State: shared = the global layers (sent down and uploaded, counted in bytes); private = the local
layers, kept on each client across rounds (all clients start from the same initial local part, or
the warm start's). Evaluation: own local part + current global part. The global layers without a
local part have no accuracy of their own: no global model.

New clients (``--new-clients``): the current global part (frozen) with a fresh local part (the
initial one, or the warm start's) trained on the client's train split for ``--local-epochs``
epochs (``Algorithm``'s default: the private part is the local layers).

Both options leave runs that do not set them exactly as before (numbers and run folders).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from pflbench import (
    Algorithm,
    Capabilities,
    ClientProgram,
    ClientUpdate,
    ConfigError,
    ProgramCapabilities,
    RunConfig,
    Tensors,
    option,
    register_algorithm,
    sample_weights,
    weighted_average,
)
from pflbench.engine.streaming import StreamingWeightedAverage
from pflbench.models.zoo import head_parameter_names

# --global-layers paper: the model → how many top layers are global (see the docstring)
PAPER_GLOBAL_LAYERS = {"mlp": 2, "cnn": 2, "lenet": 2}


@dataclass(frozen=True)
class LGFedAvgHyperparameters:
    global_layers: str = option(
        "head-layers",
        "LG-FedAvg's global (shared) layers: head-layers = the last --head-layers layers; paper = "
        "the paper's split by model (mlp: fc2, fc3; cnn, lenet: fc2, fc3).",
        choices=("head-layers", "paper"),
        omit_at_default=True,
    )
    warmup_rounds: int = option(
        0,
        "LG-FedAvg: the first R rounds are FedAvg on the whole model (the paper starts from a "
        "FedAvg-trained model); 0 = off.",
        omit_at_default=True,
    )

    def validate(self) -> None:
        if self.warmup_rounds < 0:
            raise ConfigError(f"--warmup-rounds must be ≥ 0, got {self.warmup_rounds}")


def global_layer_count(global_layers: str, model: str | None, head_layers: int) -> int:
    """How many top layers are global: ``--head-layers``, or the paper's split for ``model``."""
    if global_layers == "head-layers":
        return head_layers
    if model not in PAPER_GLOBAL_LAYERS:
        raise ConfigError(
            f"--global-layers paper is defined for --model {', '.join(PAPER_GLOBAL_LAYERS)} "
            f"(the paper's MLP and CNN), got --model {model}; use --global-layers head-layers"
        )
    return PAPER_GLOBAL_LAYERS[model]


class WarmStartProgram(ClientProgram[LGFedAvgHyperparameters]):
    """While the warm start lasts the client receives the local part too: what it receives wins
    over its stored local part, and it uploads everything it received (FedAvg on the whole model).
    Afterwards it receives only the global part, and both hooks act as the defaults do."""

    capabilities = ProgramCapabilities(batch_loop=True)

    def assemble(self, received: Tensors, private: Tensors) -> Tensors:
        return {**private, **received}

    def upload(self, state: Tensors, received: Tensors) -> Tensors:
        return {name: state[name].detach().clone() for name in received}


@register_algorithm("lgfedavg")
class LGFedAvg(Algorithm[LGFedAvgHyperparameters]):
    """Private lower layers per client; the top layers are shared and averaged."""

    capabilities = Capabilities(diagnostics_without_uploads=True, received_personal_model=True)

    display_name = "LG-FedAvg"
    paper = "Liang et al., arXiv:2001.01523, 2020"
    method_family = "decoupling"
    has_global_model = False  # the global part is only the top layers
    uses_head_layers = True
    hyperparameters = LGFedAvgHyperparameters
    checkpoint_attributes = ("rounds_done", "warm_body")

    @classmethod
    def check_config(cls, config: RunConfig, hparams: LGFedAvgHyperparameters) -> None:
        global_layer_count(hparams.global_layers, config.model, config.head_layers)
        if hparams.warmup_rounds and hparams.warmup_rounds >= config.rounds:  # a FedAvg run under LG-FedAvg's name
            raise ConfigError(
                f"--warmup-rounds {hparams.warmup_rounds} leaves no LG-FedAvg round of --rounds {config.rounds}: "
                f"every round would be FedAvg's warm start; give --warmup-rounds < --rounds"
            )

    def __init__(
        self, config: RunConfig, hparams: LGFedAvgHyperparameters, model: nn.Module, num_train: list[int]
    ) -> None:
        super().__init__(config, hparams, model, num_train)
        self.rounds_done = 0
        # the averaged local part while the warm start lasts (FedAvg over the whole model)
        self.warm_body = {n: t.clone() for n, t in self.store.initial.items()} if hparams.warmup_rounds else {}

    def make_program(self) -> ClientProgram:
        if self.hparams.warmup_rounds:
            return WarmStartProgram(self.layout, self.hparams, self.config.local_spec)
        return super().make_program()

    def select_shared(self, names: list[str]) -> list[str]:
        count = global_layer_count(self.hparams.global_layers, self.config.model, self.config.head_layers)
        head = head_parameter_names(self.model, count)
        return [name for name in names if name in head]

    def warming_up(self) -> bool:
        return self.rounds_done < self.hparams.warmup_rounds

    def broadcast(self, client_id: int) -> Tensors:
        return {**self.global_state, **self.warm_body} if self.warming_up() else self.global_state

    def streaming_aggregate(self, num_samples: list[int]) -> StreamingWeightedAverage | None:
        if self.hparams.warmup_rounds:
            return None  # the warm start's rounds need the whole list (aggregate)
        return StreamingWeightedAverage(self.global_state, sum(num_samples))

    @torch.no_grad()
    def aggregate(self, updates: list[ClientUpdate]) -> None:
        if not self.hparams.warmup_rounds:
            return super().aggregate(updates)
        if self.warming_up():
            if updates:
                average = weighted_average([u.params for u in updates], sample_weights(updates))
                for name, value in average.items():
                    (self.global_state if name in self.global_state else self.warm_body)[name].copy_(value)
            self.rounds_done += 1
            if not self.warming_up():  # the warm start is over: every client's local part is its result
                self._start_from_warm_body()
            return None
        self.rounds_done += 1
        return super().aggregate(updates)

    def _start_from_warm_body(self) -> None:
        self.store.initial = {n: t.clone() for n, t in self.warm_body.items()}
        for client in self.store.clients():
            self.store.put(client, {n: t.clone() for n, t in self.warm_body.items()})

    def restore_state(self, tensors: Tensors, meta: dict[str, Any]) -> None:
        super().restore_state(tensors, meta)
        if self.hparams.warmup_rounds and not self.warming_up():
            self.store.initial = {n: t.clone() for n, t in self.warm_body.items()}
