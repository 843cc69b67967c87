"""Test-time personalization through the executor: client programs that turn a model into the
model a client is evaluated with, using the client's own train split.

The server side (``Algorithm``) has no client data, so an evaluation model that depends on it
(FedBABU's fine-tuning, Per-FedAvg's one-step adaptation, the ``--finetune-epochs`` protocol) is
computed like any local update: a ``ClientJob`` whose ``received`` is the model to start from
(``private`` empty) goes to ``executor.train`` with a *personalization program*, and the program
uploads the whole resulting model state, which is then evaluated. Nothing of this is communication
(no bytes are counted) and the client state store is not touched. The standard such program,
``FineTuneProgram``, lives beside ``ClientProgram`` (``engine.algorithm``): ``Algorithm``'s
default adaptation of a new client (``new_client_program``) is one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pflbench.engine.algorithm import ClientProgram
from pflbench.engine.types import ClientJob, Tensors

if TYPE_CHECKING:
    from pflbench.engine.executor import Executor


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
