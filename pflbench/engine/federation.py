"""The one round loop: sample → jobs → executor → aggregate → evaluate → observers.

Evaluation (every ``eval_every`` rounds and after the last): each training client's model on its
test split (``pers_acc``, ``global_acc``, ...) and, with a validation split (``--val-frac``), the
same models on its validation split (``val_pers_acc``, ``val_global_acc``, ...: personalization
programs run once, their result is evaluated on both). With new clients (``--new-clients``),
clients held out of training entirely (never sampled: M is drawn from the training clients, and
never counted in the metrics above), each new client is served by the algorithm's adaptation
(``Algorithm.new_client_model`` / ``new_client_program``) and tested (``new_acc``, ...). With a
held-out domain (``--holdout-domain``), its samples give ``ood_acc`` (``evaluate_ood``). With
``--attack backdoor``, the triggered test samples give ``asr`` (``evaluate_asr``, engine.attacks).
"""

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
from pflbench.config.run_config import MODEL_POISONING
from pflbench.engine.algorithm import Algorithm, ClientProgram, FineTuneProgram
from pflbench.engine.attacks import PoisonedUploads, choose_attackers
from pflbench.engine.availability import RoundPlan, SystemModel
from pflbench.engine.evaluation import varying_names
from pflbench.engine.executor import Executor
from pflbench.engine.metrics import accuracy_metrics
from pflbench.engine.observers import RunObserver
from pflbench.engine.personalize import personalize
from pflbench.engine.privacy import Privacy, client_sample_rate
from pflbench.engine.robust import RobustAggregation
from pflbench.engine.types import ClientJob, ClientUpdate, EvalJob, Tensors, tensor_bytes
from pflbench.util import progress
from pflbench.util.seeding import derive_seed, rng_stream

PERSONALIZE_CHUNK = 64  # clients personalized (and held in memory) at once during evaluation
# how the progress display names a ``personalized_correct`` stream (the stage's unit: a client)
STAGE_NAMES = {
    "personalize": "personalizing for evaluation",
    "adapt_new": "adapting new clients",
    "finetune": "fine-tuning",
}


class Diverged(Exception):
    """A non-finite loss, loss term or parameter: the run stops (status ``diverged``)."""

    def __init__(self, round_index: int, client: int | None, term: str) -> None:
        self.round, self.client, self.term = round_index, client, term
        where = f"client {client}" if client is not None else "after aggregation"
        super().__init__(f"diverged at round {round_index} ({where}): {term} is not finite")

    def to_json(self) -> dict[str, Any]:
        return {"round": self.round, "client": self.client, "term": self.term}


