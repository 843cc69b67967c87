"""PFL-MoE — Guo, Mei, Xiao, Wu, Yin & Chang, "PFL-MoE: Personalized Federated Learning Based on
Mixture of Experts", APWeb-WAIM 2021 (arXiv:2012.15589).

Two experts per client and a gate that mixes their outputs per input. The global model w is
FedAvg's (trained locally from the received w, uploaded, w ← Σ_k n_k·w_k / Σ_k n_k); each client
also keeps a personalized model v_k, fine-tuned from the global model; a per-client gating network
g_k(x) ∈ (0, 1) weighs the two outputs:

    y(x) = g_k(x)·f(x; v_k) + (1 − g_k(x))·f(x; w),     g_k(x) = sigmoid(a_kᵀ·z_w(x) + b_k)

where f are the models' outputs (logits, mixed before the softmax as in the authors' code) and
z_w(x) are the global model's features at the input of its final layer (``mixture_of_experts``).
This is the paper's PFL-MF: the gate reads the features of the global model's extractor; PFL-MFE
(the authors' ``--struct``) feeds the flattened raw input to the gate instead and is not
implemented. The gate is trained with the cross-entropy of y, both experts frozen.

The paper's procedure is post hoc: FedAvg to the end, then per client the personalized model
(PFL-FB, fine-tuning) on 3/4 of its train data and the gate on the other 1/4. Here it runs every
round, in that order, on each sampled client:

1. global: ``--local-epochs`` epochs of the run's optimizer on CE(f(x; w)) from the received w;
   uploaded (FedAvg aggregates it);
2. personal: v_k (at a client's first round set to the received w: "fine-tuned from the global
   model", then kept) trained ``--local-epochs`` epochs on CE(f(x; v_k)) over its personal split;
3. gate: ``--gate-epochs`` epochs (default ``--local-epochs``) on CE(y(x)) over its gate split,
   with the received w (the global model it will be mixed with) and v_k frozen.

Choices the paper leaves open, and what the authors' code does:
- The split: ``--gate-fraction`` 0.25 of each client's train samples (a fixed random subset per
  client, from the run's seed) train the gate, the rest the personal model — the authors' cut
  (``len // 4``). 0 (or a client with fewer than 4 samples) trains both on the whole split.
- What is personalized: the authors (LeNet) share the convolutional body and fine-tune a copy of
  the fully connected layers; here v_k is a whole copy of the model (any zoo or timm model whose
  final layer is an ``nn.Linear``).
- Optimizers: the authors fine-tune with SGD (lr 1e-3, momentum 0.9, wd 5e-4) and train the gate
  with Adam (wd 5e-4) for 200 epochs; here all three phases use the run's local optimizer, and
  ``--gate-epochs`` defaults to ``--local-epochs`` (this suite's choice: every phase gets the
  run's local budget, not the authors' 200 gate epochs per round).
- Mixing weights: the authors' g weighs the global output; here g weighs the personal one (the
  same family of mixtures, g ↔ 1 − g).

Model: ``configure_model`` adds the global expert as the submodule ``pflmoe_global`` (a copy of
the model at its initialisation) and the gate ``pflmoe_gate`` (Linear(features, 1)) and a forward
hook that turns the model's output into y (the model's own parameters are v_k). State and bytes:
``pflmoe_global.*`` is the shared state (sent down and uploaded: bytes count one model each way);
v_k and the gate are private (never sent). Evaluation: pers_acc uses y with the current global w,
the client's v_k and gate (a client never trained has v = w); global_acc uses f(x; w) alone (the
gate forced to g = 0).

New clients (``--new-clients``): the paper's procedure on the final global model —
v fine-tuned from w on the personal split, then the gate on the gate split
(``PFLMoENewClientProgram``), then tested.

Refused: ``--executor vmap`` (the three phases are a custom local update) and ``--dp`` (the engine
refuses custom local updates for it).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
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
    ProgramCapabilities,
    RunConfig,
    Tensors,
    option,
    register_algorithm,
)
from pflbench.data.dataset import minibatches
from pflbench.engine import LocalResult, LocalTrainer
from pflbench.models.zoo import head_module_names
from pflbench.util.seeding import derive_seed

GLOBAL = "pflmoe_global"  # the global expert's submodule
GATE = "pflmoe_gate"  # the gate's submodule
STARTED = "pflmoe.started"  # 1 once the client's personal model was set from the global one


def mixture_of_experts(personal: torch.Tensor, global_: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """y = g·f_personal + (1 − g)·f_global, g (batch × 1) broadcast over the outputs."""
    return gate * personal + (1 - gate) * global_


class MixtureOutput:
    """Forward hook of the configured model: its own output is the personal expert's; it returns
    the mixture with the global expert (``GLOBAL``) weighted by the gate (``GATE``) on the global
    expert's features at the input of its final layer ``head``. The parts ride along as
    ``output.pflmoe_parts = (personal, global, gate)``."""

    def __init__(self, head: str) -> None:
        self.head = head

    def __call__(self, module: nn.Module, args: tuple, personal: torch.Tensor) -> torch.Tensor:
        global_output, features = expert_with_features(module.get_submodule(GLOBAL), self.head, args[0])
        gate = torch.sigmoid(module.get_submodule(GATE)(features.flatten(1)))
        output = mixture_of_experts(personal, global_output, gate)
        output.pflmoe_parts = (personal, global_output, gate)  # type: ignore[attr-defined]
        return output


def expert_with_features(expert: nn.Module, head: str, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The expert's output and the input of its final layer ``head``."""
    captured: list[torch.Tensor] = []
    handle = expert.get_submodule(head).register_forward_pre_hook(lambda _, args: captured.append(args[0]))
    try:
        output = expert(inputs)
    finally:
        handle.remove()
    if len(captured) != 1:
        raise ConfigError(f"pflmoe: the model's final layer {head!r} runs {len(captured)} times per forward, not once")
    return output, captured[0]


