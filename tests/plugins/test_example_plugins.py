"""The example plugins in algorithms/ and datasets/ run through the CLI with --plugin and do what
their docstrings say: FedProx's term (μ = 0 is FedAvg), Ditto's two models (w stays FedAvg's,
clients are evaluated with v), FedAvgM's momentum (survives a SIGKILL and --resume, and would not
without ``checkpoint_attributes``), a generated dataset, and a partitioner driven by --alpha.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from pflbench.cli import cli
from pflbench.testing import killed_after_round

ROOT = Path(__file__).resolve().parents[2]
PROX = ROOT / "algorithms" / "example_loss_term.py"
TWO_MODELS = ROOT / "algorithms" / "example_two_models.py"
MOMENTUM = ROOT / "algorithms" / "example_server_state.py"
BLOBS = ROOT / "datasets" / "example_dataset.py"
QUANTITY = ROOT / "datasets" / "example_partitioner.py"
TINY = ["--dataset", "digits", "--model", "mlp", "--num-clients", "3", "--rounds", "2", "--quiet"]
TIMING = {"round_time_s", "eval_time_s", "peak_mem_mb", "wall_time_s", "run_dir", "round_time_s_mean"}
TIMING |= {"checkpoints_written", "checkpoint_time_s"}


def invoke(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result.exit_code, result.output


def run(out: Path, *args: object) -> Path:
    """``pflbench run ARGS --out OUT``; the run's folder."""
    code, output = invoke("run", *args, "--out", out)
    assert code == 0, output
    return Path(output.strip().splitlines()[-1].removeprefix("results: "))


def rounds(folder: Path) -> list[dict]:
    records = [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in records]


def read(folder: Path, name: str) -> dict:
    return json.loads((folder / name).read_text())


