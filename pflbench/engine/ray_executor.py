"""``--executor ray``: the sampled clients of a round train in parallel on Ray actors.

Each actor (``ClientWorker``) holds a model replica and the ``FederatedData`` once per run: the
driver ``ray.put``s them once and every actor gets the same object. Inside, an actor runs a
``SequentialExecutor``, so a job computes exactly what it computes with ``--executor sequential``
(the job's seed drives dropout and batch order; the job's state is loaded over the model), and
the numbers do not depend on which actor trains which client.

Per round the driver ships ``ClientJob``s (received + private + seed) and gets ``ClientUpdate``s
back. Tensors used by several jobs of one call (FedAvg's broadcast, the global part of every
personal model) are put once and resolved by each actor once; the ``ClientProgram`` is put once
and re-sent only when its pickled bytes change. Evaluation jobs go to the actors the same way.

Faults: when an actor dies (its process killed, its node lost), its jobs are resubmitted to a
replacement actor built from the same model and data; a job is deterministic, so the run's
numbers are those of an undisturbed run. Actors are returned to a per-process pool when the run
ends (``close``), so runs one after another (a sweep) do not pay the actor start-up again.
"""

from __future__ import annotations

import collections
import copy
import hashlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import nn

from pflbench.config.groups import ExecutorSpec
from pflbench.data.dataset import FederatedData
from pflbench.engine.algorithm import Algorithm, ClientProgram
from pflbench.engine.executor import SequentialExecutor
from pflbench.engine.types import ClientJob, ClientUpdate, EvalJob, Tensors
from pflbench.errors import ConfigError
from pflbench.util.ray_cluster import cluster_cpus, cluster_gpus, connect, ship_plugins_by_value

IN_FLIGHT = 2  # calls queued per actor: one runs while the next one's arguments arrive
CALLS_PER_WORKER = 4  # a round's jobs go in chunks, about this many per actor (balance vs. overhead)
MAX_ATTEMPTS = 3  # a job whose actor died this many times fails the run


@dataclass(frozen=True)
class SharedRef:
    """A tensor found in the call's shared store (``Packed.shared``) under ``key``."""

    key: int


def pack(dicts: Sequence[Tensors]) -> tuple[Tensors, list[dict[str, Any]]]:
    """Tensors appearing in two or more of ``dicts`` move to one shared store; the dicts keep
    ``SharedRef``s to them. Returns (store, packed dicts)."""
    seen: collections.Counter[int] = collections.Counter(id(t) for d in dicts for t in d.values())
    store: dict[int, torch.Tensor] = {}
    packed = []
    for tensors in dicts:
        item: dict[str, Any] = {}
        for name, tensor in tensors.items():
            if seen[id(tensor)] > 1:
                store[id(tensor)] = tensor.detach().cpu()
                item[name] = SharedRef(id(tensor))
            else:
                item[name] = tensor.detach().cpu()
        packed.append(item)
    return {str(k): t for k, t in store.items()}, packed


def unpack(item: dict[str, Any], store: Tensors, device: torch.device) -> Tensors:
    return {n: (store[str(v.key)] if isinstance(v, SharedRef) else v).to(device) for n, v in item.items()}


def portable_data(data: FederatedData) -> FederatedData:
    """A CPU copy of ``data`` to ship (the actor moves it to its own device)."""
    if data.device.type == "cpu":
        return data
    ported = copy.copy(data)
    for name, value in vars(data).items():
        if isinstance(value, torch.Tensor):
            setattr(ported, name, value.cpu())
        elif isinstance(value, list) and value and isinstance(value[0], torch.Tensor):
            setattr(ported, name, [t.cpu() for t in value])
    ported.device = torch.device("cpu")
    return ported


def data_to(data: FederatedData, device: torch.device) -> FederatedData:
    if device == data.device:
        return data
    moved = copy.copy(data)
    for name, value in vars(data).items():
        if isinstance(value, torch.Tensor):
            setattr(moved, name, value.to(device))
        elif isinstance(value, list) and value and isinstance(value[0], torch.Tensor):
            setattr(moved, name, [t.to(device) for t in value])
    moved.device = device
    return moved


