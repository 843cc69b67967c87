"""Helpers for testing algorithms (built-in and plugins): drive a prepared run by hand.

``Harness(prepare(config))`` gives the algorithm, its executor and the round loop behind one
object: train one client, run all rounds, load a client's or the global model into the working
model, and see what travelled (``TrafficObserver``)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pflbench.config.run_config import RunConfig
from pflbench.data.dataset import FederatedData, TensorDataset
from pflbench.engine import ClientJob, ClientUpdate, Observer, Tensors, load_into
from pflbench.engine.federation import federation_of
from pflbench.engine.observer_hooks import install
from pflbench.engine.observers import RoundCallback
from pflbench.models.zoo import MLP
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
        self.federation = federation_of(prepared)
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
            sample_privacy=self.federation.sample_privacy,  # --dp sample: as the round loop gives it
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
        """The training clients' metrics (``pers_acc``, ``global_acc``, ...) and each client's ``pers_acc``."""
        metrics, columns = self.federation.evaluator.evaluate_clients()
        return metrics, columns["pers_acc"]

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


# ---- tiny pieces for hand-computed tests ----------------------------------------------------------
# What ``RunConfig(algo=..., **RESOLVED)`` needs for an algorithm built by hand around ``tiny_model()``.
RESOLVED: dict[str, Any] = {"lr": 0.1, "optimizer": "sgd", "max_grad_norm": 0.0, "public_frac": 0.0, "model": "mlp"}


def tiny_data(samples: int = 12, features: int = 4, classes: int = 3) -> FederatedData:
    """One client holding every sample for training and testing: seeded random features, labels
    ``0, 1, ..., classes - 1`` in turn."""
    generator = torch.Generator().manual_seed(0)
    dataset = TensorDataset(
        torch.randn(samples, features, generator=generator), torch.arange(samples) % classes, classes, "test"
    )
    everyone = np.arange(samples)
    return FederatedData(dataset, [everyone], [everyone], torch.device("cpu"))


def tiny_model() -> MLP:
    """A 4 → 5 → 3 MLP drawn after ``torch.manual_seed(0)`` (the same weights on every call)."""
    torch.manual_seed(0)
    return MLP((4,), 3, hidden=5)


def tiny_run(algo: str, out: Path, **settings: Any) -> RunConfig:
    """One round of ``algo`` on digits with an MLP, 3 clients, Adam at lr 0.01, written under ``out``."""
    return RunConfig(
        algo=algo,
        dataset="digits",
        model="mlp",
        num_clients=3,
        rounds=1,
        optimizer="adam",
        lr=0.01,
        out=str(out),
        **settings,
    )


# ---- kill and resume ------------------------------------------------------------------------------
class KillAfterRound(Observer):
    """SIGKILL this process once round ``round_index`` is written (and checkpointed)."""

    def __init__(self, round_index: int) -> None:
        self.round = round_index

    def on_round_end(self, record: dict[str, Any]) -> None:
        if record["round"] == self.round:
            os.kill(os.getpid(), signal.SIGKILL)


def kill_after_round(round_index: int) -> None:
    """Make every later run of this process SIGKILL it after round ``round_index`` (installed
    as the runs' last observer: ``engine.observer_hooks``). For a forked or fresh process only
    (a test's child, ``python -c``): the process dies."""
    install(lambda: KillAfterRound(round_index))


def killed_after_round(after_round: int, run: Callable[[], object]) -> None:
    """Call ``run()`` (a run, a sweep, a CLI invoke) in a forked child that SIGKILLs itself after
    round ``after_round`` (``kill_after_round``); fail unless it died so."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            torch.set_num_threads(1)
            kill_after_round(after_round)
            run()
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"wait status {status}"


def killed_and_resumed(
    run: Callable[..., dict[str, Any]], config: Callable[[Path], Any], folder: Path, after_round: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``run(config(folder / "killed"))`` SIGKILLed after round ``after_round`` (see
    ``killed_after_round``) and resumed (``resume=True``), then ``run(config(folder / "whole"))``
    uninterrupted: the two summaries, (resumed, whole). ``run`` is ``pflbench.runs.api.run_experiment``
    or a wrapper of it (this module sits beside ``pflbench.runs`` and does not import it)."""
    killed_after_round(after_round, lambda: run(config(folder / "killed")))
    resumed = run(config(folder / "killed"), resume=True)
    return resumed, run(config(folder / "whole"))


ROUND_TIMINGS = ("round_time_s", "eval_time_s", "peak_mem_mb")


@contextlib.contextmanager
def local_ray(num_cpus: int = 2) -> Iterator[None]:
    """A local Ray instance for a test's ``--executor ray`` runs: started here unless one is
    running (then left running), the executor's actor pool released at the end. Needs the ``ray``
    extra: ``pytest.importorskip("ray")`` first."""
    import ray

    from pflbench.engine import ray_executor

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=num_cpus, include_dashboard=False, logging_level=logging.WARNING)
    try:
        yield
    finally:
        ray_executor.release_pool()
        if started:
            ray.shutdown()


def round_numbers(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The records of a finished run's ``rounds.jsonl`` (its folder is ``summary["run_dir"]``) less
    the timings (``ROUND_TIMINGS``): what a resumed run and an uninterrupted one must share."""
    lines = (Path(summary["run_dir"]) / "rounds.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in ROUND_TIMINGS} for line in lines]


# ---- CLI refusals ---------------------------------------------------------------------------------
def assert_refused(result: Any, out: Path, expected: str) -> None:
    """A ``CliRunner`` result of bad input: exit code 2, one output line (``Error: ...``) that
    contains ``expected``, and nothing written under ``out``."""
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and expected in lines[0], result.output
    assert not out.exists(), f"{out} was written"
