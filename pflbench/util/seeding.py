"""Independent, named random streams derived from one seed.

Partitioning, the validation split, the choice of new (held-out) clients, client sampling, model
init, local training, the public hold-out (and its pretraining), per-client LoRA ranks, test-time
personalization / fine-tuning and the new clients' adaptation each draw from their own stream,
so (for example) every algorithm sees the same client sequence for the same seed.
"""

from __future__ import annotations

import zlib

import numpy as np

STREAMS = (
    "partition",
    "split",
    "val",
    "new_clients",
    "sampling",
    "init",
    "train",
    "dropout",
    "public",
    "ranks",
    "personalize",
    "finetune",
    "adapt_new",
    "availability",  # engine.availability: who is online (per round), their traces and speeds (per run)
    "availability_trace",
    "client_dropout",
    "system_speeds",
)


def derive_seed(seed: int, stream: str, *keys: int) -> int:
    """A 63-bit seed for ``stream`` (and optional keys such as round and client id).

    Core streams are listed in ``STREAMS``; a plugin uses its own namespace, ``"<algo>.<name>"``
    (e.g. ``"ditto.personal"``), so it can never collide with a core stream."""
    if stream not in STREAMS and "." not in stream:
        raise ValueError(
            f"unknown random stream {stream!r}; streams: {', '.join(STREAMS)} or a plugin's '<name>.<stream>'"
        )
    sequence = np.random.SeedSequence([seed, zlib.crc32(stream.encode()), *keys])
    return int(sequence.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def rng_stream(seed: int, stream: str, *keys: int) -> np.random.Generator:
    return np.random.default_rng(derive_seed(seed, stream, *keys))
