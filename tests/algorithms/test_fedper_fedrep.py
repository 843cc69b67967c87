"""FedPer / FedRep: the head stays on the client, frozen parts do not move, the server
averages only the body, and heads persist across rounds a client sits out."""

from __future__ import annotations

import pytest
import torch

from pflbench.config.run_config import RunConfig
from pflbench.models.zoo import build_model, head_parameter_names
from pflbench.runs.prepare import prepare
from pflbench.testing import Harness

HEAD = {"fc3.weight", "fc3.bias"}  # the mlp's classifier


def server_for(algo: str, **overrides):
    settings = dict(algo=algo, dataset="digits", model="mlp", num_clients=4, rounds=2, lr=0.05, out="unused")
    settings.update(overrides)
    algo_options = settings.pop("algo_options", {})
    return Harness(prepare(RunConfig(**settings), algo_options))


@pytest.mark.parametrize(
    "model, head",
    [("mlp", {"fc3.weight", "fc3.bias"}), ("cnn", {"fc3.weight", "fc3.bias"}), ("lenet", {"fc3.weight", "fc3.bias"})],
)
def test_models_declare_their_head(model: str, head: set[str]) -> None:
    assert head_parameter_names(build_model(model, (1, 8, 8), 10)) == head
    two = head_parameter_names(build_model(model, (1, 8, 8), 10), head_layers=2)
    assert two == head | {"fc2.weight", "fc2.bias"}


def test_timm_models_declare_their_head() -> None:
    vit = build_model("vit_tiny_patch16_224", (3, 32, 32), 10, patch_size=8, depth=2)
    assert head_parameter_names(vit) == {"head.weight", "head.bias"}
    assert "norm.weight" in head_parameter_names(vit, head_layers=2)


@pytest.mark.parametrize("algo", ["fedper", "fedrep"])
def test_head_never_leaves_the_client(algo: str, record_traffic) -> None:
    server = server_for(algo)
    assert set(server.private_names) == HEAD
    assert not HEAD & set(server.global_state)
    sent, uploaded = record_traffic(server)
    records = []
    server.run(records.append)
    body = set(server.shared_names)
    assert sent and all(keys == body for keys in sent) and all(keys == body for keys in uploaded)
    body_bytes = sum(server.state[n].numel() * 4 for n in body)
    assert records[0]["bytes_up"] == records[0]["bytes_down"] == 4 * body_bytes
    assert all(r["global_acc"] is None for r in records)


def test_server_average_covers_only_the_body() -> None:
    server = server_for("fedper", rounds=1)
    head_before = {n: server.store.get(0)[n].clone() for n in HEAD}
    server.run()
    assert set(server.global_state) == set(server.shared_names)
    # The initial head (for never-sampled clients) is untouched by aggregation.
    assert all(torch.equal(server.store.initial[n], head_before[n]) for n in HEAD)
    # Clients' heads differ from each other after local training: no averaging happened.
    assert not torch.equal(server.store.get(0)["fc3.weight"], server.store.get(1)["fc3.weight"])


def _snapshot(server, names):
    return {n: server.state[n].detach().clone() for n in names}


def test_fedrep_head_phase_leaves_body_bit_identical() -> None:
    """Only the head phase runs (local_epochs=0); momentum and weight decay are on."""
    server = server_for("fedrep", local_epochs=0, momentum=0.9, weight_decay=0.01, algo_options={"head_epochs": 2})
    received = {n: t.clone() for n, t in server.global_state.items()}
    update = server.train_client(0, received, 1)
    for name in server.shared_names:
        assert torch.equal(update.params[name], received[name]), name
    assert not torch.equal(server.store.get(0)["fc3.weight"], server.store.initial["fc3.weight"])


def test_fedrep_body_phase_leaves_head_bit_identical() -> None:
    server = server_for("fedrep", momentum=0.9, weight_decay=0.01, algo_options={"head_epochs": 0})
    update = server.train_client(0, server.global_state, 1)
    for name in HEAD:
        assert torch.equal(server.store.get(0)[name], server.store.initial[name]), name
    assert any(not torch.equal(update.params[n], server.global_state[n]) for n in server.shared_names)


def test_fedrep_phases_in_order_head_then_body() -> None:
    server = server_for("fedrep", local_epochs=3, algo_options={"head_epochs": 5})
    phases = server.program.local_phases(0)
    assert [p.epochs for p in phases] == [5, 3]
    assert phases[0].trainable == frozenset(HEAD)
    assert phases[1].trainable == frozenset(server.shared_names)


@pytest.mark.parametrize("algo", ["fedper", "fedrep"])
def test_head_persists_across_rounds_the_client_sits_out(algo: str) -> None:
    server = server_for(algo, num_clients=4, frac=0.25, rounds=6)
    seen: dict[int, dict[str, torch.Tensor]] = {}
    history = []

    def after_round(record):
        (client,) = record["clients"]
        history.append(
            (client, {k: {n: t.clone() for n, t in server.store.get(k).items()} for k in range(4) if k in server.store})
        )

    server.run(after_round)
    for round_index, (client, heads) in enumerate(history[1:], start=1):
        previous = history[round_index - 1][1]
        for k, head in heads.items():
            if k != client and k in previous:
                assert all(torch.equal(head[n], previous[k][n]) for n in HEAD)
                seen[k] = head
    assert seen, "some client must sit out a round after being trained"


def test_personal_evaluation_uses_own_head() -> None:
    """A client's accuracy is computed with the global body and its own stored head."""
    server = server_for("fedper", rounds=1)
    server.run()
    server.load_personal_model(2)
    for name in HEAD:
        assert torch.equal(server.state[name], server.store.get(2)[name])
    for name in server.shared_names:
        assert torch.equal(server.state[name], server.global_state[name])