class ClientWorker:
    """The Ray actor: a model replica, the run's data and a ``SequentialExecutor`` over them."""

    def __init__(self, threads: int) -> None:
        torch.set_num_threads(max(1, threads))
        self.executor: SequentialExecutor | None = None
        self.program_key, self.program = "", None
        self.store_key, self.store = "", {}

    def pid(self) -> int:
        return os.getpid()

    def reset(self) -> None:
        """Drop the run's model and data (the actor waits in the pool for the next run)."""
        self.__init__(torch.get_num_threads())

    def setup(self, model: nn.Module, data: FederatedData, use_gpu: bool) -> None:
        device = torch.device("cuda" if use_gpu else "cpu")
        self.executor = SequentialExecutor(model.to(device), data_to(data, device))
        self.program_key, self.program, self.store_key, self.store = "", None, "", {}

    def _context(
        self, program_key: str, program_box: list, store_key: str, store_box: list
    ) -> tuple[ClientProgram, Tensors]:
        import ray

        if program_key != self.program_key:
            self.program, self.program_key = ray.get(program_box[0]), program_key
        if store_key != self.store_key:
            self.store, self.store_key = ray.get(store_box[0]) if store_box else {}, store_key
        return self.program, self.store

    def train(self, context: tuple, jobs: list[tuple]) -> list[ClientUpdate]:
        program, store = self._context(*context)
        device = self.executor.data.device
        updates = []
        for client_id, round_index, seed, received, private, max_steps, sample_privacy in jobs:
            update = self.executor.train_one(
                program,
                ClientJob(
                    client_id,
                    round_index,
                    seed,
                    unpack(received, store, device),
                    unpack(private, store, device),
                    max_steps,
                    sample_privacy,
                ),
            )
            updates.append(
                replace(
                    update,
                    params={n: t.detach().cpu() for n, t in update.params.items()},
                    private={n: t.detach().cpu() for n, t in update.private.items()},
                )
            )
        return updates

    def evaluate(self, context: tuple, jobs: list[tuple]) -> list[np.ndarray]:
        program, store = self._context(*context)
        device = self.executor.data.device
        return self.executor.evaluate(
            program, [EvalJob(unpack(state, store, device), client_ids, split) for state, client_ids, split in jobs]
        )


_POOL: dict[tuple, list] = {}  # idle actors of this process, by (ray job, cpus, gpus)


def release_pool(shape: tuple | None = None) -> None:
    """Kill this process's idle actors (of one ``shape``, or all): an idle actor still holds its
    CPUs/GPUs, which Ray could give to tasks (``sweep --ray`` releases them first)."""
    import ray

    for key in [shape] if shape is not None else list(_POOL):
        for actor in _POOL.pop(key, []):
            if ray.is_initialized():
                ray.kill(actor)


