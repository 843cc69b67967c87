"""FedGen and FedKD — each defining formula against hand-computed values on small tensors, plus
the wiring: what travels (and its bytes), what stays private, what the server learns."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from pflbench.algorithms.fedgen import (
    GENERATOR,
    LABEL_COUNTS,
    LABEL_DISTRIBUTION,
    FedGenHyperparameters,
    adam_step,
    decayed_weight,
    diversity_loss,
    generate,
    label_distribution,
    label_weights,
    resolved_generative_weights,
    teacher_loss,
)
from pflbench.algorithms.fedkd import (
    DENSE,
    FACTOR_S,
    FACTOR_U,
    FACTOR_V,
    MENTOR,
    compress_update,
    decompress_update,
    energy_threshold,
    kept_rank,
    mutual_distillation_terms,
)
from pflbench.config.groups import LocalSpec
from pflbench.config.run_config import RunConfig
from pflbench.errors import ConfigError
from pflbench.runs.prepare import prepare
from pflbench.testing import Harness


def tiny_run(algo: str, out: Path, **settings) -> RunConfig:
    values = dict(
        algo=algo,
        dataset="digits",
        model="mlp",
        num_clients=3,
        rounds=2,
        alpha=0.5,
        optimizer="adam",
        lr=0.01,
        out=str(out),
        backbone="random",
    )
    return RunConfig(**{**values, **settings})


def model_bytes(algorithm) -> int:
    return sum(t.numel() * t.element_size() for t in algorithm.global_state.values())


# ---- FedGen: formulas ----------------------------------------------------------------------
def test_regulariser_weights_decay_by_0_98_per_round_down_to_the_floor() -> None:
    assert decayed_weight(10.0, 0.98, 1) == 10.0
    assert decayed_weight(10.0, 0.98, 3) == pytest.approx(10.0 * 0.9604)
    assert decayed_weight(1.0, 0.5, 30) == 1e-4  # 0.5^29 ≈ 1.9e-9 is floored


def test_label_weights_are_each_clients_share_of_a_label_and_p_hat_the_pooled_distribution() -> None:
    counts = torch.tensor([[3.0, 0.0, 1.0], [1.0, 0.0, 3.0]])  # 2 clients × 3 labels
    weights = label_weights(counts)  # labels × clients
    assert torch.allclose(weights, torch.tensor([[0.75, 0.25], [0.0, 0.0], [0.25, 0.75]]))
    assert torch.allclose(label_distribution(counts), torch.tensor([0.5, 0.0, 0.5]))


def test_diversity_loss_by_hand() -> None:
    noise = torch.tensor([[0.0, 0.0], [1.0, 1.0]])  # mean squared distance 1 between the two
    features = torch.tensor([[0.0, 0.0, 0.0], [2.0, 2.0, 2.0]])  # mean absolute distance 2
    # pairs (0,0), (0,1), (1,0), (1,1): products 0, 2, 2, 0 → mean 1 → exp(−1)
    assert float(diversity_loss(noise, features)) == pytest.approx(math.exp(-1.0))


def test_teacher_loss_weights_each_heads_cross_entropy_by_its_label_share() -> None:
    first = torch.zeros(2, 2)  # CE ln 2 on both samples
    second = torch.tensor([[math.log(3.0), 0.0], [0.0, 0.0]])  # CE ln(4/3), then ln 2
    labels = torch.tensor([0, 1])
    weights = torch.tensor([[0.25, 0.75], [1.0, 0.0]])  # label 0: 1/4 vs 3/4; label 1: all first client's
    expected = ((0.25 * math.log(2) + 0.75 * math.log(4 / 3)) + math.log(2)) / 2
    assert float(teacher_loss([first, second], labels, weights)) == pytest.approx(expected)


def test_generator_forward_by_hand_in_eval_mode() -> None:
    generator = {
        "fc.weight": torch.eye(3),
        "fc.bias": torch.zeros(3),
        "bn.weight": torch.ones(3),
        "bn.bias": torch.zeros(3),
        "bn.running_mean": torch.zeros(3),
        "bn.running_var": torch.ones(3),
        "out.weight": torch.ones(1, 3),
        "out.bias": torch.zeros(1),
    }
    noise = torch.tensor([[0.5], [-2.0]])  # [ε ‖ one-hot(y)] with 2 classes
    output = generate(generator, noise, torch.tensor([1, 0]), 2, training=False)
    # relu(ε) + 1 (the one-hot), divided by √(1 + 1e-5) by BatchNorm's running statistics
    assert torch.allclose(output.squeeze(1), torch.tensor([1.5, 1.0]) / math.sqrt(1 + 1e-5))
    before = generator["bn.running_mean"].clone()
    generate(generator, noise, torch.tensor([1, 0]), 2, training=True)
    assert not torch.equal(generator["bn.running_mean"], before)  # train mode updates the statistics


def test_adam_step_by_hand_with_weight_decay() -> None:
    params = {"w": torch.tensor([1.0], dtype=torch.float64)}
    moments = {"m/w": torch.zeros(1, dtype=torch.float64), "v/w": torch.zeros(1, dtype=torch.float64)}
    gradient = {"w": torch.tensor([0.5], dtype=torch.float64)}
    adam_step(params, gradient, moments, 1, 0.01, 0.1)
    # g = 0.5 + 0.1·1 = 0.6; m = 0.06, v = 0.00036; m̂ = 0.6, v̂ = 0.36 → w = 1 − 0.01·0.6/(0.6 + 1e-8)
    assert float(params["w"]) == pytest.approx(1 - 0.01 * 0.6 / (0.6 + 1e-8), abs=1e-12)
    adam_step(params, gradient, moments, 2, 0.01, 0.1)
    g = 0.5 + 0.1 * float(1 - 0.01 * 0.6 / (0.6 + 1e-8))  # ≈ 0.599
    m, v = 0.9 * 0.06 + 0.1 * g, 0.999 * 0.00036 + 0.001 * g * g
    previous = 1 - 0.01 * 0.6 / (0.6 + 1e-8)
    expected = previous - 0.01 / (1 - 0.9**2) * m / (math.sqrt(v) / math.sqrt(1 - 0.999**2) + 1e-8)
    assert float(params["w"]) == pytest.approx(expected, abs=1e-12)  # ≈ 0.9800005
    assert float(moments["m/w"]) == pytest.approx(m) and float(moments["v/w"]) == pytest.approx(v)


# ---- FedGen: wiring ------------------------------------------------------------------------
def test_fedgen_sends_the_generator_once_trained_and_counts_every_byte(tmp_path: Path) -> None:
    harness = Harness(prepare(tiny_run("fedgen", tmp_path, rounds=2), {"generator_steps": 3}))
    algorithm = harness.algorithm
    before = {n: t.clone() for n, t in algorithm.generator.items()}
    fingerprint = algorithm.state_fingerprint()
    traffic = harness.watch_traffic()
    seen: list[dict] = []
    harness.run(seen.append)
    generator_bytes = sum(t.numel() * 4 for t in algorithm.generator.values())
    classes = algorithm.num_classes
    model = model_bytes(algorithm)
    assert seen[0]["bytes_down"] == 3 * model  # round 1: no generator yet
    assert seen[1]["bytes_down"] == 3 * (model + generator_bytes + classes * 4)
    assert all(r["bytes_up"] == 3 * (model + classes * 4) for r in seen)  # model + label counts
    assert all(not any(n.startswith("fedgen.") for n in keys) for keys in traffic.received[:3])
    assert all(LABEL_DISTRIBUTION in keys and GENERATOR + "fc.weight" in keys for keys in traffic.received[3:])
    assert all(LABEL_COUNTS in keys for keys in traffic.uploaded)
    assert "generator_teacher_loss" in seen[0] and math.isfinite(seen[0]["generator_diversity_loss"])
    assert algorithm.generator_trainings == 2
    assert not torch.equal(algorithm.generator["fc.weight"], before["fc.weight"])
    # p̂ is the round's clients' pooled train labels
    data = harness.data
    counts = sum(torch.bincount(data.labels[data.train_indices[k]], minlength=classes) for k in range(3))
    assert torch.allclose(algorithm.label_distribution, counts.float() / counts.sum())
    assert algorithm.undeclared_state(fingerprint) == []  # all of it is checkpointed


def test_fedgen_clients_add_the_generated_terms_only_once_a_generator_exists(tmp_path: Path) -> None:
    harness = Harness(prepare(tiny_run("fedgen", tmp_path, rounds=1), {"generator_steps": 2}))
    algorithm = harness.algorithm
    first = harness.train_client(0, algorithm.broadcast(0), round_index=1)
    assert set(first.loss_terms) == {"task"}
    algorithm.aggregate([first])  # trains the generator on client 0's head
    second = harness.train_client(0, algorithm.broadcast(0), round_index=2)
    assert set(second.loss_terms) == {"task", "generated", "latent"}
    assert all(math.isfinite(v) for v in second.loss_terms.values())
    # the round's weights: (B̂/B)·α_t and β_t with α = β = 10, t = 2
    assert second.loss == pytest.approx(
        second.loss_terms["task"]
        + (32 / 32) * 10 * 0.98 * second.loss_terms["generated"]
        + 10 * 0.98 * second.loss_terms["latent"],
        rel=1e-5,
    )


def test_fedgen_default_alpha_beta_keep_the_authors_alpha_times_lr(tmp_path: Path) -> None:
    """α·lr = β·lr = 10 × 0.01 = 0.1 under SGD: α = β = 2 at lr 0.05, 1 at 0.1; Adam keeps 10; a
    given weight is used as is (the other still follows the rule). The client's round-2 loss weighs
    the generated term by (B̂/B)·α·0.98 (B̂ = B = 32)."""
    sgd = LocalSpec(epochs=1, batch_size=32, lr=0.05, optimizer="sgd", momentum=0.0, weight_decay=0.0, max_grad_norm=0)
    assert resolved_generative_weights(FedGenHyperparameters(), sgd) == pytest.approx((2.0, 2.0))
    assert resolved_generative_weights(FedGenHyperparameters(), dataclasses.replace(sgd, lr=0.1)) == pytest.approx(
        (1.0, 1.0)
    )
    assert resolved_generative_weights(FedGenHyperparameters(), dataclasses.replace(sgd, optimizer="adam")) == (
        10.0,
        10.0,
    )
    assert resolved_generative_weights(FedGenHyperparameters(generative_alpha=1.0), sgd) == pytest.approx((1.0, 2.0))
    harness = Harness(prepare(tiny_run("fedgen", tmp_path, rounds=1, optimizer="sgd", lr=0.05), {"generator_steps": 2}))
    algorithm = harness.algorithm
    assert algorithm.run_info()["fedgen_generative_alpha"] == pytest.approx(2.0)
    algorithm.aggregate([harness.train_client(0, algorithm.broadcast(0), round_index=1)])
    second = harness.train_client(0, algorithm.broadcast(0), round_index=2)
    assert second.loss == pytest.approx(
        second.loss_terms["task"] + 2 * 0.98 * second.loss_terms["generated"] + 2 * 0.98 * second.loss_terms["latent"],
        rel=1e-5,
    )


def test_fedgen_and_fedkd_refuse_other_head_layers_and_vmap(tmp_path: Path) -> None:
    for algo in ("fedgen", "fedkd"):
        with pytest.raises(ConfigError, match="head-layers 2"):
            prepare(tiny_run(algo, tmp_path, head_layers=2))
        with pytest.raises(ConfigError, match="vmap"):
            prepare(tiny_run(algo, tmp_path, executor="vmap"))


# ---- FedKD: formulas -----------------------------------------------------------------------
def test_energy_threshold_rises_linearly_to_t_end_in_the_last_round() -> None:
    assert energy_threshold(1, 10, 0.95, 0.98) == pytest.approx(0.953)
    assert energy_threshold(10, 10, 0.95, 0.98) == pytest.approx(0.98)


def test_kept_rank_is_the_smallest_reaching_the_energy() -> None:
    values = torch.tensor([3.0, 2.0, 1.0])  # σ² = 9, 4, 1 of 14
    assert kept_rank(values, 0.5) == 1  # 9 ≥ 7
    assert kept_rank(values, 0.9) == 2  # 13 ≥ 12.6 > 9
    assert kept_rank(values, 0.95) == 3  # 13.3 > 13
    assert kept_rank(values, 1.0) == 3


def test_compressed_updates_are_factors_when_smaller_and_rebuild_the_update() -> None:
    column, row = torch.arange(1.0, 7.0), torch.tensor([1.0, -1.0, 2.0, 0.5, 3.0])
    rank_one = torch.outer(column, row)  # 6 × 5, rank 1: 6 + 1 + 5 = 12 numbers < 30
    sent = compress_update("w", rank_one, 0.95)
    assert set(sent) == {FACTOR_U + "w", FACTOR_S + "w", FACTOR_V + "w"}
    assert sum(t.numel() for t in sent.values()) == 12
    assert torch.allclose(decompress_update("w", sent, rank_one.shape), rank_one, atol=1e-5)
    kernel = rank_one.reshape(6, 5, 1, 1).expand(6, 5, 2, 2).contiguous()  # conv: 6 × (5·2·2), rank 1
    sent = compress_update("conv", kernel, 0.95)
    assert FACTOR_U + "conv" in sent and decompress_update("conv", sent, kernel.shape).shape == kernel.shape
    assert torch.allclose(decompress_update("conv", sent, kernel.shape), kernel, atol=1e-4)
    full = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.5, 0.0], [0.0, 0.0, 1.0]])  # K = 3 → 21 ≥ 9
    assert set(compress_update("m", full, 0.95)) == {DENSE + "m"}
    assert set(compress_update("b", torch.ones(4), 0.95)) == {DENSE + "b"}


def test_mutual_distillation_terms_by_hand() -> None:
    mentor, mentee = torch.zeros(1, 2), torch.tensor([[math.log(3.0), 0.0]])
    targets = torch.tensor([0])
    terms = mutual_distillation_terms(mentor, mentee, torch.tensor([[1.0, 2.0]]), torch.zeros(1, 2), targets)
    scale = math.log(2) + math.log(4 / 3)  # CE of the mentor (½, ½) and of the mentee (¾, ¼)
    kl_mentee_to_mentor = 0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5)  # KL(ŷ_s ‖ ŷ_t)
    kl_mentor_to_mentee = 0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(0.5 / 0.25)  # KL(ŷ_t ‖ ŷ_s)
    assert float(terms["task_mentor"]) == pytest.approx(math.log(2))
    assert float(terms["task_mentee"]) == pytest.approx(math.log(4 / 3))
    assert float(terms["distill_mentor"]) == pytest.approx(kl_mentee_to_mentor / scale)
    assert float(terms["distill_mentee"]) == pytest.approx(kl_mentor_to_mentee / scale)
    assert float(terms["hidden"]) == pytest.approx(2.5 / scale)  # mean of 1², 2²


# ---- FedKD: wiring -------------------------------------------------------------------------
def test_fedkd_uploads_compressed_updates_and_the_server_adds_their_weighted_mean(tmp_path: Path) -> None:
    harness = Harness(prepare(tiny_run("fedkd", tmp_path, rounds=1)))
    algorithm = harness.algorithm
    received = {n: t.clone() for n, t in algorithm.global_state.items()}
    updates = [harness.train_client(k, algorithm.broadcast(k)) for k in range(3)]
    for update in updates:
        assert all(n.startswith(("fedkd.u.", "fedkd.s.", "fedkd.v.", DENSE)) for n in update.params)
        assert any(n.startswith(FACTOR_U) for n in update.params)  # the 200 × 200 layer is compressed
        assert sum(t.numel() * 4 for t in update.params.values()) < model_bytes(algorithm)
    total = sum(u.num_samples for u in updates)
    expected = {
        n: received[n] + sum(u.num_samples / total * decompress_update(n, u.params, received[n].shape) for u in updates)
        for n in received
    }
    algorithm.aggregate(updates)
    assert all(torch.allclose(algorithm.global_state[n], expected[n], atol=1e-6) for n in expected)
    # the mentor trained and stays private: it is the client's personal model
    personal = algorithm.personal_model(0)
    mentor = {n[len(MENTOR) :]: t for n, t in algorithm.store.get(0).items()}
    assert set(personal) == set(received) and all(torch.equal(personal[n], mentor[n]) for n in personal)
    assert not torch.equal(personal["fc1.weight"], algorithm.initial_state["fc1.weight"])


def test_fedkd_without_compression_uploads_the_mentee_and_averages_it(tmp_path: Path) -> None:
    harness = Harness(prepare(tiny_run("fedkd", tmp_path, rounds=2), {"compression": "none", "hidden_weight": 0.0}))
    seen: list[dict] = []
    harness.run(seen.append)
    algorithm = harness.algorithm
    assert all(r["bytes_up"] == 3 * model_bytes(algorithm) == r["bytes_down"] for r in seen)
    assert "loss_hidden" not in seen[0] and "loss_distill_mentor" in seen[0]


def test_fedkd_compressed_run_counts_fewer_bytes_up_than_down(tmp_path: Path) -> None:
    harness = Harness(prepare(tiny_run("fedkd", tmp_path, rounds=2)))
    seen: list[dict] = []
    harness.run(seen.append)
    assert all(r["bytes_up"] < r["bytes_down"] for r in seen)
    assert all(0 < r["fedkd_upload_fraction"] < 1 for r in seen)
