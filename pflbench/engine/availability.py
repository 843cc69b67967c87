"""Who answers and how long it takes: client availability, dropout, stragglers and a deadline.

Off by default (``AvailabilitySpec.active`` False: every sampled client reports, nothing is
simulated or recorded). When any of its settings is on, each round goes

1. **available** — the clients that can be sampled this round (the server only picks clients
   that checked in): ``always`` (everyone), ``bernoulli`` (client k is online with its own
   probability p_k, drawn once per run uniformly in [q − h, q + h], h = min(q, 1 − q), q =
   ``--availability-rate``: the mean is q and p_k stays in [0, 1]), ``cyclic`` (a diurnal
   trace: client k has a phase φ_k ~ U[0, 1), its time zone, and is online at round t iff
   frac(t / P + φ_k) < q, P = ``--availability-period`` rounds: online a share q of each day).
   When fewer clients are online than the server wants, it samples all of them.
2. **sampled** — M' = min(online, ceil(M·(1 + f))) of them (``--over-select f``; f = 0: M).
   Without availability and over-selection this is exactly the draw of a run without them, so
   ``--dropout`` alone keeps the client sequence of the run without it.
3. **dropped out** — each sampled client fails to report with probability ``--dropout`` (it
   received the model, which counts in bytes_down, and sends nothing; its private state does not
   change; it is not trained).
4. **system model** — per-client speeds drawn once per run: ``none`` (every device the median
   one) or ``lognormal`` (compute-time and bandwidth factors e^{σ·z}, z ~ N(0, 1), independent,
   σ = ``--straggler-sigma``: median 1, so the typical client is the median device and a few are
   many times slower). Client k's simulated time in a round is
   T_k = S_k · τ · c_k + (B_down + B_up) / (β · b_k), with S_k the training samples it processes
   (Σ over its local phases of epochs · n_k; under a cap, steps · batch size), τ =
   ``--sample-time`` (seconds per sample on the median device), c_k its compute factor, B the
   bytes it received and uploaded, β = ``--bandwidth`` MB/s (2^20 bytes) and b_k its bandwidth
   factor.
5. **deadline** (``--deadline D`` seconds) — ``drop``: a client with T_k > D is late, its update
   is discarded (its private state does not change). ``partial`` (FedProx's variable local work):
   each client does the local steps that fit, ⌊(D − network time) / (batch · τ · c_k)⌋, the
   network time estimated before training with an upload as large as its download (the common
   case: the model travels both ways); a client that fits no step, or whose real upload makes it
   late after all, is dropped. Needs the engine's batch loop (``ClientProgram.local_update`` not
   overridden), where the cap is the number of optimizer steps.
6. **reported** — the on-time clients; under over-selection the first M of them by T_k (ties by
   client id): the server closes the round at the M-th report and the others' uploads are not
   sent (they count in bytes_down only).

Round time: the slowest reporting client's T_k; with a deadline, D when a sampled client did not
report (the server cannot tell a dropout from a straggler and waits until D). Without a deadline a
dropout is noticed at once (a lost connection). 0 when nobody reported and there is no deadline.
When no sampled client reports, the global model stays as it is (the algorithm's ``aggregate`` is
not called).

All randomness is derived from the run seed (the per-client speeds, probabilities and phases
once per run; the online draws and the dropouts per round from (seed, round)), never from a
stream that advances, so a resumed run draws exactly the same; the draws are made for all K
clients each round, so who drops out does not depend on who else was sampled.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from pflbench.config.groups import AvailabilitySpec
from pflbench.util.seeding import rng_stream

MB = 2**20  # --bandwidth is in MB/s of 2^20 bytes (as mb_to_target)


# ---- pure functions -----------------------------------------------------------------------
def over_selected_count(sampled_per_round: int, over_select: float, online: int) -> int:
    """M' = min(online, ceil(M·(1 + f))): how many clients the server samples."""
    wanted = math.ceil(sampled_per_round * (1 + over_select) - 1e-9)  # 10·(1 + 0.1) is 11, not 12
    return min(online, wanted)


def bernoulli_probabilities(rate: float, rng: np.random.Generator, num_clients: int) -> np.ndarray:
    """Per-client online probabilities p_k ~ U[q − h, q + h], h = min(q, 1 − q) (mean q, in [0, 1])."""
    half_width = min(rate, 1 - rate)
    return rng.uniform(rate - half_width, rate + half_width, size=num_clients)


