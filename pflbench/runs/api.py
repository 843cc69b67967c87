"""The library's one-call entry point: prepare a run and execute it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pflbench.config.run_config import RunConfig
from pflbench.engine import RunObserver
from pflbench.runs.execute import execute
from pflbench.runs.inert import given_settings, refuse_inert
from pflbench.runs.prepare import plan_run, prepare


def run_experiment(
    config: RunConfig,
    algo_options: dict[str, Any] | None = None,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    observers: Sequence[RunObserver] = (),
    *,
    force: bool = False,
    resume: bool = False,
) -> dict[str, Any]:
    """Library entry point: prepare (resolving unset settings as the CLI does) and execute. A
    setting given (not at its default) that the run would not read is refused as by ``run``."""
    plan = plan_run(config, algo_options)
    refuse_inert(given_settings(config, algo_options), plan.config, plan.hparams)
    return execute(prepare(plan), on_round, observers=observers, force=force, resume=resume)