class RayExecutor:
    """Trains and evaluates on ``num_workers`` Ray actors; numbers as ``SequentialExecutor``'s."""

    name = "ray"

    @classmethod
    def from_spec(cls, model: nn.Module, data: FederatedData, spec: ExecutorSpec) -> RayExecutor:

        ray = connect(spec.ray_address)
        use_gpu = data.device.type == "cuda"
        gpus = cluster_gpus(ray)
        if use_gpu and gpus == 0:
            raise ConfigError(f"--device {spec.device} with --executor ray: the Ray cluster has no GPU")
        if spec.ray_workers is not None and spec.ray_workers < 1:
            raise ConfigError(f"--ray-workers must be ≥ 1, got {spec.ray_workers}")
        workers = spec.ray_workers or (gpus if use_gpu else cluster_cpus(ray))
        available = gpus if use_gpu else cluster_cpus(ray)
        if workers > available:  # more actors than the cluster can place would wait forever
            raise ConfigError(
                f"--ray-workers {workers}: the Ray cluster has only {available} {'GPUs' if use_gpu else 'CPUs'}"
            )
        workers = max(1, min(workers, spec.sampled_per_round))
        return cls(model, data, workers, gpus_per_worker=min(1.0, gpus / workers) if use_gpu else 0.0)

    def __init__(
        self,
        model: nn.Module,
        data: FederatedData,
        num_workers: int = 2,
        cpus_per_worker: int = 1,
        gpus_per_worker: float = 0.0,
    ) -> None:

        self.ray = connect()
        self.model, self.data = model, data
        self.shape = (self.ray.get_runtime_context().get_job_id(), cpus_per_worker, gpus_per_worker)
        shipped = model if data.device.type == "cpu" else copy.deepcopy(model).cpu()
        ship_plugins_by_value(self.ray, shipped)
        self._model_ref, self._data_ref = self.ray.put(shipped), self.ray.put(portable_data(data))
        self._program_key, self._program_ref = "", None
        self.replaced = 0  # actors replaced after a fault (tests and logs read it)
        for shape in [k for k in _POOL if k != self.shape]:  # idle actors of another kind hold resources
            release_pool(shape)
        idle = _POOL.setdefault(self.shape, [])
        self.actors = [idle.pop() if idle else self._new_actor() for _ in range(num_workers)]
        for actor in self.actors:
            actor.setup.remote(self._model_ref, self._data_ref, gpus_per_worker > 0)

    def _new_actor(self) -> Any:
        _, cpus, gpus = self.shape
        remote = self.ray.remote(ClientWorker).options(num_cpus=cpus, num_gpus=gpus, max_restarts=0)
        return remote.remote(cpus)

    def _replace(self, slot: int) -> None:
        self.ray.kill(self.actors[slot])
        self.actors[slot] = self._new_actor()
        self.actors[slot].setup.remote(self._model_ref, self._data_ref, self.shape[2] > 0)
        self.replaced += 1

    def _program_context(self, program: ClientProgram) -> tuple[str, list]:

        ship_plugins_by_value(self.ray, program)
        key = hashlib.sha256(self.ray.cloudpickle.dumps(program)).hexdigest()
        if key != self._program_key:
            self._program_key, self._program_ref = key, self.ray.put(program)
        return key, [self._program_ref]

    def _map(self, method: str, program: ClientProgram, items: list[tuple], store: Tensors) -> list[Any]:
        """Run ``method`` on chunks of ``items`` across the actors; results in ``items``' order.

        Chunks go to whichever actor is free (at most ``IN_FLIGHT`` queued per actor); a chunk
        whose actor died is resubmitted to the actor that replaces it."""
        if not items:
            return []
        size = -(-len(items) // (len(self.actors) * CALLS_PER_WORKER))
        chunks = [items[i : i + size] for i in range(0, len(items), size)]
        ray = self.ray
        from ray.exceptions import RayActorError

        store_ref = ray.put(store) if store else None
        context = (
            *self._program_context(program),
            store_ref.hex() if store_ref else "",
            [store_ref] if store_ref else [],
        )
        results: list[Any] = [None] * len(chunks)
        queue, attempts = collections.deque(range(len(chunks))), collections.Counter()
        pending: dict[Any, tuple[int, Any, int]] = {}

        def submit(slot: int) -> None:
            index = queue.popleft()
            actor = self.actors[slot]
            pending[getattr(actor, method).remote(context, chunks[index])] = (slot, actor, index)
            self.after_submit(slot, chunks[index])

        for _ in range(IN_FLIGHT):
            for slot in range(len(self.actors)):
                if queue:
                    submit(slot)
        while pending:
            (ref,), _ = ray.wait(list(pending), num_returns=1)
            slot, actor, index = pending.pop(ref)
            try:
                results[index] = ray.get(ref)
            except RayActorError:
                attempts[index] += 1
                if attempts[index] >= MAX_ATTEMPTS:
                    raise
                queue.appendleft(index)
                if self.actors[slot] is actor:  # the first of its failed calls: replace it
                    self._replace(slot)
            while queue and sum(1 for s, _, _ in pending.values() if s == slot) < IN_FLIGHT:
                submit(slot)
        return [result for chunk in results for result in chunk]

    def check_algorithm(self, algorithm: Algorithm) -> None:
        """Hosts every algorithm (each actor runs a ``SequentialExecutor``)."""

    def train_iter(self, program: ClientProgram, jobs: Sequence[ClientJob]) -> Iterator[ClientUpdate]:
        """The round's updates once every actor has returned its chunks (``train``)."""
        return iter(self.train(program, jobs))

    def train(self, program: ClientProgram, jobs: Sequence[ClientJob]) -> list[ClientUpdate]:
        dicts = [d for job in jobs for d in (job.received, job.private)]
        store, packed = pack(dicts)
        items = [
            (job.client_id, job.round, job.seed, packed[2 * i], packed[2 * i + 1], job.max_steps, job.sample_privacy)
            for i, job in enumerate(jobs)
        ]
        updates = self._map("train", program, items, store)
        device = self.data.device
        if device.type != "cpu":
            updates = [
                replace(
                    u,
                    params={n: t.to(device) for n, t in u.params.items()},
                    private={n: t.to(device) for n, t in u.private.items()},
                )
                for u in updates
            ]
        return updates

    def evaluate(self, program: ClientProgram, jobs: Sequence[EvalJob]) -> list[np.ndarray]:
        store, packed = pack([job.state for job in jobs])
        return self._map("evaluate", program, [(p, tuple(j.client_ids), j.split) for p, j in zip(packed, jobs)], store)

    def evaluate_split(
        self, program: ClientProgram, states: Sequence[Tensors], clients: Sequence[int], split: str
    ) -> np.ndarray | None:
        """None: the actors evaluate each client's model (``evaluate``), as jobs."""
        return None

    def after_submit(self, slot: int, chunk: list[tuple]) -> None:
        """Called after each call is submitted to actor ``slot`` (a seam for fault-injection tests)."""

    def pids(self) -> list[int]:
        return self.ray.get([actor.pid.remote() for actor in self.actors])

    def close(self) -> None:
        """Return the actors to this process's pool (the next run reuses them)."""
        if self.actors:
            for actor in self.actors:
                actor.reset.remote()
            _POOL.setdefault(self.shape, []).extend(self.actors)
            self.actors = []
