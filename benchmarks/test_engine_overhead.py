"""Engine overhead: a pflbench round against a plain PyTorch loop doing the same local steps.

Run:  .venv/bin/pytest benchmarks/ --benchmark-enable -p no:randomly
Both sides train the same model on the same clients' data (same number of steps, same batch
size) for ROUNDS rounds with FedAvg averaging and one final evaluation.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pflbench.config.run_config import RunConfig
from pflbench.runs.prepare import prepare
from pflbench.testing import Harness

ROUNDS = 3
SETTINGS = dict(
    algo="fedavg",
    dataset="digits",
    model="cnn",
    num_clients=20,
    rounds=ROUNDS,
    eval_every=ROUNDS,
    batch_size=32,
    lr=0.01,
    alpha=0.5,
    out="unused",
)


def engine_rounds() -> None:
    Harness(prepare(RunConfig(**SETTINGS))).run()


def plain_rounds() -> None:
    """A tight hand-written loop: state_dict in, SGD steps, state_dict out, average, evaluate."""
    prepared = prepare(RunConfig(**SETTINGS))  # same data, same partition, same init
    data, model = prepared.data, prepared.executor.model
    global_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    generator = torch.Generator().manual_seed(0)
    for _ in range(ROUNDS):
        states, sizes = [], []
        for client in range(data.num_clients):
            model.load_state_dict(global_state)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            indices = data.train_indices[client]
            order = indices[torch.randperm(len(indices), generator=generator)]
            for start in range(0, len(order), 32):
                inputs, targets = data.gather(order[start : start + 32])
                loss = F.cross_entropy(model(inputs), targets)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
            sizes.append(len(indices))
        total = sum(sizes)
        global_state = {k: sum(s[k] * (n / total) for s, n in zip(states, sizes)) for k in global_state}
    model.load_state_dict(global_state)
    with torch.no_grad():
        for client in range(data.num_clients):
            inputs, targets = data.gather(data.test_indices[client])
            (model(inputs).argmax(1) == targets).float().mean()


@pytest.mark.parametrize("name", ["plain", "engine"])
def test_round_time(benchmark, name: str) -> None:
    function = {"plain": plain_rounds, "engine": engine_rounds}[name]
    function()  # warm the dataset cache and the allocator
    benchmark.pedantic(function, rounds=3, iterations=1)
