"""Settings given for a run that it would not read are refused, never recorded as if they applied:
one rule for ``run``, ``sweep``, ``tune`` (``cli.options.refuse_inert_options``, which knows what
the command line gave) and the library's ``run_experiment`` (``refuse_inert``, where a setting is
given when it differs from ``RunConfig``'s default, and every hyperparameter passed is given).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pflbench.config.identity import inert_settings
from pflbench.config.run_config import RunConfig
from pflbench.errors import ConfigError
from pflbench.registry import ALGORITHMS


def unused_services(config: RunConfig, command: str = "run") -> dict[str, str]:
    """Options that configure a service the run does not use (Ray for the executor, MLflow),
    each with why. They never change the numbers (the run's identity leaves them out), so
    ``inert_settings`` does not list them; given, they would be silently ignored. A sweep's (or
    tune's) ``--ray-address`` without ``--executor ray`` is read: its runs go to Ray."""
    unused = {}
    if config.executor != "ray":
        unused["ray_workers"] = f"--executor {config.executor} starts no Ray actors (--executor ray does)"
        if command == "run":
            unused["ray_address"] = f"--executor {config.executor} joins no Ray cluster (--executor ray does)"
    trackers = {name.strip() for item in config.log for name in item.split(",")}
    if "mlflow" not in trackers:
        unused["mlflow_uri"] = "nothing logs to MLflow without --log mlflow"
    return unused


def inert_options(config: RunConfig, hparams: Any, command: str = "run") -> dict[str, str]:
    """Every setting the resolved run ``config`` (with hyperparameters ``hparams``) would not read,
    each with why."""
    return {**inert_settings(config, ALGORITHMS.get(config.algo), hparams), **unused_services(config, command)}


def ignored(name: str, value: Any, why: str, where: str = "") -> ConfigError:
    """The one refusal of an inert setting (``where``: e.g. `` of the --config file``)."""
    return ConfigError(f"--{name.replace('_', '-')} {value} would be ignored: {why}; leave it out{where}")


def given_settings(config: RunConfig, algo_options: dict[str, Any] | None) -> set[str]:
    """What a library call gave: the settings that differ from ``RunConfig``'s defaults, and every
    hyperparameter passed."""
    changed = {f.name for f in dataclasses.fields(RunConfig) if getattr(config, f.name) != f.default}
    return changed | set(algo_options or {})


def refuse_inert(given: set[str], config: RunConfig, hparams: Any) -> None:
    """ConfigError for the first (by name) of the ``given`` settings that the resolved run
    ``config`` would not read."""
    inert = inert_options(config, hparams)
    for name in sorted(given & set(inert)):
        value = getattr(config, name) if hasattr(config, name) else getattr(hparams, name)
        raise ignored(name, value, inert[name])
