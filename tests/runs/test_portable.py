"""--portable: shared results name no local absolute path."""

from __future__ import annotations

import json
from pathlib import Path

from pflbench.config.identity import identity_settings
from pflbench.config.run_config import RunConfig, resolve
from pflbench.registry import ALGORITHMS
from pflbench.runs.api import run_experiment
from pflbench.store.writer import without_local_paths


def test_absolute_paths_become_local_names_and_nothing_else_changes() -> None:
    record = {
        "out": "/home/alice/exp",
        "command": ["pflbench", "--data-dir", "/srv/data/cifar/"],
        "source": "pretrained, cached at /root/.cache/pflbench/backbones/b.pt",
        "rel": "results/runs",
        "url": "https://example.org/a/b",
        "n": 3,
        "ratio": 0.5,
    }
    cleaned = without_local_paths(record)
    assert cleaned["out"] == "<local>/exp" and cleaned["command"][2] == "<local>/cifar"
    assert cleaned["source"] == "pretrained, cached at <local>/b.pt"
    assert cleaned["rel"] == "results/runs" and cleaned["url"] == record["url"] and cleaned["n"] == 3


def test_a_portable_run_writes_no_absolute_path_and_keeps_its_identity(tmp_path: Path) -> None:
    settings = dict(dataset="digits", model="mlp", num_clients=3, rounds=1, out=str(tmp_path))
    run_experiment(RunConfig(**settings, portable=True))
    (folder,) = (tmp_path / "runs").iterdir()
    for name in ("config.json", "summary.json"):
        text = (folder / name).read_text()
        assert str(tmp_path) not in text and "<local>/" in text, name
    config = json.loads((folder / "config.json").read_text())
    fedavg = ALGORITHMS.get("fedavg")
    resolved, _ = resolve(RunConfig(**settings, portable=True), fedavg, fedavg.hyperparameters())
    assert "portable" not in identity_settings(resolved, fedavg, fedavg.hyperparameters())
    assert config["portable"] is True
