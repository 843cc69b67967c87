"""FlexLoRA: the pure aggregation/redistribution math, rank assignment, and heterogeneous rounds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from pflbench.algorithms.flexlora import (
    aggregate_lora_deltas,
    client_ranks,
    factored_svd,
    spectral_energy_kept,
    stack_lora_factors,
    svd_redistribute,
    truncate_factors,
)
from pflbench.config.run_config import RunConfig
from pflbench.engine import tensor_bytes
from pflbench.errors import ConfigError
from pflbench.runs.execute import execute
from pflbench.runs.prepare import prepare
from pflbench.testing import Harness
from pflbench.util.seeding import rng_stream

ALPHA = 16.0


def random_factors(ranks: list[int], out: int = 7, inp: int = 9, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(r, inp, generator=generator, dtype=torch.float64),
            torch.randn(out, r, generator=generator, dtype=torch.float64),
            ALPHA / r,
        )
        for r in ranks
    ]


def truncated_svd(matrix: np.ndarray, rank: int) -> np.ndarray:
    U, S, Vt = np.linalg.svd(matrix, full_matrices=False)
    return (U[:, :rank] * S[:rank]) @ Vt[:rank]


def test_aggregate_is_the_weighted_sum_of_full_size_deltas() -> None:
    factors = random_factors([2, 3, 5])
    weights = [0.5, 0.3, 0.2]
    expected = sum(w * s * (B @ A) for (A, B, s), w in zip(factors, weights))
    delta = aggregate_lora_deltas(factors, weights)
    assert delta.shape == (7, 9)
    assert torch.allclose(delta, expected)


@pytest.mark.parametrize("rank", [1, 2, 4, 6])
def test_redistribution_is_the_best_rank_r_approximation(rank: int) -> None:
    delta = aggregate_lora_deltas(random_factors([2, 3, 5]), [0.5, 0.3, 0.2])
    B, A = svd_redistribute(delta, rank, ALPHA)
    assert B.shape == (7, rank) and A.shape == (rank, 9)
    approximation = (ALPHA / rank) * (B @ A)
    assert np.allclose(approximation.numpy(), truncated_svd(delta.numpy(), rank))
    assert torch.allclose(A @ A.T, torch.eye(rank, dtype=A.dtype))  # A = Vᵀ[:r], orthonormal rows


def test_redistribution_is_exact_when_every_client_has_the_full_rank() -> None:
    factors = random_factors([7, 7, 7])  # full rank = min(out, in) = 7
    delta = aggregate_lora_deltas(factors, [0.2, 0.3, 0.5])
    B, A = svd_redistribute(delta, 7, ALPHA)
    assert torch.allclose((ALPHA / 7) * B @ A, delta)
    low_rank = aggregate_lora_deltas(random_factors([1, 2]), [0.5, 0.5])  # rank(ΔW) ≤ 3
    B, A = svd_redistribute(low_rank, 3, ALPHA)
    assert torch.allclose((ALPHA / 3) * B @ A, low_rank)


def test_truncating_the_largest_rank_factors_equals_redistributing_at_the_small_rank() -> None:
    delta = aggregate_lora_deltas(random_factors([3, 5]), [0.5, 0.5])
    B_max, A_max = svd_redistribute(delta, 6, ALPHA)
    for rank in (1, 2, 4):
        B, A = truncate_factors(B_max, A_max, rank)
        assert B.shape == (7, rank) and A.shape == (rank, 9)
        assert np.allclose(((ALPHA / rank) * B @ A).numpy(), truncated_svd(delta.numpy(), rank))


@pytest.mark.parametrize("ranks", [[1, 2], [2, 3, 5], [7, 7]])  # k = Σ r below, within, above min(out, in)
def test_factored_svd_equals_the_dense_svd_of_the_full_delta(ranks: list[int]) -> None:
    factors, weights = random_factors(ranks), [1 / len(ranks)] * len(ranks)
    U, S, Vh = factored_svd(*stack_lora_factors(factors, weights))
    delta = aggregate_lora_deltas(factors, weights)
    dense_S = torch.linalg.svdvals(delta)
    assert S.shape == (min(7, 9, sum(ranks)),)
    assert torch.allclose(S, dense_S[: len(S)]) and torch.allclose(dense_S[len(S) :], torch.zeros(1, dtype=S.dtype))
    assert torch.allclose((U * S) @ Vh, delta)
    assert torch.allclose(U.T @ U, torch.eye(len(S), dtype=U.dtype))


def test_spectral_energy_kept() -> None:
    S = torch.tensor([4.0, 3.0, 0.0])
    assert spectral_energy_kept(S, 1) == pytest.approx(16 / 25)
    assert spectral_energy_kept(S, 2) == pytest.approx(1.0)
    assert spectral_energy_kept(torch.zeros(3), 1) == 1.0


def test_rank_distributions() -> None:
    rng = lambda: rng_stream(0, "ranks")  # noqa: E731
    assert client_ranks("homo", [4, 8], 5, 8, rng()) == [8] * 5
    heavy = client_ranks("heavy-tail", [4, 8, 16, 32], 20, 8, rng())
    assert heavy.count(4) == 16 and sorted(r for r in heavy if r != 4) == [8, 8, 16, 32]
    assert heavy[:16] != [4] * 16  # the larger ranks go to random clients, not the last ones
    assert heavy == client_ranks("heavy-tail", [4, 8, 16, 32], 20, 8, rng())
    uniform = client_ranks("uniform", [4, 8, 16, 32], 200, 8, rng())
    assert set(uniform) == {4, 8, 16, 32}
    assert client_ranks("2,4,8", [4], 5, 8, rng()) == [2, 4, 8, 2, 4]


def flexlora_config(tmp_path: Path, **changes) -> RunConfig:
    settings = dict(
        algo="flexlora",
        dataset="digits",
        model="mlp",
        lora_targets="fc1,fc2",
        backbone="random",
        num_clients=3,
        rounds=1,
        optimizer="adam",
        lr=1e-2,
        out=str(tmp_path),
    )
    return RunConfig(**{**settings, **changes})


def test_heterogeneous_round_shapes_bytes_and_an_independent_svd_check(tmp_path: Path) -> None:
    server = Harness(prepare(flexlora_config(tmp_path), {"rank_dist": "2,4,8"}))
    assert server.ranks == [2, 4, 8] and server.max_rank == 8
    assert server.global_state["fc1.lora_A"].shape == (8, 64)
    updates = []
    for client, rank in enumerate(server.ranks):
        received = server.broadcast(client)
        assert received["fc1.lora_A"].shape == (rank, 64) and received["fc2.lora_B"].shape == (200, rank)
        update = server.train_client(client, received, 1)
        assert update.params["fc1.lora_A"].shape == (rank, 64) and update.params["fc1.lora_B"].shape == (200, rank)
        assert update.params["fc2.lora_A"].shape == (rank, 200) and update.params["fc3.weight"].shape == (10, 200)
        updates.append(update)
    server.aggregate(updates)
    total = sum(u.num_samples for u in updates)
    for name in ("fc1", "fc2"):
        delta = sum(
            (u.num_samples / total)
            * (ALPHA / r)
            * (u.params[f"{name}.lora_B"].double().numpy() @ u.params[f"{name}.lora_A"].double().numpy())
            for u, r in zip(updates, server.ranks)
        )
        for rank in (2, 4, 8):
            received = server.broadcast(server.ranks.index(rank))
            product = (ALPHA / rank) * received[f"{name}.lora_B"].double() @ received[f"{name}.lora_A"].double()
            assert np.allclose(product.numpy(), truncated_svd(delta, rank), atol=1e-5)
    head = sum((u.num_samples / total) * u.params["fc3.weight"] for u in updates)
    assert torch.allclose(server.global_state["fc3.weight"], head, atol=1e-6)
    assert server.round_diagnostics(updates)["ranks"] == [2, 4, 8]


def test_a_client_of_rank_r_never_holds_more_than_r_components(tmp_path: Path) -> None:
    server = Harness(prepare(flexlora_config(tmp_path), {"rank_dist": "2,8"}))
    updates = [server.train_client(k, server.broadcast(k), 1) for k in range(3)]
    server.aggregate(updates)
    layer = server.model.get_submodule("fc1")
    server.load_client(0, server.broadcast(0))
    assert layer.active_rank == 2
    assert layer.lora_A[2:].abs().sum() == 0 and layer.lora_B[:, 2:].abs().sum() == 0
    full_product = layer.lora_B.detach().double() @ layer.lora_A.detach().double()
    assert torch.linalg.matrix_rank(full_product) == 2
    x = torch.randn(4, 64)
    assert torch.allclose(layer(x), layer.merge()(x), atol=1e-5)
    server.load_global_model()
    full_product = layer.lora_B.detach().double() @ layer.lora_A.detach().double()
    assert layer.active_rank == 8 and torch.linalg.matrix_rank(full_product) == 8


def test_a_round_with_fewer_components_than_the_largest_rank(tmp_path: Path) -> None:
    server = Harness(prepare(flexlora_config(tmp_path), {"rank_dist": "2,8"}))
    update = server.train_client(0, server.broadcast(0), 1)  # one rank-2 client: k = 2 < R = 8
    server.aggregate([update])
    received = server.broadcast(1)
    assert received["fc1.lora_A"].shape == (8, 64)
    assert torch.allclose(received["fc1.lora_A"] @ received["fc1.lora_A"].T, torch.eye(8), atol=1e-5)
    delta = (ALPHA / 2) * update.params["fc1.lora_B"] @ update.params["fc1.lora_A"]
    assert torch.allclose((ALPHA / 8) * received["fc1.lora_B"] @ received["fc1.lora_A"], delta, atol=1e-6)


def test_run_records_ranks_energy_and_per_rank_bytes(tmp_path: Path) -> None:
    prepared = prepare(flexlora_config(tmp_path, rounds=2), {"rank_dist": "2,4,8"})
    summary = execute(prepared)
    folder = Path(summary["run_dir"])
    resolved = json.loads((folder / "config.json").read_text())["resolved"]
    assert resolved["client_ranks"] == [2, 4, 8] and resolved["lora_max_rank"] == 8
    record = json.loads((folder / "rounds.jsonl").read_text().splitlines()[-1])
    assert record["ranks"] == [2, 4, 8]
    assert 0 < record["energy_kept_r2"] <= record["energy_kept_r4"] <= record["energy_kept_r8"] <= 1 + 1e-9
    assert record["server_svd_time_s"] > 0
    server = Harness(prepared)
    sizes = {r: tensor_bytes(server.broadcast(server.ranks.index(r))) for r in (2, 4, 8)}
    assert sizes[2] < sizes[4] < sizes[8]
    assert record["bytes_down"] == record["bytes_up"] == sum(sizes.values())


def test_lora_rank_is_only_the_homo_rank(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--lora-rank is the rank of --rank-dist homo"):
        prepare(flexlora_config(tmp_path, lora_rank=4), {"rank_dist": "uniform"})
    assert Harness(prepare(flexlora_config(tmp_path, lora_rank=4), {"rank_dist": "homo"})).ranks == [4, 4, 4]
    with pytest.raises(ConfigError, match="--rank-set"):
        prepare(flexlora_config(tmp_path), {"rank_set": "4,x"})
