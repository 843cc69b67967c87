"""The one round loop: sample → jobs → executor → aggregate → evaluate → observers."""

from __future__ import annotations

import dataclasses
import math
import resource
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from pflbench.config.groups import FederationSpec
from pflbench.engine.algorithm import Algorithm
from pflbench.engine.executor import Executor
from pflbench.engine.metrics import accuracy_metrics
from pflbench.engine.observers import RunObserver
from pflbench.engine.personalize import FineTuneProgram, personalize
from pflbench.engine.types import ClientJob, ClientUpdate, EvalJob, Tensors, tensor_bytes
from pflbench.util.seeding import derive_seed, rng_stream

PERSONALIZE_CHUNK = 64  # clients personalized (and held in memory) at once during evaluation


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

    def __init__(
        self,
        algorithm: Algorithm,
        executor: Executor,
        num_test: Sequence[int],
        settings: FederationSpec,
        observers: Sequence[RunObserver] = (),
    ) -> None:
        self.algorithm, self.executor, self.observers = algorithm, executor, list(observers)
        self.settings = settings
        self.num_test = np.asarray(num_test)
        self.sampling_rng = rng_stream(settings.seed, "sampling")
        self.finetune_accuracy: np.ndarray | None = None  # per client, after --finetune-epochs
        self.next_round = 1
        self.bytes_up_total = self.bytes_down_total = 0
        self.client_accuracy = np.zeros(self.settings.num_clients)
        self.num_train = list(algorithm.num_train)

    def sample_clients(self) -> list[int]:
        k, m = self.settings.num_clients, self.settings.sampled_per_round
        return sorted(int(c) for c in self.sampling_rng.choice(k, size=m, replace=False))

    def train_round(self, round_index: int, sampled: list[int]) -> list[ClientUpdate]:
        """Train the sampled clients and aggregate. Under a streaming aggregation
        (``Algorithm.streaming_aggregate``) each upload is folded in as it arrives and the
        returned updates keep no params (memory: the private states, not every upload)."""
        algorithm = self.algorithm
        jobs = [
            ClientJob(
                k,
                round_index,
                derive_seed(self.settings.seed, "train", round_index, k),
                algorithm.broadcast(k),
                algorithm.store.get(k),
            )
            for k in sampled
        ]
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
            check_finite(round_index, [update])  # before a non-finite upload is folded in
            if stream is not None:
                stream.add(update)
                update = dataclasses.replace(update, params={}, private={})
            updates.append(update)
        if stream is not None:
            stream.finish()
        else:
            algorithm.aggregate(updates)
        return updates

    def evaluate(self, round_index: int = 0) -> tuple[dict[str, Any], np.ndarray]:
        """Metrics over all clients' test splits, and each client's accuracy."""
        algorithm, num_clients = self.algorithm, self.settings.num_clients
        everyone = tuple(range(num_clients))
        adaptation = algorithm.personalization_program()
        global_correct: np.ndarray | None
        if algorithm.clients_share_one_model() and adaptation is None:
            (correct,) = self.executor.evaluate(algorithm.program, [EvalJob(algorithm.global_model(), everyone)])
            global_correct = correct
        else:
            if adaptation is None:  # the body once, each client's head on its samples, if it can
                personal = [algorithm.personal_model(k) for k in everyone]
                split = getattr(self.executor, "evaluate_split", None)
                heads = split(algorithm.program, personal) if split is not None else None
                jobs = [] if heads is not None else [EvalJob(state, (k,)) for k, state in enumerate(personal)]
                correct_parts = [heads] if heads is not None else []
                del personal
            else:
                jobs, correct_parts = (
                    [],
                    [self.personalized_correct(adaptation, algorithm.personal_model, "personalize", round_index)],
                )
            if algorithm.has_global_model:
                jobs.append(EvalJob(algorithm.global_model(), everyone))
            results = self.executor.evaluate(algorithm.program, jobs) if jobs else []
            correct = np.concatenate(correct_parts + results[: len(results) - algorithm.has_global_model])
            global_correct = results[-1] if algorithm.has_global_model else None
        metrics: dict[str, Any] = dict(accuracy_metrics(correct, self.num_test))
        metrics["global_acc"] = None
        if algorithm.has_global_model and global_correct is not None:
            # float32 division, as torch's mean over the per-sample hits gave it
            hits = torch.tensor(float(global_correct.sum()), dtype=torch.float32)
            metrics["global_acc"] = float(hits / int(self.num_test.sum()))
        return metrics, correct / self.num_test

    def personalized_correct(self, program: Any, model_of: Any, stream: str, round_index: int) -> np.ndarray:
        """Correct test predictions per client of ``program`` run on ``model_of(k)`` over client
        k's train split (through the executor, in chunks so memory stays bounded)."""
        correct = []
        for start in range(0, self.settings.num_clients, PERSONALIZE_CHUNK):
            clients = list(range(start, min(start + PERSONALIZE_CHUNK, self.settings.num_clients)))
            seeds = [derive_seed(self.settings.seed, stream, round_index, k) for k in clients]
            states = personalize(self.executor, program, [model_of(k) for k in clients], clients, seeds, round_index)
            results = self.executor.evaluate(program, [EvalJob(s, (k,)) for s, k in zip(states, clients)])
            correct.extend(results)
        return np.concatenate(correct)

    def finetune_metrics(self, round_index: int) -> dict[str, float]:
        """``--finetune-epochs E`` (FedAvg-FT protocol): the global model fine-tuned for E epochs on
        each client's train split (the run's local optimizer), tested on the client's test split."""
        algorithm = self.algorithm
        program = FineTuneProgram(algorithm.layout.trainable, self.settings.local, self.settings.finetune_epochs)
        global_state: Tensors = algorithm.global_model()
        correct = self.personalized_correct(program, lambda k: global_state, "finetune", round_index)
        metrics = accuracy_metrics(correct, self.num_test)
        self.finetune_accuracy = correct / self.num_test
        return {"pers_acc_ft": metrics["pers_acc"], "pers_acc_ft_weighted": metrics["pers_acc_weighted"]}

    def run(self) -> np.ndarray:
        """The rounds from ``next_round`` on. Returns the final per-client accuracies; raises
        ``Diverged`` (after the observers saw every earlier round)."""
        settings, algorithm = self.settings, self.algorithm
        for round_index in range(self.next_round, settings.rounds + 1):
            started = time.perf_counter()
            sampled = self.sample_clients()
            updates = self.train_round(round_index, sampled)  # trained, checked and aggregated
            bytes_up, bytes_down = self._bytes_up, self._bytes_down
            if not _all_finite(algorithm.global_state):
                raise Diverged(round_index, None, f"parameter {_first_non_finite(algorithm.global_state)}")
            self.bytes_up_total += bytes_up
            self.bytes_down_total += bytes_down
            record: dict[str, Any] = {"round": round_index, "clients": sampled}
            record.update(mean_loss_terms(updates))
            record.update(
                bytes_up=bytes_up,
                bytes_down=bytes_down,
                bytes_up_cum=self.bytes_up_total,
                bytes_down_cum=self.bytes_down_total,
            )
            record.update(algorithm.round_diagnostics(updates))
            record["round_time_s"] = time.perf_counter() - started
            if round_index % settings.eval_every == 0 or round_index == settings.rounds:
                eval_started = time.perf_counter()
                metrics, self.client_accuracy = self.evaluate(round_index)
                record.update(metrics, eval_time_s=time.perf_counter() - eval_started)
            if round_index == settings.rounds and settings.finetune_epochs > 0 and algorithm.has_global_model:
                finetune_started = time.perf_counter()
                record.update(
                    self.finetune_metrics(round_index), finetune_time_s=time.perf_counter() - finetune_started
                )
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
