"""Streaming aggregation: FedAvg-style rounds fold each upload in as it arrives, bit-identical
to averaging the list of uploads, and the round keeps no uploads."""

from __future__ import annotations

import torch

from pflbench.config.run_config import RunConfig
from pflbench.engine import Observer, sample_weights, weighted_average
from pflbench.engine.federation import federation_of
from pflbench.runs.prepare import prepare


class Uploads(Observer):
    def __init__(self) -> None:
        self.updates = []

    def on_client_update(self, job, update) -> None:
        self.updates.append(update)


def test_streamed_average_is_bit_identical_and_uploads_are_not_held(tmp_path) -> None:
    prepared = prepare(
        RunConfig(algo="fedper", dataset="digits", model="mlp", num_clients=5, rounds=1, out=str(tmp_path))
    )
    algorithm = prepared.algorithm
    assert algorithm.streaming_aggregate([1]) is not None
    seen = Uploads()
    federation = federation_of(prepared, [seen])
    kept = federation.train_round(1, federation.sample_clients())
    assert all(not update.params for update in kept) and len(seen.updates) == 5
    expected = weighted_average([u.params for u in seen.updates], sample_weights(seen.updates))
    for name, value in expected.items():
        assert torch.equal(algorithm.global_state[name], value), name


def test_algorithms_with_their_own_rule_get_the_whole_list(tmp_path) -> None:
    prepared = prepare(
        RunConfig(
            algo="fedsdg",
            dataset="digits",
            model="mlp",
            num_clients=3,
            rounds=1,
            lora_targets="fc1,fc2",
            backbone="random",
            out=str(tmp_path),
        )
    )
    assert prepared.algorithm.streaming_aggregate([1, 2, 3]) is None
