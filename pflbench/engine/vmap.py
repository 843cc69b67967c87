"""``--executor vmap``: the sampled clients of a round train together with ``torch.func``.

The clients' assembled states are stacked along a new leading dimension; every local step is one
``vmap(grad(loss))`` over the clients (``functional_call`` of the one model), followed by a
functional SGD or Adam step built from the program's ``OptimizerSpec`` (param groups, momentum,
weight decay, betas, gradient clipping per client). Each client draws exactly the batches the
sequential executor draws (its job's seeded generator, ``FederatedData.train_batch_indices``), so
the numbers match ``sequential`` to floating-point tolerance.

Clients with unequal numbers of batches: at step t of a phase the clients that still have a batch
are bucketed by batch size; a client without one takes no step (its parameters and optimizer state
stay as they are). A phase (``LocalPhase``) differentiates with respect to its subset only.

What it cannot host is refused when the run is prepared (``check_algorithm``), never silently run
sequentially. On a GPU personal models are evaluated together (``evaluate``); the head split and
shared models as in the sequential executor.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from pflbench.engine.algorithm import ClientProgram
from pflbench.engine.capabilities import refusal
from pflbench.engine.executor import SequentialExecutor
from pflbench.engine.func_grad import autograd_without_dynamo
from pflbench.engine.local import LocalResult, mean_terms
from pflbench.engine.types import ClientJob, ClientUpdate, EvalJob, OptimizerSpec, Tensors
from pflbench.engine.vmap_optim import FunctionalOptimizer
from pflbench.errors import ConfigError
from pflbench.models.lora import lora_layers
from pflbench.util.precision import autocast

MAX_CLIENTS_AT_ONCE = 128  # clients stacked together (memory: this many model copies + optimizer state)


def unsupported_reason(algorithm, model: nn.Module) -> str | None:
    """Why ``--executor vmap`` cannot run ``algorithm`` on ``model`` (None: it can)."""
    program, name = algorithm.program, type(algorithm).__name__
    custom_loop = refusal("batch-loop", type(algorithm), type(program))  # declared by the program class
    if custom_loop is not None:
        return custom_loop
    for module_name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.track_running_stats:
            return f"BatchNorm layer {module_name!r} updates running statistics while training"
        if isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0:
            return f"dropout layer {module_name!r} draws random numbers (not reproducible per client)"
        if isinstance(module, nn.RNNBase):
            return f"recurrent layer {module_name!r} does not run under torch.func.vmap"
    if program.optimizer().kind not in ("sgd", "adam"):
        return f"optimizer {program.optimizer().kind!r} has no functional version (sgd, adam)"
    floats = set(algorithm.layout.trainable) | {n for n, b in model.named_buffers() if b.is_floating_point()}
    # per-client LoRA ranks (FlexLoRA): stacked like any state, read by the padded form (batchable_forms)
    ranks = {f"{name}.active_rank" for name, layer in lora_layers(model).items() if layer.variable_rank}
    state = program.assemble(algorithm.broadcast(0), algorithm.store.get(0))
    odd = sorted(n for n, t in state.items() if n not in ranks and (n not in floats or not t.is_floating_point()))
    if odd:
        return (
            f"{name} gives each client model state that is not a float parameter or buffer "
            f"({', '.join(odd[:3])}; e.g. per-client LoRA ranks) and cannot be stacked"
        )
    phases = [[p.trainable for p in program.local_phases(k)] for k in range(len(algorithm.num_train))]
    if any(p != phases[0] for p in phases):
        return f"{name}'s clients train different parameter subsets (local_phases differ per client)"
    return None


def contiguous_runs(sizes: list[int]) -> list[slice]:
    """Slices of consecutive equal nonzero ``sizes`` (clients with a batch of one size)."""
    runs, start = [], 0
    for i in range(1, len(sizes) + 1):
        if i == len(sizes) or sizes[i] != sizes[start]:
            if sizes[start]:
                runs.append(slice(start, i))
            start = i
    return runs


def stack_padded(tensors: list[torch.Tensor]) -> torch.Tensor:
    """``torch.stack``; tensors of different shapes (FlexLoRA's per-client factor ranks, as
    received) are zero-padded at the end of each dimension to the largest shape first, as the
    client's ``assemble`` pads its working copy."""
    shape = [max(sizes) for sizes in zip(*(t.shape for t in tensors))]
    if all(list(t.shape) == shape for t in tensors):
        return torch.stack(tensors)
    stacked = tensors[0].new_zeros((len(tensors), *shape))
    for row, tensor in zip(stacked, tensors):
        row[tuple(slice(0, n) for n in tensor.shape)] = tensor
    return stacked


