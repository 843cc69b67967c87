"""Defaults that learn: unset settings take the defaults of the model's family.

Measured with the defaults (digits, Dirichlet α = 0.5, 20 clients all sampled, 50 rounds, 1 local
epoch, batch 32, plain SGD, seed 0, one CPU thread); the full table is in the docs (docs/guides/
configuration.md, "Defaults that learn"). lr 0.01 (the old default) left FedAvg at chance after 5 rounds; with the
family's lr 0.1 every built-in algorithm ends well above chance (0.1). Here: resolution picks
the family's values (and only for unset settings), and one short run learns.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from pflbench.config.defaults import (
    BASE_DEFAULTS,
    DEFAULTS_BY_FAMILY,
    model_family,
)
from pflbench.config.lora import RUN_DEFAULTS
from pflbench.config.run_config import RunConfig, resolve
from pflbench.registry import ALGORITHMS

SMALL_LR = DEFAULTS_BY_FAMILY["small"]["lr"]
BUILTIN = (
    "fedavg",
    "fedprox",
    "local",
    "fedper",
    "fedrep",
    "flexlora",
    "fedsdg",
    "fedbn",
    "fedrod",
    "fedala",
    "scaffold",
    "moon",
    "feddyn",
)


def resolved(config: RunConfig, algo: str = "fedavg", shared: dict | None = None):
    algorithm = ALGORITHMS.get(algo)
    return resolve(dataclasses.replace(config, algo=algo), algorithm, algorithm.hyperparameters(), shared)


@pytest.mark.parametrize("model", [None, "cnn", "mlp", "lenet", "cnn_bn"])
def test_small_zoo_models_get_the_family_lr(model: str | None) -> None:
    config, applied = resolved(RunConfig(model=model))
    assert model_family(config.model) == "small"
    assert config.lr == applied["lr"] == SMALL_LR == 0.1
    assert config.optimizer == "sgd" and config.max_grad_norm == 0.0


def test_algorithm_refinements_of_the_family() -> None:
    config, applied = resolved(RunConfig(), algo="scaffold")
    assert config.lr == applied["lr"] == ALGORITHMS.get("scaffold").defaults_by_family["small"]["lr"] == 0.02
    config, _ = resolved(RunConfig(model="resnet18"), algo="scaffold")  # no family: base defaults
    assert config.lr == BASE_DEFAULTS["lr"]
    config, _ = resolved(RunConfig(lr=0.2), algo="scaffold")
    assert config.lr == 0.2


def test_other_models_lora_runs_and_given_values_keep_theirs() -> None:
    config, applied = resolved(RunConfig(model="resnet18"))
    assert model_family("resnet18") is None and config.lr == BASE_DEFAULTS["lr"] == 0.01
    config, applied = resolved(RunConfig(lr=0.03))  # given: kept
    assert config.lr == 0.03 and "lr" not in applied
    config, _ = resolved(RunConfig(lora_rank=4))  # LoRA: config.lora.RUN_DEFAULTS
    assert (config.model, config.lr, config.optimizer) == (RUN_DEFAULTS["model"], 1e-3, "adam")
    config, _ = resolved(RunConfig(model="mlp", lora_rank=4))  # LoRA on a small model too
    assert config.lr == 1e-3
    config, _ = resolved(RunConfig(), shared=RUN_DEFAULTS)  # a LoRA sweep's shared defaults
    assert config.lr == 1e-3 and config.model == RUN_DEFAULTS["model"]
    config, _ = resolved(RunConfig(), algo="fedsdg")  # the algorithm's own first
    assert config.max_grad_norm == 1.0 and config.lr == 1e-3


def test_every_builtin_algorithm_resolves_a_learning_default() -> None:
    for name in BUILTIN:
        algorithm = ALGORITHMS.get(name)
        config, _ = resolve(RunConfig(algo=name), algorithm, algorithm.hyperparameters())
        own = algorithm.defaults_by_family.get("small", {}).get("lr", SMALL_LR)
        expected = 1e-3 if algorithm.lora_rank(config, algorithm.hyperparameters()) else own
        assert config.lr == expected, name


def test_a_short_run_with_the_defaults_learns_and_records_them(tmp_path: Path) -> None:
    from pflbench.runs.execute import execute
    from pflbench.runs.prepare import prepare

    # default lr, batch, optimizer; fewer clients and rounds to stay fast
    prepared = prepare(RunConfig(model="mlp", num_clients=5, rounds=10, out=str(tmp_path)))
    summary = execute(prepared)
    assert summary["pers_acc"] > 0.6 and summary["global_acc"] > 0.6  # chance: 0.1
    config = json.loads((prepared.run_dir / "config.json").read_text())
    assert config["lr"] == SMALL_LR
    assert config["resolved"]["run_defaults"]["lr"] == SMALL_LR
    assert config["resolved"]["defaults_family"] == "small"
