"""Checkpoints of a running federation, so a killed run resumes exactly where it was.

``OUT/runs/.tmp-NAME/checkpoint.pt`` is a verified cache entry (``cache.save_entry``: tensors +
JSON metadata with a content hash, loaded with ``weights_only=True``, written atomically) holding

- the algorithm's state (``Algorithm.checkpoint_state``: global_state, each stored client's
  private tensors, the attributes named in ``checkpoint_attributes``);
- the loop's state: the next round, the client-sampling stream (``sampling_rng``), the byte
  totals, the simulated time so far (the availability draws are derived from seed and round, so
  they need no saved state) and the last per-client accuracies (test, validation, new clients; training seeds are
  derived per (round, client); no optimizer state crosses rounds); with --dp the privacy state
  (``engine.privacy.Privacy.state``: the adaptive clip, each client's DP-SGD steps);
- the number of rounds.jsonl lines written (the file is cut back to it on resume) and the
  accuracy of the starting backbone (measured once, before round 1);
- the run's identity hash: a checkpoint of other settings is never resumed.

It is written every ``--checkpoint-every`` rounds (default 10, 0 = never), never after the last
round (the finished run replaces it), and removed when the run is complete. A write that fails (a
full disk: torch's writer says only ``unexpected pos``, ``util.atomic`` recovers the ENOSPC) stops
the run with one error naming the file and the cause; the earlier checkpoint stays whole (the new
one is written beside it and moved into place only when complete), so ``--resume`` continues
from it once there is room.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from pflbench.engine import Federation, Observer
from pflbench.engine.federation import Traffic
from pflbench.store.layout import OutputError, os_reason
from pflbench.util.cache import json_safe, load_entry, save_entry, warn

KIND = "pflbench-checkpoint-v1"
DEFAULT_EVERY = 10


def save_checkpoint(
    path: Path, federation: Federation, identity_hash: str, records: int, before: dict[str, Any]
) -> None:
    tensors, algorithm_meta = federation.algorithm.checkpoint_state()
    meta = {
        "kind": KIND,
        "identity_hash": identity_hash,
        "next_round": federation.next_round,
        "records": records,
        "before": before,
        "algorithm": algorithm_meta,
        "sampling_rng": federation.sampling_rng.bit_generator.state,
        "bytes_up_total": federation.traffic_total.up,
        "bytes_down_total": federation.traffic_total.down,
        "sim_time_total": federation.sim_time_total,  # the system model's clock (engine.availability)
        "client_accuracy": _floats(federation.client_accuracy),
        # --dp: the adaptive clip norm and each client's DP-SGD steps (the noise is derived per round)
        "privacy": federation.privacy.state() if federation.privacy is not None else None,
        "client_metrics": {name: _floats(values) for name, values in federation.client_metrics.items()},
    }
    if not json_safe(meta):
        raise ValueError(
            f"{type(federation.algorithm).__name__}.checkpoint_state() returned metadata "
            "that is not JSON-able; keep tensors in the tensor dict"
        )
    save_entry(path, tensors, meta)


def load_checkpoint(path: Path, identity_hash: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The checkpoint's (tensors, metadata), or None (none; or corrupt/foreign: warned, deleted)."""
    entry = load_entry(path, expect={"kind": KIND, "identity_hash": identity_hash})
    return entry


def restore_checkpoint(federation: Federation, tensors: dict[str, Any], meta: dict[str, Any]) -> None:
    federation.algorithm.restore_state(tensors, meta["algorithm"])
    federation.sampling_rng.bit_generator.state = meta["sampling_rng"]
    federation.next_round = meta["next_round"]
    federation.traffic_total = Traffic(meta["bytes_up_total"], meta["bytes_down_total"])
    federation.sim_time_total = meta.get("sim_time_total", 0.0)
    federation.client_accuracy = _array(meta["client_accuracy"])
    if federation.privacy is not None and meta.get("privacy") is not None:
        federation.privacy.restore(meta["privacy"])
    federation.client_metrics = {name: _array(values) for name, values in meta.get("client_metrics", {}).items()}


def _floats(values: np.ndarray) -> list[float | None]:
    """Per-client values for JSON: NaN (a client a metric does not cover) as null."""
    return [float(v) if np.isfinite(v) else None for v in values]


def _array(values: list[float | None]) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=float)


class CheckpointObserver(Observer):
    """Saves a checkpoint after every ``every``-th round (not the last); times each save."""

    def __init__(
        self,
        path: Path,
        federation: Federation,
        identity_hash: str,
        every: int,
        writer: Any,
        before: dict[str, Any],
        claim: Any = None,
    ) -> None:
        self.path, self.federation, self.identity_hash = path, federation, identity_hash
        self.every, self.writer, self.before, self.claim = every, writer, before, claim
        self.times: list[float] = []
        # what a fresh (or just restored) algorithm holds beyond what a checkpoint saves
        self.unsaved_at_start = federation.algorithm.state_fingerprint() if every else {}

    def on_round_end(self, record: dict[str, Any]) -> None:
        if self.claim is not None:
            self.claim.touch()
        round_index = record["round"]
        if not self.every or round_index % self.every or round_index >= self.federation.settings.rounds:
            return
        undeclared = self.federation.algorithm.undeclared_state(self.unsaved_at_start)
        if undeclared:  # a resume would lose this state and silently differ: stop checkpointing
            self.every = 0
            self.path.unlink(missing_ok=True)
            warn(
                f"{type(self.federation.algorithm).__name__} changed {', '.join(undeclared)} across rounds, "
                "which checkpoints do not save: no more checkpoints for this run (a resume starts it over). "
                "Name server state in checkpoint_attributes (diagnostics in transient_attributes)"
            )
            return
        started = time.perf_counter()
        self.writer.sync()  # the rounds a checkpoint counts are on disk before it
        try:
            save_checkpoint(self.path, self.federation, self.identity_hash, round_index, self.before)
        except OSError as error:  # a full disk: one line naming the file, the cause and what to do
            raise OutputError(
                error.filename or self.path,
                f"{os_reason(error)} (the run stopped after round {round_index}; "
                "once there is room the same command with --resume continues from its last checkpoint)",
            ) from error
        self.times.append(time.perf_counter() - started)

    def report(self) -> dict[str, Any]:
        """Summary entries: checkpoints written by this process and their total time."""
        return {"checkpoints_written": len(self.times), "checkpoint_time_s": float(sum(self.times))}
