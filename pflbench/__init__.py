"""pflbench: a benchmark suite for personalized federated learning.

The plugin-facing API is importable from here (one import for a plugin author)::

    from pflbench import Algorithm, ClientProgram, LocalPhase, option, register_algorithm

Names that need torch are loaded on first access, so ``pflbench --help`` and ``pflbench list``
stay fast. This face holds only what a plugin uses, plus ``load_model`` (a run's saved model and
its input transform); the library's entry point for running an experiment is
``pflbench.runs.api.run_experiment``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pflbench._version import __version__ as __version__
from pflbench.config.run_config import RunConfig, option  # noqa: E402
from pflbench.config.space import Choice, Dimension, Range  # noqa: E402
from pflbench.errors import ConfigError  # noqa: E402
from pflbench.registry import (  # noqa: E402
    register_algorithm,
    register_dataset,
    register_model,
    register_partitioner,
    register_tracker,
)

_LAZY = {
    "Algorithm": "engine",
    "Capabilities": "engine",
    "ProgramCapabilities": "engine",
    "ClientProgram": "engine",
    "LocalPhase": "engine",
    "ClientJob": "engine",
    "ClientUpdate": "engine",
    "OptimizerSpec": "engine",
    "ParamGroup": "engine",
    "ParamLayout": "engine",
    "Tensors": "engine",
    "Observer": "engine",
    "NoHyperparameters": "engine",
    "LocalTrainer": "engine",
    "LocalResult": "engine",
    "mean_terms": "engine",
    "sample_weights": "engine",
    "weighted_average": "engine",
    "standard_local_update": "engine",
    "TensorDataset": "data.dataset",
    # not imported for type checking either: the face must not import runs (a layer above the
    # algorithms that import the face)
    "load_model": "runs.loading",  # a saved model (--save-model) and its input transform
    "Tracker": "runs.trackers",  # base class of --log trackers (torch-free)
    "TrackedRun": "runs.trackers",
}

if TYPE_CHECKING:
    from pflbench.data.dataset import TensorDataset
    from pflbench.engine import (
        Algorithm,
        Capabilities,
        ClientJob,
        ClientProgram,
        ClientUpdate,
        LocalPhase,
        LocalResult,
        LocalTrainer,
        NoHyperparameters,
        Observer,
        OptimizerSpec,
        ParamGroup,
        ParamLayout,
        ProgramCapabilities,
        Tensors,
        mean_terms,
        sample_weights,
        standard_local_update,
        weighted_average,
    )


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"pflbench.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'pflbench' has no attribute {name!r}")


__all__ = [
    "Algorithm",
    "Capabilities",
    "ProgramCapabilities",
    "ClientJob",
    "ClientProgram",
    "ClientUpdate",
    "Choice",
    "ConfigError",
    "Dimension",
    "LocalPhase",
    "LocalResult",
    "LocalTrainer",
    "NoHyperparameters",
    "Observer",
    "OptimizerSpec",
    "ParamGroup",
    "ParamLayout",
    "Range",
    "RunConfig",
    "TensorDataset",
    "Tensors",
    "TrackedRun",
    "Tracker",
    "load_model",
    "mean_terms",
    "option",
    "register_algorithm",
    "register_dataset",
    "register_model",
    "register_partitioner",
    "register_tracker",
    "sample_weights",
    "standard_local_update",
    "weighted_average",
]
assert set(__all__) >= set(_LAZY)
