"""Local training of one client: what an executor lends a client program (``LocalTrainer``) and
the default local update (``standard_local_update``, the one batch loop).

A ``ClientProgram`` normally only names phases, loss terms and its optimizer; the batch loop is
``standard_local_update``. An algorithm whose local update is not "minimise a loss over batches"
(pFedMe's inner problem, Per-FedAvg's meta step, Ditto's second model) overrides
``ClientProgram.local_update`` and builds it from the trainer's primitives: ``forward``,
``epoch``, ``optimizer``, ``train_only`` and the live ``state``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from pflbench.engine.optim import SGD, Adam, LocalOptimizer
from pflbench.engine.types import ClientJob, Forward, LocalPhase, OptimizerSpec, ParamLayout, Tensors
from pflbench.util.precision import autocast

if TYPE_CHECKING:
    from pflbench.data.dataset import FederatedData


class BatchLoopProgram(Protocol):
    """What the batch loop asks of a client program (``ClientProgram`` is the one implementation;
    a protocol here keeps ``local`` below ``algorithm``, so the two do not import each other)."""

    layout: ParamLayout
    loss_weights: dict[str, float]

    def optimizer(self) -> OptimizerSpec: ...

    def local_phases(self, client_id: int) -> list[LocalPhase]: ...

    def loss_terms(
        self, forward: Forward, params: Tensors, inputs: torch.Tensor, targets: torch.Tensor, received: Tensors
    ) -> dict[str, torch.Tensor]: ...


def build_optimizer(spec: OptimizerSpec, params: dict[str, nn.Parameter]) -> LocalOptimizer:
    """The optimizer an ``OptimizerSpec`` describes (``optim.SGD`` / ``optim.Adam``: torch's
    arithmetic, bit-identical on a CPU); groups keep ``params``' order."""
    grouped = {n for group in spec.groups for n in group.names}
    groups = [([p for n, p in params.items() if n in group.names], group.lr or spec.lr) for group in spec.groups]
    rest = [p for n, p in params.items() if n not in grouped]
    arguments = [(ps, lr) for ps, lr in [(rest, spec.lr), *groups] if ps] if spec.groups else [(rest, spec.lr)]
    if spec.kind == "adam":
        return Adam(arguments, betas=spec.betas, weight_decay=spec.weight_decay)
    if spec.kind == "sgd":
        return SGD(arguments, momentum=spec.momentum, weight_decay=spec.weight_decay)
    raise ValueError(f"unknown optimizer kind {spec.kind!r}; valid: sgd, adam")


@dataclass
class LocalResult:
    """What a local update reports. ``upload``/``private`` None: the program's ``upload`` and
    ``private_state`` are applied to the final model state."""

    loss: float
    loss_terms: dict[str, float]
    upload: Tensors | None = None
    private: Tensors | None = None
    extra: dict = field(default_factory=dict)
    steps: int | None = None  # optimizer steps taken (the batch loop counts them; None: not counted)


