"""The one round loop: sample → jobs → executor → aggregate → evaluate → observers."""
from __future__ import annotations

import math
import resource
import time
from typing import Any, Sequence

import numpy as np
import torch

from ..metrics import accuracy_metrics
from ..seeding import derive_seed, rng_stream
from .algorithm import Algorithm
from .executor import Executor
from .observers import RunObserver
from .types import ClientJob, ClientUpdate, EvalJob, tensor_bytes


class Diverged(Exception):
    """A non-finite loss, loss term or parameter: the run stops (status ``diverged``)."""

    def __init__(self, round_index: int, client: int | None, term: str) -> None:
        self.round, self.client, self.term = round_index, client, term
        where = f"client {client}" if client is not None else "after aggregation"
        super().__init__(f"diverged at round {round_index} ({where}): {term} is not finite")

    def to_json(self) -> dict[str, Any]:
        return {"round": self.round, "client": self.client, "term": self.term}


def _all_finite(tensors: dict[str, torch.Tensor]) -> bool:
    floats = [t for t in tensors.values() if t.is_floating_point()]
    return not floats or bool(torch.stack([t.isfinite().all() for t in floats]).all())


def _first_non_finite(tensors: dict[str, torch.Tensor]) -> str:
    return next(n for n, t in tensors.items() if t.is_floating_point() and not bool(t.isfinite().all()))


def check_finite(round_index: int, updates: list[ClientUpdate]) -> None:
    """Raise ``Diverged`` on the first client whose loss, a loss term or private state is not finite
    (a client that took no step reports a NaN loss and no terms: not a divergence)."""
    for update in updates:
        if update.loss_terms:
            for name, value in [("loss", update.loss), *update.loss_terms.items()]:
                if not math.isfinite(value):
                    raise Diverged(round_index, update.client_id, name)
        for kind, tensors in (("upload", update.params), ("private", update.private)):
            if tensors and not _all_finite(tensors):
                raise Diverged(round_index, update.client_id, f"{kind} {_first_non_finite(tensors)}")


class Federation:
    """Runs ``algorithm``'s rounds on ``executor``; the algorithm's state lives in the driver.

    ``next_round``, the byte totals and ``client_accuracy`` are the loop's own state between
    rounds (with ``sampling_rng`` and the algorithm's state: what a checkpoint saves)."""

    def __init__(self, algorithm: Algorithm, executor: Executor, num_test: Sequence[int],
                 observers: Sequence[RunObserver] = ()) -> None:
        self.algorithm, self.executor, self.observers = algorithm, executor, list(observers)
        self.config = algorithm.config
        self.num_test = np.asarray(num_test)
        self.sampling_rng = rng_stream(self.config.seed, "sampling")
        self.next_round = 1
        self.bytes_up_total = self.bytes_down_total = 0
        self.client_accuracy = np.zeros(self.config.num_clients)

    def sample_clients(self) -> list[int]:
        k, m = self.config.num_clients, self.config.sampled_per_round
        return sorted(int(c) for c in self.sampling_rng.choice(k, size=m, replace=False))

    def train_round(self, round_index: int, sampled: list[int]) -> list[ClientUpdate]:
        algorithm = self.algorithm
        jobs = [ClientJob(k, round_index, derive_seed(self.config.seed, "train", round_index, k),
                          algorithm.broadcast(k), algorithm.store.get(k)) for k in sampled]
        updates = self.executor.train(algorithm.program, jobs)
        for job, update in zip(jobs, updates):
            if update.private:
                algorithm.store.put(update.client_id, update.private)
            for observer in self.observers:
                observer.on_client_update(job, update)
        self._bytes_down = sum(tensor_bytes(job.received) for job in jobs)
        return updates

    def evaluate(self) -> tuple[dict[str, Any], np.ndarray]:
        """Metrics over all clients' test splits, and each client's accuracy."""
        algorithm, num_clients = self.algorithm, self.config.num_clients
        everyone = tuple(range(num_clients))
        if algorithm.clients_share_one_model():
            (correct,) = self.executor.evaluate(algorithm.program, [EvalJob(algorithm.global_model(), everyone)])
            global_correct = correct
        else:
            jobs = [EvalJob(algorithm.personal_model(k), (k,)) for k in everyone]
            if algorithm.has_global_model:
                jobs.append(EvalJob(algorithm.global_model(), everyone))
            results = self.executor.evaluate(algorithm.program, jobs)
            correct = np.concatenate(results[:num_clients])
            global_correct = results[-1] if algorithm.has_global_model else None
        metrics = accuracy_metrics(correct, self.num_test)
        metrics["global_acc"] = None
        if algorithm.has_global_model and global_correct is not None:
            # float32 division, as torch's mean over the per-sample hits gave it
            hits = torch.tensor(float(global_correct.sum()), dtype=torch.float32)
            metrics["global_acc"] = float(hits / int(self.num_test.sum()))
        return metrics, correct / self.num_test

    def run(self) -> np.ndarray:
        """The rounds from ``next_round`` on. Returns the final per-client accuracies; raises
        ``Diverged`` (after the observers saw every earlier round)."""
        config, algorithm = self.config, self.algorithm
        for round_index in range(self.next_round, config.rounds + 1):
            started = time.perf_counter()
            sampled = self.sample_clients()
            updates = self.train_round(round_index, sampled)
            check_finite(round_index, updates)
            bytes_up = sum(tensor_bytes(u.params) for u in updates)
            bytes_down = self._bytes_down
            algorithm.aggregate(updates)
            if not _all_finite(algorithm.global_state):
                raise Diverged(round_index, None, f"parameter {_first_non_finite(algorithm.global_state)}")
            self.bytes_up_total += bytes_up
            self.bytes_down_total += bytes_down
            record: dict[str, Any] = {"round": round_index, "clients": sampled}
            record.update(mean_loss_terms(updates))
            record.update(bytes_up=bytes_up, bytes_down=bytes_down,
                          bytes_up_cum=self.bytes_up_total, bytes_down_cum=self.bytes_down_total)
            record.update(algorithm.round_diagnostics(updates))
            record["round_time_s"] = time.perf_counter() - started
            if round_index % config.resolved_eval_every == 0 or round_index == config.rounds:
                eval_started = time.perf_counter()
                metrics, self.client_accuracy = self.evaluate()
                record.update(metrics, eval_time_s=time.perf_counter() - eval_started)
            record["peak_mem_mb"] = peak_memory_mb(self.executor)
            self.next_round = round_index + 1
            for observer in self.observers:
                observer.on_round_end(record)
        return self.client_accuracy


def mean_loss_terms(updates: list[ClientUpdate]) -> dict[str, float]:
    """train_loss = mean over the round's clients of their mean total loss; plus each term."""
    if not updates:
        return {"train_loss": float("nan")}
    names = list(updates[0].loss_terms)
    result = {"train_loss": float(np.mean([u.loss for u in updates]))}
    if len(names) > 1:
        result.update({f"loss_{n}": float(np.mean([u.loss_terms[n] for u in updates])) for n in names})
    return result


def peak_memory_mb(executor: Any) -> float:
    device = getattr(getattr(executor, "data", None), "device", torch.device("cpu"))
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
