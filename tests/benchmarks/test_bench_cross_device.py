"""benchmarks/bench_cross_device.py at a tiny size on the CPU (a check of the plumbing, not a
timing): pflbench alone, and next to PFLlib when a PFLlib work tree is at hand (``PFLLIB_DIR``
or the checkout's ignored ``.pfllib/PFLlib``)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_cross_device.py"
TINY = ["--clients", "4", "--train-samples", "42", "--test-samples", "8", "--join-ratio", "0.5", "--rounds", "1"]
TINY += ["--data-jobs", "1"]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_cross_device", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_cross_device", module)
    spec.loader.exec_module(module)
    return module


def _pfllib_tree() -> Path | None:
    for candidate in (os.environ.get("PFLLIB_DIR"), ROOT / ".pfllib" / "PFLlib"):
        if candidate and (Path(candidate) / "system" / "main.py").is_file():
            return Path(candidate)
    return None


def test_client_sizes_split_evenly():
    bench = _bench()
    assert bench.client_sizes(10, 3) == [4, 3, 3]
    assert bench.client_sizes(50_000, 1000) == [50] * 1000


def test_data_folder_is_pfllibs_format(tmp_path):
    """The generated folder reads back with pflbench's PFLlib reader: 4 clients, 42 / 8 samples
    split 11, 11, 10, 10 and 2 each, PFLlib's normalised float images in [-1, 1]."""
    from pflbench.data.pfllib import read_pfllib_folder

    root = _bench().write_folder(tmp_path, 4, 42, 8)
    folder = read_pfllib_folder(root)
    assert [len(s) for s in folder["train"]] == [11, 11, 10, 10]
    assert [len(s) for s in folder["test"]] == [2, 2, 2, 2]
    assert folder["x"].shape == (50, 3, 32, 32) and folder["x"].dtype == np.float32
    assert folder["x"].min() >= -1 and folder["x"].max() <= 1 and folder["num_classes"] == 10


def test_fedavg_cnn_has_pfllibs_parameter_shapes():
    """PFLlib's FedAvgCNN for Cifar10 (dim=1600): conv 3→32 and 32→64 (5×5), fc 1600→512, fc 512→10."""
    from pflbench.registry import MODELS, load_plugin_file, loaded_plugin_file

    plugin = ROOT / "benchmarks" / "fedavg_cnn.py"
    if loaded_plugin_file(plugin) is None:
        load_plugin_file(plugin)
    model = MODELS.get("fedavg_cnn")((3, 32, 32), 10)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    assert shapes == {
        "conv1.weight": (32, 3, 5, 5),
        "conv1.bias": (32,),
        "conv2.weight": (64, 32, 5, 5),
        "conv2.bias": (64,),
        "fc1.weight": (512, 1600),
        "fc1.bias": (512,),
        "fc.weight": (10, 512),
        "fc.bias": (10,),
    }
    assert sum(p.numel() for p in model.parameters()) == 2432 + 51264 + 819712 + 5130


def test_pflbench_side_runs(tmp_path, monkeypatch):
    monkeypatch.delenv("PFLLIB_DIR", raising=False)
    results = _bench().main([*TINY, "--repeats", "1", "--work", str(tmp_path), "--out", str(tmp_path / "out")])
    cases = results["cases"]
    assert [(c["clients"], c["algo"], c["sampled"]) for c in cases] == [(4, "fedavg", 2), (4, "fedper", 2)]
    for case in cases:
        assert "pfllib" not in case and "round_ratio" not in case
        run = case["pflbench"]
        assert case["samples_per_round"] == 21  # 2 of 4 clients, 10.5 samples each on average
        assert run["round_s"] > 0 and run["rss_peak_mb"] > 0 and run["samples_per_s"] == 21 / run["round_s"]
        assert len(case["runs"]["pflbench"][0]["rounds_s"]) == 3  # R + 2 rounds (the first dropped)
        # CPU seconds of round 2 (round 3 evaluates), read from /proc in 10 ms clock ticks: a
        # tiny 0.05 s round can fall between two ticks (CI saw 0.0), so only presence and sign hold
        assert run["round_cpu_s"] >= 0
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [c["algo"] for c in saved["cases"]] == ["fedavg", "fedper"]


@pytest.mark.skipif(_pfllib_tree() is None, reason="no PFLlib work tree (PFLLIB_DIR or .pfllib/PFLlib)")
def test_both_programs_run(tmp_path):
    tree = _pfllib_tree()
    arguments = [*TINY, "--repeats", "1", "--algos", "fedper", "--pfllib", str(tree), "--work", str(tmp_path)]
    (case,) = _bench().main(arguments)["cases"]
    assert case["pfllib"]["round_s"] > 0 and case["pflbench"]["round_s"] > 0
    assert len(case["runs"]["pfllib"][0]["rounds_s"]) == 2  # PFLlib's rounds 0 and 1
    assert case["round_ratio"] == case["pflbench"]["round_s"] / case["pfllib"]["round_s"]
