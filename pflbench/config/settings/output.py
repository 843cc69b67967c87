"""Where a run's results go and what is written beside them: never part of the run identity."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pflbench.config.settings.base import SettingGroup, option
from pflbench.errors import ConfigError


@dataclass(frozen=True)
class OutputSettings(SettingGroup):
    title = "Output"

    out: str = option("results", "Output folder; the run goes to OUT/runs/<name>/.")
    portable: bool = option(
        False,
        "Share-safe results: config.json and summary.json name no local absolute path (each becomes "
        "<local>/NAME). Not part of the run identity.",
    )
    checkpoint_every: int = option(10, "Checkpoint every N rounds (run --resume; sweeps resume); 0 = never.")
    save_model: bool = option(
        False,
        "After the last round, write the global model and each client's "
        "private state to RUN_DIR/models/ (safetensors; LoRA runs also a peft adapter).",
    )
    log: tuple[str, ...] = option(
        (),
        "Experiment tracker(s): tensorboard, mlflow, wandb (offline unless WANDB_MODE=online) or a "
        "plugin's (comma-separated or repeatable; pip install 'pflbench[tensorboard]' / '[mlflow]' "
        "/ '[wandb]'; `pflbench list trackers`).",
    )
    mlflow_uri: str | None = option(None, "MLflow tracking URI for --log mlflow [default: sqlite:///OUT/mlflow.db].")

    def validate(self, config: Any) -> None:
        if self.checkpoint_every < 0:
            raise ConfigError(f"--checkpoint-every must be ≥ 0 (0 = never), got {self.checkpoint_every}")
