"""Robust aggregation of the model updates (``engine.robust``): the rule and its parameters, and
what the algorithm, the clients sampled per round and the built upload must allow
(``RobustSettings.check_run``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pflbench.config.settings.base import RunFacts, RunReads, SettingGroup, check_choice, option, refuse_first
from pflbench.errors import ConfigError

ROBUST_AGGREGATORS = ("none", "median", "trimmed-mean", "krum", "multi-krum", "norm-bound")  # engine.robust
# The parameters each rule reads (the rest are inert under it).
RULE_PARAMETERS: dict[str, tuple[str, ...]] = {
    "trimmed-mean": ("trim_frac",),
    "krum": ("krum_f",),
    "multi-krum": ("krum_f", "krum_select"),
    "norm-bound": ("norm_bound",),
}


@dataclass(frozen=True)
class RobustSettings(SettingGroup):
    title = "Robust aggregation"
    section = "Attacks and robust aggregation"
    omitted_at_default = ("robust_agg",)

    robust_agg: str = option(
        "none",
        "Robust aggregation of the model updates (engine.robust), for algorithms whose aggregation is "
        "FedAvg's average: median (coordinate-wise), trimmed-mean (--trim-frac per side), krum / "
        "multi-krum (--krum-f, --krum-select), norm-bound (each update clipped to --norm-bound, then "
        "averaged). none = the algorithm's own rule.",
        choices=ROBUST_AGGREGATORS,
    )
    trim_frac: float = option(0.1, "β of --robust-agg trimmed-mean: the fraction trimmed on each side, in [0, 0.5).")
    krum_f: int = option(1, "f of --robust-agg krum / multi-krum: the Byzantine clients tolerated (needs M > 2f + 2).")
    krum_select: int = option(0, "Updates --robust-agg multi-krum averages; 0 = m − f (m: the reports of the round).")
    norm_bound: float = option(1.0, "M of --robust-agg norm-bound: each model update is clipped to norm M.")

    def spec(self) -> RobustSpec | None:
        """What the engine reads; None: the algorithm's own rule."""
        if self.robust_agg == "none":
            return None
        return RobustSpec(
            rule=self.robust_agg,
            trim_frac=self.trim_frac,
            krum_f=self.krum_f,
            krum_select=self.krum_select,
            norm_bound=self.norm_bound,
        )

    def validate(self, config: Any) -> None:
        check_choice("robust_agg", self.robust_agg, ROBUST_AGGREGATORS)
        refuse_first(
            [
                (
                    math.isfinite(self.trim_frac) and 0 <= self.trim_frac < 0.5,
                    f"--trim-frac is the fraction trimmed on each side and must be in [0, 0.5), got {self.trim_frac}",
                ),
                (self.krum_f >= 0, f"--krum-f (Byzantine clients tolerated) must be ≥ 0, got {self.krum_f}"),
                (self.krum_select >= 0, f"--krum-select must be ≥ 0 (0 = m − f), got {self.krum_select}"),
                (
                    math.isfinite(self.norm_bound) and self.norm_bound > 0,
                    f"--norm-bound must be a finite number > 0, got {self.norm_bound}",
                ),
                (
                    self.robust_agg == "none" or config.dp != "client",
                    f"--robust-agg {self.robust_agg} replaces the mean whose noise --dp client calibrates; "
                    "use one of them",
                ),
            ]
        )

    def check_run(self, config: Any, run: RunFacts) -> None:
        """The rule replaces the FedAvg average of model updates (the algorithm's
        ``averaged-upload`` capability) and needs uploads (the built upload); with M clients
        sampled per round, Krum needs m > 2f + 2 and Multi-Krum selects at most m."""
        if self.robust_agg == "none":
            return
        rule, algorithm = self.robust_agg, run.algorithm
        if algorithm is not None:
            refusal = "it uploads nothing" if algorithm.uploads_nothing else algorithm.refusals["averaged-upload"]
            if refusal is not None:
                raise ConfigError(
                    f"--robust-agg {rule} cannot replace the aggregation of --algo {config.algo}: {refusal}"
                )
        if run.clients is not None:
            sampled = run.clients.sampled_per_round
            if rule in ("krum", "multi-krum") and sampled < 2 * self.krum_f + 3:
                raise ConfigError(
                    f"--robust-agg {rule} with --krum-f {self.krum_f} needs more than 2f + 2 = "
                    f"{2 * self.krum_f + 2} clients per round (Blanchard et al. 2017), got {sampled}; "
                    "lower --krum-f or sample more clients"
                )
            if rule == "multi-krum" and self.krum_select > sampled:
                raise ConfigError(
                    f"--krum-select {self.krum_select} is more than the {sampled} clients sampled per round"
                )
        if run.upload is not None and not run.upload.uploads:
            raise ConfigError(
                f"--robust-agg {rule}: --algo {config.algo} uploads nothing, so there is nothing to aggregate"
            )

    def identity(self, run: RunReads) -> dict[str, Any]:
        """None while off (runs made before robust rules keep their folders); else the rule and
        the parameters it reads."""
        if self.robust_agg == "none":
            return {}
        read: dict[str, Any] = {"robust_agg": self.robust_agg}
        read.update({name: getattr(self, name) for name in RULE_PARAMETERS.get(self.robust_agg, ())})
        return read

    def inert(self, run: RunReads) -> dict[str, str]:
        read = self.identity(run)
        reasons = {
            "trim_frac": "only --robust-agg trimmed-mean reads it",
            "krum_f": "only --robust-agg krum or multi-krum reads it",
            "krum_select": "only --robust-agg multi-krum reads it",
            "norm_bound": "only --robust-agg norm-bound reads it",
        }
        return {name: why for name, why in reasons.items() if name not in read}


@dataclass(frozen=True)
class RobustSpec:
    """What ``engine.robust`` reads: the rule and its parameters, β per side (trimmed mean), f
    and the number selected (Krum / Multi-Krum), M (norm bounding). Defaults: those of
    ``RobustSettings``."""

    rule: str
    trim_frac: float = RobustSettings.default("trim_frac")
    krum_f: int = RobustSettings.default("krum_f")
    krum_select: int = RobustSettings.default("krum_select")  # 0: m − f (the reports less the Byzantine assumed)
    norm_bound: float = RobustSettings.default("norm_bound")
