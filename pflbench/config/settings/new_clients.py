"""New clients: a fraction of the K clients held out of training entirely and served after it
by the algorithm's adaptation (``new_acc``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pflbench.config.settings.base import RunReads, SettingGroup, option
from pflbench.errors import ConfigError


@dataclass(frozen=True)
class NewClientsSettings(SettingGroup):
    title = "New clients"
    section = "Clients and rounds"
    omitted_at_default = ("new_clients",)  # runs made before new clients keep their folders

    new_clients: float = option(
        0.0,
        "Fraction of the K clients held out of training entirely (new, unseen clients; a seeded "
        "choice, at least 1 when > 0): never sampled, served after training by the algorithm's "
        "adaptation and reported as new_acc at every evaluation. 0 = none.",
    )

    def validate(self, config: Any) -> None:
        check_new_clients_fraction(self.new_clients)
        if config.num_clients is not None:  # else checked once K is fitted (data.partition.fit_num_clients)
            new_client_count(config.num_clients, self.new_clients)

    def identity(self, run: RunReads) -> dict[str, Any]:
        return {} if self.new_clients == self.default("new_clients") else {"new_clients": self.new_clients}


def new_client_count(num_clients: int, fraction: float) -> int:
    """How many of ``num_clients`` clients ``--new-clients fraction`` holds out of training:
    floor(fraction·K + 0.5), at least 1 when fraction > 0; ConfigError when none would train."""
    check_new_clients_fraction(fraction)
    if fraction == 0:
        return 0
    count = max(1, math.floor(fraction * num_clients + 0.5))
    if count >= num_clients:
        fix = (
            "it needs at least 2 clients"
            if num_clients < 2
            else f"use a fraction below {(num_clients - 0.5) / num_clients:.3g} or more clients"
        )
        raise ConfigError(
            f"--new-clients {fraction:g} holds out {count} of {num_clients} clients, leaving none to train; {fix}"
        )
    return count


def check_new_clients_fraction(fraction: float) -> None:
    if not (math.isfinite(fraction) and 0 <= fraction < 1):
        raise ConfigError(f"--new-clients must be a fraction in [0, 1) (0 = none), got {fraction}")
