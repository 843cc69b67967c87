"""A digest of any algorithm attribute's value, to notice state a checkpoint would not save.

Tensors, arrays and modules by their bytes; containers item by item; random generators by their
state; other objects by their attributes (a few levels deep) or their repr."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import torch
from torch import nn

MAX_DEPTH = 4


def fingerprint(value: Any) -> str:
    """A sha256 hex digest that changes when ``value``'s content changes."""
    digest = hashlib.sha256()
    _feed(digest, value, 0)
    return digest.hexdigest()


def _feed(digest: Any, value: Any, depth: int) -> None:
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        digest.update(f"T{tensor.dtype}{tuple(tensor.shape)}".encode())
        if tensor.numel():
            digest.update(tensor.reshape(-1).view(torch.uint8).numpy().data)
    elif isinstance(value, np.ndarray):
        digest.update(f"A{value.dtype}{value.shape}".encode() + np.ascontiguousarray(value).tobytes())
    elif isinstance(value, nn.Module):
        _feed(digest, value.state_dict(), depth)
    elif isinstance(value, np.random.Generator):
        digest.update(repr(value.bit_generator.state).encode())
    elif isinstance(value, torch.Generator):
        _feed(digest, value.get_state(), depth)
    elif isinstance(value, dict):
        digest.update(b"{")
        for key in sorted(value, key=repr):
            digest.update(repr(key).encode())
            _feed(digest, value[key], depth + 1)
        digest.update(b"}")
    elif isinstance(value, (list, tuple, set, frozenset)):
        digest.update(type(value).__name__.encode() + b"[")
        for item in sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value:
            _feed(digest, item, depth + 1)
        digest.update(b"]")
    elif hasattr(value, "__dict__") and not callable(value) and depth < MAX_DEPTH:
        digest.update(type(value).__qualname__.encode())
        _feed(digest, vars(value), depth + 1)
    else:
        digest.update(repr(value).encode())
