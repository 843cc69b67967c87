"""``--log tensorboard``: scalars, hyperparameters and the config text in ``RUN_DIR/tensorboard/``.

``tensorboard --logdir OUT/runs`` shows every run; the parameters are in the HPARAMS tab and as
a text ``config``. The folder holds one event file, written from the start: a resumed run
replays its earlier rounds into a fresh file (the killed attempt's file is removed), so every
round is in it exactly once. The file is renamed when closed to
``events.out.tfevents.<time>.pflbench``: TensorBoard's own name carries the host name and pid.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pflbench.runs.trackers import TrackedRun, Tracker, numeric_items, register_tracker

EVENT_PREFIX = "events.out.tfevents."


@register_tracker("tensorboard")
class TensorBoardTracker(Tracker):
    """TensorBoard: scalars, HPARAMS and the config in RUN_DIR/tensorboard/ (tensorboard --logdir OUT/runs)."""

    requires = ("tensorboard",)
    install = "pip install 'pflbench[tensorboard]'"

    def __init__(self, run: TrackedRun) -> None:
        super().__init__(run)
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        self.log_dir = Path(run.folder) / "tensorboard"
        for stale in self.log_dir.glob(f"{EVENT_PREFIX}*"):  # a rerun or a resume starts the
            stale.unlink()  # file over (a resume replays the earlier rounds)
        self.writer = SummaryWriter(log_dir=str(self.log_dir))
        self.params: dict[str, Any] = {}
        self.closed = False

    def start(self) -> None:
        self.params = self.run.params()
        lines = ["| parameter | value |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in self.params.items()]
        self.writer.add_text("config", "\n".join(lines), global_step=0)
        self.writer.flush()

    def log_round(self, record: dict[str, Any]) -> None:
        step = int(record["round"])
        for key, value in numeric_items(record, skip=("round",)).items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def finish(self, summary: dict[str, Any]) -> None:
        from torch.utils.tensorboard.summary import hparams

        metrics = {f"summary/{k}": v for k, v in numeric_items(summary).items()}
        step = int(summary.get("rounds") or 0)
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, global_step=step)
        # The HPARAMS dashboard: parameters of this run + the summary metrics as its columns.
        experiment, session_start, session_end = hparams(self.params, metrics)
        file_writer = self.writer.file_writer
        assert file_writer is not None, "the writer is open"
        for event in (experiment, session_start, session_end):
            file_writer.add_summary(event)

    def close(self, failed: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        self.writer.close()
        for index, path in enumerate(sorted(self.log_dir.glob(f"{EVENT_PREFIX}*"))):
            path.rename(path.with_name(portable_event_name(path.name, index)))


def portable_event_name(name: str, index: int = 0) -> str:
    """``events.out.tfevents.<time>.<host>.<pid>.<n>`` → ``events.out.tfevents.<time>.pflbench[.<index>]``
    (TensorBoard reads every file whose name contains ``tfevents``, in name order)."""
    stamp = name[len(EVENT_PREFIX) :].split(".", 1)[0]
    return f"{EVENT_PREFIX}{stamp}.pflbench" + (f".{index}" if index else "")
