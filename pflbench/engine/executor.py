"""Executors run client programs: ``train(program, jobs) -> updates`` and ``evaluate``.

``Executor`` declares every member the engine and the runs use of one; an executor implements
them all (``SequentialExecutor``'s are the reference; ``vmap`` and ``ray`` follow its numbers).

``SequentialExecutor`` trains one client after another in one working model: it loads
``program.assemble(received, private)`` into the model in place, runs the local phases (the
batch loop) and reads the upload and the new private state back out.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from pflbench.config.groups import ExecutorSpec
from pflbench.data.dataset import FederatedData
from pflbench.engine.algorithm import Algorithm, ClientProgram
from pflbench.engine.evaluation import evaluate_heads, head_split
from pflbench.engine.local import LocalTrainer
from pflbench.engine.types import ClientJob, ClientUpdate, EvalJob, Tensors, load_into
from pflbench.util.precision import autocast, eval_batch
from pflbench.util.ray_cluster import require_ray
from pflbench.util.seeding import derive_seed


class Executor(Protocol):
    name: str
    model: nn.Module  # the working model (the run's architecture; what ``export`` saves)
    data: FederatedData  # the clients' data, on the run's device

    def check_algorithm(self, algorithm: Algorithm) -> None:
        """Raise ConfigError when this executor cannot host ``algorithm`` (before any work)."""

    def train(self, program: ClientProgram, jobs: Sequence[ClientJob]) -> list[ClientUpdate]:
        """Run each job's local training; updates in the order of ``jobs``."""

    def train_iter(self, program: ClientProgram, jobs: Sequence[ClientJob]) -> Iterator[ClientUpdate]:
        """``train``'s updates one by one, in the order of ``jobs``, as soon as each is ready
        (the round loop folds each into a streamed aggregation as it arrives)."""

    def evaluate(self, program: ClientProgram, jobs: Sequence[EvalJob]) -> list[np.ndarray]:
        """Per job, the number of correct predictions of each of its clients on the job's split."""

    def evaluate_split(
        self, program: ClientProgram, states: Sequence[Tensors], clients: Sequence[int], split: str
    ) -> np.ndarray | None:
        """Correct predictions on ``split`` of each client ``clients[i]`` with model
        ``states[i]``, the shared body run once (``evaluation.head_split``); None when this
        executor does not, or the states are not body + own head (then ``evaluate`` per client)."""

    def close(self) -> None:
        """Release what the executor holds (Ray actors back to the pool); the run is over."""


