"""Experiment trackers (``--log tensorboard``, ``--log mlflow``): optional run observers.

Each tracker receives the same per-round records as ``rounds.jsonl`` and the final summary:

* ``on_run_start(run)``: logs the run's parameters, the flattened ``RunConfig``
  (``dataclasses.asdict(run.config)``) plus the algorithm's hyperparameters as
  ``algo_hparams.<name>`` (from ``run.hparams`` when the run has them);
* ``on_client_update(job, update)``: ignored;
* ``on_round_end(record)``: every finite number of the record (not ``round`` itself, not
  ``None``, lists or strings) as a scalar at step ``record["round"]``;
* ``on_run_end(summary)``: every finite number of the summary as ``summary/<key>``, then closes.
  ``close(failed=True)`` ends a run that stopped early (safe to call twice).

Stores are local. TensorBoard writes event files to ``RUN_DIR/tensorboard/`` (``tensorboard
--logdir OUT/runs`` shows every run; the parameters are in the HPARAMS tab and as a text
``config``). MLflow logs to ``--mlflow-uri`` when given, else to the SQLite store
``OUT/mlflow.db`` beside ``OUT/runs`` (``mlflow ui --backend-store-uri sqlite:///OUT/mlflow.db``;
MLflow 3 refuses new ``file:`` stores unless ``MLFLOW_ALLOW_FILE_STORE=true``), experiment
``pflbench`` (artifacts, if any, in ``OUT/mlartifacts``), one MLflow run per pflbench run,
named after the run folder.

The libraries are imported only when a tracker is made; a missing one is a ``ConfigError`` that
says which extra to install.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pflbench.errors import ConfigError
from pflbench.store.layout import WORK_PREFIX

EXPERIMENT = "pflbench"


# --------------------------------------------------------------------------- helpers


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts → ``{"a.b": value}``; lists/tuples become JSON text, None the text ``None``."""
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        data = dataclasses.asdict(data)
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    key = prefix[:-1]
    if isinstance(data, (list, tuple)):
        return {key: json.dumps(list(data), default=str)}
    if data is None:
        return {key: "None"}
    if isinstance(data, (bool, int, float, str)):
        return {key: data}
    return {key: str(data)}


def run_params(run: Any) -> dict[str, Any]:
    """The parameters a tracker logs: the flattened config + ``algo_hparams.*``."""
    params = flatten(run.config)
    hparams = getattr(run, "hparams", None)
    if hparams is not None:
        params.update(flatten(hparams, "algo_hparams."))
    return params


def numeric_items(record: dict[str, Any], skip: Iterable[str] = ()) -> dict[str, float]:
    """The finite real numbers of a record (bools, None, NaN, lists and strings left out)."""
    skipped = set(skip)
    out = {}
    for key, value in record.items():
        if key in skipped or isinstance(value, bool) or not isinstance(value, numbers.Real):
            continue
        value = float(value)
        if math.isfinite(value):
            out[str(key)] = value
    return out


# --------------------------------------------------------------------------- TensorBoard


