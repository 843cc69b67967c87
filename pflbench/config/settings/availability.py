"""Client availability, dropout, stragglers and a round deadline (``engine.availability``):
the system model of a cross-device federation. At the defaults it is off: every sampled client
reports, and a run's identity names none of these settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pflbench.config.settings.base import (
    RunFacts,
    RunReads,
    SettingGroup,
    check_choice,
    finite,
    option,
    refuse_first,
)
from pflbench.errors import ConfigError

AVAILABILITY_TRACES = ("always", "bernoulli", "cyclic")  # --availability (engine.availability)
STRAGGLER_MODELS = ("none", "lognormal")  # --straggler-model
DEADLINE_POLICIES = ("drop", "partial")  # --deadline-policy
# σ = 20 already spreads client speeds over e^(±20·z); σ·z past ~709 overflows the factors
MAX_STRAGGLER_SIGMA = 20.0
MAX_OVER_SELECT = 100.0  # sampling 101·M clients: beyond it, every client of any benchmark
SIMULATED_ONLY_WHEN_ACTIVE = (
    "it times the simulated rounds, simulated only with --dropout, --availability, "
    "--straggler-model, --deadline or --over-select"
)


@dataclass(frozen=True)
class AvailabilitySettings(SettingGroup):
    """Also the view ``engine.availability`` reads (``AvailabilitySpec``): the same fields."""

    title = "Availability and stragglers"
    omitted_at_default = ("dropout", "availability", "straggler_model", "over_select")

    dropout: float = option(
        0.0,
        "Client dropout: the probability that a sampled client fails to report in a round (it "
        "received the model, sends nothing, its state does not change; seeded per round). 0 = off.",
    )
    availability: str = option(
        "always",
        "Which clients are online to be sampled each round: always; bernoulli (client k with its "
        "own probability, drawn once uniformly around --availability-rate); cyclic (a diurnal trace: "
        "online a share --availability-rate of every --availability-period rounds, at its own phase).",
        choices=AVAILABILITY_TRACES,
    )
    availability_rate: float = option(
        0.5, "Mean share of rounds a client is online (--availability bernoulli, cyclic)."
    )
    availability_period: int = option(24, "Rounds in one cycle of --availability cyclic (a simulated day).")
    straggler_model: str = option(
        "none",
        "System model of client speeds, drawn once per run: none (every device the median one) or "
        "lognormal (compute time and bandwidth factors e^(σ·z), σ = --straggler-sigma). Simulated "
        "client time = samples · --sample-time · compute factor + bytes / (--bandwidth · bandwidth factor).",
        choices=STRAGGLER_MODELS,
    )
    straggler_sigma: float = option(1.0, "σ of --straggler-model lognormal (0 = everyone the median device).")
    sample_time: float = option(
        0.01, "Simulated seconds one training sample takes on the median device (simulated time only)."
    )
    bandwidth: float = option(1.0, "Simulated network bandwidth of the median client, MB/s (2^20 bytes).")
    deadline: float | None = option(
        None,
        "Round deadline in simulated seconds: clients that would report later are dropped, or with "
        "--deadline-policy partial do the local steps that fit (FedProx's variable local work). Unset = none.",
    )
    deadline_policy: str = option(
        "drop", "What --deadline does to a late client: drop it, or partial work.", choices=DEADLINE_POLICIES
    )
    over_select: float = option(
        0.0,
        "Over-selection: sample ceil(M·(1 + FRAC)) clients and keep the first M to report "
        "(by simulated time). 0 = off.",
    )

    @property
    def active(self) -> bool:
        """Whether anything is simulated (then rounds.jsonl records who reported and sim_time)."""
        return (
            self.dropout > 0
            or self.availability != "always"
            or self.straggler_model != "none"
            or self.deadline is not None
            or self.over_select > 0
        )

    def validate(self, config: Any) -> None:
        check_choice("availability", self.availability, AVAILABILITY_TRACES)
        check_choice("straggler_model", self.straggler_model, STRAGGLER_MODELS)
        check_choice("deadline_policy", self.deadline_policy, DEADLINE_POLICIES)
        deadline = self.deadline
        refuse_first(
            [
                (
                    finite(self.dropout) and 0 <= self.dropout < 1,
                    f"--dropout must be a probability in [0, 1) (0 = off), got {self.dropout}",
                ),
                (
                    finite(self.availability_rate) and 0 < self.availability_rate <= 1,
                    f"--availability-rate must be in (0, 1], got {self.availability_rate}",
                ),
                (
                    self.availability_period >= 1,
                    f"--availability-period must be ≥ 1 round, got {self.availability_period}",
                ),
                (  # above MAX_STRAGGLER_SIGMA the factors e^(σ·z) overflow to inf or underflow to 0
                    finite(self.straggler_sigma) and 0 <= self.straggler_sigma <= MAX_STRAGGLER_SIGMA,
                    f"--straggler-sigma must be in [0, {MAX_STRAGGLER_SIGMA:g}], got {self.straggler_sigma}",
                ),
                (
                    finite(self.sample_time) and self.sample_time > 0,
                    f"--sample-time must be > 0 seconds, got {self.sample_time}",
                ),
                (
                    finite(self.bandwidth) and self.bandwidth > 0,
                    f"--bandwidth must be > 0 MB/s, got {self.bandwidth}",
                ),
                (
                    deadline is None or (finite(deadline) and deadline > 0),
                    f"--deadline must be > 0 seconds (unset = none), got {deadline}",
                ),
                (  # ceil(M·(1 + f)) must stay a finite count; past MAX_OVER_SELECT every client is sampled anyway
                    finite(self.over_select) and 0 <= self.over_select <= MAX_OVER_SELECT,
                    f"--over-select must be ≥ 0 (0 = off) and ≤ {MAX_OVER_SELECT:g}, got {self.over_select}",
                ),
            ]
        )
        if self.deadline_policy == "partial" and deadline is not None and config.executor == "vmap":
            raise ConfigError(
                "--deadline-policy partial caps each client's local steps, which --executor vmap cannot; "
                "use --executor sequential or ray"
            )

    def check_run(self, config: Any, run: RunFacts) -> None:
        """``--deadline-policy partial`` caps the engine's batch loop; an algorithm with its own
        local update (its program declares no ``batch_loop``: the ``batch-loop`` capability)
        would ignore the cap: refused."""
        if run.algorithm is None or self.deadline is None or self.deadline_policy != "partial":
            return
        if run.algorithm.refusals["batch-loop"] is not None:
            raise ConfigError(
                f"--deadline-policy partial caps the local steps of the engine's batch loop, and --algo "
                f"{config.algo} trains with its own local update; use --deadline-policy drop"
            )

    def identity(self, run: RunReads) -> dict[str, Any]:
        """None while it is off (``active``): runs made before it keep their folders; else each
        setting that applies."""
        if not self.active:
            return {}
        read: dict[str, Any] = {"dropout": self.dropout, "availability": self.availability}
        if self.availability != "always":
            read["availability_rate"] = self.availability_rate
        if self.availability == "cyclic":
            read["availability_period"] = self.availability_period
        read["straggler_model"] = self.straggler_model
        if self.straggler_model != "none":
            read["straggler_sigma"] = self.straggler_sigma
        read.update(sample_time=self.sample_time, bandwidth=self.bandwidth, deadline=self.deadline)
        if self.deadline is not None:
            read["deadline_policy"] = self.deadline_policy
        read["over_select"] = self.over_select
        return read

    def inert(self, run: RunReads) -> dict[str, str]:
        read = self.identity(run)
        reasons = {
            "availability_rate": "only --availability bernoulli or cyclic reads it",
            "availability_period": "only --availability cyclic reads it",
            "straggler_sigma": "only --straggler-model lognormal reads it",
            "deadline_policy": "it says what --deadline does to late clients; no --deadline is set",
            "sample_time": SIMULATED_ONLY_WHEN_ACTIVE,
            "bandwidth": SIMULATED_ONLY_WHEN_ACTIVE,
        }
        return {name: why for name, why in reasons.items() if name not in read}


AvailabilitySpec = AvailabilitySettings  # what engine.availability reads: the group itself
