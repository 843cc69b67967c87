"""Validation metrics (``--val-frac``) and new clients (``--new-clients``) in the round loop:
the recorded numbers equal a recomputation by hand from per-client counts, new clients are never
sampled nor counted in the training clients' metrics, and each is served by its algorithm's
adaptation."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from pflbench.config.run_config import RunConfig
from pflbench.engine import load_into, personalize
from pflbench.engine.metrics import NEW_CLIENT_METRICS, VAL_METRICS
from pflbench.runs.execute import execute
from pflbench.runs.prepare import prepare
from pflbench.util.seeding import derive_seed


def tiny(algo: str, out: Path, **kwargs) -> RunConfig:
    settings = {"num_clients": 6, "rounds": 2, "lr": 0.05, "model": "mlp", **kwargs}
    return RunConfig(algo=algo, dataset="digits", alpha=0.3, out=str(out), **settings)


def run(config: RunConfig, algo_options: dict | None = None):
    prepared = prepare(config, algo_options)
    records: list[dict] = []
    summary = execute(prepared, on_round=records.append)
    return prepared, records, summary


@torch.no_grad()
def counted_by_hand(prepared, state, clients, split: str) -> np.ndarray:
    """Correct predictions of the model ``state`` on each client's ``split`` split, counted directly."""
    model, data = prepared.executor.model, prepared.data
    load_into(prepared.executor.tensors, state)
    model.eval()
    correct = []
    for k in clients:
        inputs, targets = data.gather((data.val_indices if split == "val" else data.test_indices)[k])
        correct.append(int((model(inputs).argmax(dim=1) == targets).sum()))
    return np.array(correct)


def by_hand(correct: np.ndarray, sizes: np.ndarray) -> dict[str, float]:
    """mean, weighted, population std and worst-10% mean of the per-client accuracies."""
    accuracy = correct / sizes
    worst = np.sort(accuracy)[: max(1, math.ceil(0.1 * len(accuracy)))]
    return {
        "": accuracy.mean(),
        "_weighted": correct.sum() / sizes.sum(),
        "_std": accuracy.std(),
        "_worst10": worst.mean(),
    }


