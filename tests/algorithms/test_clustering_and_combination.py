"""IFCA (clustering), FedFomo, FedAMP and FedAS (dynamic model combination): each defining formula
against hand-computed values, the wiring of what travels, checkpoint/resume and the Ray executor."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from pflbench.algorithms.fedamp import (
    CLOUD,
    FedAMP,
    FedAMPHyperparameters,
    attention_coefficients,
    attention_derivative,
    cloud_model,
    default_sigma,
    self_weight_floor,
)
from pflbench.algorithms.fedas import (
    FISHER,
    FedAS,
    FedASHyperparameters,
    alignment_loss,
    class_prototypes,
    fisher_weights,
)
from pflbench.algorithms.fedfomo import (
    WEIGHT,
    FedFomo,
    FedFomoHyperparameters,
    choose_downloads,
    download_prefix,
    fomo_epsilon,
    fomo_update,
    fomo_weights,
)
from pflbench.algorithms.ifca import (
    CHOSEN,
    IFCA,
    IFCAHyperparameters,
    adjusted_rand_index,
    cluster_average,
    cluster_prefix,
    select_cluster,
)
from pflbench.config.run_config import RunConfig
from pflbench.engine import ClientUpdate
from pflbench.errors import ConfigError
from pflbench.models.zoo import MLP
from pflbench.runs.api import run_experiment
from pflbench.runs.prepare import prepare
from pflbench.testing import RESOLVED, Harness, tiny_model

ALGOS = ("ifca", "fedfomo", "fedamp", "fedas")


def tiny_run(algo: str, out: Path, **settings) -> RunConfig:
    values = dict(
        algo=algo,
        dataset="digits",
        model="mlp",
        num_clients=4,
        rounds=2,
        alpha=0.5,
        optimizer="adam",
        lr=0.01,
        out=str(out),
        backbone="random",
    )
    return RunConfig(**{**values, **settings})


def run_folder(out: Path) -> Path:
    (folder,) = [p for p in (out / "runs").iterdir() if p.is_dir() and not p.name.startswith(".")]
    return folder


def records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines()]


# ---- IFCA ----------------------------------------------------------------------------------
def test_ifca_assignment_is_the_argmin_with_ties_to_the_lowest_cluster() -> None:
    assert select_cluster([0.9, 0.2, 0.4]) == 1
    assert select_cluster([0.5, 0.2, 0.2]) == 1  # tie between 1 and 2
    assert select_cluster([3.0]) == 0
    with pytest.raises(ValueError):
        select_cluster([])


def test_ifca_averages_each_cluster_over_the_clients_that_chose_it() -> None:
    clusters = [{"w": torch.tensor([0.0, 0.0])}, {"w": torch.tensor([9.0, 9.0])}, {"w": torch.tensor([5.0, 5.0])}]
    uploads = [{"w": torch.tensor([1.0, 2.0])}, {"w": torch.tensor([3.0, 6.0])}, {"w": torch.tensor([7.0, 7.0])}]
    result = cluster_average(clusters, uploads, chosen=[1, 1, 0], num_samples=[1, 3, 10])
    assert torch.allclose(result[0]["w"], torch.tensor([7.0, 7.0]))  # only the third upload
    assert torch.allclose(result[1]["w"], torch.tensor([2.5, 5.0]))  # (1·[1,2] + 3·[3,6]) / 4
    assert result[2] is clusters[2]  # nobody chose cluster 2: unchanged


def test_adjusted_rand_index_hand_computed() -> None:
    # n_ij: (0,0)=2, (1,1)=1, (1,2)=1 → Σ C(n_ij,2) = 1; rows [2,2] → 2; columns [2,1,1] → 1;
    # E = 2·1/C(4,2) = 1/3; max = 3/2 → (1 − 1/3)/(3/2 − 1/3) = 4/7
    assert adjusted_rand_index([0, 0, 1, 1], [0, 0, 1, 2]) == pytest.approx(4 / 7)
    # crossing groups: Σ C(n_ij,2) = 0, E = 2·2/6, max = 2 → (0 − 2/3)/(2 − 2/3) = −1/2
    assert adjusted_rand_index(["a", "a", "b", "b"], [0, 1, 0, 1]) == pytest.approx(-0.5)
    assert adjusted_rand_index(["x", "x", "y", "y", "z"], [5, 5, 3, 3, 1]) == 1.0  # relabelled
    assert adjusted_rand_index(["x", "x"], [0, 0]) == 1.0  # 0/0: one group each
    assert adjusted_rand_index(["x", "y", "x", "y"], [0, 0, 0, 0]) == 0.0  # one cluster for two groups
    with pytest.raises(ValueError):
        adjusted_rand_index([0, 1], [0])


def test_ifca_clusters_start_apart_and_a_client_trains_its_lowest_loss_cluster(tmp_path: Path) -> None:
    harness = Harness(prepare(tiny_run("ifca", tmp_path, rounds=1), {"clusters": 3}))
    algorithm = harness.algorithm
    assert set(algorithm.global_state) == {cluster_prefix(j) + n for j in range(3) for n in algorithm.layout.shared}
    assert not torch.equal(algorithm.cluster_model(0)["fc1.weight"], algorithm.cluster_model(1)["fc1.weight"])
    assert torch.equal(algorithm.cluster_model(0)["fc1.weight"], algorithm.initial_state["fc1.weight"])
    # cluster 1: cluster 0 with client 1's label prior added to the output bias (a lower loss);
    # cluster 2: confident in the class client 1 holds least (a far higher loss)
    inputs, labels = harness.data.gather(harness.data.train_indices[1])
    counts = torch.bincount(labels, minlength=10).float()
    with torch.no_grad():
        for n, t in algorithm.cluster_model(0).items():
            algorithm.global_state[cluster_prefix(1) + n].copy_(t)
        algorithm.global_state[cluster_prefix(1) + "fc3.bias"].add_(torch.log((counts + 0.1) / counts.sum()))
        algorithm.global_state[cluster_prefix(2) + "fc3.bias"][int(counts.argmin())] += 50.0
    losses = []
    for j in range(3):  # F_1(θ_j), computed here independently of the program
        model = MLP((1, 8, 8), 10)
        model.load_state_dict(algorithm.cluster_model(j))
        losses.append(torch.nn.functional.cross_entropy(model.eval()(inputs), labels).item())
    assert losses[1] < losses[0] < losses[2]
    received = algorithm.broadcast(1)
    update = harness.train_client(1, received)
    assert int(update.params[CHOSEN]) == 1 and update.params[CHOSEN].dtype == torch.int64
    assert set(update.params) == {*algorithm.layout.shared, CHOSEN}
    before = {j: algorithm.cluster_model(j)["fc1.weight"].clone() for j in range(3)}
    algorithm.aggregate([update])
    assert torch.equal(algorithm.cluster_model(1)["fc1.weight"], update.params["fc1.weight"])
    assert torch.equal(algorithm.cluster_model(0)["fc1.weight"], before[0])
    assert algorithm.assignment[1] == 1 and algorithm.assignment[0] == -1
    assert algorithm.most_popular_cluster() == 1
    assert torch.equal(algorithm.global_model()["fc1.weight"], update.params["fc1.weight"])


def test_ifca_reports_assignments_bytes_and_agreement_with_true_groups(tmp_path: Path) -> None:
    config = tiny_run("ifca", tmp_path, num_clients=6, feature_shift="rotate", shift_groups=2, alpha=100.0)
    summary = run_experiment(config, {"clusters": 2})
    folder = run_folder(tmp_path)
    domains = json.loads((folder / "partition.json").read_text())["client_domains"]
    model_bytes = sum(t.numel() * 4 for t in MLP((1, 8, 8), 10).state_dict().values())
    for record in records(folder):
        assert len(record["ifca_assignment"]) == len(record["clients"]) == 6
        assert sum(record["ifca_cluster_sizes"]) == 6
        assert record["bytes_down"] == 6 * 2 * model_bytes  # every client receives both clusters
        assert record["bytes_up"] == 6 * (model_bytes + 8)  # its model and the int64 cluster index
        expected = adjusted_rand_index([domains[k] for k in record["clients"]], record["ifca_assignment"])
        assert record["ifca_ari"] == pytest.approx(expected)
    last = records(folder)[-1]
    assert summary["ifca_ari"] == pytest.approx(adjusted_rand_index(domains, last["ifca_assignment"]))
    clients = (folder / "clients.csv").read_text().splitlines()
    column = clients[0].split(",").index("ifca_cluster")
    assert [int(row.split(",")[column]) for row in clients[1:]] == last["ifca_assignment"]


def test_ifca_without_true_groups_reports_no_agreement(tmp_path: Path) -> None:
    summary = run_experiment(tiny_run("ifca", tmp_path, rounds=1))
    assert "ifca_ari" not in summary and "ifca_ari" not in records(run_folder(tmp_path))[0]
    with pytest.raises(ConfigError, match="--clusters"):
        IFCAHyperparameters(clusters=0).validate()


# ---- FedFomo -------------------------------------------------------------------------------
def test_fedfomo_weights_hand_computed() -> None:
    raw, normalised = fomo_weights(1.0, losses=[0.5, 1.2, 0.0], distances=[1.0, 2.0, 4.0])
    assert raw == pytest.approx([0.5 / (1 + 1e-5), -0.2 / (2 + 1e-5), 1.0 / (4 + 1e-5)])
    assert normalised == pytest.approx([2 / 3, 0.0, 1 / 3], rel=1e-4)  # max(w,0), then /Σ: 0.5 : 0.25
    assert fomo_weights(0.1, [0.5, 0.2], [1.0, 1.0])[1] == [0.0, 0.0]  # no download helps: all 0


def test_fedfomo_update_and_epsilon_greedy_choice_hand_computed() -> None:
    own = {"w": torch.tensor([1.0, 1.0])}
    models = [{"w": torch.tensor([3.0, 1.0])}, {"w": torch.tensor([1.0, 5.0])}]
    # θ + 0.5·([3,1] − [1,1]) + 0.25·([1,5] − [1,1]) = [2, 2]
    assert torch.equal(fomo_update(own, models, [0.5, 0.25])["w"], torch.tensor([2.0, 2.0]))
    assert torch.equal(fomo_update(own, models, [0.0, 0.0])["w"], own["w"])
    assert fomo_epsilon(0.3, 0.05, 1) == 0.3
    assert fomo_epsilon(0.3, 0.05, 3) == pytest.approx(0.2)
    assert fomo_epsilon(0.3, 0.05, 8) == 0.0
    affinity = [9.0, 0.5, 0.5, -1.0, 2.0]  # client 0's row (itself is never a candidate)
    rng = np.random.default_rng(0)
    assert choose_downloads(affinity, [1, 2, 3, 4], 2, explore=False, rng=rng) == [1, 4]  # 2.0, then 0.5 (tie: id 1)
    assert choose_downloads(affinity, [1, 2], 5, explore=False, rng=rng) == [1, 2]  # fewer candidates than M
    drawn = choose_downloads(affinity, [1, 2, 3, 4], 3, explore=True, rng=np.random.default_rng(1))
    assert len(drawn) == 3 and set(drawn) <= {1, 2, 3, 4}


def test_fedfomo_downloads_travel_and_the_affinity_accumulates(tmp_path: Path) -> None:
    harness = Harness(prepare(tiny_run("fedfomo", tmp_path, rounds=3), {"downloads": 2}))
    seen: list[dict] = []
    traffic = harness.watch_traffic()
    received, uploaded = traffic.received, traffic.uploaded
    harness.run(seen.append)
    algorithm = harness.algorithm
    model_bytes = sum(t.numel() * 4 for t in algorithm.initial_state.values())
    assert seen[0]["bytes_down"] == 0  # round 1: nobody has a model yet
    for record in seen[1:]:  # then 2 of the 3 other clients, for each of the 4 clients
        assert record["bytes_down"] == 4 * 2 * model_bytes
        assert record["bytes_up"] == 4 * (model_bytes + 2 * 4)  # the model and 2 float32 weights
        assert record["fedfomo_downloads"] == 8
    for k, keys in zip([0, 1, 2, 3] * 3, received):
        assert {int(n.split(".")[1]) for n in keys} <= {0, 1, 2, 3} - {k}
    assert all(any(n.startswith(WEIGHT) for n in keys) for keys in uploaded[4:])
    assert algorithm.rounds_done == 3 and algorithm.affinity.abs().sum() > 0
    assert algorithm.affinity.diagonal().abs().sum() == 0  # a client never downloads its own model


def test_fedfomo_combines_on_the_validation_split(tmp_path: Path) -> None:
    harness = Harness(prepare(tiny_run("fedfomo", tmp_path, rounds=1, local_epochs=0)))
    algorithm = harness.algorithm
    own = algorithm.model_state(algorithm.store.get(0))
    labels = harness.data.labels[harness.data.val_indices[0]]
    counts = torch.bincount(labels, minlength=10).float()
    better = {n: t.clone() for n, t in own.items()}
    better["fc3.bias"] += torch.log((counts + 0.1) / counts.sum())  # the validation labels' prior
    update = harness.train_client(0, {download_prefix(2) + n: t for n, t in better.items()})
    # no local epochs: the combination alone; the one positive weight normalises to 1
    assert float(update.params[WEIGHT + "2"]) > 0
    assert torch.allclose(update.params["fc3.bias"], better["fc3.bias"])
    worse = {n: t.clone() for n, t in own.items()}
    worse["fc3.bias"][int(counts.argmin())] += 50.0  # a class client 0 barely holds, confidently
    update = harness.train_client(0, {download_prefix(3) + n: t for n, t in worse.items()}, round_index=2)
    assert float(update.params[WEIGHT + "3"]) < 0  # worse than its own model: weight 0, model kept
    assert torch.equal(update.params["fc3.bias"], algorithm.model_state(algorithm.store.get(0))["fc3.bias"])


def test_fedfomo_validation_data_falls_back_to_a_fixed_part_of_the_train_split() -> None:
    from types import SimpleNamespace

    from pflbench.algorithms.fedfomo import FedFomoProgram

    program = object.__new__(FedFomoProgram)
    program.seed = 0
    train = torch.arange(100, 110)
    data = SimpleNamespace(val_indices=[torch.zeros(0, dtype=torch.long)], train_indices=[train])
    trainer = SimpleNamespace(job=SimpleNamespace(client_id=0), data=data)
    chosen = program.validation_indices(trainer)
    assert len(chosen) == 2 and set(chosen.tolist()) <= set(train.tolist())  # 20 % of 10
    assert torch.equal(chosen, program.validation_indices(trainer))  # the same every round
    data.val_indices = [torch.tensor([7, 8])]
    assert torch.equal(program.validation_indices(trainer), torch.tensor([7, 8]))  # its own val split


# ---- FedAMP --------------------------------------------------------------------------------
def test_fedamp_attention_weights_hand_computed() -> None:
    assert attention_derivative(2.0, 1.0) == pytest.approx(math.exp(-2.0))
    assert attention_derivative(2.0, 2.0) == pytest.approx(math.exp(-1.0) / 2)
    # ‖w_i − w_j‖² = 0 and ln 2, α_k = 0.5, σ = 1: ξ = 0.5·1, 0.5·0.5; ξ_ii = 1 − 0.75
    self_weight, weights = attention_coefficients([0.0, math.log(2.0)], 0.5, 1.0)
    assert weights == pytest.approx([0.5, 0.25]) and self_weight == pytest.approx(0.25)
    u = cloud_model(
        {"w": torch.tensor([4.0])}, [{"w": torch.tensor([0.0])}, {"w": torch.tensor([8.0])}], 0.25, [0.5, 0.25]
    )
    assert u["w"].item() == pytest.approx(0.25 * 4 + 0.5 * 0 + 0.25 * 8)
    assert attention_coefficients([], 1.0, 1.0) == (1.0, [])  # alone: u_i = w_i


def test_fedamp_default_sigma_keeps_the_self_weight_at_least_a_half() -> None:
    """A'(x) ≤ 1/σ, so ξ_ii ≥ 1 − α_k·(K − 1)/σ, reached at distance 0. PFLlib's σ = α_k = 1 with
    20 clients: 1 − 19 = −18. The default σ = 2·α_k·(K − 1) = 38: ξ_ii = 1 − 19/38 = ½ when all
    19 others sit on w_i, and 1 − 19·e^{−38/38}/38 = 1 − e^{−1}/2 ≈ 0.816 at distance² 38."""
    assert self_weight_floor(1.0, 1.0, 19) == pytest.approx(-18.0)
    assert default_sigma(1.0, 19) == 38.0 and default_sigma(0.5, 4) == 4.0 and default_sigma(1.0, 0) == 2.0
    assert self_weight_floor(1.0, 38.0, 19) == pytest.approx(0.5)
    assert attention_coefficients([0.0] * 19, 1.0, 38.0)[0] == pytest.approx(0.5)
    assert attention_coefficients([38.0] * 19, 1.0, 38.0)[0] == pytest.approx(1 - math.exp(-1.0) / 2)
    assert attention_coefficients([0.0] * 19, 1.0, 1.0)[0] == pytest.approx(-18.0)  # what σ = 1 gave
    model = tiny_model()
    config = RunConfig(algo="fedamp", num_clients=5, **RESOLVED)
    algorithm = FedAMP(config, FedAMPHyperparameters(alpha_k=0.5), model, [6] * 5)
    assert algorithm.sigma == 4.0 and algorithm.run_info() == {"fedamp_sigma": 4.0}  # 2·0.5·(5 − 1)
    assert FedAMP(config, FedAMPHyperparameters(sigma=7.0), model, [6] * 5).sigma == 7.0


def test_fedamp_refuses_a_sigma_that_makes_the_self_weight_negative(tmp_path: Path) -> None:
    """σ < α_k·(K − 1) lets ξ_ii go below 0: one Error line naming the bound; σ = α_k·(K − 1)
    (ξ_ii ≥ 0, equal at distance 0) is accepted."""
    with pytest.raises(ConfigError, match=r"--sigma 1 .*--alpha-k 1 and 4 training clients.*--sigma ≥ .* = 3") as error:
        prepare(tiny_run("fedamp", tmp_path / "bad"), {"sigma": 1.0})
    assert "\n" not in str(error.value)
    prepare(tiny_run("fedamp", tmp_path / "edge"), {"sigma": 3.0})
    with pytest.raises(ConfigError, match="--sigma 2.9"):
        prepare(tiny_run("fedamp", tmp_path / "near"), {"sigma": 2.9})


def test_fedamp_cloud_model_and_attention_term_wiring() -> None:
    model = tiny_model()
    config = RunConfig(algo="fedamp", num_clients=3, **RESOLVED)
    hparams = FedAMPHyperparameters(alpha_k=0.5, lamda=1.0, sigma=10.0)
    algorithm = FedAMP(config, hparams, model, [6, 6, 6])
    trainable = algorithm.layout.trainable
    assert algorithm.layout.shared == () and set(trainable) <= set(algorithm.layout.private)
    w0 = {n: algorithm.initial_state[n] for n in trainable}
    assert all(torch.equal(algorithm.broadcast(0)[CLOUD + n], w0[n]) for n in trainable)  # nobody uploaded
    w1 = {n: t + 0.1 for n, t in w0.items()}
    w2 = {n: t - 0.2 for n, t in w0.items()}
    algorithm.aggregate([ClientUpdate(1, 6, w1, {}), ClientUpdate(2, 6, w2, {})])
    numel = sum(t.numel() for t in w0.values())
    d1, d2 = numel * 0.01, numel * 0.04  # client 0 has not trained: w_0 = w⁰
    x1, x2 = 0.5 * math.exp(-d1 / 10) / 10, 0.5 * math.exp(-d2 / 10) / 10
    cloud = algorithm.broadcast(0)
    for n in trainable:
        expected = (1 - x1 - x2) * w0[n] + x1 * w1[n] + x2 * w2[n]
        assert torch.allclose(cloud[CLOUD + n], expected, atol=1e-6)
    assert set(cloud) == {CLOUD + n for n in trainable}  # bytes_down: one model's parameters
    # the client's term (λ/(2α_k))·‖w − u‖²: with w = u + 1 everywhere, (1/(2·0.5))·numel
    params = {n: cloud[CLOUD + n] + 1 for n in trainable}
    terms = algorithm.program.loss_terms(
        lambda p, x: torch.zeros(1, 3), params, torch.zeros(1, 4), torch.tensor([0]), cloud
    )
    assert terms["attention"].item() == pytest.approx(numel)


# ---- FedAS ---------------------------------------------------------------------------------
def test_fedas_fisher_weighted_aggregation_hand_computed() -> None:
    assert fisher_weights([1.0, 3.0], [10, 10]) == pytest.approx([0.25, 0.75])
    assert fisher_weights([0.0, 0.0], [10, 30]) == pytest.approx([0.25, 0.75])  # fallback: samples
    model = tiny_model()
    config = RunConfig(algo="fedas", num_clients=2, **RESOLVED)
    algorithm = FedAS(config, FedASHyperparameters(), model, [5, 5])
    assert not {n for n in algorithm.layout.shared if n.startswith("fc3.")}  # the head stays private
    body = list(algorithm.global_state)
    a = {n: torch.full_like(algorithm.global_state[n], 1.0) for n in body}
    b = {n: torch.full_like(algorithm.global_state[n], 5.0) for n in body}
    algorithm.aggregate(
        [
            ClientUpdate(0, 50, {**a, FISHER: torch.tensor(1.0)}, {}),
            ClientUpdate(1, 5, {**b, FISHER: torch.tensor(3.0)}, {}),
        ]
    )
    for n in body:  # 0.25·1 + 0.75·5, whatever the sample counts
        assert torch.allclose(algorithm.global_state[n], torch.full_like(a[n], 4.0))


def test_fedas_prototypes_and_alignment_loss_hand_computed() -> None:
    features = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 2.0]])
    prototypes = class_prototypes(features, torch.tensor([0, 0, 1]))
    assert torch.equal(prototypes[0], torch.tensor([2.0, 0.0])) and torch.equal(prototypes[1], torch.tensor([0.0, 2.0]))
    batch = torch.tensor([[1.0, 1.0], [3.0, 1.0], [0.0, 0.0]])
    # class 0: ((−1)² + 1² + 1² + 1²)/4 = 1; class 1: (0² + (−2)²)/2 = 2
    assert alignment_loss(batch, torch.tensor([0, 0, 1]), prototypes).item() == pytest.approx(3.0)
    assert alignment_loss(batch[:1], torch.tensor([2]), prototypes) is None  # no prototype of class 2


def test_fedas_aligns_only_after_a_first_round_and_keeps_its_body(tmp_path: Path) -> None:
    harness = Harness(prepare(tiny_run("fedas", tmp_path, rounds=1)))
    algorithm = harness.algorithm
    first = harness.train_client(0, algorithm.broadcast(0))
    assert set(first.params) == {*algorithm.layout.shared, FISHER} and float(first.params[FISHER]) > 0
    state = algorithm.store.get(0)
    assert int(state["fedas.rounds"]) == 1
    assert torch.equal(state["fedas.body.fc1.weight"], first.params["fc1.weight"])
    personal = algorithm.personal_model(0)
    assert torch.equal(personal["fc1.weight"], first.params["fc1.weight"])  # its own body
    assert torch.equal(personal["fc3.weight"], state["fc3.weight"])
    calls = []
    program = algorithm.program
    original = type(program).align
    type(program).align = lambda self, trainer: calls.append(trainer.job.client_id) or original(self, trainer)
    try:
        harness.train_client(0, algorithm.broadcast(0), round_index=2)  # trained before: aligns
        harness.train_client(1, algorithm.broadcast(1), round_index=2)  # first time: no alignment
    finally:
        type(program).align = original
    assert calls == [0]


# ---- all four: refusals (resume: tests/runs/test_resume.py STATEFUL; Ray: tests/engine/test_ray.py) ----
@pytest.mark.parametrize("algo", ["ifca", "fedfomo", "fedas"])
def test_vmap_refuses_the_custom_local_updates(algo: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="vmap"):
        prepare(tiny_run(algo, tmp_path, executor="vmap"))


def test_bad_hyperparameters_are_one_clear_line() -> None:
    for bad, name in (
        (FedFomoHyperparameters(downloads=0), "--downloads"),
        (FedFomoHyperparameters(epsilon=1.5), "--epsilon"),
        (FedAMPHyperparameters(alpha_k=0.0), "--alpha-k"),
        (FedAMPHyperparameters(sigma=-1.0), "--sigma"),
        (FedASHyperparameters(align_lr=0.0), "--align-lr"),
        (FedASHyperparameters(align_epochs=-1), "--align-epochs"),
    ):
        with pytest.raises(ConfigError, match=name) as error:
            bad.validate()
        assert "\n" not in str(error.value)


def test_families_and_global_models() -> None:
    assert IFCA.method_family == "clustering" and IFCA.has_global_model
    for algorithm in (FedFomo, FedAMP, FedAS):
        assert algorithm.method_family == "model_combination" and not algorithm.has_global_model
