"""``pflbench.load_model``: a saved model used alone reproduces the run's per-client accuracy.

Each case trains a tiny run with ``--save-model``, copies only its ``models/`` folder elsewhere and
scores every client with ``load_model(copy, client=k)`` on the dataset's raw test samples of that
client (indices from ``partition.json``): the accuracy equals ``clients.csv``'s ``pers_acc``
exactly. The cases cover a global-model method, body + own head (FedPer), a second personal model
(Ditto), a test-time adaptation (Per-FedAvg), everything local, and LoRA (FedAvg + LoRA, FedSDG's
gated private adapters).
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import torch

import pflbench
from pflbench.config.run_config import RunConfig
from pflbench.data.dataset import load_dataset
from pflbench.errors import ConfigError
from pflbench.models.preprocessing import InputTransform
from pflbench.runs.api import run_experiment
from pflbench.runs.prepare import prepare

LORA = dict(lora_targets="fc1,fc2", backbone="random", public_frac=0.0)
CASES = {
    "fedavg": dict(algo="fedavg"),
    "fedper": dict(algo="fedper"),
    "ditto": dict(algo="ditto"),
    "perfedavg": dict(algo="perfedavg"),
    "local": dict(algo="local"),
    "fedavg_lora": dict(algo="fedavg", lora_rank=4, **LORA),
    "fedsdg": dict(algo="fedsdg", **LORA),
    "fedper_new_clients": dict(algo="fedper", new_clients=0.34),  # a held-out client: its new_acc model
    "fedavg_new_clients": dict(algo="fedavg", new_clients=0.34, finetune_epochs=0),
}


def settings(out: Path, **extra) -> RunConfig:
    values = dict(dataset="digits", model="mlp", num_clients=3, rounds=2, lr=0.05, out=str(out), save_model=True)
    return RunConfig(**{**values, **extra})


def saved_run(tmp_path: Path, **extra) -> tuple[Path, Path, dict]:
    """(run folder, a copy of its models/ folder alone, summary)."""
    summary = run_experiment(settings(tmp_path / "out", **extra))
    (run_dir,) = (tmp_path / "out" / "runs").iterdir()
    alone = tmp_path / "elsewhere" / "models"
    shutil.copytree(run_dir / "models", alone)
    return run_dir, alone, summary


@pytest.mark.parametrize("case", list(CASES))
def test_saved_models_alone_reproduce_clients_csv(case: str, tmp_path: Path) -> None:
    run_dir, alone, summary = saved_run(tmp_path, **CASES[case])
    raw = load_dataset("digits")  # the raw uint8 images, as anyone would load them
    test_indices = json.loads((run_dir / "partition.json").read_text())["test_indices"]
    rows = list(csv.DictReader((run_dir / "clients.csv").open()))
    assert len(rows) == 3
    for row in rows:
        k = int(row["client"])
        model, transform = pflbench.load_model(alone, client=k)
        assert not model.training
        indices = torch.tensor(test_indices[k])
        with torch.no_grad():
            predicted = model(transform(raw.inputs[indices])).argmax(dim=1)
        hits = int((predicted == raw.labels[indices]).sum())
        column = "new_acc" if row.get("new_client") == "1" else "pers_acc"
        assert hits / len(indices) == float(row[column]), f"client {k} ({column})"
    if "new_clients" in CASES[case]:
        assert sum(row["new_client"] == "1" for row in rows) == 1
    if summary["global_acc"] is not None:  # the global model on the union of the training clients' test splits
        loaded = pflbench.load_model(alone)
        training = [int(row["client"]) for row in rows if row.get("new_client") != "1"]
        indices = torch.tensor([i for k in training for i in test_indices[k]])
        hits = (loaded.predict(raw.inputs[indices]) == raw.labels[indices]).sum().float()
        assert float(hits / len(indices)) == summary["global_acc"]
    else:
        with pytest.raises(ConfigError, match=f"'{CASES[case]['algo']}' has no global model; pass client=K"):
            pflbench.load_model(alone)


def test_which_tensors_are_per_client_is_recorded(tmp_path: Path) -> None:
    _, alone, _ = saved_run(tmp_path, algo="fedper")
    meta = json.loads((alone / "meta.json").read_text())["meta"]
    # FedPer: the shared body + each client's own head, which is exactly its stored private state
    assert meta["personal_base"] == "shared.safetensors"
    assert meta["personal"] == {str(k): f"clients/{k}.safetensors" for k in range(3)}
    assert not (alone / "personal").exists()
    assert meta["build"]["config"]["algo"] == "fedper" and meta["build"]["algo_hparams"] == {}
    assert meta["inputs"]["kind"] == "image" and meta["inputs"]["input_shape"] == [1, 8, 8]
    assert meta["inputs"]["input_dtype"] == "uint8" and meta["inputs"]["scale"] == "1/255"

    _, alone, _ = saved_run(tmp_path / "ditto", algo="ditto")
    meta = json.loads((alone / "meta.json").read_text())["meta"]
    # Ditto: the personal model is its own full model, written beside the training state
    assert meta["personal_base"] == "global.safetensors"
    assert meta["personal"] == {str(k): f"personal/{k}.safetensors" for k in range(3)}

    _, alone, _ = saved_run(tmp_path / "fedavg", algo="fedavg")
    meta = json.loads((alone / "meta.json").read_text())["meta"]
    assert meta["personal"] == {"0": None, "1": None, "2": None}  # every client: the global model


def test_the_transform_is_what_the_run_applied_bit_for_bit(tmp_path: Path) -> None:
    prepared = prepare(settings(tmp_path, algo="fedavg"))
    from pflbench.models.preprocessing import input_transform

    transform = InputTransform.from_json(
        json.loads(json.dumps(input_transform(prepared.data, prepared.dataset).to_json()))
    )
    indices = torch.arange(0, len(prepared.dataset.labels), 7)
    expected, _ = prepared.data.gather(indices)
    assert torch.equal(transform(prepared.dataset.inputs[indices]), expected)


def test_input_transform_by_hand() -> None:
    images = InputTransform(
        "image", (1, 1, 2), "uint8", torch.tensor([0.5]).view(1, 1, 1, 1), torch.tensor([0.25]).view(1, 1, 1, 1)
    )
    raw = torch.tensor([[[[0, 255]]]], dtype=torch.uint8)
    assert images(raw).tolist() == [[[[-2.0, 2.0]]]]  # (0/255 − 0.5)/0.25, (255/255 − 0.5)/0.25
    with pytest.raises(ValueError, match="integers 0-255"):
        images(raw.float() / 255)
    with pytest.raises(ValueError, match=r"shape \[N, 1, 1, 2\]"):
        images(torch.zeros(1, 2, 1, dtype=torch.uint8))
    features = InputTransform("features", (2,), "float32", torch.tensor([[1.0, 2.0]]), torch.tensor([[2.0, 4.0]]))
    assert features(torch.tensor([[3.0, 10.0]], dtype=torch.float64)).tolist() == [[1.0, 2.0]]
    tokens = InputTransform("tokens", (3,), "uint8", torch.zeros(1, 3), torch.ones(1, 3), classes=("a", "b"))
    assert tokens(torch.tensor([[0, 1, 300]])).tolist() == [[0.0, 1.0, 300.0]] and tokens.num_classes == 2
    again = InputTransform.from_json(json.loads(json.dumps(images.to_json())))
    assert torch.equal(again.mean, images.mean) and again.input_shape == (1, 1, 2) and again.classes is None


def test_load_model_errors_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no saved models in .*was the run made with --save-model"):
        pflbench.load_model(tmp_path)
    _, alone, _ = saved_run(tmp_path, algo="fedper")
    with pytest.raises(ConfigError, match=r"client=7 is not a client of this run; choose from 0\.\.2"):
        pflbench.load_model(alone, client=7)
    record = json.loads((alone / "meta.json").read_text())
    del record["meta"]["inputs"], record["meta"]["build"], record["meta"]["personal"]
    (alone / "meta.json").write_text(json.dumps(record))
    with pytest.raises(ConfigError, match="older pflbench"):
        pflbench.load_model(alone, client=0)