@pytest.fixture(scope="module")
def fedavg(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return rounds(run(tmp_path_factory.mktemp("fedavg"), "--algo", "fedavg", *TINY))


def test_every_example_loads_and_is_listed() -> None:
    code, output = invoke(
        "list", *[a for path in (PROX, TWO_MODELS, MOMENTUM, BLOBS, QUANTITY) for a in ("--plugin", path)]
    )
    assert code == 0, output
    for name in ("example_prox", "example_two_models", "example_server_momentum", "example_blobs"):
        assert name in output
    assert "quantity-skew-example" in output


def test_loss_term_example_is_fedavg_at_mu_zero_and_pulls_towards_the_global_model(tmp_path, fedavg) -> None:
    def prox(mu: str) -> list[dict]:
        return rounds(run(tmp_path, "--plugin", PROX, "--algo", "example_prox", "--prox-mu", mu, *TINY))

    zero = prox("0")
    assert [{k: v for k, v in r.items() if not k.startswith("loss_")} for r in zero] == fedavg  # bit for bit
    weak, strong = prox("0.01"), prox("1")
    for record in weak + strong:
        assert record["loss_proximal"] > 0 and math.isfinite(record["loss_proximal"])
        assert math.isclose(record["loss_task"] + record["loss_proximal"], record["train_loss"], rel_tol=1e-5)
    # (μ/2)·‖w − w^t‖² / μ: a stronger pull keeps the local models nearer the global one (round 1:
    # same start)
    assert strong[0]["loss_proximal"] / 1 < weak[0]["loss_proximal"] / 0.01
    assert [r["global_acc"] for r in strong] != [r["global_acc"] for r in fedavg]
    # loss_terms is pure in params: the vectorized executor runs it (torch.func.vmap) to the same numbers
    vectorized = rounds(
        run(tmp_path, "--plugin", PROX, "--algo", "example_prox", "--prox-mu", "1", *TINY, "--executor", "vmap")
    )
    for v, s in zip(vectorized, strong):
        assert math.isclose(v["loss_proximal"], s["loss_proximal"], rel_tol=1e-4) and math.isclose(
            v["pers_acc"], s["pers_acc"], abs_tol=0.01
        )


def test_two_models_example_keeps_fedavg_global_model_and_evaluates_the_personal_one(tmp_path, fedavg) -> None:
    folder = run(tmp_path, "--plugin", TWO_MODELS, "--algo", "example_two_models", "--pull", "0.1", *TINY)
    records = rounds(folder)
    # w is trained, uploaded and averaged exactly as in FedAvg; v never travels
    for key in ("global_acc", "bytes_up", "bytes_down"):
        assert [r[key] for r in records] == [r[key] for r in fedavg], key
    assert [r["loss_task"] for r in records] == [r["train_loss"] for r in fedavg]
    # clients are evaluated with v, trained on f_k(v) + (λ/2)·‖v − w^t‖²
    # (pers_acc_weighted of the global model would equal global_acc up to float32 rounding)
    assert all(abs(r["pers_acc_weighted"] - r["global_acc"]) > 1e-4 for r in records)
    assert all(r["loss_personal_pull"] > 0 and math.isfinite(r["loss_personal_task"]) for r in records)
    assert read(folder, "config.json")["resolved"]["private_parameters"] == 0  # v is extra state, not model


def killed_and_resumed(plugin: Path, algo: str, out: Path) -> Path:
    args = ["--plugin", plugin, "--algo", algo, *TINY, "--rounds", "4", "--checkpoint-every", "2", "--out", out]
    killed_after_round(3, lambda: invoke("run", *args))  # `pflbench run ARGS` in a forked child
    (work,) = (out / "runs").glob(".tmp-*")  # the unfinished run: 3 rounds logged, checkpoint at 2
    assert len((work / "rounds.jsonl").read_text().splitlines()) == 3
    return run(out, *args[:-2], "--resume")


def close(a: dict, b: dict) -> bool:
    return all(math.isclose(a[k], b[k], rel_tol=1e-4, abs_tol=1e-4) for k in ("train_loss", "pers_acc", "global_acc"))


def test_server_state_example_is_fedavg_with_server_momentum(tmp_path, fedavg) -> None:
    def momentum(beta: str) -> list[dict]:
        args = ["--plugin", MOMENTUM, "--algo", "example_server_momentum", "--server-momentum", beta, *TINY]
        return rounds(run(tmp_path, *args))

    no_momentum, heavy = momentum("0"), momentum("0.9")
    assert all(close(r, f) for r, f in zip(no_momentum, fedavg))  # β = 0, η = 1: w ← w̄ (up to rounding)
    # v¹ = Δ¹, so round 1 is FedAvg's and round 2's clients start from FedAvg's w¹; its server
    # step w² = w¹ − (β·v¹ + Δ²) is not FedAvg's
    assert close(heavy[0], fedavg[0]) and math.isclose(heavy[1]["train_loss"], fedavg[1]["train_loss"], rel_tol=1e-4)
    assert heavy[1]["global_acc"] != fedavg[1]["global_acc"]
    assert all(r["server_velocity_norm"] > 0 for r in no_momentum + heavy)


def test_server_state_example_resumes_exactly_after_a_kill(tmp_path) -> None:
    args = ["--plugin", MOMENTUM, "--algo", "example_server_momentum", "--server-momentum", "0.9", *TINY]
    whole = run(tmp_path / "whole", *args, "--rounds", "4")
    records = rounds(whole)
    assert all(math.isfinite(r["train_loss"]) for r in records)
    resumed = killed_and_resumed(MOMENTUM, "example_server_momentum", tmp_path / "resumed")
    assert rounds(resumed) == records
    assert {k: v for k, v in read(resumed, "summary.json").items() if k not in TIMING} == {
        k: v for k, v in read(whole, "summary.json").items() if k not in TIMING
    }
    # the same plugin without checkpoint_attributes: the engine sees `velocity` change, writes no
    # checkpoint (a resume would restart v at 0 after round 2) and the resume starts the run over
    text, declared = MOMENTUM.read_text(), '\n    checkpoint_attributes = ("velocity",)'
    assert text.count(declared) == 1
    forgetful = tmp_path / "forgetful.py"
    forgetful.write_text(
        text.replace(declared, "\n    checkpoint_attributes = ()").replace(
            '"example_server_momentum"', '"example_forgetful_momentum"'
        )
    )
    lost = rounds(killed_and_resumed(forgetful, "example_forgetful_momentum", tmp_path / "lost"))
    assert lost == records


def test_server_state_example_refuses_a_bad_momentum(tmp_path) -> None:
    bad = ["--plugin", MOMENTUM, "--algo", "example_server_momentum", "--server-momentum", "1"]
    code, output = invoke("run", *bad, *TINY, "--out", tmp_path)
    assert code == 2 and "--server-momentum must be in [0, 1)" in output


def test_dataset_example_is_what_its_options_say(tmp_path) -> None:
    options = ["--dataset-option", "num_samples=600", "--dataset-option", "num_classes=3", "--dataset-option", "dim=5"]
    folder = run(tmp_path, "--plugin", BLOBS, "--dataset", "example_blobs", *options, *TINY[2:])
    resolved = read(folder, "config.json")["resolved"]
    assert (resolved["dataset_size"], resolved["num_classes"], resolved["input_shape"]) == (600, 3, [5])
    histogram = read(folder, "partition.json")["stats"]["label_histogram"]
    assert [sum(column) for column in zip(*histogram)] == [200, 200, 200]  # balanced classes, all used
    summary = read(folder, "summary.json")
    assert summary["pers_acc"] > 0.6  # well-separated blobs; chance is 1/3
    code, output = invoke(
        "run", "--plugin", BLOBS, "--dataset", "example_blobs", "--dataset-option", "num_classes=1", "--out", tmp_path
    )
    assert code == 2 and "example_blobs needs num_classes ≥ 2" in output


def test_partitioner_example_follows_alpha(tmp_path) -> None:
    def partition(alpha: str) -> dict:
        args = ["--plugin", QUANTITY, "--partition", "quantity-skew-example", "--alpha", alpha, "--algo", "fedavg"]
        folder = run(tmp_path, *args, *TINY, "--num-clients", "5", "--rounds", "1")
        return read(folder, "partition.json")

    skewed, even = partition("0.2"), partition("100")
    assert skewed["train_indices"] != even["train_indices"]  # two runs (alpha is part of their identity)
    assert len(list((tmp_path / "runs").iterdir())) == 2
    for stats in (skewed["stats"], even["stats"]):
        assert sum(stats["samples_per_client"]) == 1797 and stats["samples_min"] >= 10  # digits, --min-size
    assert skewed["stats"]["samples_std"] > 3 * even["stats"]["samples_std"]  # quantity skew follows α
    assert even["stats"]["classes_per_client"] == [10] * 5  # labels are IID
    too_many = ["--plugin", QUANTITY, "--partition", "quantity-skew-example", "--num-clients", "200"]
    code, output = invoke("run", *too_many, *TINY[:4], "--out", tmp_path)  # 200 × --min-size 10 > 1797
    assert code == 2 and "needs 2000 samples" in output
