"""The one round loop: sample → jobs → executor → aggregate → evaluate → observers.

What a round measures of its models (every ``eval_every`` rounds and after the last) is the
evaluation seam's (``engine.evaluator.Evaluator``: personalized and global accuracy, new
clients, the held-out domain, the backdoor, fine-tuning); the loop only asks it. The bytes each
round moves are counted in a ``Traffic``. ``federation_of(run)`` builds the loop of a prepared
run (the one construction ``runs.execute`` and ``pflbench.testing`` share).
"""

from __future__ import annotations

import dataclasses
import math
import resource
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from pflbench.config.groups import FederationSpec
from pflbench.config.run_config import MODEL_POISONING, RunConfig
from pflbench.data.dataset import FederatedData
from pflbench.data.partition import Partition
from pflbench.engine.algorithm import Algorithm
from pflbench.engine.attacks import PoisonedUploads, choose_attackers
from pflbench.engine.availability import RoundPlan, SystemModel
from pflbench.engine.evaluator import EvaluationSets, Evaluator
from pflbench.engine.executor import Executor
from pflbench.engine.observers import RunObserver
from pflbench.engine.privacy import Privacy, client_sample_rate
from pflbench.engine.robust import RobustAggregation
from pflbench.engine.types import ClientJob, ClientUpdate, tensor_bytes
from pflbench.util.seeding import derive_seed, rng_stream