@pytest.mark.parametrize("algo", ["fedavg", "fedper", "local", "fedbabu"])
def test_validation_metrics_equal_a_recomputation_by_hand(algo: str, tmp_path: Path) -> None:
    """The evaluation paths: one shared model (FedAvg), the body once and each client's head
    (FedPer), a whole model per client (Local), a test-time personalization (FedBABU)."""
    prepared, records, summary = run(tiny(algo, tmp_path, val_frac=0.2), {"ft_epochs": 1} if algo == "fedbabu" else {})
    algorithm, data = prepared.algorithm, prepared.data
    clients = range(6)
    states = [algorithm.personal_model(k) for k in clients]
    if algo == "fedbabu":  # each client's fine-tuned model, as the last evaluation made it
        seeds = [derive_seed(prepared.config.seed, "personalize", 2, k) for k in clients]
        states = personalize(prepared.executor, algorithm.personalization_program(), states, list(clients), seeds, 2)
    val = np.concatenate([counted_by_hand(prepared, state, [k], "val") for k, state in zip(clients, states)])
    test = np.concatenate([counted_by_hand(prepared, state, [k], "test") for k, state in zip(clients, states)])
    final = records[-1]
    for suffix, value in by_hand(val, np.array(data.num_val)).items():
        assert final[f"val_pers_acc{suffix}"] == pytest.approx(value, abs=1e-12)
        assert summary[f"val_pers_acc{suffix}"] == final[f"val_pers_acc{suffix}"]
    assert final["pers_acc"] == pytest.approx(by_hand(test, np.array(data.num_test))[""], abs=1e-12)
    assert all(key in records[0] for key in VAL_METRICS) and "val_pers_acc_last10" in summary
    if algo == "fedavg":  # the global model on the union of the validation splits
        assert final["val_global_acc"] == pytest.approx(val.sum() / sum(data.num_val), rel=1e-6)
    elif not algorithm.has_global_model:
        assert final["val_global_acc"] is None
    with open(Path(summary["run_dir"]) / "clients.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r["val_samples"]) for r in rows] == data.num_val
    np.testing.assert_allclose([float(r["val_pers_acc"]) for r in rows], val / np.array(data.num_val))


def test_without_validation_there_are_no_validation_numbers(tmp_path: Path) -> None:
    prepared, records, summary = run(tiny("fedper", tmp_path, val_frac=0.0))
    assert not any(key.startswith("val_") for record in records for key in record)
    assert not any(key.startswith("val_") for key in summary)
    header = (Path(summary["run_dir"]) / "clients.csv").read_text().splitlines()[0]
    assert header == "client,train_samples,test_samples,classes,pers_acc"
    partition = json.loads((Path(summary["run_dir"]) / "partition.json").read_text())
    assert (
        "val_indices" not in partition
        and "val_frac" in json.loads((Path(summary["run_dir"]) / "config.json").read_text())["identity"]
    )


def test_new_clients_are_never_sampled_and_fedavg_serves_them_its_global_model(tmp_path: Path) -> None:
    config = tiny("fedavg", tmp_path, rounds=4, frac=0.5, new_clients=0.34, val_frac=0.0)
    prepared, records, summary = run(config)
    new = prepared.partition.new_clients
    training = [k for k in range(6) if k not in new]
    assert len(new) == 2 and config.sampled_per_round == 2  # M = round(4 training clients · 0.5)
    assert all(len(r["clients"]) == 2 and set(r["clients"]) <= set(training) for r in records)
    assert set().union(*(r["clients"] for r in records)) <= set(training)
    model = prepared.algorithm.global_model()
    new_correct = counted_by_hand(prepared, model, new, "test")
    sizes = np.array(prepared.data.num_test)
    for suffix, value in by_hand(new_correct, sizes[new]).items():
        assert records[-1][f"new_acc{suffix}"] == pytest.approx(value, abs=1e-12)
    # pers_acc and global_acc count only the training clients
    trained_correct = counted_by_hand(prepared, model, training, "test")
    assert records[-1]["pers_acc"] == pytest.approx(by_hand(trained_correct, sizes[training])[""], abs=1e-12)
    assert records[-1]["global_acc"] == pytest.approx(trained_correct.sum() / sizes[training].sum(), rel=1e-6)
    assert all(key in r for r in records for key in NEW_CLIENT_METRICS)  # every evaluation round
    assert summary["new_acc"] == records[-1]["new_acc"] and "new_acc_last10" in summary
    with open(Path(summary["run_dir"]) / "clients.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r["new_client"]) for r in rows] == [int(k in new) for k in range(6)]
    assert all((r["pers_acc"] == "") == (r["new_acc"] != "") for r in rows)
    identity = json.loads((Path(summary["run_dir"]) / "config.json").read_text())["identity"]
    assert identity["new_clients"] == 0.34


def test_a_fedper_new_client_trains_only_a_fresh_head(tmp_path: Path) -> None:
    prepared, records, _ = run(tiny("fedper", tmp_path, new_clients=0.2, val_frac=0.0))
    algorithm, executor = prepared.algorithm, prepared.executor
    (k,) = prepared.partition.new_clients
    start = algorithm.new_client_model(k)
    head = set(algorithm.layout.private)
    for name in head:  # a fresh head: the initial one, whatever the training clients learned
        assert torch.equal(start[name], algorithm.store.initial[name])
    program = algorithm.new_client_program()
    assert program.names == frozenset(head) and program.epochs == prepared.config.local_epochs
    seed = derive_seed(prepared.config.seed, "adapt_new", 2, k)
    (served,) = personalize(executor, program, [start], [k], [seed], 2)
    for name in algorithm.layout.shared:
        assert torch.equal(served[name], algorithm.global_state[name]), name  # the body is frozen
    assert any(not torch.equal(served[name], start[name]) for name in head)
    correct = counted_by_hand(prepared, served, [k], "test")
    assert records[-1]["new_acc"] == correct[0] / prepared.data.num_test[k]


def test_fedrep_adapts_a_new_clients_head_for_its_head_epochs(tmp_path: Path) -> None:
    prepared = prepare(tiny("fedrep", tmp_path, new_clients=0.2), {"head_epochs": 3})
    assert prepared.algorithm.new_client_program().epochs == 3


def test_personalization_runs_once_and_is_evaluated_on_both_splits(tmp_path: Path) -> None:
    """FedBABU fine-tunes each training client once per evaluation (not once per split), and each
    new client once; --finetune-epochs adds new_acc_ft for the new clients."""
    config = tiny("fedbabu", tmp_path, rounds=1, new_clients=0.34, finetune_epochs=1)
    prepared = prepare(config, {"ft_epochs": 1})
    trained: list[int] = []
    train = prepared.executor.train

    def counting(program, jobs):
        trained.extend(job.client_id for job in jobs)
        return train(program, jobs)

    prepared.executor.train = counting
    records: list[dict] = []
    execute(prepared, on_round=records.append)
    new = prepared.partition.new_clients
    training = [k for k in range(6) if k not in new]
    # (local training goes through train_iter) FedBABU's fine-tuning of the training clients, the
    # new clients' (its personalization), then --finetune-epochs of the training and the new clients
    assert trained == training + new + training + new
    assert {"val_pers_acc", "new_acc", "pers_acc_ft", "new_acc_ft"} <= set(records[0])


def test_vmap_gives_the_sequential_numbers_with_validation_and_new_clients(tmp_path: Path) -> None:
    numbers = {}
    for executor in ("sequential", "vmap"):
        _, records, _ = run(tiny("fedper", tmp_path / executor, new_clients=0.2, executor=executor))
        numbers[executor] = records[-1]
    for key in (*VAL_METRICS[:4], "pers_acc", *NEW_CLIENT_METRICS):
        assert numbers["vmap"][key] == pytest.approx(numbers["sequential"][key], abs=1e-6), key
