"""THE evaluation seam: what a run measures of its models, one protocol per kind.

``Federation`` (the round loop) asks ``Evaluator.evaluate`` every ``eval_every`` rounds and
after the last, and ``Evaluator.finetune`` after the last round; it never looks inside. The
protocols, in the order their metrics enter a round's record:

- ``ClientProtocol``: each training client's evaluation model on its test split (``pers_acc``,
  ...) and, with a validation split (``--val-frac``), on its validation split (``val_pers_acc``,
  ...): a personalization program runs once, its result is evaluated on both; the global model
  on the same samples (``global_acc``, ``val_global_acc``).
- ``NewClientProtocol`` (``--new-clients``): clients held out of training entirely, each served
  by the algorithm's adaptation (``Algorithm.new_client_model`` / ``new_client_program``) and
  tested (``new_acc``, ...).
- ``HeldOutProtocol``: one accuracy of the global model (without one: of each client's own
  model, as it is) on samples nobody trained on: the held-out domain (``--holdout-domain``:
  ``ood_acc``) and the triggered test samples of the honest clients (``--attack backdoor``:
  ``asr``, engine.attacks).
- ``FineTuneProtocol`` (``--finetune-epochs``, after the last round): the global model
  fine-tuned on each client's train split (``pers_acc_ft``, ``new_acc_ft``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pflbench.config.groups import FederationSpec
from pflbench.data.dataset import FederatedData
from pflbench.data.partition import Partition
from pflbench.engine.algorithm import Algorithm, ClientProgram, FineTuneProgram
from pflbench.engine.evaluation import varying_names
from pflbench.engine.executor import Executor
from pflbench.engine.metrics import accuracy_metrics
from pflbench.engine.personalize import personalize
from pflbench.engine.types import EvalJob, Tensors
from pflbench.util import progress
from pflbench.util.seeding import derive_seed

PERSONALIZE_CHUNK = 64  # clients personalized (and held in memory) at once during evaluation
# how the progress display names a ``personalized_correct`` stream (the stage's unit: a client)
STAGE_NAMES = {
    "personalize": "personalizing for evaluation",
    "adapt_new": "adapting new clients",
    "finetune": "fine-tuning",
}
Columns = dict[str, np.ndarray]  # per-client values (NaN where a metric does not cover a client)


@dataclass(frozen=True)
class EvaluationSets:
    """The samples the protocols evaluate on: each client's test (and validation) split size,
    the clients held out of training (``data.partition.choose_new_clients``), the held-out
    domain's size (the executor's ``ood`` split; 0: none) and each client's triggered test
    samples (``--attack backdoor``; None: none)."""

    num_test: np.ndarray
    num_val: np.ndarray | None = None
    new_clients: tuple[int, ...] = ()
    num_ood: int = 0
    num_backdoor: np.ndarray | None = None

    @classmethod
    def of(cls, data: FederatedData, partition: Partition) -> EvaluationSets:
        """A prepared run's sets (``runs.prepare``): its data and its partition."""
        return cls.given(
            data.num_test,
            data.num_val if partition.has_val else None,
            partition.new_clients,
            len(partition.ood),
            data.num_backdoor,
        )

    @classmethod
    def given(
        cls,
        num_test: Sequence[int],
        num_val: Sequence[int] | None = None,
        new_clients: Sequence[int] = (),
        num_ood: int = 0,
        num_backdoor: Sequence[int] | None = None,
    ) -> EvaluationSets:
        """Sizes as lists; an all-zero validation or backdoor split is no split."""
        return cls(
            np.asarray(num_test),
            np.asarray(num_val) if num_val is not None and any(num_val) else None,
            tuple(sorted(int(k) for k in new_clients)),
            int(num_ood),
            np.asarray(num_backdoor) if num_backdoor is not None and any(num_backdoor) else None,
        )


