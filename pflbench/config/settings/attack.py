"""Malicious clients (``engine.attacks``): which attack, how many attackers, and each attack's
own parameters. What needs the algorithm, the number of clients, the data or the built upload
is checked here too, once the run knows it (``AttackSettings.check_run``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pflbench.config.settings.base import RunFacts, RunReads, SettingGroup, check_choice, option, refuse_first
from pflbench.errors import ConfigError

ATTACKS = ("none", "label-flip", "sign-flip", "scale", "gaussian", "backdoor")  # --attack (engine.attacks)
MODEL_POISONING = ("sign-flip", "scale", "gaussian")  # attacks on the uploads (the rest poison the data)
SCALED_ATTACKS = ("scale", "gaussian")  # the attacks that read --attack-scale
TRIGGER_SIZE = 3  # the backdoor's square patch, in pixels, in the bottom-right corner


def attacker_count(num_training: int, fraction: float) -> int:
    """a = ⌊ρ·K_train + ½⌋, at least 1 when ρ > 0."""
    return 0 if fraction == 0 else max(1, math.floor(fraction * num_training + 0.5))


@dataclass(frozen=True)
class AttackSettings(SettingGroup):
    title = "Attacks"
    section = "Attacks and robust aggregation"
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

    def check_run(self, config: Any, run: RunFacts) -> None:
        """Model poisoning needs an upload that is a model update averaged by the FedAvg rule
        (the algorithm's ``averaged-upload`` capability) and one at all (the built upload); at
        least one training client stays honest (K); the backdoor stamps a patch on images and
        teaches one of the dataset's classes (the data)."""
        if self.attack == "none":
            return
        poisons_models = self.attack in MODEL_POISONING
        algorithm = run.algorithm
        if algorithm is not None and poisons_models:
            refusal = "it uploads nothing" if algorithm.uploads_nothing else algorithm.refusals["averaged-upload"]
            if refusal is not None:
                raise ConfigError(
                    f"--attack {self.attack} poisons model updates, and --algo {config.algo} has none to poison: "
                    f"{refusal}; data poisoning (--attack label-flip or backdoor) works with it"
                )
        if run.clients is not None:
            num_training = run.clients.num_training
            count = attacker_count(num_training, self.attackers)
            if count >= num_training:
                raise ConfigError(
                    f"--attackers {self.attackers:g} makes {count} of the {num_training} training clients "
                    "malicious, leaving no honest client; use a smaller fraction or more clients"
                )
        data = run.data
        if data is not None and self.attack == "backdoor":
            if not data.is_image or min(data.input_shape[-2:]) < TRIGGER_SIZE:
                raise ConfigError(
                    f"--attack backdoor stamps a {TRIGGER_SIZE}×{TRIGGER_SIZE} patch on images, and --dataset "
                    f"{data.name} has no images of that size (inputs {tuple(data.input_shape)}); use --attack label-flip"
                )
            if self.backdoor_target >= data.num_classes:
                raise ConfigError(
                    f"--backdoor-target {self.backdoor_target} is not a class of --dataset {data.name} "
                    f"(0 … {data.num_classes - 1})"
                )
        if run.upload is not None and poisons_models and not run.upload.uploads:
            raise ConfigError(
                f"--attack {self.attack}: --algo {config.algo} uploads nothing, so there is no update to poison; "
                "data poisoning (--attack label-flip or backdoor) works with it"
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
