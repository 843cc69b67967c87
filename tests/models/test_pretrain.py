"""The public hold-out, the cached pretrained backbone, and how LoRA runs pick their defaults."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from pflbench.algorithms.fedavg import FedAvg
from pflbench.cli import cli
from pflbench.config.run_config import RunConfig, resolve
from pflbench.data.dataset import load_dataset
from pflbench.data.partition import make_partition
from pflbench.data.partitioners import partition, split_train_test
from pflbench.errors import ConfigError
from pflbench.runs.prepare import prepare
from pflbench.testing import Harness
from pflbench.util.seeding import rng_stream

TINY_VIT = ("depth=1", "embed_dim=16", "num_heads=2")
MODEL_ARGS = [*[arg for option in TINY_VIT for arg in ("--model-option", option)], "--pretrain-epochs", "2"]
TINY_RUN = ["--dataset", "digits", "--num-clients", "3", "--rounds", "1", "--quiet"]


def lora_config(tmp_path: Path, **changes) -> RunConfig:
    settings = dict(
        algo="fedavg",
        dataset="digits",
        model="vit_tiny_patch16_224",
        model_option=TINY_VIT,
        lora_rank=2,
        public_frac=0.2,
        pretrain_epochs=2,
        num_clients=3,
        rounds=1,
        out=str(tmp_path),
    )
    return RunConfig(**{**settings, **changes})


def test_public_fraction_goes_to_no_client_and_zero_changes_nothing() -> None:
    dataset = load_dataset("digits")
    base = RunConfig(num_clients=5, val_frac=0)  # train/test as split_train_test makes them
    plain, held = make_partition(base, dataset), make_partition(dataclasses.replace(base, public_frac=0.2), dataset)
    labels = dataset.labels.numpy()
    clients = partition("dirichlet", labels, 5, rng_stream(0, "partition"), alpha=0.5)
    train, test = split_train_test(labels, clients, 0.25, rng_stream(0, "split"))
    assert len(plain.public) == 0
    assert all(np.array_equal(a, b) for a, b in zip(plain.train + plain.test, train + test))
    clients = np.concatenate(held.train + held.test)
    assert len(np.intersect1d(clients, held.public)) == 0
    assert abs(len(held.public) - 0.2 * len(dataset.labels)) <= 10
    assert len(clients) + len(held.public) == len(dataset.labels)
    public_labels = np.bincount(dataset.labels.numpy()[held.public], minlength=10)
    assert public_labels.min() >= 30  # stratified: every class is represented
    assert held.stats["public_samples"] == len(held.public)


def test_lora_run_without_public_data_or_weights_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"random frozen backbone.*--public-frac.*--weights.*--backbone random"):
        prepare(lora_config(tmp_path, public_frac=0.0))


def test_backbone_is_pretrained_once_cached_and_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PFLBENCH_CACHE", str(tmp_path / "cache"))
    first = prepare(lora_config(tmp_path))
    backbone = first.resolved["backbone"]
    assert backbone["cache"] == "created" and backbone["head"] == "not in the file: freshly initialised"
    assert "pretrained on public fraction 0.2 of digits" in backbone["source"]
    assert 0.0 <= backbone["public_val_acc"] <= 1.0
    path = Path(backbone["source"].rsplit("cached at ", 1)[1])
    assert path.is_file()
    second = prepare(lora_config(tmp_path, algo="fedper"))
    assert second.resolved["backbone"]["cache"] == "hit"
    assert second.resolved["backbone"]["sha256"] == backbone["sha256"]
    saved = torch.load(path, weights_only=True)["state_dict"]
    assert "head.weight" not in saved and "blocks.0.attn.proj.weight" in saved
    proj = Harness(second).model.blocks[0].attn.proj
    assert torch.equal(proj.base.weight, saved["blocks.0.attn.proj.weight"])
    other = prepare(lora_config(tmp_path, pretrain_epochs=3)).resolved["backbone"]
    assert other["cache"] == "created" and other["sha256"] != backbone["sha256"]


def test_a_backbone_pretrained_on_other_public_data_is_refused(tmp_path: Path) -> None:
    path = Path(prepare(lora_config(tmp_path)).resolved["backbone"]["source"].rsplit("cached at ", 1)[1])
    with pytest.raises(ConfigError, match="would give that data to clients"):
        prepare(lora_config(tmp_path, weights=str(path), seed=1))
    assert prepare(lora_config(tmp_path, weights=str(path))).resolved["backbone"]["source"] == f"file:{path}"


def test_lora_run_defaults_fill_only_what_the_user_did_not_set() -> None:
    hparams = FedAvg.hyperparameters()
    config, applied = resolve(RunConfig(lr=0.05, lora_rank=4), FedAvg, hparams)
    assert config.model == applied["model"] == "vit_tiny_patch16_224"
    assert config.public_frac == 0.2 and config.lr == 0.05 and "lr" not in applied
    assert config.model_option == ("depth=6", "embed_dim=64", "num_heads=4")
    kept, applied = resolve(RunConfig(model="resnet18", lora_rank=4), FedAvg, hparams)
    assert kept.model_option == () and "model" not in applied and "model_option" not in applied
    plain, applied = resolve(RunConfig(), FedAvg, hparams)
    # the CNN's lr comes from its family's defaults (defaults.DEFAULTS_BY_FAMILY, issue 14 item 6)
    assert (plain.model, plain.lr, plain.optimizer, plain.public_frac) == ("cnn", 0.1, "sgd", 0.0)


def test_library_and_cli_resolve_a_lora_run_the_same_way(tmp_path: Path) -> None:
    """A library call with the same arguments as the CLI gets the same resolved config."""
    from pflbench.runs.prepare import prepare as prepare_run

    library = prepare_run(lora_config(tmp_path)).config
    assert library.model == "vit_tiny_patch16_224" and library.optimizer == "adam"


def test_cli_lora_run_uses_recorded_defaults_and_the_pretrain_command_shares_its_cache(tmp_path: Path) -> None:
    runner = CliRunner()
    pretrained = runner.invoke(cli, ["pretrain", "--dataset", "digits", *MODEL_ARGS])
    assert pretrained.exit_code == 0, pretrained.output
    assert "held-back accuracy" in pretrained.output and "weights: " in pretrained.output
    result = runner.invoke(
        cli, ["run", "--algo", "fedavg", "--lora-rank", "2", *TINY_RUN, *MODEL_ARGS, "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    assert "before fine-tuning: pers_acc" in result.output and "head not in the file" in result.output
    (folder,) = list((tmp_path / "runs").iterdir())
    config = json.loads((folder / "config.json").read_text())
    assert config["model"] == "vit_tiny_patch16_224" and config["public_frac"] == 0.2
    assert config["model_option"] == list(TINY_VIT)
    # --model-option was given: the user's options stay, the model comes from the LoRA defaults
    assert set(config["resolved"]["run_defaults"]) == {"model", "public_frac", "optimizer", "lr", "max_grad_norm"}
    assert config["resolved"]["backbone"]["cache"] == "hit"
    assert len(json.loads((folder / "partition.json").read_text())["public_indices"]) > 300
    summary = json.loads((folder / "summary.json").read_text())
    assert 0.0 <= summary["backbone_pers_acc"] <= 1.0


def test_cli_plain_run_is_untouched_by_lora_defaults(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["run", "--model", "mlp", *TINY_RUN, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    (folder,) = list((tmp_path / "runs").iterdir())
    config = json.loads((folder / "config.json").read_text())
    assert config["public_frac"] == 0.0 and config["optimizer"] == "sgd"
    assert set(config["resolved"]["run_defaults"]) == {"public_frac", "optimizer", "lr", "max_grad_norm"}
    assert config["resolved"]["backbone"]["source"] == "random init"


def test_a_scenario_s_backbones_built_two_at_a_time_are_the_ones_built_one_after_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``pretrain_backbones(..., jobs=2)`` builds each seed's backbone in its own process: the
    same cache files, byte for byte, as ``jobs=1``; a second call finds them cached."""
    from pflbench.config.reference import parse_scenario
    from pflbench.sweeps.reference import pretrain_backbones, scenario_base

    scenario = parse_scenario(
        {
            "run": {
                "dataset": "digits",
                "num_clients": 3,
                "rounds": 1,
                "model": "vit_tiny_patch16_224",
                "model_option": list(TINY_VIT),
                "public_frac": 0.2,
                "pretrain_epochs": 1,
                "threads": 1,
            },
            "protocol": {"algos": ["fedavg"], "seeds": [0, 1], "trials": 1},
            "algo_options": {"fedavg": {"lora_rank": 2}},
        },
        "tiny-lora",
    )
    files = {}
    for jobs in (1, 2):
        monkeypatch.setenv("PFLBENCH_CACHE", str(tmp_path / f"cache{jobs}"))
        lines: list[str] = []
        pretrain_backbones(scenario, scenario_base(scenario, tmp_path / "work"), ["fedavg"], lines.append, jobs)
        assert [line.split(":")[0] for line in lines] == [
            "backbone vit_tiny_patch16_224 seed 0",
            "backbone vit_tiny_patch16_224 seed 1",
        ]
        assert all("pretrained" in line for line in lines), lines
        built = sorted((tmp_path / f"cache{jobs}" / "backbones").glob("*.pt"))
        files[jobs] = {path.name: path.read_bytes() for path in built}
        again: list[str] = []
        pretrain_backbones(scenario, scenario_base(scenario, tmp_path / "work"), ["fedavg"], again.append, jobs)
        assert all("cached" in line for line in again), again
    assert len(files[1]) == 2 and files[1] == files[2]
