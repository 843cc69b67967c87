"""The library's one-call entry point: prepare a run and execute it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pflbench.config.run_config import RunConfig
from pflbench.engine import RunObserver
from pflbench.runs.execute import execute
from pflbench.runs.prepare import prepare


def run_experiment(
    config: RunConfig,
    algo_options: dict[str, Any] | None = None,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    observers: Sequence[RunObserver] = (),
    *,
    force: bool = False,
    resume: bool = False,
) -> dict[str, Any]:
    """Library entry point: prepare (resolving unset settings as the CLI does) and execute."""
    return execute(prepare(config, algo_options), on_round, observers=observers, force=force, resume=resume)
