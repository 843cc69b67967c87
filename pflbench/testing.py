"""Helpers for testing algorithms (built-in and plugins): drive a prepared run by hand.

``Harness(prepare(config))`` gives the algorithm, its executor and the round loop behind one
object: train one client, run all rounds, load a client's or the global model into the working
model, and see what travelled (``TrafficObserver``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from pflbench.engine import ClientJob, ClientUpdate, Federation, Observer, Tensors, load_into
from pflbench.engine.observers import RoundCallback
from pflbench.util.seeding import derive_seed

# Settings an algorithm needs beyond the shared ones in the tests' tiny runs: FedBN keeps BatchNorm
# layers local (the mlp has none, which it refuses); SCAFFOLD's correction is defined for plain SGD
# only; FedNova's a_k counts SGD steps (it refuses Adam).
ALGORITHM_OVERRIDES: dict[str, dict[str, Any]] = {
    "fedbn": {"model": "cnn_bn"},
    "scaffold": {"optimizer": "sgd", "lr": 0.1},
    "fednova": {"optimizer": "sgd", "lr": 0.1},
}


class TrafficObserver(Observer):
    """Records the keys each client received and uploaded."""

    def __init__(self) -> None:
        self.received: list[set[str]] = []
        self.uploaded: list[set[str]] = []

    def on_client_update(self, job: ClientJob, update: ClientUpdate) -> None:
        self.received.append(set(job.received))
        self.uploaded.append(set(update.params))


class Harness:
    """A prepared run (``runs.prepare.prepare``) opened up for tests."""

    def __init__(self, prepared: Any) -> None:
        self.prepared = prepared
        self.algorithm = prepared.algorithm
        self.executor = prepared.executor
        partition = prepared.partition
        self.federation = Federation(
            self.algorithm,
            self.executor,
            prepared.data.num_test,
            prepared.config.federation_spec,
            num_val=prepared.data.num_val if partition.has_val else None,
            new_clients=partition.new_clients,
            num_ood=len(partition.ood),
            num_backdoor=prepared.data.num_backdoor,
        )
        self.observers = self.federation.observers

    # what tests read
    @property
    def model(self) -> torch.nn.Module:
        return self.executor.model

    @property
    def data(self) -> Any:
        return self.prepared.data

    @property
    def state(self) -> Tensors:
        """The working model's live tensors (parameters and buffers)."""
        return self.executor.tensors

    @property
    def parameters(self) -> dict[str, torch.nn.Parameter]:
        return dict(self.model.named_parameters())

    @property
    def program(self) -> Any:
        return self.algorithm.program

    @property
    def shared_names(self) -> list[str]:
        return list(self.algorithm.layout.shared)

    @property
    def private_names(self) -> list[str]:
        return list(self.algorithm.layout.private)

    @property
    def trainable_names(self) -> list[str]:
        return list(self.algorithm.layout.trainable)

    def __getattr__(self, name: str) -> Any:  # global_state, store, broadcast, aggregate, ranks, ...
        return getattr(self.algorithm, name)

    # what tests do
    def train_client(self, client_id: int, received: Tensors, round_index: int = 1) -> ClientUpdate:
        """One client's local training through the executor; its private state is stored."""
        job = ClientJob(
            client_id,
            round_index,
            derive_seed(self.algorithm.config.seed, "train", round_index, client_id),
            received,
            self.algorithm.store.get(client_id),
        )
        (update,) = self.executor.train(self.algorithm.program, [job])
        if update.private:
            self.algorithm.store.put(client_id, update.private)
        return update

    def run(self, on_round: Callable[[dict[str, Any]], None] | None = None) -> np.ndarray:
        if on_round is not None:
            self.observers.append(RoundCallback(on_round))
        return self.federation.run()

    def evaluate(self) -> tuple[dict[str, Any], np.ndarray]:
        return self.federation.evaluate()

    def sample_clients(self) -> list[int]:
        return self.federation.sample_clients()

    def load_client(self, client_id: int, received: Tensors) -> None:
        assembled = self.algorithm.program.assemble(received, self.algorithm.store.get(client_id))
        load_into(self.state, self.algorithm.model_state(assembled))

    def load_global_model(self) -> None:
        load_into(self.state, self.algorithm.global_model())

    def load_personal_model(self, client_id: int) -> None:
        load_into(self.state, self.algorithm.personal_model(client_id))

    def forward(self, params: Tensors, inputs: torch.Tensor) -> torch.Tensor:
        return self.model(inputs)

    def watch_traffic(self) -> TrafficObserver:
        observer = TrafficObserver()
        self.observers.append(observer)
        return observer