def cyclic_online(phases: np.ndarray, round_index: int, period: int, rate: float) -> np.ndarray:
    """Online mask of a diurnal trace: frac(t / P + φ_k) < q."""
    position = np.mod(round_index / period + phases, 1.0)
    return position < rate


def speed_factors(
    model: str, sigma: float, rng: np.random.Generator, num_clients: int
) -> tuple[np.ndarray, np.ndarray]:
    """(compute-time factors c_k, bandwidth factors b_k): ones for ``none``; e^{σ·z} (z ~ N(0, 1),
    two independent draws per client) for ``lognormal``."""
    if model == "none":
        return np.ones(num_clients), np.ones(num_clients)
    if model == "lognormal":
        normal = rng.standard_normal((2, num_clients))
        return np.exp(sigma * normal[0]), np.exp(sigma * normal[1])
    raise ValueError(f"unknown straggler model {model!r}; valid: none, lognormal")


def client_seconds(
    samples: float,
    sample_time: float,
    compute_factor: float,
    bytes_moved: int,
    bandwidth: float,
    bandwidth_factor: float,
) -> float:
    """T_k = S_k·τ·c_k + B / (β·2^20·b_k)."""
    return samples * sample_time * compute_factor + bytes_moved / (bandwidth * MB * bandwidth_factor)


def partial_step_cap(
    deadline: float, network_seconds: float, batch_size: int, sample_time: float, compute_factor: float
) -> int:
    """The local steps that fit before the deadline: ⌊(D − network) / (batch·τ·c_k)⌋, at least 0."""
    budget = deadline - network_seconds
    if budget <= 0:
        return 0
    return int(math.floor(budget / (batch_size * sample_time * compute_factor) + 1e-9))


def choose_reporters(times: dict[int, float], deadline: float | None, keep: int | None) -> list[int]:
    """The clients whose update the server uses: on time (T_k ≤ D), and of those the first
    ``keep`` by T_k (ties by client id) when over-selecting; sorted by client id."""
    on_time = [k for k, t in times.items() if deadline is None or t <= deadline]
    if keep is not None:
        on_time = sorted(on_time, key=lambda k: (times[k], k))[:keep]
    return sorted(on_time)


def round_seconds(reporter_times: Iterable[float], someone_missing: bool, deadline: float | None) -> float:
    """The simulated round time: the slowest reporter; the deadline when a client is missing."""
    if deadline is not None and someone_missing:
        return float(deadline)
    return float(max(reporter_times, default=0.0))


# ---- the model a federation holds -----------------------------------------------------------
@dataclass
class RoundPlan:
    """One round's availability: who was sampled and trains, each trainer's step cap, and (after
    ``reports``) who reported and the simulated round time."""

    sampled: list[int]
    dropped_out: list[int]
    training: list[int]
    step_caps: dict[int, int | None]
    planned_samples: dict[int, int]
    times: dict[int, float] = field(default_factory=dict)
    reported: list[int] = field(default_factory=list)
    sim_time: float = 0.0

    def record(self) -> dict[str, object]:
        """The round's rounds.jsonl entries."""
        return {
            "sampled": self.sampled,
            "reported": self.reported,
            "dropped_out": self.dropped_out,
            "sim_time": self.sim_time,
        }


