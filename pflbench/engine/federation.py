"""The one round loop: sample → jobs → executor → aggregate → evaluate → observers."""
from __future__ import annotations

import dataclasses
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


class Federation:
    """Runs ``algorithm``'s rounds on ``executor``; the algorithm's state lives in the driver."""

    def __init__(self, algorithm: Algorithm, executor: Executor, num_test: Sequence[int],
                 observers: Sequence[RunObserver] = ()) -> None:
        self.algorithm, self.executor, self.observers = algorithm, executor, list(observers)
        self.config = algorithm.config
        self.num_test = np.asarray(num_test)
        self.sampling_rng = rng_stream(self.config.seed, "sampling")
        self.num_train = list(algorithm.num_train)

    def sample_clients(self) -> list[int]:
        k, m = self.config.num_clients, self.config.sampled_per_round
        return sorted(int(c) for c in self.sampling_rng.choice(k, size=m, replace=False))

    def train_round(self, round_index: int, sampled: list[int]) -> list[ClientUpdate]:
        """Train the sampled clients and aggregate. Under a streaming aggregation
        (``Algorithm.streaming_aggregate``) each upload is folded in as it arrives and the
        returned updates keep no params (memory: the private states, not every upload)."""
        algorithm = self.algorithm
        jobs = [ClientJob(k, round_index, derive_seed(self.config.seed, "train", round_index, k),
                          algorithm.broadcast(k), algorithm.store.get(k)) for k in sampled]
        self._bytes_down = sum(tensor_bytes(job.received) for job in jobs)
        self._bytes_up = 0
        stream = algorithm.streaming_aggregate([self.num_train[k] for k in sampled])
        train = getattr(self.executor, "train_iter", self.executor.train)
        updates = []
        for job, update in zip(jobs, train(algorithm.program, jobs)):
            if update.private:
                algorithm.store.put(update.client_id, update.private)
            for observer in self.observers:
                observer.on_client_update(job, update)
            self._bytes_up += tensor_bytes(update.params)
            if stream is not None:
                stream.add(update)
                update = dataclasses.replace(update, params={}, private={})
            updates.append(update)
        if stream is not None:
            stream.finish()
        else:
            algorithm.aggregate(updates)
        return updates

    def evaluate(self) -> tuple[dict[str, Any], np.ndarray]:
        """Metrics over all clients' test splits, and each client's accuracy."""
        algorithm, num_clients = self.algorithm, self.config.num_clients
        everyone = tuple(range(num_clients))
        if algorithm.clients_share_one_model():
            (correct,) = self.executor.evaluate(algorithm.program, [EvalJob(algorithm.global_model(), everyone)])
            global_correct = correct
        else:
            personal = [algorithm.personal_model(k) for k in everyone]
            split = getattr(self.executor, "evaluate_split", None)
            heads = split(algorithm.program, personal) if split is not None else None
            jobs = [] if heads is not None else [EvalJob(state, (k,)) for k, state in enumerate(personal)]
            del personal
            if algorithm.has_global_model:
                jobs.append(EvalJob(algorithm.global_model(), everyone))
            results = self.executor.evaluate(algorithm.program, jobs) if jobs else []
            correct = heads if heads is not None else np.concatenate(results[:num_clients])
            global_correct = results[-1] if algorithm.has_global_model else None
        metrics = accuracy_metrics(correct, self.num_test)
        metrics["global_acc"] = None
        if algorithm.has_global_model and global_correct is not None:
            # float32 division, as torch's mean over the per-sample hits gave it
            hits = torch.tensor(float(global_correct.sum()), dtype=torch.float32)
            metrics["global_acc"] = float(hits / int(self.num_test.sum()))
        return metrics, correct / self.num_test

    def run(self) -> np.ndarray:
        """All rounds. Returns the final per-client accuracies."""
        config, algorithm = self.config, self.algorithm
        bytes_up_total = bytes_down_total = 0
        client_accuracy = np.zeros(config.num_clients)
        for round_index in range(1, config.rounds + 1):
            started = time.perf_counter()
            sampled = self.sample_clients()
            updates = self.train_round(round_index, sampled)  # trained and aggregated
            bytes_up, bytes_down = self._bytes_up, self._bytes_down
            bytes_up_total += bytes_up
            bytes_down_total += bytes_down
            record: dict[str, Any] = {"round": round_index, "clients": sampled}
            record.update(mean_loss_terms(updates))
            record.update(bytes_up=bytes_up, bytes_down=bytes_down,
                          bytes_up_cum=bytes_up_total, bytes_down_cum=bytes_down_total)
            record.update(algorithm.round_diagnostics(updates))
            record["round_time_s"] = time.perf_counter() - started
            if round_index % config.resolved_eval_every == 0 or round_index == config.rounds:
                eval_started = time.perf_counter()
                metrics, client_accuracy = self.evaluate()
                record.update(metrics, eval_time_s=time.perf_counter() - eval_started)
            record["peak_mem_mb"] = peak_memory_mb(self.executor)
            for observer in self.observers:
                observer.on_round_end(record)
        return client_accuracy


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
