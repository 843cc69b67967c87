"""`--save-model` and `--log` wired into runs: files that reload into the run's models, trackers
fed by the run's own records."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from pflbench.cli import cli
from pflbench.config.identity import identity_settings
from pflbench.config.run_config import RunConfig
from pflbench.models.saving import load_run_models
from pflbench.models.zoo import build_model
from pflbench.runs.prepare import prepare

TINY = ["--dataset", "digits", "--model", "mlp", "--num-clients", "4", "--rounds", "3", "--lr", "0.05", "--quiet"]


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def run_folder(out: Path) -> Path:
    (folder,) = list((out / "runs").iterdir())
    return folder


@torch.no_grad()
def accuracy(state: dict[str, torch.Tensor], data, clients) -> float:
    model = build_model("mlp", data.input_shape, data.num_classes)
    model.load_state_dict(state, strict=True)
    model.eval()
    indices = torch.cat([data.test_indices[k] for k in clients])
    x, y = data.gather(indices)
    hits = (model(x).argmax(1) == y).sum()
    return float(hits.float() / len(indices))


def test_save_model_global_model_reproduces_the_final_global_acc(tmp_path: Path) -> None:
    code, output = invoke("run", "--algo", "fedavg", *TINY, "--save-model", "--out", str(tmp_path))
    assert code == 0, output
    folder = run_folder(tmp_path)
    assert f"models: {folder / 'models'}" in output
    summary = json.loads((folder / "summary.json").read_text())
    config = json.loads((folder / "config.json").read_text())
    assert config["save_model"] is True
    assert "save_model" not in config["identity"]  # not part of the run's identity
    from safetensors.torch import load_file

    global_state = load_file(str(folder / "models" / "global.safetensors"))
    _, clients, meta = load_run_models(folder)
    assert meta["algo"] == "fedavg" and meta["has_global_model"] and not clients
    assert meta["identity_hash"] == config["identity_hash"]
    # a fresh model with the saved global weights reproduces the run's final global_acc
    data = prepare(RunConfig(model="mlp", num_clients=4, rounds=3, lr=0.05, out=str(tmp_path / "x"))).data
    assert accuracy(global_state, data, range(4)) == pytest.approx(summary["global_acc"], abs=1e-6)


def test_save_model_private_states_rebuild_the_personal_models(tmp_path: Path) -> None:
    code, output = invoke("run", "--algo", "fedper", *TINY, "--save-model", "--out", str(tmp_path))
    assert code == 0, output
    folder = run_folder(tmp_path)
    global_state, clients, meta = load_run_models(folder)
    assert global_state is None and not meta["has_global_model"]  # FedPer: no global model
    from safetensors.torch import load_file

    shared = load_file(str(folder / "models" / meta["shared_file"]))
    assert sorted(clients) == [0, 1, 2, 3]
    assert set(clients[0]) == {"fc3.weight", "fc3.bias"}  # FedPer's private head
    assert "fc3.weight" not in shared and "fc1.weight" in shared
    data = prepare(
        RunConfig(algo="fedper", model="mlp", num_clients=4, rounds=3, lr=0.05, out=str(tmp_path / "x"))
    ).data
    per_client = (folder / "clients.csv").read_text().splitlines()
    header = per_client[0].split(",")
    for line in per_client[1:]:
        row = dict(zip(header, line.split(",")))
        k = int(row["client"])
        personal = {**shared, **clients[k]}
        assert accuracy(personal, data, [k]) == pytest.approx(float(row["pers_acc"]), abs=1e-6)


def test_save_model_torch_format_loads_weights_only(tmp_path: Path) -> None:
    from pflbench.models.saving import save_run_models
    from pflbench.runs.execute import execute
    from pflbench.runs.export import save_models

    prepared = prepare(
        RunConfig(algo="local", model="mlp", num_clients=3, rounds=1, lr=0.05, save_model=True, out=str(tmp_path))
    )
    execute(prepared)
    global_state, clients, meta = load_run_models(prepared.run_dir)
    assert global_state is None and not meta["has_global_model"] and sorted(clients) == [0, 1, 2]
    # the same states as .pt files: plain tensor dicts that torch.load(weights_only=True) reads
    save_run_models(tmp_path / "pt", None, clients, fmt="torch")
    loaded = torch.load(tmp_path / "pt" / "models" / "clients" / "0.pt", weights_only=True)
    assert all(torch.equal(loaded[n], clients[0][n]) for n in clients[0])
    assert save_models(prepared) == prepared.run_dir / "models"


def test_save_model_lora_run_exports_a_peft_adapter(tmp_path: Path) -> None:
    prepared = prepare(
        RunConfig(
            algo="fedavg",
            model="mlp",
            num_clients=3,
            rounds=2,
            lora_rank=4,
            lora_targets="fc1,fc2",
            backbone="random",
            public_frac=0.0,
            save_model=True,
            out=str(tmp_path),
        )
    )
    from pflbench.runs.execute import execute

    execute(prepared)
    models = prepared.run_dir / "models"
    adapter = json.loads((models / "peft_global" / "adapter_config.json").read_text())
    assert adapter["peft_type"] == "LORA" and adapter["r"] == 4
    assert (models / "base_model.safetensors").is_file()
    peft = pytest.importorskip("peft")
    from safetensors.torch import load_file

    global_state, _, _ = load_run_models(prepared.run_dir)
    ours = copy.deepcopy(prepared.executor.model).cpu()
    ours.load_state_dict(global_state)
    base = build_model("mlp", prepared.dataset.input_shape, prepared.dataset.num_classes)
    base.load_state_dict(load_file(str(models / "base_model.safetensors")))
    loaded = peft.PeftModel.from_pretrained(base, str(models / "peft_global"))
    x = torch.randn(5, *prepared.dataset.input_shape)
    ours.eval(), loaded.eval()
    with torch.no_grad():
        assert torch.allclose(loaded(x), ours(x), atol=1e-5)


def test_log_tensorboard_writes_the_round_metrics(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    code, output = invoke("run", "--algo", "fedavg", *TINY, "--log", "tensorboard", "--out", str(tmp_path))
    assert code == 0, output
    folder = run_folder(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    assert config["log"] == ["tensorboard"] and "log" not in config["identity"]
    events = EventAccumulator(str(folder / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    records = [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines()]
    for key in ("pers_acc", "global_acc", "train_loss", "bytes_up"):
        logged = [(e.step, e.value) for e in events.Scalars(key)]
        assert logged == [(r["round"], pytest.approx(r[key], rel=1e-6)) for r in records], key


def test_log_mlflow_logs_params_and_rounds(tmp_path: Path) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'store.db'}"
    code, output = invoke(
        "run",
        "--algo",
        "fedprox",
        "--mu",
        "0.1",
        *TINY,
        "--log",
        "mlflow",
        "--mlflow-uri",
        uri,
        "--out",
        str(tmp_path / "out"),
    )
    assert code == 0, output
    folder = run_folder(tmp_path / "out")
    client = MlflowClient(tracking_uri=uri)
    (found,) = client.search_runs([client.get_experiment_by_name("pflbench").experiment_id])
    assert found.info.run_name == folder.name and found.info.status == "FINISHED"
    assert found.data.params["algo_hparams.mu"] == "0.1" and float(found.data.params["lr"]) == 0.05
    records = [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines()]
    history = sorted((m.step, m.value) for m in client.get_metric_history(found.info.run_id, "pers_acc"))
    assert history == [(r["round"], pytest.approx(r["pers_acc"])) for r in records]


def test_bad_tracker_fails_before_any_work(tmp_path: Path) -> None:
    code, output = invoke("run", *TINY, "--log", "tensorbord", "--out", str(tmp_path))
    assert code == 2 and "--log 'tensorbord' is not a tracker; choose from mlflow, tensorboard, wandb" in output
    assert not (tmp_path / "runs").exists()


def test_save_model_and_log_are_not_part_of_the_identity() -> None:
    from pflbench.registry import ALGORITHMS

    algorithm = ALGORITHMS.get("fedavg")
    hparams = algorithm.hyperparameters()
    plain = RunConfig(model="mlp", lr=0.05, optimizer="sgd", public_frac=0.0, max_grad_norm=0.0)
    extra = RunConfig(
        model="mlp",
        lr=0.05,
        optimizer="sgd",
        public_frac=0.0,
        max_grad_norm=0.0,
        save_model=True,
        log=("tensorboard",),
        mlflow_uri="sqlite:///x.db",
    )
    assert identity_settings(plain, algorithm, hparams) == identity_settings(extra, algorithm, hparams)
