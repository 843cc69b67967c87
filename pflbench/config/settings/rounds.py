"""The round schedule: how many rounds, how many clients each, when to evaluate, and the
FedAvg-FT evaluation protocol after the last round."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pflbench.config.settings.base import RunFacts, RunReads, SettingGroup, option, refuse_first
from pflbench.errors import ConfigError


@dataclass(frozen=True)
class RoundsSettings(SettingGroup):
    title = "Rounds"
    section = "Clients and rounds"
    omitted_at_default = ("finetune_epochs",)  # runs made before FedAvg-FT keep their folders

    frac: float = option(1.0, "Fraction of the training clients sampled per round, M = max(1, round(K_train·frac)).")
    rounds: int = option(50, "Communication rounds.")
    eval_every: int | None = option(
        None,
        "Evaluate every N rounds [default: 1 up to 100 rounds, else rounds/100]; the last round is always evaluated.",
    )
    finetune_epochs: int = option(
        0,
        "Evaluation protocol (FedAvg-FT): after the last round, fine-tune the global model for E "
        "epochs on each client's train split (the local optimizer settings) and report it as "
        "pers_acc_ft; 0 = off. Only for algorithms with a global model.",
    )

    @property
    def resolved_eval_every(self) -> int:
        if self.eval_every is not None:
            return self.eval_every
        return 1 if self.rounds <= 100 else math.ceil(self.rounds / 100)

    def validate(self, config: Any) -> None:
        refuse_first(
            [
                (math.isfinite(self.frac) and 0 < self.frac <= 1, f"--frac must be in (0, 1], got {self.frac}"),
                (self.rounds >= 1, f"--rounds must be ≥ 1, got {self.rounds}"),
                (self.eval_every is None or self.eval_every >= 1, f"--eval-every must be ≥ 1, got {self.eval_every}"),
                (
                    self.finetune_epochs >= 0,
                    f"--finetune-epochs must be ≥ 0 (0 = off), got {self.finetune_epochs}",
                ),
            ]
        )

    def check_run(self, config: Any, run: RunFacts) -> None:
        """FedAvg-FT fine-tunes the global model: an algorithm without one is refused."""
        if run.algorithm is not None and self.finetune_epochs and not run.algorithm.has_global_model:
            raise ConfigError(
                f"--finetune-epochs fine-tunes the global model, and --algo {config.algo} has none; leave it at 0"
            )

    def identity(self, run: RunReads) -> dict[str, Any]:
        read: dict[str, Any] = {
            "rounds": self.rounds,
            "frac": self.frac,
            # every N ≥ rounds evaluates only after the last round: one run, one identity
            "eval_every": min(self.resolved_eval_every, self.rounds),
        }
        if self.finetune_epochs != self.default("finetune_epochs"):
            read["finetune_epochs"] = self.finetune_epochs
        return read