def _all_finite(tensors: dict[str, torch.Tensor]) -> bool:
    """One host read per device (a plugin's upload may mix a CPU scalar into GPU tensors).

    A finite sum of a tensor's entries proves them all finite (a NaN or ±inf entry makes the sum
    NaN or ±inf), and a sum costs ~20× less than ``isfinite().all()`` on a CPU (which writes a
    bool per entry: 3.5 vs 0.16 ms per FedAvgCNN upload, checked for every client); only a
    non-finite sum (a non-finite entry, or large finite entries overflowing) is checked entry by
    entry."""
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for t in tensors.values():
        if t.is_floating_point():
            by_device.setdefault(t.device, []).append(t)
    for group in by_device.values():
        if not bool(torch.stack([t.sum().isfinite() for t in group]).all()):
            if not bool(torch.stack([t.isfinite().all() for t in group]).all()):
                return False
    return True


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

    ``num_val``: each client's validation samples (None or all 0: no validation metrics);
    ``new_clients``: the clients held out of training (``data.partition.choose_new_clients``);
    ``num_ood``: samples of the held-out domain (the executor's ``ood`` split; 0: no ``ood_acc``).

    ``system``: who is online, drops out, is late (``engine.availability``; None: every sampled
    client reports). ``next_round``, the byte totals, ``sim_time_total``, ``client_accuracy`` and
    ``client_metrics`` are the loop's own
    state between rounds (with ``sampling_rng`` and the algorithm's state: what a checkpoint saves)."""

    def __init__(
        self,
        algorithm: Algorithm,
        executor: Executor,
        num_test: Sequence[int],
        settings: FederationSpec,
        observers: Sequence[RunObserver] = (),
        *,
        num_val: Sequence[int] | None = None,
        new_clients: Sequence[int] = (),
        num_ood: int = 0,
        num_backdoor: Sequence[int] | None = None,
    ) -> None:
        self.algorithm, self.executor, self.observers = algorithm, executor, list(observers)
        self.settings = settings
        self.num_test = np.asarray(num_test)
        self.num_val = np.asarray(num_val) if num_val is not None and any(num_val) else None
        self.new_clients = sorted(int(k) for k in new_clients)
        self.num_ood = int(num_ood)
        held_out = set(self.new_clients)
        self.training_clients = [k for k in range(settings.num_clients) if k not in held_out]
        self.sampling_rng = rng_stream(settings.seed, "sampling")
        # --dropout, --availability, stragglers, --deadline, --over-select (engine.availability); None: off
        self.system = (
            SystemModel(settings.availability, settings.num_clients, settings.seed, settings.local.batch_size)
            if settings.availability.active
            else None
        )
        self.sim_time_total = 0.0  # simulated seconds of the rounds so far (with the system model)
        self.round_plan: RoundPlan | None = None  # the last round's availability (with the system model)
        self.next_round = 1
        self.bytes_up_total = self.bytes_down_total = 0
        self.client_accuracy = np.zeros(self.settings.num_clients)  # test accuracy (pers_acc); NaN: new client
        # further per-client columns, as measured: val_pers_acc, new_acc, pers_acc_ft, new_acc_ft
        self.client_metrics: dict[str, np.ndarray] = {}
        self.num_train = list(algorithm.num_train)
        # --dp client|sample (engine.privacy): the server's private mean and the accountant; None: off
        self.privacy = (
            Privacy(
                settings.privacy,
                settings.seed,
                settings.sampled_per_round,
                client_sample_rate(settings.sampled_per_round, len(self.training_clients), settings.availability),
                self.num_train,
                settings.local.batch_size,
                algorithm.program.local_phases,
            )
            if settings.privacy is not None
            else None
        )
        if self.privacy is not None:  # DP-SGD travels with the program (to every executor)
            algorithm.program.sample_privacy = self.privacy.program_privacy()
        # --attack (engine.attacks): the malicious clients, the run's fixed seeded choice (their
        # data was poisoned when the run's data was built; model poisoning happens at the seam)
        attack = settings.attack
        self.attackers = choose_attackers(settings.seed, self.training_clients, attack.fraction) if attack else []
        # --attack backdoor: each client's triggered test samples (``asr``); None: not measured
        self.num_backdoor = np.asarray(num_backdoor) if num_backdoor is not None and any(num_backdoor) else None
        self.robust_stream: RobustAggregation | None = None  # --robust-agg: this round's rule (its record)

    @property
    def splits(self) -> tuple[str, ...]:
        """The evaluation splits of the training clients: test, and val with a validation split."""
        return ("test", "val") if self.num_val is not None else ("test",)

    def split_sizes(self, split: str) -> np.ndarray:
        return self.num_test if split == "test" else self.num_val  # type: ignore[return-value]

    def sample_clients(self, round_index: int | None = None) -> list[int]:
        """M = ``sampled_per_round`` of the training clients (never a new client), sorted. With the
        system model: of those online at ``round_index`` (default: the next round), M' with
        over-selection (``SystemModel.sample``)."""
        k, m = len(self.training_clients), self.settings.sampled_per_round
        if self.system is not None:
            at = self.next_round if round_index is None else round_index
            return self.system.sample(self.sampling_rng, self.training_clients, m, at)
        return sorted(self.training_clients[int(c)] for c in self.sampling_rng.choice(k, size=m, replace=False))

    def train_round(self, round_index: int, sampled: list[int]) -> list[ClientUpdate]:
        """Train the sampled clients and aggregate. Under a streaming aggregation
        (``Algorithm.streaming_aggregate``) each upload is folded in as it arrives and the
        returned updates keep no params (memory: the private states, not every upload)."""
        algorithm = self.algorithm
        plan = self.plan_round(round_index, sampled) if self.system is not None else None
        jobs = [
            ClientJob(
                k,
                round_index,
                derive_seed(self.settings.seed, "train", round_index, k),
                algorithm.broadcast(k),
                algorithm.store.get(k),
                None if plan is None else plan.step_caps[k],
            )
            for k in (sampled if plan is None else plan.training)
        ]
        self._bytes_down = sum(tensor_bytes(job.received) for job in jobs)
        self._bytes_up = 0
        train = getattr(self.executor, "train_iter", self.executor.train)
        arrivals: Any = zip(jobs, train(algorithm.program, jobs) if jobs else [])
        if plan is not None:  # who reports (after training: a deadline, over-selection), and their bytes down
            arrivals = self.reporting(plan, list(arrivals))
        reporting = sampled if plan is None else plan.reported
        stream = self.aggregation(round_index, reporting)
        updates = []
        for job, update in arrivals:
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
        elif updates or plan is None:  # no client reported: the global model stays as it is
            algorithm.aggregate(updates)
        return updates

    def aggregation(self, round_index: int, reporting: list[int]) -> Any:
        """THE seam between the clients' uploads and the server's update rule: a stream that each
        reporting client's update is ``add``-ed to as it arrives, then ``finish``-ed, or None:
        the algorithm's ``aggregate(updates)`` gets the round's list. Its stages, in this order:

        1. the attack on the uploads (``--attack sign-flip|scale|gaussian``: each attacker's
           upload replaced, ``engine.attacks.PoisonedUploads``);
        2. client-level DP (``--dp client``: each update clipped, the mean noised,
           ``engine.privacy.PrivateMean``), which is also its aggregation rule, or
        3. the aggregation rule: a robust one (``--robust-agg``, ``engine.robust``; refused with
           ``--dp client``, whose noise is calibrated to the mean), else the algorithm's
           ``streaming_aggregate`` (the FedAvg rule streamed, or None).

        Model poisoning and robust rules are only accepted for algorithms whose upload is a
        model update averaged by the FedAvg rule (checked when the run is planned), so a stream
        always exists for them."""
        algorithm = self.algorithm
        self.robust_stream = None
        if self.privacy is not None and self.privacy.client_level:
            rule: Any = self.privacy.aggregation(algorithm.global_state, round_index)
        elif self.settings.robust is not None:
            rule = self.robust_stream = RobustAggregation(algorithm.global_state, self.settings.robust)
        else:
            rule = algorithm.streaming_aggregate([self.num_train[k] for k in reporting])
        attack = self.settings.attack
        if attack is not None and attack.kind in MODEL_POISONING:
            if rule is None:
                raise RuntimeError(f"--attack {attack.kind} needs a streamed FedAvg aggregation (checked at planning)")
            rule = PoisonedUploads(
                rule, algorithm.global_state, set(self.attackers), attack, self.settings.seed, round_index
            )
        return rule

    def plan_round(self, round_index: int, sampled: list[int]) -> RoundPlan:
        """The system model's decisions before training (engine.availability): who drops out, who
        trains and with how many steps; the dropouts' downloads count in bytes_down."""
        assert self.system is not None
        algorithm = self.algorithm
        received = {k: tensor_bytes(algorithm.broadcast(k)) for k in sampled}
        planned = {
            k: sum(phase.epochs for phase in algorithm.program.local_phases(k)) * self.num_train[k] for k in sampled
        }
        plan = self.system.plan(round_index, sampled, planned, received)
        self._dropped_bytes_down = sum(received[k] for k in sampled if k not in set(plan.training))
        self.round_plan = plan
        return plan

    def reporting(
        self, plan: RoundPlan, arrivals: list[tuple[ClientJob, ClientUpdate]]
    ) -> list[tuple[ClientJob, ClientUpdate]]:
        """The trained clients that report (on time; the first M under over-selection), in job
        order; the round's simulated time in ``plan``. The others leave no trace (no upload, no
        new private state), except the model they received (bytes_down)."""
        assert self.system is not None
        trained = {job.client_id: (tensor_bytes(job.received), tensor_bytes(update.params)) for job, update in arrivals}
        self.system.report(plan, trained, self.settings.sampled_per_round)
        self._bytes_down += self._dropped_bytes_down
        kept = set(plan.reported)
        return [(job, update) for job, update in arrivals if job.client_id in kept]

    def evaluate(self, round_index: int = 0) -> tuple[dict[str, Any], np.ndarray]:
        """Metrics of the training clients (``evaluate_clients``) and each client's test accuracy."""
        metrics, columns = self.evaluate_clients(round_index)
        return metrics, columns["pers_acc"]

    def evaluate_clients(self, round_index: int = 0) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """Metrics over the training clients' test splits (and validation splits: ``val_*``), and
        per client (NaN for new clients) ``pers_acc`` (and ``val_pers_acc``)."""
        correct, global_correct = self.count_correct(round_index)
        clients = self.training_clients
        metrics: dict[str, Any] = {}
        columns: dict[str, np.ndarray] = {}
        for split in self.splits:
            name = "pers_acc" if split == "test" else "val_pers_acc"
            sizes = self.split_sizes(split)[clients]
            metrics.update(accuracy_metrics(correct[split], sizes, name))
            metrics[name.replace("pers_acc", "global_acc")] = None
            if self.algorithm.has_global_model and global_correct.get(split) is not None:
                # float32 division, as torch's mean over the per-sample hits gave it
                hits = torch.tensor(float(global_correct[split].sum()), dtype=torch.float32)
                metrics[name.replace("pers_acc", "global_acc")] = float(hits / int(sizes.sum()))
            columns[name] = np.full(self.settings.num_clients, np.nan)
            columns[name][clients] = correct[split] / sizes
        return metrics, columns

    def count_correct(self, round_index: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Per split: correct predictions of each training client's evaluation model (in
        ``training_clients`` order), and of the global model on each of them (where it has one)."""
        algorithm, splits = self.algorithm, self.splits
        clients = tuple(self.training_clients)
        adaptation = algorithm.personalization_program()
        if algorithm.clients_share_one_model() and adaptation is None:
            model = algorithm.global_model()
            results = self.executor.evaluate(algorithm.program, [EvalJob(model, clients, s) for s in splits])
            shared = dict(zip(splits, results))
            return shared, shared
        correct: dict[str, np.ndarray] = {}
        jobs: list[EvalJob] = []
        if adaptation is None:  # the body once, each client's head on its samples, if it can
            personal = [algorithm.personal_model(k) for k in clients]
            evaluate_split = getattr(self.executor, "evaluate_split", None)
            for split in splits:
                heads = evaluate_split(algorithm.program, personal, clients, split) if evaluate_split else None
                if heads is not None:
                    correct[split] = heads
                else:
                    jobs.extend(EvalJob(state, (k,), split) for k, state in zip(clients, personal))
            del personal
        else:  # personalized once, evaluated on every split
            correct = self.personalized_correct(adaptation, algorithm.personal_model, "personalize", round_index)
        global_jobs = (
            [EvalJob(algorithm.global_model(), clients, s) for s in splits] if algorithm.has_global_model else []
        )
        results = self.executor.evaluate(algorithm.program, jobs + global_jobs) if jobs or global_jobs else []
        for split in splits:
            if split not in correct:
                correct[split] = np.concatenate([r for job, r in zip(jobs, results) if job.split == split])
        global_correct = {job.split: r for job, r in zip(global_jobs, results[len(jobs) :])}
        return correct, global_correct

    def personalized_correct(
        self,
        program: ClientProgram,
        model_of: Any,
        stream: str,
        round_index: int,
        clients: Sequence[int] | None = None,
        splits: Sequence[str] | None = None,
    ) -> dict[str, np.ndarray]:
        """Per split (default: the training clients' evaluation splits), correct predictions of
        ``program`` run on ``model_of(k)`` over client k's train split, for each of ``clients``
        (default: the training clients; through the executor, in chunks so memory stays
        bounded). Each client is personalized once; the result is evaluated on every split."""
        clients = self.training_clients if clients is None else list(clients)
        splits = self.splits if splits is None else tuple(splits)
        correct: dict[str, list[np.ndarray]] = {split: [] for split in splits}
        with progress.stage(STAGE_NAMES.get(stream, stream), len(clients), "client") as shown:
            for start in range(0, len(clients), PERSONALIZE_CHUNK):
                chunk = clients[start : start + PERSONALIZE_CHUNK]
                seeds = [derive_seed(self.settings.seed, stream, round_index, k) for k in chunk]
                states = personalize(self.executor, program, [model_of(k) for k in chunk], chunk, seeds, round_index)
                jobs = [EvalJob(state, (k,), split) for split in splits for state, k in zip(states, chunk)]
                results = self.executor.evaluate(program, jobs)
                for job, result in zip(jobs, results):
                    correct[job.split].append(result)
                shown.advance(len(chunk))
        return {split: np.concatenate(parts) for split, parts in correct.items()}

    def evaluate_new_clients(self, round_index: int) -> tuple[dict[str, float], np.ndarray]:
        """``new_acc`` and its companions over the new clients, each served by the algorithm's
        adaptation (``new_client_program`` run on ``new_client_model(k)`` over its train split,
        or ``new_client_model(k)`` as it is) and tested on its test split; per client (NaN for
        training clients) the accuracy."""
        algorithm, clients = self.algorithm, self.new_clients
        program = algorithm.new_client_program()
        if program is not None:
            model_of = algorithm.new_client_model
            correct = self.personalized_correct(program, model_of, "adapt_new", round_index, clients, ("test",))
            hits = correct["test"]
        else:
            states = [algorithm.new_client_model(k) for k in clients]
            if varying_names(states) == []:  # one model for all of them (the global one)
                (hits,) = self.executor.evaluate(algorithm.program, [EvalJob(states[0], tuple(clients))])
            else:
                jobs = [EvalJob(state, (k,)) for k, state in zip(clients, states)]
                hits = np.concatenate(self.executor.evaluate(algorithm.program, jobs))
        sizes = self.num_test[clients]
        accuracy = np.full(self.settings.num_clients, np.nan)
        accuracy[clients] = hits / sizes
        return accuracy_metrics(hits, sizes, "new_acc"), accuracy

    def evaluate_ood(self) -> dict[str, float]:
        """``ood_acc``: accuracy on the held-out domain's samples (``--holdout-domain``) of the
        global model; for an algorithm without one (``has_global_model`` False), the mean over the
        training clients of their evaluation models' accuracy there (``personal_model(k)`` as it
        is: the unseen domain has no labelled data to adapt on, so no personalization or
        new-client program runs; every client sees the same samples, so the mean of the
        accuracies is the pooled accuracy)."""
        algorithm, clients = self.algorithm, self.training_clients
        if algorithm.has_global_model:
            job = EvalJob(algorithm.global_model(), (clients[0],), "ood")
            (hits,) = self.executor.evaluate(algorithm.program, [job])
            return {"ood_acc": float(hits.sum() / self.num_ood)}
        correct = []
        for start in range(0, len(clients), PERSONALIZE_CHUNK):  # bounded memory, like personalized_correct
            chunk = clients[start : start + PERSONALIZE_CHUNK]
            jobs = [EvalJob(algorithm.personal_model(k), (k,), "ood") for k in chunk]
            correct.extend(self.executor.evaluate(algorithm.program, jobs))
        return {"ood_acc": float(np.concatenate(correct).sum() / (self.num_ood * len(clients)))}

    def evaluate_asr(self) -> dict[str, float]:
        """``asr`` (``--attack backdoor``, engine.attacks): the fraction of the honest training
        clients' triggered test samples (true class ≠ target, labelled with the target)
        classified as the target, by the global model; for an algorithm without one, each honest
        client's personal model on its own triggered samples, as it is (no personalization
        program, as ``evaluate_ood``)."""
        algorithm, clients = self.algorithm, [k for k in self.training_clients if k not in set(self.attackers)]
        assert self.num_backdoor is not None
        total = int(self.num_backdoor[clients].sum())
        if algorithm.has_global_model:
            (hits,) = self.executor.evaluate(
                algorithm.program, [EvalJob(algorithm.global_model(), tuple(clients), "backdoor")]
            )
            return {"asr": float(hits.sum() / total)}
        correct = []
        for start in range(0, len(clients), PERSONALIZE_CHUNK):  # bounded memory, like personalized_correct
            chunk = clients[start : start + PERSONALIZE_CHUNK]
            jobs = [EvalJob(algorithm.personal_model(k), (k,), "backdoor") for k in chunk]
            correct.extend(self.executor.evaluate(algorithm.program, jobs))
        return {"asr": float(np.concatenate(correct).sum() / total)}

    def finetune_metrics(self, round_index: int) -> dict[str, float]:
        """``--finetune-epochs E`` (FedAvg-FT protocol): the global model fine-tuned for E epochs on
        each client's train split (the run's local optimizer), tested on the client's test split:
        ``pers_acc_ft`` over the training clients, ``new_acc_ft`` over the new clients."""
        algorithm = self.algorithm
        program = FineTuneProgram(algorithm.layout.trainable, self.settings.local, self.settings.finetune_epochs)
        global_state: Tensors = algorithm.global_model()
        metrics: dict[str, float] = {}
        for name, clients in (("pers_acc_ft", self.training_clients), ("new_acc_ft", self.new_clients)):
            if not clients:
                continue
            tuned = self.personalized_correct(
                program, lambda k: global_state, "finetune", round_index, clients, ("test",)
            )
            hits = tuned["test"]
            sizes = self.num_test[clients]
            found = accuracy_metrics(hits, sizes, name)
            metrics.update({name: found[name], f"{name}_weighted": found[f"{name}_weighted"]})
            self.client_metrics[name] = np.full(self.settings.num_clients, np.nan)
            self.client_metrics[name][clients] = hits / sizes
        return metrics

    def run(self) -> np.ndarray:
        """The rounds from ``next_round`` on. Returns the final per-client accuracies; raises
        ``Diverged`` (after the observers saw every earlier round)."""
        settings, algorithm = self.settings, self.algorithm
        for round_index in range(self.next_round, settings.rounds + 1):
            started = time.perf_counter()
            sampled = self.sample_clients(round_index)
            updates = self.train_round(round_index, sampled)  # trained, checked and aggregated
            bytes_up, bytes_down = self._bytes_up, self._bytes_down
            if not _all_finite(algorithm.global_state):
                raise Diverged(round_index, None, f"parameter {_first_non_finite(algorithm.global_state)}")
            self.bytes_up_total += bytes_up
            self.bytes_down_total += bytes_down
            record: dict[str, Any] = {"round": round_index, "clients": sampled}
            if self.round_plan is not None:  # the system model: who reported, simulated time
                self.sim_time_total += self.round_plan.sim_time
                record.update(self.round_plan.record(), sim_time_cum=self.sim_time_total)
            record.update(mean_loss_terms(updates))
            record.update(
                bytes_up=bytes_up,
                bytes_down=bytes_down,
                bytes_up_cum=self.bytes_up_total,
                bytes_down_cum=self.bytes_down_total,
            )
            record.update(algorithm.round_diagnostics(updates) if updates else {})
            if self.privacy is not None:  # dp_epsilon (and the clip) after this round
                record.update(self.privacy.end_round(round_index, updates))
            if self.settings.attack is not None:  # the attackers among this round's reports
                record["attackers"] = [u.client_id for u in updates if u.client_id in set(self.attackers)]
            if self.robust_stream is not None:  # e.g. Krum's selected clients
                record.update(self.robust_stream.record)
            record["round_time_s"] = time.perf_counter() - started
            if round_index % settings.eval_every == 0 or round_index == settings.rounds:
                eval_started = time.perf_counter()
                metrics, columns = self.evaluate_clients(round_index)
                self.client_accuracy = columns.pop("pers_acc")
                self.client_metrics.update(columns)
                record.update(metrics)
                if self.new_clients:
                    new_metrics, self.client_metrics["new_acc"] = self.evaluate_new_clients(round_index)
                    record.update(new_metrics)
                if self.num_ood:
                    record.update(self.evaluate_ood())
                if self.num_backdoor is not None:
                    record.update(self.evaluate_asr())
                record["eval_time_s"] = time.perf_counter() - eval_started
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