class LocalTrainer:
    """One client's model (loaded with its assembled state) and data, for one job."""

    def __init__(
        self, model: nn.Module, data: FederatedData, job: ClientJob, batch_size: int, precision: str = "fp32"
    ) -> None:
        self.model, self.data, self.job, self.batch_size = model, data, job, batch_size
        self.precision = precision  # --precision (util.precision): fp32, or bf16 autocast of forwards and losses
        self.params: dict[str, nn.Parameter] = dict(model.named_parameters())
        self.state: Tensors = {**self.params, **dict(model.named_buffers())}
        self.generator = torch.Generator().manual_seed(job.seed)
        self.device = data.device

    def forward(self, params: Tensors, inputs: torch.Tensor) -> torch.Tensor:
        """The model's output with ``params``: the live parameters, or any other tensors of the
        same names (e.g. a second model, a mixture) through ``torch.func.functional_call``.
        Under ``--precision bf16``: called inside ``autocast()`` (the batch loop, whose loss is
        autocast too) it returns the output as autocast makes it (the tensor the model returns:
        attributes and identity kept); called outside (a custom ``local_update``) it runs
        autocast itself and returns float32 logits, so that a loss computed on them is float32."""
        if self.precision == "fp32" or torch.is_autocast_enabled(self.device.type):
            return self._forward(params, inputs)
        with self.autocast():
            return self._forward(params, inputs).float()

    def _forward(self, params: Tensors, inputs: torch.Tensor) -> torch.Tensor:
        if params is self.params:
            return self.model(inputs)
        return functional_call(self.model, params, (inputs,), strict=False)

    def autocast(self) -> AbstractContextManager[Any]:
        """The context of a forward pass and its loss at the run's ``--precision`` (nothing for fp32)."""
        return autocast(self.device, self.precision)

    def epoch(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """One shuffled pass over the client's train split (the job's seeded generator)."""
        return self.data.train_batches(self.job.client_id, self.batch_size, self.generator)

    def train_only(self, names: frozenset[str] | set[str], trainable: tuple[str, ...]) -> dict[str, nn.Parameter]:
        """Gradients for ``names`` only (of ``trainable``); returns those parameters in order."""
        for name in trainable:
            self.params[name].requires_grad_(name in names)
        return {n: self.params[n] for n in trainable if n in names}

    def optimizer(self, spec: OptimizerSpec, params: dict[str, nn.Parameter]) -> LocalOptimizer:
        return build_optimizer(spec, params)

    def step(
        self,
        optimizer: LocalOptimizer,
        loss: torch.Tensor,
        params: dict[str, nn.Parameter],
        max_grad_norm: float | None,
    ) -> None:
        """One step of a custom loop, as the batch loop takes it: zero the gradients, backward,
        clip their norm over ``params`` (``--max-grad-norm``; None: no clipping), step."""
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(params.values(), max_grad_norm)
        optimizer.step()

    @torch.no_grad()
    def load(self, tensors: Tensors) -> None:
        """Copy ``tensors`` into the live model state (same names)."""
        if tensors:
            torch._foreach_copy_([self.state[n] for n in tensors], list(tensors.values()))

    def snapshot(self, names: tuple[str, ...] | list[str]) -> Tensors:
        return {n: self.state[n].detach().clone() for n in names}

    def gradient(self, params: Tensors, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, Tensors]:
        """(loss, ∇loss) of the cross-entropy of the model with ``params`` (any tensors of the
        parameters' names; the live buffers) on one batch, without touching ``.grad``. For
        updates written as explicit gradient formulas (pFedMe, Per-FedAvg, APFL, Ditto)."""
        leaves = {n: p.detach().requires_grad_(True) for n, p in params.items()}
        with self.autocast():
            loss = F.cross_entropy(functional_call(self.model, leaves, (inputs,), strict=False), targets)
        return loss.detach(), dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))

    def batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """An endless stream of minibatches: shuffled epoch after shuffled epoch."""
        while True:
            yield from self.epoch()

    def batches_per_epoch(self) -> int:
        """Minibatches in one pass over the client's train split (``epoch``'s count: a trailing
        single sample joins the previous batch)."""
        size, batch = self.data.num_train[self.job.client_id], self.batch_size
        count = max(1, -(-size // batch))
        return count - 1 if batch > 1 and count > 1 and size - (count - 1) * batch == 1 else count


def apply_gradients(
    optimizer: LocalOptimizer, params: Tensors, gradients: Tensors, max_grad_norm: float | None = None
) -> None:
    """One ``optimizer`` step on ``params`` with the given gradients (optionally clipped to
    ``max_grad_norm`` as a whole): for updates whose direction is not ∇ of one loss."""
    for name, param in params.items():
        param.grad = gradients[name].detach().clone()
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(list(params.values()), max_grad_norm)
    optimizer.step()
    for param in params.values():
        param.grad = None


def standard_local_update(program: BatchLoopProgram, trainer: LocalTrainer) -> LocalResult:
    """The batch loop: for each phase, a fresh optimizer over the phase's parameters, then
    ``epochs`` passes minimising Σ weight·term (optionally clipped). Logs each term's mean.
    ``job.max_steps`` (partial work under a deadline) stops it after that many steps in all."""
    job, spec = trainer.job, program.optimizer()
    trainable_names = program.layout.trainable
    sums: dict[str, torch.Tensor] = {}
    total = torch.zeros((), device=trainer.device)
    steps = 0
    privacy = job.sample_privacy  # --dp sample: DP-SGD steps (engine.privacy), given with the job
    noise = privacy.generator(job.seed) if privacy is not None else None
    trainer.model.train()
    for phase in program.local_phases(job.client_id):
        trainable = trainer.train_only(phase.trainable, trainable_names)
        optimizer = trainer.optimizer(spec, trainable)
        for _ in range(phase.epochs):
            for inputs, targets in trainer.epoch():
                if steps == job.max_steps:
                    break
                if privacy is not None:
                    loss, terms = private_gradients(program, trainer, trainable, inputs, targets, privacy, noise)
                else:
                    with trainer.autocast():  # --precision bf16: the forward and the loss, never the backward
                        terms = program.loss_terms(trainer.forward, trainer.params, inputs, targets, job.received)  # type: ignore[arg-type]
                        loss = sum(program.loss_weights.get(n, 1.0) * t for n, t in terms.items())  # type: ignore[assignment]
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                if spec.max_grad_norm is not None:
                    torch.nn.utils.clip_grad_norm_(trainable.values(), spec.max_grad_norm)
                optimizer.step()
                total += loss.detach()
                for name, value in terms.items():
                    sums[name] = sums[name] + value.detach() if name in sums else value.detach()
                steps += 1
    trainer.train_only(frozenset(trainable_names), trainable_names)
    return mean_terms(total, sums, steps)


def private_gradients(
    program: BatchLoopProgram,
    trainer: LocalTrainer,
    trainable: dict[str, nn.Parameter],
    inputs: torch.Tensor,
    targets: torch.Tensor,
    privacy: Any,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """--dp sample: set each trainable parameter's ``.grad`` to DP-SGD's noised mean of the
    clipped per-sample gradients of the program's loss (``engine.privacy.SampleLevelDP``);
    returns the batch's (loss, terms) for the log."""
    job = trainer.job
    frozen = {n: p.detach() for n, p in trainer.params.items() if n not in trainable}

    def loss_of(params: Tensors, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        terms = program.loss_terms(trainer.forward, {**frozen, **params}, x, y, job.received)
        loss: torch.Tensor = sum(program.loss_weights.get(n, 1.0) * t for n, t in terms.items())  # type: ignore[assignment]
        return loss, terms

    gradients, loss, terms = privacy.private_gradients(loss_of, trainable, inputs, targets, generator)
    for name, param in trainable.items():
        param.grad = gradients[name]
    return loss, terms


def mean_terms(total: torch.Tensor, sums: dict[str, torch.Tensor], steps: int) -> LocalResult:
    """Means over ``steps`` of the total loss and of each term (NaN / {} without steps)."""
    means = torch.stack([total, *sums.values()]).div(max(steps, 1)).tolist()
    terms = dict(zip(sums, means[1:])) if steps else {}
    return LocalResult(means[0] if steps else float("nan"), terms, steps=steps)
