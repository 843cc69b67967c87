"""Test-time personalization through the executor: client programs that turn a model into the
model a client is evaluated with, using the client's own train split.

The server side (``Algorithm``) has no client data, so an evaluation model that depends on it
(FedBABU's fine-tuning, Per-FedAvg's one-step adaptation, the ``--finetune-epochs`` protocol) is
computed like any local update: a ``ClientJob`` whose ``received`` is the model to start from
(``private`` empty) goes to ``executor.train`` with a *personalization program*, and the program
uploads the whole resulting model state, which is then evaluated. Nothing of this is communication
(no bytes are counted) and the client state store is not touched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pflbench.engine.algorithm import ClientProgram
from pflbench.engine.types import ClientJob, LocalPhase, NoHyperparameters, ParamLayout, Tensors

if TYPE_CHECKING:
    from pflbench.config.groups import LocalSpec
    from pflbench.engine.executor import Executor


class FineTuneProgram(ClientProgram[NoHyperparameters]):
    """``epochs`` epochs of the standard batch loop (cross-entropy, the run's local optimizer) over
    ``names`` (default: every trainable parameter), then the whole model state is uploaded.

    It uses only the default ``local_update``, so every executor that runs plain local training
    can run it."""

    def __init__(
        self, trainable: tuple[str, ...], local: LocalSpec, epochs: int, names: frozenset[str] | None = None
    ) -> None:
        layout = ParamLayout(trainable=tuple(trainable), shared=(), private=())
        super().__init__(layout, NoHyperparameters(), local)
        self.epochs = epochs
        self.names = frozenset(trainable) if names is None else frozenset(names)

    def local_phases(self, client_id: int) -> list[LocalPhase]:
        return [LocalPhase(self.epochs, self.names)]

    def upload(self, state: Tensors, received: Tensors) -> Tensors:
        """The tuned model: every tensor the job received (the full evaluation state)."""
        return {name: state[name].detach().clone() for name in received}

    def private_state(self, state: Tensors, job_private: Tensors) -> Tensors:
        return {}


def personalize(
    executor: Executor,
    program: ClientProgram,
    states: Sequence[Tensors],
    client_ids: Sequence[int],
    seeds: Sequence[int],
    round_index: int,
) -> list[Tensors]:
    """Run ``program`` on each client's train split starting from ``states[i]``; returns the
    uploaded (personalized) states, in order."""
    jobs = [ClientJob(k, round_index, seed, state, {}) for k, state, seed in zip(client_ids, states, seeds)]
    return [update.params for update in executor.train(program, jobs)]
