"""Every registered algorithm runs end to end: 2 rounds, 3 clients, a tiny model."""

from __future__ import annotations

import json
import math
import os

import pytest

from pflbench.config.run_config import RunConfig
from pflbench.registry import ALGORITHMS
from pflbench.runs.api import run_experiment
from pflbench.sweeps.reference import is_lora_only
from pflbench.testing import ALGORITHM_OVERRIDES as OVERRIDES

# The device and precision every algorithm runs on here: the CPU in CI; on a GPU machine
# `PFLBENCH_TEST_DEVICE=cuda [PFLBENCH_TEST_PRECISION=bf16] pytest tests/algorithms/test_every_algorithm.py`
# (benchmarks/gpu_all.sh) checks that every algorithm keeps its tensors on the device.
DEVICE = os.environ.get("PFLBENCH_TEST_DEVICE", "cpu")
PRECISION = os.environ.get("PFLBENCH_TEST_PRECISION", "fp32")


@pytest.mark.parametrize("algo", ALGORITHMS.names())
def test_every_algorithm_runs_two_rounds(algo: str, tmp_path) -> None:
    # LoRA algorithms (FlexLoRA, FedSDG) adapt the mlp's hidden layers on its random frozen body. Adam: FedSDG always uses it. One of the
    # 4 clients is new (--new-clients): never trained, served by the algorithm's adaptation.
    settings = {"model": "mlp", "optimizer": "adam", "lr": 0.01, **OVERRIDES.get(algo, {})}
    if is_lora_only(algo):  # the LoRA settings only where they are read: elsewhere they are refused
        settings |= {"lora_targets": "fc1,fc2", "backbone": "random"}
    config = RunConfig(
        algo=algo,
        dataset="digits",
        num_clients=4,
        new_clients=0.25,
        rounds=2,
        alpha=0.5,
        out=str(tmp_path),
        device=DEVICE,
        precision=PRECISION,
        **settings,
    )
    summary = run_experiment(config)
    run_dir = tmp_path / "runs"
    (folder,) = list(run_dir.iterdir())
    for name in ("config.json", "rounds.jsonl", "clients.csv", "partition.json", "summary.json"):
        assert (folder / name).is_file(), name
    records = [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in records] == [1, 2]
    assert 0.0 <= summary["pers_acc"] <= 1.0 and math.isfinite(summary["final_train_loss"])
    assert summary["pers_acc"] > 0.15, "two rounds on digits should beat chance (0.1)"
    (new,) = json.loads((folder / "partition.json").read_text())["new_clients"]
    assert all(new not in r["clients"] for r in records) and all(len(r["clients"]) == 3 for r in records)
    assert 0.0 <= summary["new_acc"] <= 1.0 and 0.0 <= summary["val_pers_acc"] <= 1.0
    assert records[-1]["new_acc"] == summary["new_acc"] and "new_acc" in records[0]  # every evaluation
    server_class = ALGORITHMS.get(algo)
    if server_class.has_global_model:
        assert summary["global_acc"] is not None
    else:
        assert summary["global_acc"] is None
