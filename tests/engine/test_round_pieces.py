"""Hand-checked engine pieces: FedAvg weighting, the proximal term, the client-state store."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pflbench.algorithms.fedprox import proximal_term
from pflbench.config.run_config import RunConfig
from pflbench.engine import ClientStateStore, ClientUpdate, tensor_bytes, weighted_average
from pflbench.registry import ALGORITHMS
from pflbench.runs.prepare import prepare
from pflbench.testing import Harness


def test_weighted_average_hand_computed() -> None:
    updates = [
        {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor(3.0)},
        {"w": torch.tensor([4.0, 8.0]), "b": torch.tensor(-1.0)},
    ]
    average = weighted_average(updates, [0.25, 0.75])
    assert torch.allclose(average["w"], torch.tensor([3.25, 6.5]))
    assert torch.allclose(average["b"], torch.tensor(0.0))


def test_fedavg_aggregate_weights_by_samples() -> None:
    """Clients with 10 and 30 samples: w = (10·w1 + 30·w2) / 40."""
    config = RunConfig(algo="fedavg", model="mlp", num_clients=3, rounds=1, out="unused")
    server = Harness(prepare(config))
    name = server.shared_names[0]
    shape = server.global_state[name].shape
    ones, threes = torch.ones(shape), torch.full(shape, 3.0)
    updates = [
        ClientUpdate(0, 10, {n: torch.ones_like(t) for n, t in server.global_state.items()}, {}),
        ClientUpdate(1, 30, {n: torch.full_like(t, 3.0) for n, t in server.global_state.items()}, {}),
    ]
    server.aggregate(updates)
    expected = (10 * ones + 30 * threes) / 40  # = 2.5
    assert torch.allclose(server.global_state[name], expected)
    assert torch.allclose(server.global_state[name], torch.full(shape, 2.5))


def test_proximal_term_hand_computed() -> None:
    """(μ/2)·‖w − w_t‖² with μ = 0.1: diffs (1, 2) and (2) → 0.05 · (1 + 4 + 4) = 0.45."""
    params = {"a": torch.tensor([1.0, 3.0]), "b": torch.tensor([2.0])}
    anchor = {"a": torch.tensor([0.0, 1.0]), "b": torch.tensor([0.0])}
    assert proximal_term(params, anchor, 0.1).item() == pytest.approx(0.45)


def test_proximal_term_gradient_is_mu_times_difference() -> None:
    params = {"a": torch.tensor([1.0, 3.0], requires_grad=True)}
    anchor = {"a": torch.tensor([0.0, 1.0])}
    proximal_term(params, anchor, 0.5).backward()
    assert torch.allclose(params["a"].grad, torch.tensor([0.5, 1.0]))


def test_fedprox_loss_adds_exactly_the_proximal_term() -> None:
    config = RunConfig(algo="fedprox", model="mlp", num_clients=3, rounds=1, out="unused")
    server = Harness(prepare(config, {"mu": 0.2}))
    received = {n: t + 0.5 for n, t in server.global_state.items()}
    inputs, targets = server.data.gather(server.data.train_indices[0][:8])
    terms = server.program.loss_terms(server.forward, server.parameters, inputs, targets, received)
    numel = sum(t.numel() for t in received.values())
    assert terms["proximal"].item() == pytest.approx(0.1 * 0.25 * numel, rel=1e-5)
    plain = torch.nn.functional.cross_entropy(server.model(inputs), targets)
    assert terms["task"].item() == pytest.approx(plain.item(), rel=1e-6)


def test_client_state_store_keeps_each_clients_state() -> None:
    initial = {"head": torch.zeros(2)}
    store = ClientStateStore(initial)
    assert store.get(3) is initial and 3 not in store
    store.put(3, {"head": torch.tensor([1.0, 2.0])})
    assert torch.equal(store.get(3)["head"], torch.tensor([1.0, 2.0]))
    assert torch.equal(store.get(4)["head"], torch.zeros(2)) and store.clients() == [3]
    assert store.nbytes() == 8


def test_private_state_returned_by_the_executor_does_not_alias_the_working_model() -> None:
    server = Harness(prepare(RunConfig(algo="fedper", model="mlp", num_clients=3, rounds=1, out="unused")))
    update = server.train_client(0, server.global_state)
    before = {n: t.clone() for n, t in update.private.items()}
    server.train_client(1, server.global_state)  # overwrites the working model
    assert all(torch.equal(update.private[n], before[n]) for n in before)
    assert all(not torch.equal(server.store.get(0)[n], server.store.get(1)[n]) for n in before)


def test_tensor_bytes_counts_numel_times_element_size() -> None:
    assert tensor_bytes({"a": torch.zeros(3, 4), "b": torch.zeros(5, dtype=torch.float16)}) == 48 + 10


def test_bytes_are_counted_from_the_tensors_sent() -> None:
    config = RunConfig(algo="fedavg", model="mlp", num_clients=4, frac=0.5, rounds=2, out="unused")
    prepared = prepare(config)
    records = []
    Harness(prepared).run(records.append)
    model_bytes = sum(p.numel() * 4 for p in Harness(prepared).model.parameters())
    for record in records:
        assert record["bytes_up"] == record["bytes_down"] == 2 * model_bytes
    assert records[-1]["bytes_up_cum"] == 4 * model_bytes


def test_same_seed_gives_same_client_sequence_for_every_algorithm() -> None:
    sequences = {}
    builtin = [a for a in ALGORITHMS.names() if ALGORITHMS.get(a).__module__.startswith("pflbench.algorithms.")]
    for algo in builtin:  # (plugins loaded by other tests' --plugin stay registered in this process)
        config = RunConfig(
            algo=algo,
            model="cnn_bn" if algo == "fedbn" else "mlp",
            num_clients=10,
            frac=0.3,
            rounds=1,
            out="unused",
            lora_targets="fc1,fc2",
            backbone="random",
            optimizer="sgd" if algo == "scaffold" else None,
        )  # LoRA algorithms: the mlp's body
        server = Harness(prepare(config))
        sequences[algo] = [server.sample_clients() for _ in range(5)]
    first = next(iter(sequences.values()))
    assert all(seq == first for seq in sequences.values())
    assert all(len(s) == 3 for s in first) and len({tuple(s) for s in first}) > 1


def test_local_phase_freezing_and_restores_requires_grad() -> None:
    config = RunConfig(algo="fedavg", model="mlp", num_clients=3, rounds=1, out="unused")
    server = Harness(prepare(config))
    assert all(server.parameters[n].requires_grad for n in server.trainable_names)
    server.train_client(0, server.global_state, 1)
    assert all(server.parameters[n].requires_grad for n in server.trainable_names)


def test_optimizer_is_data_and_builds_the_described_optimizer() -> None:
    from pflbench.engine import OptimizerSpec, ParamGroup, build_optimizer
    from pflbench.engine.optim import SGD, Adam

    params = {"a": torch.nn.Parameter(torch.zeros(2)), "b": torch.nn.Parameter(torch.zeros(3))}
    sgd = build_optimizer(OptimizerSpec("sgd", lr=0.1, momentum=0.9, weight_decay=0.01), params)
    assert isinstance(sgd, SGD) and sgd.momentum == 0.9 and sgd.weight_decay == 0.01
    adam = build_optimizer(OptimizerSpec("adam", lr=0.1, groups=(ParamGroup(frozenset({"b"}), 0.5),)), params)
    assert isinstance(adam, Adam) and [g["lr"] for g in adam.param_groups] == [0.1, 0.5]
    assert adam.param_groups[1]["params"][0] is params["b"]
    import pickle

    assert pickle.loads(pickle.dumps(OptimizerSpec("adam", lr=0.1))) == OptimizerSpec("adam", lr=0.1)


@pytest.mark.parametrize(
    "spec",
    [
        dict(kind="sgd", lr=0.1),
        dict(kind="sgd", lr=0.1, momentum=0.9, weight_decay=0.01),
        dict(kind="sgd", lr=0.05, momentum=0.5, group_lr=0.5),
        dict(kind="adam", lr=0.01),
        dict(kind="adam", lr=0.01, betas=(0.8, 0.99), weight_decay=0.001, group_lr=0.1),
    ],
    ids=["sgd", "sgd-momentum-wd", "sgd-groups", "adam", "adam-wd-groups"],
)
def test_local_optimizers_are_bit_identical_to_torch_optim(spec) -> None:
    """Our SGD/Adam replace torch.optim (no torch._dynamo import): same bits after 6 steps, with
    a parameter group, weight decay, and a parameter without a gradient in some steps."""
    from pflbench.engine import OptimizerSpec, ParamGroup, build_optimizer

    group_lr = spec.pop("group_lr", None)
    groups = (ParamGroup(frozenset({"b"}), group_lr),) if group_lr else ()
    generator = torch.Generator().manual_seed(0)
    start = {n: torch.randn(shape, generator=generator) for n, shape in (("a", (4, 3)), ("b", (3,)), ("c", (2,)))}
    ours = {n: torch.nn.Parameter(t.clone()) for n, t in start.items()}
    theirs = {n: torch.nn.Parameter(t.clone()) for n, t in start.items()}
    optimizer = build_optimizer(OptimizerSpec(**spec, groups=groups), ours)
    arguments = {k: v for k, v in spec.items() if k in ("lr", "momentum", "weight_decay", "betas")}
    rest = [theirs[n] for n in ("a", "c")] if groups else list(theirs.values())
    param_groups = [{"params": rest}] + ([{"params": [theirs["b"]], "lr": group_lr}] if groups else [])
    reference = (torch.optim.Adam if spec["kind"] == "adam" else torch.optim.SGD)(param_groups, **arguments)
    for step in range(6):
        gradients = {n: torch.randn(t.shape, generator=generator) for n, t in start.items()}
        for params, opt in ((ours, optimizer), (theirs, reference)):
            opt.zero_grad(set_to_none=True)
            for n, p in params.items():
                p.grad = None if (n == "c" and step in (1, 2)) else gradients[n].clone()
            opt.step()
    for n in start:
        assert torch.equal(ours[n], theirs[n]), n


def test_client_program_is_picklable_and_has_no_server_reference() -> None:
    import pickle

    for algo in ("fedavg", "fedprox", "fedrep"):
        server = Harness(prepare(RunConfig(algo=algo, model="mlp", num_clients=3, rounds=1, out="unused")))
        program = pickle.loads(pickle.dumps(server.program))
        assert program.layout == server.algorithm.layout
        assert not any(hasattr(value, "global_state") for value in vars(program).values())


def test_config_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        RunConfig().rounds = 3  # type: ignore[misc]


def test_inert_settings_do_not_change_the_run_identity() -> None:
    """Defect: every field was hashed, so inert options split run folders and leaderboard rows."""
    from pflbench.algorithms.fedavg import FedAvg
    from pflbench.algorithms.fedper import FedPer
    from pflbench.config.identity import run_name
    from pflbench.config.run_config import resolve

    def name(algorithm=FedAvg, **settings):
        config, _ = resolve(RunConfig(**settings), algorithm, algorithm.hyperparameters())
        return run_name(config, algorithm, algorithm.hyperparameters())

    plain = name()
    assert name(shards_per_client=5) == name(lora_alpha=32.0) == name(head_layers=2) == plain
    assert name(optimizer="adam", momentum=0.9) == name(optimizer="adam")  # momentum is SGD's
    assert name(out="elsewhere") == plain
    assert name(lr=0.02) != plain and name(seed=1) != plain and name(alpha=0.1) != plain
    assert name(partition="shards", shards_per_client=5) != name(partition="shards")
    assert name(FedPer, head_layers=2) != name(FedPer)  # FedPer reads --head-layers
    default_lr, _ = resolve(RunConfig(), FedAvg, FedAvg.hyperparameters())
    assert name(lr=default_lr.lr) == plain  # the resolved default and the same value given explicitly


def test_head_layers_are_honoured_under_lora() -> None:
    """Defect: LoRA froze all but a 1-layer head, so FedPer's extra head layers dropped out."""
    config = RunConfig(
        algo="fedper",
        dataset="digits",
        model="mlp",
        num_clients=3,
        rounds=1,
        lora_rank=2,
        lora_targets="fc1",
        head_layers=2,
        backbone="random",
        out="unused",
    )
    server = Harness(prepare(config))
    assert set(server.private_names) == {"fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"}
    assert {"fc1.lora_A", "fc1.lora_B"} <= set(server.shared_names)
    assert all(server.parameters[n].requires_grad for n in server.private_names)