class TensorBoardTracker:
    """Scalars, hyperparameters and the config text in ``RUN_DIR/tensorboard/``."""

    name = "tensorboard"

    def __init__(self, log_dir: str | Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        self.log_dir = Path(log_dir)
        for stale in self.log_dir.glob("events.out.tfevents.*"):  # a rerun replaces the run's
            stale.unlink()  # results, as RunWriter does
        self.writer = SummaryWriter(log_dir=str(self.log_dir))
        self.params: dict[str, Any] = {}
        self.closed = False

    def on_run_start(self, run: Any) -> None:
        self.params = run_params(run)
        lines = ["| parameter | value |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in self.params.items()]
        self.writer.add_text("config", "\n".join(lines), global_step=0)
        self.writer.flush()

    def on_client_update(self, job: Any, update: Any) -> None:
        pass

    def on_round_end(self, record: dict[str, Any]) -> None:
        step = int(record["round"])
        for key, value in numeric_items(record, skip=("round",)).items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def on_run_end(self, summary: dict[str, Any]) -> None:
        from torch.utils.tensorboard.summary import hparams

        metrics = {f"summary/{k}": v for k, v in numeric_items(summary).items()}
        step = int(summary.get("rounds") or 0)
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, global_step=step)
        # The HPARAMS dashboard: parameters of this run + the summary metrics as its columns.
        experiment, session_start, session_end = hparams(self.params, metrics)
        for event in (experiment, session_start, session_end):
            self.writer.file_writer.add_summary(event)
        self.close()

    def close(self, failed: bool = False) -> None:
        if not self.closed:
            self.closed = True
            self.writer.close()


# --------------------------------------------------------------------------- MLflow

_MLFLOW_KEY = re.compile(r"[^0-9A-Za-z_\-. /]")
MLFLOW_PARAM_LENGTH = 500  # the smallest limit MLflow versions have had


class MLflowTracker:
    """One MLflow run per pflbench run, through ``MlflowClient`` (no global MLflow state)."""

    name = "mlflow"

    def __init__(
        self, tracking_uri: str, run_name: str, experiment: str = EXPERIMENT, artifact_location: str | None = None
    ) -> None:
        from mlflow.tracking import MlflowClient

        self.tracking_uri = tracking_uri
        try:
            self.client = MlflowClient(tracking_uri=tracking_uri)
            found = self.client.get_experiment_by_name(experiment)
            self.experiment_id = (
                found.experiment_id
                if found is not None
                else self.client.create_experiment(experiment, artifact_location)
            )
        except Exception as error:  # MlflowException, sqlalchemy errors: a bad store is bad input
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ConfigError(f"--mlflow-uri {tracking_uri!r}: {first}") from error
        self.run_name = run_name
        self.run_id: str | None = None
        self.closed = False

    @staticmethod
    def key(name: str) -> str:
        return _MLFLOW_KEY.sub("_", name)

    def on_run_start(self, run: Any) -> None:
        from mlflow.entities import Param

        created = self.client.create_run(
            self.experiment_id, run_name=self.run_name, tags={"pflbench.run_dir": str(run.run_dir)}
        )
        self.run_id = created.info.run_id
        params = [Param(self.key(k), str(v)[:MLFLOW_PARAM_LENGTH]) for k, v in run_params(run).items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[start : start + 100])

    def on_client_update(self, job: Any, update: Any) -> None:
        pass

    def _log(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(self.key(k), v, now, step) for k, v in values.items()]
        for start in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[start : start + 1000])

    def on_round_end(self, record: dict[str, Any]) -> None:
        self._log(numeric_items(record, skip=("round",)), int(record["round"]))

    def on_run_end(self, summary: dict[str, Any]) -> None:
        values = {f"summary/{k}": v for k, v in numeric_items(summary).items()}
        self._log(values, int(summary.get("rounds") or 0))
        self.close()

    def close(self, failed: bool = False) -> None:
        if not self.closed and self.run_id is not None:
            self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")
        self.closed = True


# --------------------------------------------------------------------------- factory


def default_mlflow_uri(run_dir: Path) -> str:
    """SQLite store ``OUT/mlflow.db`` for a run folder ``OUT/runs/<name>``."""
    return f"sqlite:///{Path(run_dir).resolve().parent.parent / 'mlflow.db'}"


def _tensorboard(run: Any, options: dict[str, Any]) -> TensorBoardTracker:
    return TensorBoardTracker(Path(run.run_dir) / "tensorboard")


def _mlflow(run: Any, options: dict[str, Any]) -> MLflowTracker:
    uri = options.get("mlflow_uri")
    artifacts = None
    if not uri:
        uri = default_mlflow_uri(run.run_dir)
        artifacts = (Path(run.run_dir).resolve().parent.parent / "mlartifacts").as_uri()
    name = Path(run.run_dir).name.removeprefix(WORK_PREFIX)  # the runner's work folder: the run's name
    return MLflowTracker(uri, name, options.get("mlflow_experiment") or EXPERIMENT, artifacts)


TRACKERS: dict[str, tuple[Callable[[Any, dict[str, Any]], Any], str]] = {
    # name: (factory, the module whose absence means the extra is not installed)
    "tensorboard": (_tensorboard, "tensorboard"),
    "mlflow": (_mlflow, "mlflow"),
}


def check_trackers(names: Iterable[str]) -> list[str]:
    """The tracker names of ``--log`` (repeatable or comma-separated), de-duplicated; raises
    ``ConfigError`` for an unknown name or a library that is not installed (nothing is made)."""
    import importlib.util

    wanted: list[str] = []
    for item in names:
        for name in str(item).split(","):
            name = name.strip().lower()
            if name and name not in wanted:
                wanted.append(name)
    for name in wanted:
        if name not in TRACKERS:
            raise ConfigError(f"--log {name!r} is not a tracker; choose from {', '.join(TRACKERS)}")
        module = TRACKERS[name][1]
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f'--log {name} needs the {module} package: pip install "pflbench[{name}]"')
    return wanted


def make_trackers(
    names: Iterable[str], run: Any, mlflow_uri: str | None = None, mlflow_experiment: str | None = None
) -> list[Any]:
    """Build the observers for ``--log NAME`` (repeatable or comma-separated).

    ``run`` has ``.config`` (a RunConfig), ``.run_dir`` and optionally ``.hparams``. Raises
    ``ConfigError`` for an unknown name or a library that is not installed.
    """
    wanted = check_trackers(names)
    options = {"mlflow_uri": mlflow_uri, "mlflow_experiment": mlflow_experiment}
    trackers: list[Any] = []
    try:
        for name in wanted:
            trackers.append(TRACKERS[name][0](run, options))
    except BaseException:
        for tracker in trackers:  # the ones already made (open files)
            tracker.close(failed=True)
        raise
    return trackers
