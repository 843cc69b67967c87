"""pflbench: a benchmark suite for personalized federated learning.

The plugin-facing API is importable from here (one import for a plugin author)::

    from pflbench import Algorithm, ClientProgram, LocalPhase, option, register_algorithm

Names that need torch are loaded on first access, so ``pflbench --help`` and ``pflbench list``
stay fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

from .config import RunConfig, option  # noqa: E402
from .errors import ConfigError  # noqa: E402
from .registry import register_algorithm, register_dataset, register_model, register_partitioner  # noqa: E402

_LAZY = {
    "Algorithm": "engine",
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
    "run_experiment": "runner",
}

if TYPE_CHECKING:
    from .engine import (
        Algorithm,
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
        Tensors,
        mean_terms,
        sample_weights,
        weighted_average,
    )
    from .runner import run_experiment


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'pflbench' has no attribute {name!r}")


__all__ = [
    "Algorithm",
    "ClientJob",
    "ClientProgram",
    "ClientUpdate",
    "ConfigError",
    "LocalPhase",
    "LocalResult",
    "LocalTrainer",
    "NoHyperparameters",
    "Observer",
    "OptimizerSpec",
    "ParamGroup",
    "ParamLayout",
    "RunConfig",
    "Tensors",
    "mean_terms",
    "option",
    "register_algorithm",
    "register_dataset",
    "register_model",
    "register_partitioner",
    "run_experiment",
    "sample_weights",
    "weighted_average",
]
assert set(__all__) >= set(_LAZY)