class Personalizer:
    """Runs a program on models over clients' train splits, in bounded chunks, and counts the
    results' correct predictions (what the personalized, new-client and fine-tune protocols share)."""

    def __init__(self, executor: Executor, seed: int) -> None:
        self.executor, self.seed = executor, seed

    def correct(
        self,
        program: ClientProgram,
        model_of: Callable[[int], Tensors],
        stream: str,
        round_index: int,
        clients: Sequence[int],
        splits: Sequence[str],
    ) -> dict[str, np.ndarray]:
        """Per split, correct predictions of ``program`` run on ``model_of(k)`` over client k's
        train split, for each of ``clients`` (through the executor, in chunks so memory stays
        bounded). Each client is personalized once; the result is evaluated on every split."""
        correct: dict[str, list[np.ndarray]] = {split: [] for split in splits}
        with progress.stage(STAGE_NAMES.get(stream, stream), len(clients), "client") as shown:
            for start in range(0, len(clients), PERSONALIZE_CHUNK):
                chunk = list(clients[start : start + PERSONALIZE_CHUNK])
                seeds = [derive_seed(self.seed, stream, round_index, k) for k in chunk]
                states = personalize(self.executor, program, [model_of(k) for k in chunk], chunk, seeds, round_index)
                jobs = [EvalJob(state, (k,), split) for split in splits for state, k in zip(states, chunk)]
                results = self.executor.evaluate(program, jobs)
                for job, result in zip(jobs, results):
                    correct[job.split].append(result)
                shown.advance(len(chunk))
        return {split: np.concatenate(parts) for split, parts in correct.items()}


