"""benchmarks/bench_batched.py at a tiny size on the CPU (the plumbing of the GPU script
``gpu_batched.sh``, not a timing): vmap equals sequential to float tolerance on clients of
unequal step counts, and the micro cases train the same numbers as the sequential executor."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_batched.py"
TINY = ["--clients", "8", "--train-samples", "160", "--test-samples", "16", "--join-ratio", "0.5"]
TINY += ["--data-jobs", "1", "--micro-repeats", "1", "--check-clients", "6", "--rounds", "1"]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_batched", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_batched", module)
    spec.loader.exec_module(module)
    return module


def test_check_and_micro_agree_with_the_sequential_executor(tmp_path):
    results = _bench().main([*TINY, "--parts", "check,micro", "--work", str(tmp_path), "--out", str(tmp_path / "o")])
    check, fedper = results["check"]  # fedavg, fedper (private heads)
    assert fedper["algo"] == "fedper" and fedper["private_max_abs_diff"] < 1e-5
    assert check["clients"] == 6 and check["steps_min_max"] == [1, 12]  # sizes 1, 2, 10, 11, 12, 120
    assert check["upload_max_abs_diff"] < 1e-5 and check["loss_max_abs_diff"] < 1e-5
    (micro,) = results["micro"]
    assert micro["clients"] == 4 and micro["steps"] == 8  # 20 samples each, batch 10
    names = {"sequential_executor", "vmap_executor", "eager_loop", "vmap_loop"}
    assert names <= set(micro) and not any("error" in micro[n] for n in names)
    assert micro["eager_loop"]["max_abs_diff_vs_sequential"] == 0  # torch.optim.SGD's arithmetic, on a CPU
    assert all(micro[n]["max_abs_diff_vs_sequential"] < 1e-5 for n in names)
    saved = json.loads((tmp_path / "o" / "results.json").read_text())
    assert saved["micro"][0]["clients"] == 4 and (tmp_path / "o" / "results.txt").read_text()


def test_runs_alternate_the_executors(tmp_path, monkeypatch):
    monkeypatch.delenv("PFLLIB_DIR", raising=False)
    results = _bench().main([*TINY, "--parts", "runs", "--work", str(tmp_path)])
    (case,) = results["cases"]
    assert case["sequential"]["round_s"] > 0 and case["vmap"]["round_s"] > 0
    assert "vmap_speedup_vs_sequential" in case


def test_bad_part_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        _bench().parse(["--parts", "micro,graphs"])
    assert exit_.value.code == 2 and "--parts: unknown 'graphs'; valid: check, micro, runs" in capsys.readouterr().err
