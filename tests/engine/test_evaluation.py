"""Evaluation of private heads runs the shared body once: identical per-client counts to
evaluating every client's whole model, and a fallback where the model cannot be split."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pflbench.config.run_config import RunConfig
from pflbench.engine import EvalJob
from pflbench.engine.evaluation import evaluate_heads, head_split
from pflbench.engine.vmap import VmapExecutor
from pflbench.models.zoo import body_stages, build_model
from pflbench.runs.execute import execute
from pflbench.runs.prepare import prepare


def per_client_counts(prepared) -> np.ndarray:
    """Today's evaluation: each client's whole model on its own test split."""
    algorithm, executor = prepared.algorithm, prepared.executor
    jobs = [EvalJob(algorithm.personal_model(k), (k,)) for k in range(prepared.config.num_clients)]
    return np.concatenate(executor.evaluate(algorithm.program, jobs))


@pytest.mark.parametrize(
    "algo, model, head_layers", [("fedper", "cnn", 1), ("fedrep", "mlp", 2), ("fedper", "cnn_bn", 1)]
)
def test_head_split_counts_equal_per_client_evaluation(algo, model, head_layers, tmp_path) -> None:
    config = RunConfig(
        algo=algo,
        dataset="digits",
        model=model,
        num_clients=6,
        rounds=1,
        alpha=0.3,
        head_layers=head_layers,
        out=str(tmp_path),
        lr=0.05,
    )
    prepared = prepare(config, {"head_epochs": 1} if algo == "fedrep" else {})
    execute(prepared)
    algorithm, executor = prepared.algorithm, prepared.executor
    states = [algorithm.personal_model(k) for k in range(config.num_clients)]
    split = head_split(executor.model, states)
    assert split is not None and split.body == len(executor.model.layer_names) - head_layers
    heads = executor.evaluate_split(algorithm.program, states)
    np.testing.assert_array_equal(heads, per_client_counts(prepared))


def test_no_split_when_everything_is_private_or_the_model_has_no_stages(tmp_path) -> None:
    config = RunConfig(algo="local", dataset="digits", model="mlp", num_clients=3, rounds=1, out=str(tmp_path))
    prepared = prepare(config)
    execute(prepared)
    states = [prepared.algorithm.personal_model(k) for k in range(3)]
    assert head_split(prepared.executor.model, states) is None  # the body would be empty
    vectorized = VmapExecutor(prepared.executor.model, prepared.data)  # personal models together
    vectorized.evaluate_together = True  # the GPU default, here on the CPU
    jobs = [EvalJob(state, (k,)) for k, state in enumerate(states)]
    np.testing.assert_array_equal(
        np.concatenate(vectorized.evaluate(prepared.algorithm.program, jobs)), per_client_counts(prepared)
    )
    plain = torch.nn.Sequential(torch.nn.Linear(4, 3))
    assert body_stages(plain, ["0.weight"]) is None


@pytest.mark.parametrize(
    "name, shape",
    [("mlp", (1, 8, 8)), ("cnn", (1, 8, 8)), ("lenet", (3, 32, 32)), ("cnn_bn", (1, 8, 8)), ("char_lstm", (5,))],
)
def test_stages_compose_to_forward(name: str, shape: tuple) -> None:
    torch.manual_seed(0)
    model = build_model(name, shape, 10).eval()
    x = torch.randint(0, 10, (4, *shape)).float()
    split = len(model.layer_names) - 1
    with torch.no_grad():
        torch.testing.assert_close(model.run_stages(model.run_stages(x, 0, split), split), model(x), rtol=0, atol=0)


class Doubled(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * x


def test_models_without_stages_split_at_the_head_module_only_if_it_ends_the_forward(tmp_path) -> None:
    prepared = prepare(
        RunConfig(algo="fedper", dataset="digits", model="mlp", num_clients=4, rounds=1, out=str(tmp_path))
    )
    data = prepared.data
    torch.manual_seed(0)
    for tail in ((), (Doubled(),)):
        model = torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(64, 16), torch.nn.ReLU(), torch.nn.Linear(16, 10), *tail
        ).eval()
        tensors = dict(model.named_parameters())
        common = {n: t.detach().clone() for n, t in tensors.items()}
        states = [{**common, "3.weight": torch.randn(10, 16), "3.bias": torch.randn(10)} for _ in range(4)]
        split = head_split(model, states)
        assert split is not None and split.module == "3"
        counts = evaluate_heads(model, tensors, data, split)
        if tail:
            assert counts is None  # the head module's output is not the model's output
            continue
        expected = []
        with torch.no_grad():
            for k, state in enumerate(states):
                inputs, targets = data.gather(data.test_indices[k])
                logits = torch.func.functional_call(model, state, (inputs,))
                expected.append(int((logits.argmax(dim=1) == targets).sum()))
        np.testing.assert_array_equal(counts, expected)
