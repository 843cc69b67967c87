"""The experiment: which algorithm on which dataset, with which seed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pflbench.config.settings.base import RunReads, SettingGroup, option
from pflbench.errors import ConfigError


@dataclass(frozen=True)
class ExperimentSettings(SettingGroup):
    title = "Experiment"

    algo: str = option("fedavg", "Algorithm (see `pflbench list algorithms`).")
    dataset: str = option("digits", "Dataset (see `pflbench list datasets`).")
    dataset_option: tuple[str, ...] = option(
        (), "Dataset option KEY=VALUE, repeatable (e.g. num_samples=2000 for synthetic)."
    )
    data_dir: str | None = option(None, "Local copy of a hub dataset, or a path for local data.")
    seed: int = option(0, "Seed of the partition, client sampling, init and local training.")

    def dataset_options(self) -> dict[str, Any]:
        options = key_values(self.dataset_option, "--dataset-option")
        if self.data_dir is not None:
            options["data_dir"] = self.data_dir
        return options

    def validate(self, config: Any) -> None:
        if self.seed < 0:
            raise ConfigError(f"--seed must be ≥ 0, got {self.seed}")

    def identity(self, run: RunReads) -> dict[str, Any]:
        return {
            "algo": self.algo,
            "dataset": self.dataset,
            "dataset_options": self.dataset_options(),
            "seed": self.seed,
        }


def key_values(items: tuple[str, ...], flag: str) -> dict[str, Any]:
    """``KEY=VALUE`` items as a dict, each value an int, else a float, else the text."""
    options: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{flag} {item!r} is not KEY=VALUE")
        options[key.strip()] = _parse_scalar(value.strip())
    return options


def _parse_scalar(text: str) -> Any:
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text