class SequentialExecutor:
    """One working model; clients train one after another, bit-for-bit the reference numbers."""

    name = "sequential"

    def __init__(self, model: nn.Module, data: FederatedData) -> None:
        self.model, self.data = model, data
        self.tensors: Tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
        self._everyone: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # split → (indices, owner) of all clients

    def check_algorithm(self, algorithm: Algorithm) -> None:
        """Hosts every algorithm."""

    def close(self) -> None:
        """Holds nothing to release."""

    def train(self, program: ClientProgram, jobs: Sequence[ClientJob]) -> list[ClientUpdate]:
        return list(self.train_iter(program, jobs))

    def train_iter(self, program: ClientProgram, jobs: Sequence[ClientJob]) -> Iterator[ClientUpdate]:
        """The updates one by one, as each client finishes (the round loop folds them in)."""
        for job in jobs:
            yield self.train_one(program, job)

    def train_one(self, program: ClientProgram, job: ClientJob) -> ClientUpdate:
        """Load the client's model, run its local update, read back upload and private state."""
        assembled = program.assemble(job.received, job.private)
        load_into(
            self.tensors, {n: t for n, t in assembled.items() if n in self.tensors}
        )  # extra state stays in the job
        torch.manual_seed(derive_seed(job.seed, "dropout"))  # dropout and friends: per job
        trainer = LocalTrainer(self.model, self.data, job, program.local.batch_size, program.local.precision)
        result = program.local_update(trainer)
        upload = result.upload if result.upload is not None else program.upload(self.tensors, job.received)
        private = result.private if result.private is not None else program.private_state(self.tensors, job.private)
        return ClientUpdate(
            job.client_id,
            self.data.num_train[job.client_id],
            upload,
            result.loss_terms,
            result.loss,
            private,
            local_steps=result.steps,
        )

    @torch.no_grad()
    def _count_correct(self, indices: torch.Tensor, precision: str = "fp32", batch: int = 256) -> torch.Tensor:
        """Per-sample correctness (bool) of the working model on ``indices`` (``batch`` on the
        CPU, a large one on an accelerator: ``util.precision.eval_batch``). 256 on the CPU: a
        conv net's activations at 1,024 (FedRep's CNN on 28×28: 150 MB per layer output) set a
        run's peak memory, and the outputs are the same bit for bit (checked for the zoo)."""
        hits = []
        batch = eval_batch(self.data.device, batch)
        for start in range(0, len(indices), batch):
            inputs, targets = self.data.gather(indices[start : start + batch])
            with autocast(self.data.device, precision):
                hits.append(self.model(inputs).argmax(dim=1) == targets)
        return torch.cat(hits) if hits else torch.zeros(0, dtype=torch.bool, device=self.data.device)

    def evaluate_split(
        self,
        program: ClientProgram,
        states: Sequence[Tensors],
        clients: Sequence[int] | None = None,
        split: str = "test",
    ) -> np.ndarray | None:
        """Correct predictions on ``split`` of every client ``clients[i]`` (default: all, in
        order) with model ``states[i]``, the shared body run once (``evaluation.head_split``);
        None when the states are not body + own head."""
        heads = head_split(self.model, list(states))
        if heads is None:
            return None
        clients = range(self.data.num_clients) if clients is None else clients
        return evaluate_heads(
            self.model,
            self.tensors,
            self.data,
            heads,
            clients=list(clients),
            on=split,
            precision=program.local.precision,
        )

    def _owned_indices(self, client_ids: Sequence[int], split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The clients' ``split`` indices, concatenated, and each index's position in ``client_ids``."""
        indices, counts = self.data.eval_indices(split), self.data.eval_counts(split)
        owner = [
            torch.full((counts[k],), i, dtype=torch.long, device=self.data.device) for i, k in enumerate(client_ids)
        ]
        return torch.cat([indices[k] for k in client_ids]), torch.cat(owner)

    @torch.no_grad()
    def evaluate(self, program: ClientProgram, jobs: Sequence[EvalJob]) -> list[np.ndarray]:
        """The counts stay on the device until every job is queued: one host sync, not one per job."""
        self.model.eval()
        results: list[torch.Tensor] = []
        for job in jobs:
            load_into(self.tensors, job.state)
            if len(job.client_ids) == 1:
                (k,) = job.client_ids
                hits = self._count_correct(self.data.eval_indices(job.split)[k], program.local.precision)
                results.append(hits.sum(dtype=torch.long).reshape(1))
                continue
            if list(job.client_ids) == list(range(self.data.num_clients)):
                if job.split not in self._everyone:  # every evaluation round: built once
                    self._everyone[job.split] = self._owned_indices(job.client_ids, job.split)
                indices, owner = self._everyone[job.split]
            else:
                indices, owner = self._owned_indices(job.client_ids, job.split)
            correct = torch.zeros(len(job.client_ids), dtype=torch.long, device=self.data.device)
            correct.index_add_(0, owner, self._count_correct(indices, program.local.precision).long())
            results.append(correct)
        if not results:
            return []
        return [part.numpy() for part in torch.cat(results).cpu().split([len(r) for r in results])]


class LazyExecutor:
    """An executor class imported on first use (``"module:Class"``), so that an optional
    dependency (Ray) is imported only by runs that ask for it. ``check()`` runs before any
    expensive stage and raises ConfigError when the dependency is missing."""

    def __init__(self, path: str, check: Callable[[], object] | None = None) -> None:
        self.path, self._check = path, check

    def check(self) -> None:
        if self._check is not None:
            self._check()

    def load(self) -> type:
        module, _, name = self.path.partition(":")
        return getattr(importlib.import_module(module), name)


def _require_ray() -> None:

    require_ray()


def check_executor(kind: str) -> None:
    """Raise ConfigError when executor ``kind``'s optional dependency is missing (Ray), before
    any expensive stage; an executor without one (a class) has nothing to check."""
    factory = EXECUTORS[kind]
    if isinstance(factory, LazyExecutor):
        factory.check()


def make_executor(spec: ExecutorSpec, model: nn.Module, data: FederatedData) -> Executor:
    """Build executor ``spec.kind``; a class with ``from_spec(model, data, spec)`` reads its settings."""
    factory: Any = EXECUTORS[spec.kind]
    if isinstance(factory, LazyExecutor):
        factory.check()
        factory = factory.load()
    from_spec = getattr(factory, "from_spec", None)
    return from_spec(model, data, spec) if from_spec is not None else factory(model, data)


EXECUTORS: dict[str, object] = {
    "sequential": SequentialExecutor,
    "vmap": LazyExecutor("pflbench.engine.vmap:VmapExecutor"),  # torch.func only when asked for
    "ray": LazyExecutor("pflbench.engine.ray_executor:RayExecutor", check=_require_ray),
}
