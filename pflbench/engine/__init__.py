"""The round engine: plugin contract, executors, the round loop and observers.

- ``types``: what crosses the executor seam (``ClientJob``, ``ClientUpdate``, ``OptimizerSpec``, ...)
- ``algorithm``: ``Algorithm`` (server-side hooks), ``ClientProgram`` (client-side hooks) and
  ``FineTuneProgram`` (train some parameters for some epochs, upload the whole model)
- ``capabilities``: what an algorithm's hooks do, declared (``Capabilities``,
  ``ProgramCapabilities``), and the one reader of the declarations (``refusal``)
- ``state``: ``ClientStateStore`` (each client's private tensors)
- ``local``: ``LocalTrainer`` (one client's model and data) and the default batch loop
- ``executor``: ``Executor`` protocol and ``SequentialExecutor``
- ``federation``: ``Federation``, the one round loop
- ``observers``: ``RunObserver`` (progress bar, writer, tests)
- ``personalize``: test-time personalization through the executor (``personalize``)
"""

from __future__ import annotations

from pflbench.engine.algorithm import Algorithm, ClientProgram, FineTuneProgram
from pflbench.engine.capabilities import Capabilities, ProgramCapabilities
from pflbench.engine.executor import EXECUTORS, Executor, SequentialExecutor
from pflbench.engine.federation import Diverged, Federation, mean_loss_terms
from pflbench.engine.local import (
    LocalResult,
    LocalTrainer,
    apply_gradients,
    build_optimizer,
    mean_terms,
    standard_local_update,
)
from pflbench.engine.observers import Observer, RunObserver
from pflbench.engine.personalize import personalize
from pflbench.engine.state import ClientStateStore
from pflbench.engine.types import (
    ClientJob,
    ClientUpdate,
    EvalJob,
    Forward,
    LocalPhase,
    NoHyperparameters,
    OptimizerSpec,
    ParamGroup,
    ParamLayout,
    Tensors,
    load_into,
    sample_weights,
    tensor_bytes,
    weighted_average,
)

__all__ = [
    "LocalResult",
    "LocalTrainer",
    "apply_gradients",
    "mean_terms",
    "standard_local_update",
    "Algorithm",
    "Capabilities",
    "ClientProgram",
    "ProgramCapabilities",
    "EXECUTORS",
    "Executor",
    "SequentialExecutor",
    "build_optimizer",
    "Diverged",
    "Federation",
    "mean_loss_terms",
    "Observer",
    "RunObserver",
    "ClientStateStore",
    "FineTuneProgram",
    "personalize",
    "ClientJob",
    "ClientUpdate",
    "EvalJob",
    "Forward",
    "LocalPhase",
    "NoHyperparameters",
    "OptimizerSpec",
    "ParamGroup",
    "ParamLayout",
    "Tensors",
    "load_into",
    "sample_weights",
    "tensor_bytes",
    "weighted_average",
]
