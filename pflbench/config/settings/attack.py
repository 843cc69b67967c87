"""Malicious clients (``engine.attacks``): which attack, how many attackers, and each attack's
own parameters. What needs the number of clients or the algorithm is checked by
``engine.attacks`` once they are known."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pflbench.config.settings.base import RunReads, SettingGroup, check_choice, option, refuse_first

ATTACKS = ("none", "label-flip", "sign-flip", "scale", "gaussian", "backdoor")  # --attack (engine.attacks)
MODEL_POISONING = ("sign-flip", "scale", "gaussian")  # attacks on the uploads (the rest poison the data)
SCALED_ATTACKS = ("scale", "gaussian")  # the attacks that read --attack-scale


@dataclass(frozen=True)
class AttackSettings(SettingGroup):
    title = "Attacks"
    omitted_at_default = ("attack",)

    attack: str = option(
        "none",
        "Malicious clients (engine.attacks; a fraction --attackers of the training clients, a seeded "
        "choice fixed for the run): label-flip (their train labels y → C−1−y), sign-flip (they upload "
        "received − Δ), scale (received + λ·Δ), gaussian (received + N(0, λ²) per entry; λ = "
        "--attack-scale), backdoor (a 3×3 white patch in the bottom-right corner and label "
        "--backdoor-target on a share --backdoor-frac of their train images; asr measured). none = off.",
        choices=ATTACKS,
    )
    attackers: float = option(0.0, "Fraction of the training clients that are malicious (--attack), in [0, 1).")
    attack_scale: float = option(
        10.0, "λ of --attack scale (Δ → λ·Δ) and the std of --attack gaussian (Δ ~ N(0, λ²) per entry)."
    )
    backdoor_target: int = option(0, "The label --attack backdoor teaches for the trigger.")
    backdoor_frac: float = option(
        0.5, "Share of each attacker's train samples that --attack backdoor poisons, in (0, 1]."
    )

    def spec(self) -> AttackSpec | None:
        """What the engine reads; None while every client is honest."""
        if self.attack == "none":
            return None
        return AttackSpec(
            kind=self.attack,
            fraction=self.attackers,
            scale=self.attack_scale,
            backdoor_target=self.backdoor_target,
            backdoor_frac=self.backdoor_frac,
        )

    def validate(self, config: Any) -> None:
        check_choice("attack", self.attack, ATTACKS)
        fraction = self.attackers
        refuse_first(
            [
                (
                    isinstance(fraction, (int, float)) and math.isfinite(fraction) and 0 <= fraction < 1,
                    f"--attackers must be a fraction in [0, 1) of the training clients, got {fraction}",
                ),
                (
                    self.attack == "none" or fraction > 0,
                    f"--attack {self.attack} needs malicious clients: give --attackers FRAC > 0 (e.g. 0.2)",
                ),
                (
                    math.isfinite(self.attack_scale) and self.attack_scale > 0,
                    f"--attack-scale must be a finite number > 0, got {self.attack_scale}",
                ),
                (
                    self.backdoor_target >= 0,
                    f"--backdoor-target must be a class label ≥ 0, got {self.backdoor_target}",
                ),
                (
                    math.isfinite(self.backdoor_frac) and 0 < self.backdoor_frac <= 1,
                    f"--backdoor-frac must be in (0, 1], got {self.backdoor_frac}",
                ),
            ]
        )

    def identity(self, run: RunReads) -> dict[str, Any]:
        """None while every client is honest (runs made before attacks keep their folders)."""
        if self.attack == "none":
            return {}
        read: dict[str, Any] = {"attack": self.attack, "attackers": self.attackers}
        if self.attack in SCALED_ATTACKS:
            read["attack_scale"] = self.attack_scale
        if self.attack == "backdoor":
            read.update(backdoor_target=self.backdoor_target, backdoor_frac=self.backdoor_frac)
        return read

    def inert(self, run: RunReads) -> dict[str, str]:
        read = self.identity(run)
        reasons = {
            "attackers": "no --attack is set (label-flip, sign-flip, scale, gaussian or backdoor)",
            "attack_scale": "only --attack scale or gaussian reads it",
            "backdoor_target": "only --attack backdoor reads it",
            "backdoor_frac": "only --attack backdoor reads it",
        }
        return {name: why for name, why in reasons.items() if name not in read}


@dataclass(frozen=True)
class AttackSpec:
    """What ``engine.attacks`` reads: the attack, the fraction of the training clients that are
    attackers, λ / σ of the scaled and Gaussian updates, and the backdoor's target label and
    share of each attacker's train samples that carry the trigger. Defaults: those of
    ``AttackSettings``."""

    kind: str
    fraction: float
    scale: float = AttackSettings.default("attack_scale")
    backdoor_target: int = AttackSettings.default("backdoor_target")
    backdoor_frac: float = AttackSettings.default("backdoor_frac")
