"""Verified, self-healing cache entries: tensors + JSON-safe metadata, no code in the file.

An entry is one torch file ``{"state_dict": {name: Tensor}, "meta": {...}}`` — the shape that
``--weights`` already reads — loaded only with ``torch.load(..., weights_only=True)``, whose
unpickler rebuilds tensors and plain containers and refuses every other global, so a poisoned
file cannot run code. ``meta["sha256"]`` is the content hash (``content_hash``) of the tensors'
names, dtypes, shapes and bytes plus the rest of the metadata; it is checked on every load.

A truncated, bit-flipped, unreadable or foreign entry is reported in one ``warning:`` line on
stderr naming the file, deleted, and ``load_entry`` returns None so the caller rebuilds it.
Writes are atomic (``pflbench.util.atomic``): a temporary file in the same folder, fsync,
``os.replace``; a killed writer leaves at most a ``*.tmp`` file that is never read as an entry,
deleted by the next write of the entry once it is clearly abandoned. A write that fails (a full
disk, even where ``torch.save`` hides the ENOSPC behind ``RuntimeError: ... unexpected pos``) is an
``OSError`` naming the entry and leaves no file: the callers warn and go on without the cache.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import pickle
import sys
import warnings
from pathlib import Path
from typing import Any

import torch

from pflbench.util.atomic import atomic_write, remove_stale_temporaries

HASH_KEY = "sha256"


def warn(message: str) -> None:
    """One ``warning: ...`` line on stderr (newlines folded, so it stays one line)."""
    print("warning: " + " ".join(str(message).split()), file=sys.stderr, flush=True)


def content_hash(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> str:
    """sha256 over the metadata (canonical JSON, without the hash) and every tensor's
    name, dtype, shape and raw bytes, in name order."""
    digest = hashlib.sha256()
    body = {key: value for key, value in meta.items() if key != HASH_KEY}
    digest.update(json.dumps(body, sort_keys=True, allow_nan=True).encode())
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        digest.update(json.dumps([name, str(tensor.dtype), list(tensor.shape)]).encode())
        if tensor.numel():
            digest.update(tensor.reshape(-1).view(torch.uint8).numpy().data)
    return digest.hexdigest()


def verified(tensors: dict[str, Any], meta: dict[str, Any]) -> bool:
    """Whether ``meta``'s content hash matches ``tensors`` (all tensors) and ``meta``."""
    if not all(isinstance(t, torch.Tensor) for t in tensors.values()):
        return False
    return meta.get(HASH_KEY) == content_hash(tensors, meta)


def json_safe(value: Any) -> bool:
    """Whether ``value`` survives a JSON round trip unchanged (what metadata must do)."""
    try:
        return json.loads(json.dumps(value, allow_nan=True)) == value
    except (TypeError, ValueError):
        return False


def entry_bytes(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> bytes:
    """The bytes of a verified entry (what ``save_entry`` writes). ``meta`` must be JSON-safe."""
    if not json_safe(meta):
        raise ValueError("cache metadata is not JSON-safe")
    tensors = {name: tensor.detach().cpu().contiguous() for name, tensor in tensors.items()}
    buffer = io.BytesIO()
    torch.save({"state_dict": tensors, "meta": {**meta, HASH_KEY: content_hash(tensors, meta)}}, buffer)
    return buffer.getvalue()


def save_entry(path: Path, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> str:
    """Write a verified entry atomically; returns its content hash. ``meta`` must be JSON-safe."""
    if not json_safe(meta):
        raise ValueError(f"cache metadata for {path} is not JSON-safe")
    tensors = {name: tensor.detach().cpu().contiguous() for name, tensor in tensors.items()}
    meta = {**meta, HASH_KEY: content_hash(tensors, meta)}
    try:
        atomic_write(Path(path), lambda file: torch.save({"state_dict": tensors, "meta": meta}, file))
    except RuntimeError as error:  # torch.save reports a full disk as RuntimeError, not OSError
        if "No space left" not in str(error) and "errno 28" not in str(error).lower():
            raise
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from error
    remove_stale_temporaries(Path(path))
    return meta[HASH_KEY]


def _read(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The entry's tensors and metadata; ValueError saying what is wrong with it."""
    try:
        with warnings.catch_warnings():  # torch's multi-line notes on odd pickles: we say it once
            warnings.simplefilter("ignore")
            saved = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise ValueError("not plain tensor data (holds other objects: refused, nothing of it was run)") from error
    except Exception as error:  # truncated zip, unreadable file: all "unreadable"
        first_line = (str(error).strip().splitlines() or [""])[0][:160]
        raise ValueError(f"unreadable ({type(error).__name__}: {first_line})") from error
    if not isinstance(saved, dict) or set(saved) != {"state_dict", "meta"}:
        raise ValueError("not a pflbench cache entry")
    tensors, meta = saved["state_dict"], saved["meta"]
    if (
        not isinstance(tensors, dict)
        or not isinstance(meta, dict)
        or not all(isinstance(t, torch.Tensor) for t in tensors.values())
    ):
        raise ValueError("not a pflbench cache entry")
    if HASH_KEY not in meta:
        raise ValueError("from an older pflbench (no content hash)")
    if meta[HASH_KEY] != content_hash(tensors, meta):
        raise ValueError("content hash mismatch (corrupted)")
    return tensors, meta


def load_entry(
    path: Path, expect: dict[str, Any] | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, Any]] | None:
    """The verified entry at ``path``, or None if there is none (or it was bad: warned, deleted).

    ``expect``: metadata items the entry must carry (e.g. its full cache key), so a file that is
    intact but belongs to something else is never served either.
    """
    path = Path(path)
    if not path.exists():
        return None
    if not os.access(path, os.R_OK):  # someone else's entry: never delete what we cannot even read
        warn(f"cannot read cache file {path} (permission denied); rebuilding without it")
        return None
    try:
        tensors, meta = _read(path)
        wrong = [key for key, value in (expect or {}).items() if meta.get(key) != value]
        if wrong:
            raise ValueError(f"written for another {wrong[0]}")
    except ValueError as problem:
        if isinstance(problem.__cause__, FileNotFoundError):  # another process just replaced it
            return None
        warn(f"cache file {path} is {problem}; deleted it and rebuilding")
        discard(path)
        return None
    return tensors, meta


def discard(path: Path) -> None:
    """Remove a bad entry; one that cannot be removed is reported, and the rebuild replaces it."""
    try:
        Path(path).unlink(missing_ok=True)
    except OSError as error:
        warn(f"could not delete cache file {path}: {error.strerror or error}")