@dataclass
class ClientProtocol:
    """``pers_acc`` (and ``val_pers_acc``) with their companions, and ``global_acc``, over the
    training clients; per client (NaN for new clients) ``pers_acc`` (and ``val_pers_acc``)."""

    algorithm: Algorithm
    executor: Executor
    personalizer: Personalizer
    sets: EvaluationSets
    clients: list[int]  # the training clients
    num_clients: int

    @property
    def splits(self) -> tuple[str, ...]:
        """The evaluation splits of the training clients: test, and val with a validation split."""
        return ("test", "val") if self.sets.num_val is not None else ("test",)

    def sizes(self, split: str) -> np.ndarray:
        return self.sets.num_test if split == "test" else self.sets.num_val  # type: ignore[return-value]

    def measure(self, round_index: int) -> tuple[dict[str, Any], Columns]:
        correct, global_correct = self.count_correct(round_index)
        clients = self.clients
        metrics: dict[str, Any] = {}
        columns: Columns = {}
        for split in self.splits:
            name = "pers_acc" if split == "test" else "val_pers_acc"
            sizes = self.sizes(split)[clients]
            metrics.update(accuracy_metrics(correct[split], sizes, name))
            metrics[name.replace("pers_acc", "global_acc")] = None
            if self.algorithm.has_global_model and global_correct.get(split) is not None:
                # float32 division, as torch's mean over the per-sample hits gave it
                hits = torch.tensor(float(global_correct[split].sum()), dtype=torch.float32)
                metrics[name.replace("pers_acc", "global_acc")] = float(hits / int(sizes.sum()))
            columns[name] = np.full(self.num_clients, np.nan)
            columns[name][clients] = correct[split] / sizes
        return metrics, columns

    def count_correct(self, round_index: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Per split: correct predictions of each training client's evaluation model (in
        ``clients`` order), and of the global model on each of them (where it has one)."""
        algorithm, executor, splits = self.algorithm, self.executor, self.splits
        clients = tuple(self.clients)
        adaptation = algorithm.personalization_program()
        if algorithm.clients_share_one_model() and adaptation is None:
            model = algorithm.global_model()
            results = executor.evaluate(algorithm.program, [EvalJob(model, clients, s) for s in splits])
            shared = dict(zip(splits, results))
            return shared, shared
        correct: dict[str, np.ndarray] = {}
        jobs: list[EvalJob] = []
        if adaptation is None:  # the body once, each client's head on its samples, if it can
            personal = [algorithm.personal_model(k) for k in clients]
            for split in splits:
                heads = executor.evaluate_split(algorithm.program, personal, clients, split)
                if heads is not None:
                    correct[split] = heads
                else:
                    jobs.extend(EvalJob(state, (k,), split) for k, state in zip(clients, personal))
            del personal
        else:  # personalized once, evaluated on every split
            model_of = algorithm.personal_model
            correct = self.personalizer.correct(adaptation, model_of, "personalize", round_index, clients, splits)
        global_jobs = (
            [EvalJob(algorithm.global_model(), clients, s) for s in splits] if algorithm.has_global_model else []
        )
        results = executor.evaluate(algorithm.program, jobs + global_jobs) if jobs or global_jobs else []
        for split in splits:
            if split not in correct:
                correct[split] = np.concatenate([r for job, r in zip(jobs, results) if job.split == split])
        global_correct = {job.split: r for job, r in zip(global_jobs, results[len(jobs) :])}
        return correct, global_correct


@dataclass
class NewClientProtocol:
    """``new_acc`` and its companions over the new clients, each served by the algorithm's
    adaptation (``new_client_program`` run on ``new_client_model(k)`` over its train split, or
    ``new_client_model(k)`` as it is) and tested on its test split; per client (NaN for
    training clients) the accuracy (``new_acc``)."""

    algorithm: Algorithm
    executor: Executor
    personalizer: Personalizer
    sets: EvaluationSets
    num_clients: int

    def measure(self, round_index: int) -> tuple[dict[str, Any], Columns]:
        algorithm, clients = self.algorithm, list(self.sets.new_clients)
        program = algorithm.new_client_program()
        if program is not None:
            model_of = algorithm.new_client_model
            hits = self.personalizer.correct(program, model_of, "adapt_new", round_index, clients, ("test",))["test"]
        else:
            states = [algorithm.new_client_model(k) for k in clients]
            if varying_names(states) == []:  # one model for all of them (the global one)
                (hits,) = self.executor.evaluate(algorithm.program, [EvalJob(states[0], tuple(clients))])
            else:
                jobs = [EvalJob(state, (k,)) for k, state in zip(clients, states)]
                hits = np.concatenate(self.executor.evaluate(algorithm.program, jobs))
        sizes = self.sets.num_test[clients]
        accuracy = np.full(self.num_clients, np.nan)
        accuracy[clients] = hits / sizes
        return accuracy_metrics(hits, sizes, "new_acc"), {"new_acc": accuracy}


@dataclass
class HeldOutProtocol:
    """``metric``: the fraction of ``clients``' samples of split ``split`` that the global model
    classifies as labelled; for an algorithm without one (``has_global_model`` False), each
    client's evaluation model (``personal_model(k)`` as it is: samples nobody trained on have no
    labelled data to adapt on, so no personalization or new-client program runs) on its own
    samples, pooled. ``shared``: every client holds the same samples (the held-out domain): the
    global model is evaluated on them once.

    The held-out domain (``ood_acc``): every training client, ``shared``. The backdoor's attack
    success rate (``asr``, engine.attacks): the honest training clients' triggered test samples
    (true class ≠ target, labelled with the target)."""

    algorithm: Algorithm
    executor: Executor
    metric: str
    split: str
    clients: list[int]
    sizes: np.ndarray  # per client of ``clients``, its samples of ``split``
    shared: bool = False

    def measure(self, round_index: int) -> tuple[dict[str, Any], Columns]:
        algorithm, clients = self.algorithm, self.clients
        if algorithm.has_global_model:
            job = EvalJob(algorithm.global_model(), tuple(clients[:1] if self.shared else clients), self.split)
            (hits,) = self.executor.evaluate(algorithm.program, [job])
            total = int(self.sizes[0]) if self.shared else int(self.sizes.sum())
            return {self.metric: float(hits.sum() / total)}, {}
        correct = []
        for start in range(0, len(clients), PERSONALIZE_CHUNK):  # bounded memory, like Personalizer
            chunk = clients[start : start + PERSONALIZE_CHUNK]
            jobs = [EvalJob(algorithm.personal_model(k), (k,), self.split) for k in chunk]
            correct.extend(self.executor.evaluate(algorithm.program, jobs))
        return {self.metric: float(np.concatenate(correct).sum() / int(self.sizes.sum()))}, {}


@dataclass
class FineTuneProtocol:
    """``--finetune-epochs E`` (FedAvg-FT protocol): the global model fine-tuned for E epochs on
    each client's train split (the run's local optimizer), tested on the client's test split:
    ``pers_acc_ft`` over the training clients, ``new_acc_ft`` over the new clients."""

    algorithm: Algorithm
    personalizer: Personalizer
    sets: EvaluationSets
    settings: FederationSpec
    clients: list[int]  # the training clients

    def measure(self, round_index: int) -> tuple[dict[str, Any], Columns]:
        algorithm, settings = self.algorithm, self.settings
        program = FineTuneProgram(algorithm.layout.trainable, settings.local, settings.finetune_epochs)
        global_state: Tensors = algorithm.global_model()
        metrics: dict[str, Any] = {}
        columns: Columns = {}
        for name, clients in (("pers_acc_ft", self.clients), ("new_acc_ft", list(self.sets.new_clients))):
            if not clients:
                continue
            tuned = self.personalizer.correct(
                program, lambda k: global_state, "finetune", round_index, clients, ("test",)
            )
            hits = tuned["test"]
            sizes = self.sets.num_test[clients]
            found = accuracy_metrics(hits, sizes, name)
            metrics.update({name: found[name], f"{name}_weighted": found[f"{name}_weighted"]})
            columns[name] = np.full(settings.num_clients, np.nan)
            columns[name][clients] = hits / sizes
        return metrics, columns


class Evaluator:
    """The protocols a run measures, chosen once from its settings and sets: ``evaluate`` runs
    the per-round ones (clients, new clients, held-out domain, backdoor), ``finetune`` the
    after-training one (None: the run fine-tunes nothing)."""

    def __init__(
        self,
        algorithm: Algorithm,
        executor: Executor,
        settings: FederationSpec,
        sets: EvaluationSets,
        training_clients: list[int],
        attackers: Sequence[int] = (),
    ) -> None:
        self.sets = sets
        personalizer = Personalizer(executor, settings.seed)
        k = settings.num_clients
        self.clients = ClientProtocol(algorithm, executor, personalizer, sets, training_clients, k)
        protocols: list[Any] = [self.clients]
        if sets.new_clients:
            protocols.append(NewClientProtocol(algorithm, executor, personalizer, sets, k))
        if sets.num_ood:
            sizes = np.full(len(training_clients), sets.num_ood)
            protocols.append(HeldOutProtocol(algorithm, executor, "ood_acc", "ood", training_clients, sizes, True))
        if sets.num_backdoor is not None:
            honest = [c for c in training_clients if c not in set(attackers)]
            sizes = sets.num_backdoor[honest]
            protocols.append(HeldOutProtocol(algorithm, executor, "asr", "backdoor", honest, sizes))
        self.protocols = protocols
        self.finetuning = (
            FineTuneProtocol(algorithm, personalizer, sets, settings, training_clients)
            if settings.finetune_epochs > 0 and algorithm.has_global_model
            else None
        )

    def evaluate(self, round_index: int = 0) -> tuple[dict[str, Any], Columns]:
        """Every per-round protocol's metrics (in the record's order) and per-client columns."""
        metrics: dict[str, Any] = {}
        columns: Columns = {}
        for protocol in self.protocols:
            found, found_columns = protocol.measure(round_index)
            metrics.update(found)
            columns.update(found_columns)
        return metrics, columns

    def evaluate_clients(self, round_index: int = 0) -> tuple[dict[str, Any], Columns]:
        """The training clients' metrics only (a backbone's accuracy before training, benchmarks)."""
        return self.clients.measure(round_index)
