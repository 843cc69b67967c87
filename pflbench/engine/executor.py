"""Executors run client programs: ``train(program, jobs) -> updates`` and ``evaluate``.

``SequentialExecutor`` trains one client after another in one working model: it loads
``program.assemble(received, private)`` into the model in place, runs the local phases (the
batch loop) and reads the upload and the new private state back out.
"""
from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np
import torch
from torch import nn

from ..data import FederatedData
from ..seeding import derive_seed
from .algorithm import ClientProgram
from .types import ClientJob, ClientUpdate, EvalJob, OptimizerSpec, Tensors, load_into


class Executor(Protocol):
    name: str

    def train(self, program: ClientProgram, jobs: Sequence[ClientJob]) -> list[ClientUpdate]:
        """Run each job's local training; updates in the order of ``jobs``."""

    def evaluate(self, program: ClientProgram, jobs: Sequence[EvalJob]) -> list[np.ndarray]:
        """Per job, the number of correct test predictions of each of its clients."""


def build_optimizer(spec: OptimizerSpec, params: dict[str, nn.Parameter]) -> torch.optim.Optimizer:
    """A ``torch.optim`` optimizer from its description; groups keep ``params``' order."""
    grouped = {n for group in spec.groups for n in group.names}
    groups = [([p for n, p in params.items() if n in group.names], group.lr or spec.lr)
              for group in spec.groups]
    rest = [p for n, p in params.items() if n not in grouped]
    if not spec.groups:
        arguments: list = rest
    else:
        arguments = [{"params": ps, "lr": lr} for ps, lr in ([(rest, spec.lr)] if rest else []) + groups if ps]
    if spec.kind == "adam":
        return torch.optim.Adam(arguments, lr=spec.lr, betas=spec.betas, weight_decay=spec.weight_decay)
    if spec.kind == "sgd":
        return torch.optim.SGD(arguments, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay)
    raise ValueError(f"unknown optimizer kind {spec.kind!r}; valid: sgd, adam")


class SequentialExecutor:
    """One working model; clients train one after another, bit-for-bit the reference numbers."""

    name = "sequential"

    def __init__(self, model: nn.Module, data: FederatedData) -> None:
        self.model, self.data = model, data
        self.params = dict(model.named_parameters())
        self.tensors: Tensors = {**self.params, **dict(model.named_buffers())}
        self._test_owner = torch.cat([torch.full((n,), k, dtype=torch.long, device=data.device)
                                      for k, n in enumerate(data.num_test)])
        self._all_test = torch.cat(data.test_indices)

    def forward(self, params: Tensors, inputs: torch.Tensor) -> torch.Tensor:
        # ``params`` are the working model's own parameters here.
        return self.model(inputs)

    def train(self, program: ClientProgram, jobs: Sequence[ClientJob]) -> list[ClientUpdate]:
        return [self.train_one(program, job) for job in jobs]

    def train_one(self, program: ClientProgram, job: ClientJob) -> ClientUpdate:
        """Load the client's model, run its local phases (the batch loop), read back the results."""
        load_into(self.tensors, program.assemble(job.received, job.private))
        generator = torch.Generator().manual_seed(job.seed)
        torch.manual_seed(derive_seed(job.seed, "dropout"))  # dropout and friends: per job
        params, trainable_names = self.params, program.layout.trainable
        spec = program.optimizer()
        sums: dict[str, torch.Tensor] = {}
        total = torch.zeros((), device=self.data.device)
        steps = 0
        self.model.train()
        for phase in program.local_phases(job.client_id):
            trainable = {n: params[n] for n in trainable_names if n in phase.trainable}
            for name in trainable_names:
                params[name].requires_grad_(name in phase.trainable)
            optimizer = build_optimizer(spec, trainable)
            for _ in range(phase.epochs):
                for inputs, targets in self.data.train_batches(job.client_id, program.local.batch_size, generator):
                    terms = program.loss_terms(self.forward, params, inputs, targets, job.received)
                    loss = sum(program.loss_weights.get(n, 1.0) * t for n, t in terms.items())
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    if spec.max_grad_norm is not None:
                        torch.nn.utils.clip_grad_norm_(trainable.values(), spec.max_grad_norm)
                    optimizer.step()
                    total += loss.detach()
                    for name, value in terms.items():
                        sums[name] = sums[name] + value.detach() if name in sums else value.detach()
                    steps += 1
        for name in trainable_names:
            params[name].requires_grad_(True)
        means = torch.stack([total, *sums.values()]).div(max(steps, 1)).tolist()
        loss_terms = dict(zip(sums, means[1:])) if steps else {}
        return ClientUpdate(job.client_id, self.data.num_train[job.client_id],
                            program.upload(self.tensors, job.received), loss_terms,
                            means[0] if steps else float("nan"),
                            program.private_state(self.tensors, job.private))

    @torch.no_grad()
    def _count_correct(self, indices: torch.Tensor, batch: int = 1024) -> torch.Tensor:
        """Per-sample correctness (bool) of the working model on ``indices``."""
        hits = []
        for start in range(0, len(indices), batch):
            inputs, targets = self.data.gather(indices[start:start + batch])
            hits.append(self.model(inputs).argmax(dim=1) == targets)
        return torch.cat(hits) if hits else torch.zeros(0, dtype=torch.bool, device=self.data.device)

    @torch.no_grad()
    def evaluate(self, program: ClientProgram, jobs: Sequence[EvalJob]) -> list[np.ndarray]:
        self.model.eval()
        results = []
        for job in jobs:
            load_into(self.tensors, job.state)
            if len(job.client_ids) == 1:
                (k,) = job.client_ids
                results.append(np.array([int(self._count_correct(self.data.test_indices[k]).sum())]))
                continue
            if list(job.client_ids) == list(range(self.data.num_clients)):
                indices, owner = self._all_test, self._test_owner
            else:
                indices = torch.cat([self.data.test_indices[k] for k in job.client_ids])
                owner = torch.cat([torch.full((self.data.num_test[k],), i, dtype=torch.long, device=self.data.device)
                                   for i, k in enumerate(job.client_ids)])
            correct = torch.zeros(len(job.client_ids), dtype=torch.long, device=self.data.device)
            correct.index_add_(0, owner, self._count_correct(indices).long())
            results.append(correct.cpu().numpy())
        return results


EXECUTORS = {"sequential": SequentialExecutor}