@contextmanager
def batchable_forms(model: nn.Module) -> Iterator[None]:
    """While vmapped, the forms of two layers that batch over clients (same functions, rounding
    aside; the sequential executor keeps the others):

    - attention as plain matrix products: timm's fused kernel (``scaled_dot_product_attention``)
      has no ``vmap`` batching rule for its CPU or CUDA backward, so under ``vmap`` torch runs it
      client by client (a warning says so); the unfused path (``q @ kᵀ``, softmax, ``@ v``: timm's
      own ``fused_attn = False`` branch) batches like any product;
    - LoRA layers of per-client ranks (FlexLoRA) at full width (``LoRALinear.padded``): the
      zero-padded factors with scaling α/r_k from each client's ``active_rank`` buffer."""
    attention = [m for m in model.modules() if getattr(m, "fused_attn", False) is True]
    variable = [m for m in lora_layers(model).values() if m.variable_rank]
    for module in attention:
        module.fused_attn = False
    for layer in variable:
        layer.padded = True
    try:
        yield
    finally:
        for module in attention:
            module.fused_attn = True
        for layer in variable:
            layer.padded = False


class VmapExecutor(SequentialExecutor):
    """Trains the sampled clients together (vectorized); evaluates like ``SequentialExecutor``."""

    name = "vmap"

    def __init__(self, model: nn.Module, data) -> None:
        super().__init__(model, data)
        self.buffers = {n for n, b in model.named_buffers()}
        # personal models evaluated together pay off where small batches leave the device idle
        # (GPU); on a CPU, stacking K model copies costs more than it saves (measured: 0.7x)
        self.evaluate_together = data.device.type == "cuda"

    def check_algorithm(self, algorithm) -> None:
        reason = unsupported_reason(algorithm, self.model)
        if reason is not None:
            raise ConfigError(f"--executor vmap cannot run this: {reason}; use --executor sequential")

    def train_iter(self, program: ClientProgram, jobs: Sequence[ClientJob]) -> Iterator[ClientUpdate]:
        for start in range(0, len(jobs), MAX_CLIENTS_AT_ONCE):
            with batchable_forms(self.model), autograd_without_dynamo():  # no torch._dynamo import
                updates = self.train_together(program, jobs[start : start + MAX_CLIENTS_AT_ONCE])
            yield from updates

    def train_together(self, program: ClientProgram, jobs: Sequence[ClientJob]) -> list[ClientUpdate]:
        """One chunk of clients. Every client's batches are drawn first (its job's generator, phase
        by phase, epoch by epoch: the sequential order); clients are stacked sorted by their batch
        sizes, so that at every step the clients with equal batch sizes are contiguous slices of
        the stack (views: no copies) and a client whose batches are exhausted is left alone."""
        self.model.train()
        batch_size = program.local.batch_size
        phases = program.local_phases(jobs[0].client_id)  # the same subsets for every client
        plans: list[list[list[torch.Tensor]]] = []  # client → phase → batches (its own epochs)
        for job in jobs:
            generator = torch.Generator().manual_seed(job.seed)
            plans.append(
                [
                    [
                        batch
                        for _ in range(phase.epochs)
                        for batch in self.data.train_batch_indices(job.client_id, batch_size, generator)
                    ]
                    for phase in program.local_phases(job.client_id)
                ]
            )
        order = sorted(
            range(len(jobs)), key=lambda i: [[-len(p) for p in plans[i]], [[len(b) for b in p] for p in plans[i]]]
        )
        states = [program.assemble(jobs[i].received, jobs[i].private) for i in order]
        stacked = {n: torch.stack([s[n].detach() for s in states]) for n in states[0]}
        del states
        same_received = all(job.received is jobs[0].received for job in jobs)
        received = (
            jobs[0].received
            if same_received
            else {n: stack_padded([jobs[i].received[n] for i in order]) for n in jobs[0].received}
        )
        module_tensors = {n: t for n, t in self.tensors.items() if n not in stacked}
        total = torch.zeros(len(jobs), device=self.data.device)
        sums: dict[str, torch.Tensor] = {}
        spec = program.optimizer()
        for p, phase in enumerate(phases):
            names = [n for n in program.layout.trainable if n in phase.trainable]
            self._run_phase(
                program,
                spec,
                names,
                [plans[i][p] for i in order],
                stacked,
                module_tensors,
                received,
                same_received,
                total,
                sums,
            )
        position = {i: row for row, i in enumerate(order)}
        return [
            self._update(
                program,
                job,
                position[i],
                stacked,
                module_tensors,
                total,
                sums,
                sum(len(batches) for batches in plans[i]),
            )
            for i, job in enumerate(jobs)
        ]

    def _run_phase(
        self,
        program: ClientProgram,
        spec: OptimizerSpec,
        names: list[str],
        plans: list[list[torch.Tensor]],
        stacked: Tensors,
        module_tensors: Tensors,
        received: Tensors,
        same_received: bool,
        total: torch.Tensor,
        sums: dict[str, torch.Tensor],
    ) -> None:
        if not names or not any(plans):
            return
        optimizer = FunctionalOptimizer(spec, names, {n: stacked[n] for n in names})
        step_grad = vmap(
            grad(self._loss_function(program), has_aux=True), in_dims=(0, 0, None, 0, 0, None if same_received else 0)
        )
        for t in range(max(len(plan) for plan in plans)):
            sizes = [len(plan[t]) if t < len(plan) else 0 for plan in plans]
            for rows in contiguous_runs(sizes):
                trained = {n: stacked[n][rows] for n in names}
                fixed = {n: v[rows] for n, v in stacked.items() if n not in trained}
                inputs, targets = self.data.gather(torch.stack([plans[i][t] for i in range(rows.start, rows.stop)]))
                anchor = received if same_received else {n: v[rows] for n, v in received.items()}
                grads, (loss, terms) = step_grad(trained, fixed, module_tensors, inputs, targets, anchor)
                optimizer.step_(trained, grads, t + 1, rows)  # in place: the slices are views of the stack
                total[rows] += loss.detach()
                for term, value in terms.items():
                    sums.setdefault(term, torch.zeros_like(total))[rows] += value.detach()

    @torch.no_grad()
    def evaluate(self, program: ClientProgram, jobs: Sequence[EvalJob]) -> list[np.ndarray]:
        """With ``evaluate_together`` (on a GPU), single-client jobs (personal models) are
        evaluated together, ``MAX_CLIENTS_AT_ONCE`` models at a time (``vmap`` over the stacked
        states, each on its own samples of its job's split, padded to the longest); other jobs as the
        sequential executor does."""
        single = [i for i, job in enumerate(jobs) if len(job.client_ids) == 1]
        same_names = all(jobs[i].state.keys() == jobs[single[0]].state.keys() for i in single[1:])
        if not self.evaluate_together or len(single) < 2 or not same_names:
            return super().evaluate(program, jobs)
        results: list[np.ndarray | None] = [None] * len(jobs)
        for start in range(0, len(single), MAX_CLIENTS_AT_ONCE):
            chunk = single[start : start + MAX_CLIENTS_AT_ONCE]
            with batchable_forms(self.model):
                counts = self._evaluate_together([jobs[i] for i in chunk], program.local.precision)
            for i, count in zip(chunk, counts):
                results[i] = np.array([count])
        rest = [i for i in range(len(jobs)) if results[i] is None]
        for i, result in zip(rest, super().evaluate(program, [jobs[i] for i in rest])):
            results[i] = result
        return results  # type: ignore[return-value]

    def _evaluate_together(self, jobs: Sequence[EvalJob], precision: str = "fp32", batch: int = 256) -> list[int]:
        self.model.eval()
        stacked = {n: torch.stack([job.state[n] for job in jobs]) for n in jobs[0].state}
        module_tensors = {n: t for n, t in self.tensors.items() if n not in stacked}
        model = self.model

        def predict(state: Tensors, inputs: torch.Tensor) -> torch.Tensor:
            with autocast(self.data.device, precision):
                return functional_call(model, {**module_tensors, **state}, (inputs,)).argmax(dim=1)

        predict_all = vmap(predict)
        splits = [self.data.eval_indices(job.split)[job.client_ids[0]] for job in jobs]
        longest = max(len(split) for split in splits)
        correct = torch.zeros(len(jobs), dtype=torch.long, device=self.data.device)
        for start in range(0, longest, batch):
            stop = min(start + batch, longest)
            rows = torch.arange(start, stop, device=self.data.device)
            # shorter splits are padded with their last sample, masked out of the count
            indices = torch.stack(
                [
                    split[rows.clamp(max=max(len(split) - 1, 0))]
                    if len(split)
                    else torch.zeros(len(rows), dtype=torch.long, device=self.data.device)
                    for split in splits
                ]
            )
            valid = torch.stack([rows < len(split) for split in splits])
            inputs, targets = self.data.gather(indices)
            correct += ((predict_all(stacked, inputs) == targets) & valid).sum(dim=1)
        return correct.tolist()

    def _loss_function(self, program: ClientProgram):
        model, buffers, weights = self.model, self.buffers, program.loss_weights
        device, precision = self.data.device, program.local.precision

        def loss(
            trained: Tensors,
            fixed: Tensors,
            module_tensors: Tensors,
            inputs: torch.Tensor,
            targets: torch.Tensor,
            received: Tensors,
        ):
            state = {**module_tensors, **fixed, **trained}
            own_buffers = {n: t for n, t in state.items() if n in buffers}
            params = {n: t for n, t in state.items() if n not in buffers}

            def forward(p: Tensors, x: torch.Tensor) -> torch.Tensor:
                return functional_call(model, {**own_buffers, **p}, (x,), strict=False)

            with autocast(device, precision):  # --precision bf16: the forward and the loss, as the batch loop
                terms = program.loss_terms(forward, params, inputs, targets, received)
                value = sum(weights.get(n, 1.0) * t for n, t in terms.items())
            return value, (value, terms)

        return loss

    def _update(
        self,
        program: ClientProgram,
        job: ClientJob,
        i: int,
        stacked: Tensors,
        module_tensors: Tensors,
        total: torch.Tensor,
        sums: dict[str, torch.Tensor],
        steps: int,
    ) -> ClientUpdate:
        state = {**module_tensors, **{n: t[i] for n, t in stacked.items()}}
        result: LocalResult = mean_terms(total[i], {n: s[i] for n, s in sums.items()}, steps)
        upload = program.upload(state, job.received)
        private = program.private_state(state, job.private)
        return ClientUpdate(
            job.client_id,
            self.data.num_train[job.client_id],
            upload,
            result.loss_terms,
            result.loss,
            private,
            local_steps=steps,  # every drawn batch is one optimizer step (no step cap under vmap)
        )