@dataclass
class Traffic:
    """Bytes that travelled: ``up`` the uploads that reached the server, ``down`` the models the
    sampled clients received (a client that dropped out received its model too)."""

    up: int = 0
    down: int = 0

    def add(self, other: Traffic) -> None:
        self.up += other.up
        self.down += other.down


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

    ``sets``: what the evaluation protocols evaluate on (``engine.evaluator.EvaluationSets``:
    the clients' split sizes, the new clients held out of training, the held-out domain, the
    triggered samples). ``system``: who is online, drops out, is late (``engine.availability``;
    None: every sampled client reports). ``next_round``, ``traffic_total``, ``sim_time_total``,
    ``client_accuracy`` and ``client_metrics`` are the loop's own state between rounds (with
    ``sampling_rng`` and the algorithm's state: what a checkpoint saves); ``traffic`` and
    ``round_plan`` are the last round's."""

    def __init__(
        self,
        algorithm: Algorithm,
        executor: Executor,
        settings: FederationSpec,
        sets: EvaluationSets,
        observers: Sequence[RunObserver] = (),
    ) -> None:
        self.algorithm, self.executor, self.observers = algorithm, executor, list(observers)
        self.settings = settings
        held_out = set(sets.new_clients)  # never sampled, never in the training clients' metrics
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
        self.traffic = Traffic()  # the last round's bytes
        self.traffic_total = Traffic()
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
        # --dp sample: DP-SGD's setting, given with every training job (``ClientJob.sample_privacy``)
        self.sample_privacy = self.privacy.program_privacy() if self.privacy is not None else None
        # --attack (engine.attacks): the malicious clients, the run's fixed seeded choice (their
        # data was poisoned when the run's data was built; model poisoning happens at the seam)
        attack = settings.attack
        self.attackers = choose_attackers(settings.seed, self.training_clients, attack.fraction) if attack else []
        self.robust_stream: RobustAggregation | None = None  # --robust-agg: this round's rule (its record)
        self.evaluator = Evaluator(algorithm, executor, settings, sets, self.training_clients, self.attackers)

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
        plan, dropped_down = self.plan_round(round_index, sampled) if self.system is not None else (None, 0)
        jobs = [
            ClientJob(
                k,
                round_index,
                derive_seed(self.settings.seed, "train", round_index, k),
                algorithm.broadcast(k),
                algorithm.store.get(k),
                None if plan is None else plan.step_caps[k],
                self.sample_privacy,
            )
            for k in (sampled if plan is None else plan.training)
        ]
        traffic = self.traffic = Traffic(down=sum(tensor_bytes(job.received) for job in jobs) + dropped_down)
        arrivals: Any = zip(jobs, self.executor.train_iter(algorithm.program, jobs) if jobs else [])
        if plan is not None:  # who reports (after training: a deadline, over-selection)
            arrivals = self.reporting(plan, list(arrivals))
        reporting = sampled if plan is None else plan.reported
        stream = self.aggregation(round_index, reporting)
        updates = []
        for job, update in arrivals:
            if update.private:
                algorithm.store.put(update.client_id, update.private)
            for observer in self.observers:
                observer.on_client_update(job, update)
            traffic.up += tensor_bytes(update.params)
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

    def plan_round(self, round_index: int, sampled: list[int]) -> tuple[RoundPlan, int]:
        """The system model's decisions before training (engine.availability): who drops out, who
        trains and with how many steps; and the bytes the dropouts downloaded (they count)."""
        assert self.system is not None
        algorithm = self.algorithm
        received = {k: tensor_bytes(algorithm.broadcast(k)) for k in sampled}
        planned = {
            k: sum(phase.epochs for phase in algorithm.program.local_phases(k)) * self.num_train[k] for k in sampled
        }
        plan = self.system.plan(round_index, sampled, planned, received)
        self.round_plan = plan
        return plan, sum(received[k] for k in sampled if k not in set(plan.training))

    def reporting(
        self, plan: RoundPlan, arrivals: list[tuple[ClientJob, ClientUpdate]]
    ) -> list[tuple[ClientJob, ClientUpdate]]:
        """The trained clients that report (on time; the first M under over-selection), in job
        order; the round's simulated time in ``plan``. The others leave no trace (no upload, no
        new private state), except the model they received (bytes_down)."""
        assert self.system is not None
        trained = {job.client_id: (tensor_bytes(job.received), tensor_bytes(update.params)) for job, update in arrivals}
        self.system.report(plan, trained, self.settings.sampled_per_round)
        kept = set(plan.reported)
        return [(job, update) for job, update in arrivals if job.client_id in kept]

    def run(self) -> np.ndarray:
        """The rounds from ``next_round`` on. Returns the final per-client accuracies; raises
        ``Diverged`` (after the observers saw every earlier round)."""
        settings, algorithm = self.settings, self.algorithm
        for round_index in range(self.next_round, settings.rounds + 1):
            started = time.perf_counter()
            sampled = self.sample_clients(round_index)
            updates = self.train_round(round_index, sampled)  # trained, checked and aggregated
            if not _all_finite(algorithm.global_state):
                raise Diverged(round_index, None, f"parameter {_first_non_finite(algorithm.global_state)}")
            self.traffic_total.add(self.traffic)
            record: dict[str, Any] = {"round": round_index, "clients": sampled}
            if self.round_plan is not None:  # the system model: who reported, simulated time
                self.sim_time_total += self.round_plan.sim_time
                record.update(self.round_plan.record(), sim_time_cum=self.sim_time_total)
            record.update(mean_loss_terms(updates))
            record.update(
                bytes_up=self.traffic.up,
                bytes_down=self.traffic.down,
                bytes_up_cum=self.traffic_total.up,
                bytes_down_cum=self.traffic_total.down,
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
                metrics, columns = self.evaluator.evaluate(round_index)
                self.client_accuracy = columns.pop("pers_acc")
                self.client_metrics.update(columns)
                record.update(metrics, eval_time_s=time.perf_counter() - eval_started)
            finetuning = self.evaluator.finetuning
            if round_index == settings.rounds and finetuning is not None:
                finetune_started = time.perf_counter()
                metrics, columns = finetuning.measure(round_index)
                self.client_metrics.update(columns)
                record.update(metrics, finetune_time_s=time.perf_counter() - finetune_started)
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


def peak_memory_mb(executor: Executor) -> float:
    device = executor.data.device
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class BuiltRun(Protocol):
    """What ``federation_of`` reads of a prepared run (``runs.prepared.PreparedRun``)."""

    algorithm: Algorithm
    executor: Executor
    data: FederatedData
    partition: Partition
    config: RunConfig


def federation_of(run: BuiltRun, observers: Sequence[RunObserver] = ()) -> Federation:
    """The round loop of a prepared run: its algorithm and executor, the sets its evaluation
    protocols evaluate on. The one place a run's ``Federation`` is built."""
    return Federation(
        run.algorithm,
        run.executor,
        run.config.federation_spec,
        EvaluationSets.of(run.data, run.partition),
        observers,
    )
