"""pflbench: a benchmark suite for personalized federated learning."""
from __future__ import annotations

__version__ = "0.1.0"

from . import models, partition  # noqa: E402,F401  (register the built-in models and partitioners)
from .registry import (  # noqa: E402,F401
    register_algorithm, register_dataset, register_model, register_partitioner)
