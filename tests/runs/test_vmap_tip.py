"""The one-line tip on a GPU: ``--executor vmap`` for runs it can host, nothing otherwise."""

from __future__ import annotations

import dataclasses

import torch

from pflbench.config.run_config import RunConfig
from pflbench.runs.prepare import prepare, vmap_tip

BASE = RunConfig(algo="fedavg", dataset="digits", model="mlp", num_clients=4, rounds=1, out="unused")
CUDA = torch.device("cuda")  # only its type is read: no GPU needed


def tip_for(config: RunConfig, device: torch.device = CUDA) -> str | None:
    prepared = prepare(config)
    return vmap_tip(config, prepared.algorithm, prepared.executor.model, device)


def test_a_gpu_run_one_client_after_another_gets_the_tip() -> None:
    tip = tip_for(BASE)
    assert tip is not None and tip.startswith("tip: --executor vmap trains the 4 clients")
    assert "\n" not in tip


def test_no_tip_on_the_cpu_under_vmap_for_one_client_or_what_vmap_cannot_host() -> None:
    assert tip_for(BASE, torch.device("cpu")) is None
    assert tip_for(dataclasses.replace(BASE, executor="vmap")) is None
    assert tip_for(dataclasses.replace(BASE, frac=0.25)) is None  # one client per round
    assert tip_for(dataclasses.replace(BASE, model="cnn_bn")) is None  # BatchNorm statistics: vmap refuses