def subset_batches(
    data: Any, indices: torch.Tensor, batch_size: int, generator: torch.Generator
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One shuffled epoch over ``indices``, cut as the engine's own epochs (``minibatches``: no
    batch of a single sample, which BatchNorm cannot train on)."""
    shuffled = indices[torch.randperm(len(indices), generator=generator).to(indices.device)]
    for batch in minibatches(shuffled, batch_size):
        yield data.gather(batch)


@dataclass(frozen=True)
class PFLMoEHyperparameters:
    gate_fraction: float = option(
        0.25,
        "Fraction of each client's train samples that train the gate (the rest: the personal model; authors: 1/4).",
    )
    gate_epochs: int | None = option(None, "Epochs of the gate per round [default: --local-epochs].")

    def validate(self) -> None:
        if not 0 <= self.gate_fraction < 1:
            raise ConfigError(f"--gate-fraction must be in [0, 1), got {self.gate_fraction}")
        if self.gate_epochs is not None and self.gate_epochs < 0:
            raise ConfigError(f"--gate-epochs must be ≥ 0, got {self.gate_epochs}")


class PFLMoEProgram(ClientProgram[PFLMoEHyperparameters]):
    capabilities = ProgramCapabilities(model_upload=True)
    run_seed: int = 0  # set by the server side (the run's seed: each client's fixed gate split)
    train_global = True  # False: a new client's adaptation (personal model and gate only)

    def splits(self, trainer: LocalTrainer) -> tuple[torch.Tensor, torch.Tensor]:
        """(personal split, gate split) of the client's train indices: a fixed random subset of
        ⌊n·gate_fraction⌋ samples trains the gate (both: everything when that is 0)."""
        client = trainer.job.client_id
        indices = trainer.data.train_indices[client]
        count = int(len(indices) * self.hparams.gate_fraction)
        if count == 0:
            return indices, indices
        generator = torch.Generator().manual_seed(derive_seed(self.run_seed, "pflmoe.split", client))
        order = torch.randperm(len(indices), generator=generator).to(indices.device)
        return indices[order[count:]], indices[order[:count]]

    def local_update(self, trainer: LocalTrainer) -> LocalResult:
        job, groups, spec = trainer.job, self.layout.groups, self.optimizer()
        model = trainer.model
        personal_split, gate_split = self.splits(trainer)
        terms: dict[str, float] = {}
        steps = 0
        model.train()

        def train(
            names: tuple[str, ...],
            epochs: int,
            batches: Callable[[], Iterator[tuple[torch.Tensor, torch.Tensor]]],
            loss_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        ) -> float:
            nonlocal steps
            params = trainer.train_only(frozenset(names), self.layout.trainable)
            optimizer = trainer.optimizer(spec, params)
            total, count = torch.zeros((), device=trainer.device), 0
            for _ in range(epochs):
                for inputs, targets in batches():
                    with trainer.autocast():  # --precision bf16: forward and loss, as the batch loop
                        loss = loss_of(inputs, targets)
                    trainer.step(optimizer, loss, params, spec.max_grad_norm)
                    total += loss.detach()
                    count += 1
            steps += count
            return float(total) / count if count else float("nan")

        epochs, size = self.local.epochs, self.local.batch_size
        upload = None
        if self.train_global:  # 1. FedAvg's local training of the global expert
            expert = model.get_submodule(GLOBAL)
            terms["global_task"] = train(
                groups["global"], epochs, trainer.epoch, lambda x, y: F.cross_entropy(expert(x), y)
            )
            upload = self.upload(trainer.state, job.received)
            trainer.load({n: job.received[n] for n in groups["global"]})  # the gate is mixed with w^t
        if self.train_global and float(job.private[STARTED]) == 0:  # the first round: v ← w^t
            trainer.load({n: job.received[f"{GLOBAL}.{n}"] for n in groups["personal"]})
        terms["personal_task"] = train(  # 2. the personal expert, its own output (no hook: forward)
            groups["personal"],
            epochs,
            lambda: subset_batches(trainer.data, personal_split, size, trainer.generator),
            lambda x, y: F.cross_entropy(model.forward(x), y),
        )
        gate_epochs = epochs if self.hparams.gate_epochs is None else self.hparams.gate_epochs
        terms["mixture_task"] = train(  # 3. the gate, on the mixture
            groups["gate"],
            gate_epochs,
            lambda: subset_batches(trainer.data, gate_split, size, trainer.generator),
            lambda x, y: F.cross_entropy(model(x), y),
        )
        trainer.train_only(frozenset(self.layout.trainable), self.layout.trainable)
        private = {n: trainer.state[n].detach().clone() for n in self.layout.private}
        if self.train_global:
            private[STARTED] = torch.ones((), device=trainer.device)
        loss = terms.get("global_task", terms["personal_task"])
        return LocalResult(loss, terms, upload=upload, private=private, steps=steps)


class PFLMoENewClientProgram(PFLMoEProgram):
    """A new client: v (set to the final global w by ``new_client_model``) fine-tuned on its
    personal split, then its gate; the whole mixture model uploaded (what it is tested with)."""

    train_global = False

    def upload(self, state: Tensors, received: Tensors) -> Tensors:
        return {n: state[n].detach().clone() for n in received}

    def private_state(self, state: Tensors, job_private: Tensors) -> Tensors:
        return {}

    def local_update(self, trainer: LocalTrainer) -> LocalResult:
        result = super().local_update(trainer)
        upload = self.upload(trainer.state, trainer.job.received)
        return LocalResult(result.loss, result.loss_terms, upload=upload, private={}, steps=result.steps)


@register_algorithm("pflmoe")
class PFLMoE(Algorithm[PFLMoEHyperparameters]):
    """FedAvg global model + a personal model per client, mixed per input by a private gate."""

    capabilities = Capabilities(same_broadcast=True, fedavg_aggregate=True, diagnostics_without_uploads=True)

    display_name = "PFL-MoE"
    paper = "Guo et al., APWeb-WAIM 2021"
    method_family = "mixture_of_experts"
    hyperparameters = PFLMoEHyperparameters
    program_class = PFLMoEProgram

    @classmethod
    def configure_model(cls, model: nn.Module, config: RunConfig, hparams: Any) -> dict[str, Any]:
        record = super().configure_model(model, config, hparams)
        head = head_module_names(model, 1)[0]
        final = model.get_submodule(head)
        if not isinstance(final, nn.Linear):
            raise ConfigError(
                f"pflmoe's gate reads the input of a linear final layer; {head!r} is a {type(final).__name__}"
            )
        expert = copy.deepcopy(model)  # the global expert: the same initial model
        model.add_module(GLOBAL, expert)
        model.add_module(GATE, nn.Linear(final.in_features, 1, device=final.weight.device, dtype=final.weight.dtype))
        model.register_forward_hook(MixtureOutput(head))
        return {**record, "pflmoe": f"{GLOBAL} (global expert, shared), own parameters + {GATE} (private)"}

    def select_shared(self, names: list[str]) -> list[str]:
        shared = [n for n in names if n.startswith(GLOBAL + ".")]
        if not shared:
            raise ConfigError("pflmoe: the model has no global expert (configure_model not applied)")
        return shared

    def param_groups(self) -> dict[str, tuple[str, ...]]:
        trainable = [n for n, p in self.model.named_parameters() if p.requires_grad]
        return {
            "global": tuple(n for n in trainable if n.startswith(GLOBAL + ".")),
            "gate": tuple(n for n in trainable if n.startswith(GATE + ".")),
            "personal": tuple(n for n in trainable if not n.startswith((GLOBAL + ".", GATE + "."))),
        }

    def make_program(self) -> ClientProgram:
        program = super().make_program()
        program.run_seed = self.config.seed  # type: ignore[attr-defined]
        return program

    def extra_private_state(self) -> Tensors:
        device = next(iter(self.initial_state.values())).device
        return {STARTED: torch.zeros((), device=device)}

    def with_personal_from_global(self, state: Tensors) -> Tensors:
        """``state`` with the personal expert set to the global one (a client not trained yet)."""
        personal = {n: state[f"{GLOBAL}.{n}"] for n in self.layout.groups["personal"]}
        return {**state, **personal}

    def personal_model(self, client_id: int) -> Tensors:
        private = self.store.get(client_id)
        model = self.model_state(self.program.assemble(self.broadcast(client_id), private))
        return model if float(private[STARTED]) else self.with_personal_from_global(model)

    def new_client_model(self, client_id: int) -> Tensors:
        state = self.model_state(self.program.assemble(self.broadcast(client_id), self.store.initial))
        return self.with_personal_from_global(state)

    def new_client_program(self) -> ClientProgram:
        program = PFLMoENewClientProgram(self.layout, self.hparams, self.config.local_spec)
        program.run_seed = self.config.seed
        return program

    def global_model(self) -> Tensors:
        """f(x; w) alone: the gate forced to g = 0 (weight 0, bias −∞), v = w (finite)."""
        state = self.with_personal_from_global(super().global_model())
        for name in self.layout.groups["gate"]:
            state[name] = torch.full_like(state[name], float("-inf") if name.endswith("bias") else 0.0)
        return state