class SystemModel:
    """The per-run draws of ``AvailabilitySpec`` and the per-round decisions (see the module)."""

    def __init__(self, spec: AvailabilitySpec, num_clients: int, seed: int, batch_size: int) -> None:
        self.spec, self.num_clients, self.seed, self.batch_size = spec, num_clients, seed, batch_size
        trace = rng_stream(seed, "availability_trace")
        self.probabilities = bernoulli_probabilities(spec.availability_rate, trace, num_clients)
        self.phases = trace.uniform(0.0, 1.0, size=num_clients)
        self.compute_factors, self.bandwidth_factors = speed_factors(
            spec.straggler_model, spec.straggler_sigma, rng_stream(seed, "system_speeds"), num_clients
        )

    @property
    def decides_after_training(self) -> bool:
        """Whether who reports depends on the trained clients' times (a deadline, over-selection)."""
        return self.spec.deadline is not None or self.spec.over_select > 0

    def online(self, round_index: int) -> np.ndarray:
        """The K clients' online mask at ``round_index``."""
        kind = self.spec.availability
        if kind == "always":
            return np.ones(self.num_clients, dtype=bool)
        if kind == "bernoulli":
            draws = rng_stream(self.seed, "availability", round_index).random(self.num_clients)
            return draws < self.probabilities
        if kind == "cyclic":
            return cyclic_online(self.phases, round_index, self.spec.availability_period, self.spec.availability_rate)
        raise ValueError(f"unknown availability {kind!r}; valid: always, bernoulli, cyclic")

    def sample(
        self, rng: np.random.Generator, training_clients: Sequence[int], sampled_per_round: int, round_index: int
    ) -> list[int]:
        """The round's sampled clients (sorted): M' of the online training clients."""
        mask = self.online(round_index)
        pool = [k for k in training_clients if mask[k]]
        count = over_selected_count(sampled_per_round, self.spec.over_select, len(pool))
        if count == 0:
            return []
        return sorted(pool[int(c)] for c in rng.choice(len(pool), size=count, replace=False))

    def dropouts(self, round_index: int) -> np.ndarray:
        """The K clients' dropout mask at ``round_index`` (u_k < rate, u drawn for every client)."""
        if self.spec.dropout == 0:
            return np.zeros(self.num_clients, dtype=bool)
        return rng_stream(self.seed, "client_dropout", round_index).random(self.num_clients) < self.spec.dropout

    def network_seconds(self, client: int, bytes_moved: int) -> float:
        return client_seconds(0, 0.0, 1.0, bytes_moved, self.spec.bandwidth, float(self.bandwidth_factors[client]))

    def plan(
        self, round_index: int, sampled: list[int], planned_samples: dict[int, int], bytes_down: dict[int, int]
    ) -> RoundPlan:
        """Before training: who drops out, who trains, and each trainer's step cap (partial work;
        a client that fits no step is not trained and does not report)."""
        dropped = self.dropouts(round_index)
        dropped_out = [k for k in sampled if dropped[k]]
        training = [k for k in sampled if not dropped[k]]
        caps: dict[int, int | None] = {k: None for k in training}
        spec = self.spec
        if spec.deadline is not None and spec.deadline_policy == "partial":
            for k in training:
                network = self.network_seconds(k, 2 * bytes_down[k])  # the upload taken as large as the download
                cap = partial_step_cap(
                    spec.deadline, network, self.batch_size, spec.sample_time, float(self.compute_factors[k])
                )
                planned_steps = -(-planned_samples[k] // self.batch_size)
                caps[k] = cap if cap < planned_steps else None
            training = [k for k in training if caps[k] != 0]
            caps = {k: caps[k] for k in training}
        return RoundPlan(sampled, dropped_out, training, caps, {k: planned_samples[k] for k in training})

    def samples_processed(self, plan: RoundPlan, client: int) -> int:
        """S_k: the planned samples, or under a step cap at most cap·batch size."""
        cap = plan.step_caps.get(client)
        planned = plan.planned_samples[client]
        return planned if cap is None else min(planned, cap * self.batch_size)

    def report(self, plan: RoundPlan, trained: dict[int, tuple[int, int]], sampled_per_round: int) -> None:
        """After training: each trainer's T_k from its (bytes down, bytes up), who reported and
        the round time, written into ``plan``. The server waits for every sampled client, or
        under over-selection for M = ``sampled_per_round`` of them."""
        spec = self.spec
        for k, (down, up) in trained.items():
            plan.times[k] = client_seconds(
                self.samples_processed(plan, k),
                spec.sample_time,
                float(self.compute_factors[k]),
                down + up,
                spec.bandwidth,
                float(self.bandwidth_factors[k]),
            )
        over_selecting = spec.over_select > 0
        plan.reported = choose_reporters(plan.times, spec.deadline, sampled_per_round if over_selecting else None)
        waited_for = min(sampled_per_round, len(plan.sampled)) if over_selecting else len(plan.sampled)
        missing = len(plan.reported) < waited_for
        plan.sim_time = round_seconds((plan.times[k] for k in plan.reported), missing, spec.deadline)
