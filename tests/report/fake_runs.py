"""Finished run folders with known numbers, written through ``pflbench.store.writer.RunWriter``
(config.json, rounds.jsonl, summary.json as a run writes them), for fast leaderboard tests."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pflbench.store.writer import RunWriter

MB = 2**20


def make_run(
    out: Path,
    algo: str,
    seed: int,
    curve: Sequence[float | None],
    *,
    alpha: float = 0.1,
    dataset: str = "digits",
    mb_per_round: float = 1.0,
    summary: Mapping[str, Any] | None = None,
    status: str = "completed",
    hparams: Mapping[str, Any] | None = None,
    **settings: Any,
) -> Path:
    """A run of len(curve) rounds: ``pers_acc`` = curve[r-1] at round r (None: not evaluated),
    ``mb_per_round`` MB up and as many down each round; summary: final pers_acc (the last
    evaluated value), totals, plus ``summary``. ``settings`` (lr=0.1, ...) enter the identity."""
    identity = {
        "algo": algo,
        "dataset": dataset,
        "partition": "dirichlet",
        "alpha": alpha,
        "seed": seed,
        "num_clients": 10,
        "frac": 1.0,
        "rounds": len(curve),
        "local_epochs": 1,
        "model": "mlp",
        "lr": 0.05,
        **settings,
        "algo_hparams": dict(hparams or {}),
    }
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:8]
    folder = out / "runs" / f"{algo}__{dataset}__a{alpha:g}__s{seed}__{digest}"
    writer = RunWriter(folder)
    writer.write_config({**identity, "out": str(out), "identity": identity})
    sent = mb_per_round * MB
    for r, value in enumerate(curve, start=1):
        record: dict[str, Any] = {"round": r, "clients": [0, 1], "train_loss": 1.0 / r, "bytes_up": sent}
        record.update(bytes_down=sent, bytes_up_cum=r * sent, bytes_down_cum=r * sent, round_time_s=0.5)
        if value is not None:
            record["pers_acc"] = value
        writer.write_round(record)
    final = [v for v in curve if v is not None][-1]
    writer.write_summary(
        {
            "status": status,
            "algo": algo,
            "seed": seed,
            "pers_acc": final,
            "bytes_up_total": len(curve) * sent,
            "bytes_down_total": len(curve) * sent,
            "round_time_s_mean": 0.5,
            "wall_time_s": 2.0 + seed,
            **(summary or {}),
        }
    )
    return folder
