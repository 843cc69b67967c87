"""``--log mlflow``: one MLflow run per pflbench run, through ``MlflowClient`` (no global MLflow state).

MLflow logs to ``--mlflow-uri`` when given, else to the SQLite store ``OUT/mlflow.db`` beside
``OUT/runs`` (``mlflow ui --backend-store-uri sqlite:///OUT/mlflow.db``; MLflow 3 refuses new
``file:`` stores unless ``MLFLOW_ALLOW_FILE_STORE=true``), experiment ``pflbench`` (artifacts, if
any, in ``OUT/mlartifacts``; under ``--portable`` a new experiment's artifact location is
``mlflow-artifacts:/pflbench``, which ``mlflow server`` serves, not a local path), named after the
run folder, tagged ``pflbench.run_dir``.

The MLflow run id is kept in ``RUN_DIR/trackers.json``: a resumed run continues the same MLflow
run (status back to RUNNING) and logs each metric only at the steps it does not hold yet, so the
rounds a killed run logged after its checkpoint are not logged twice (a resumed run recomputes
them identically). A recorded run missing from the store (another ``--mlflow-uri``) starts a new
MLflow run that gets every round.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from pflbench.errors import ConfigError
from pflbench.runs.trackers import EXPERIMENT, TrackedRun, Tracker, numeric_items, register_tracker

_MLFLOW_KEY = re.compile(r"[^0-9A-Za-z_\-. /]")
MLFLOW_PARAM_LENGTH = 500  # the smallest limit MLflow versions have had
PORTABLE_ARTIFACTS = "mlflow-artifacts:/pflbench"


def default_mlflow_uri(run_dir: Path) -> str:
    """SQLite store ``OUT/mlflow.db`` for a run folder ``OUT/runs/<name>``."""
    return f"sqlite:///{Path(run_dir).resolve().parent.parent / 'mlflow.db'}"


def mlflow_key(name: str) -> str:
    """A metric or parameter name MLflow accepts (other characters become ``_``)."""
    return _MLFLOW_KEY.sub("_", name)


@register_tracker("mlflow")
class MLflowTracker(Tracker):
    """MLflow: params, round metrics and summary in one MLflow run (OUT/mlflow.db or --mlflow-uri)."""

    requires = ("mlflow",)
    install = "pip install 'pflbench[mlflow]'"

    def __init__(self, run: TrackedRun) -> None:
        super().__init__(run)
        from mlflow.tracking import MlflowClient

        uri = run.options.get("mlflow_uri")
        artifacts = None
        if not uri:
            uri = default_mlflow_uri(run.folder)
            out = Path(run.folder).resolve().parent.parent
            artifacts = PORTABLE_ARTIFACTS if run.portable else (out / "mlartifacts").as_uri()
        experiment = run.options.get("mlflow_experiment") or EXPERIMENT
        self.tracking_uri = uri
        try:
            self.client = MlflowClient(tracking_uri=uri)
            found = self.client.get_experiment_by_name(experiment)
            self.experiment_id = (
                found.experiment_id if found is not None else self.client.create_experiment(experiment, artifacts)
            )
        except Exception as error:  # MlflowException, sqlalchemy errors: a bad store is bad input
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ConfigError(f"--mlflow-uri {uri!r}: {first}") from error
        self.run_name = run.name
        self.run_id: str | None = None
        self.logged: set[tuple[str, int]] = set()  # (metric, step) the MLflow run already holds
        self.closed = False

    key = staticmethod(mlflow_key)

    def _recorded_run(self) -> Any:
        """The MLflow run this run folder recorded, if it is in this store and experiment."""
        recorded = self.run.recall("mlflow")
        run_id = recorded.get("run_id") if isinstance(recorded, dict) else None
        if not self.run.resumed or not isinstance(run_id, str):
            return None
        try:
            found = self.client.get_run(run_id)
        except Exception:  # not in this store (RESOURCE_DOES_NOT_EXIST)
            return None
        if found.info.experiment_id != self.experiment_id or found.info.lifecycle_stage != "active":
            return None
        return found

    def start(self) -> None:
        from mlflow.entities import Param

        found = self._recorded_run()
        if found is not None:  # a resume: the same MLflow run, running again
            self.run_id = found.info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            for key in found.data.metrics:
                self.logged.update((key, m.step) for m in self.client.get_metric_history(self.run_id, key))
            held = set(found.data.params)
        else:
            tags = {"pflbench.run_dir": str(self.run.local(str(self.run.final_dir)))}
            created = self.client.create_run(self.experiment_id, run_name=self.run_name, tags=tags)
            self.run_id = created.info.run_id
            self.run.remember("mlflow", {"run_id": self.run_id})
            held = set()
        params = [
            Param(self.key(k), str(v)[:MLFLOW_PARAM_LENGTH])
            for k, v in self.run.params().items()
            if self.key(k) not in held  # a parameter once logged cannot be logged again
        ]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[start : start + 100])

    def _log(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        assert self.run_id is not None, "start() first"
        now = int(time.time() * 1000)
        metrics = [
            Metric(self.key(k), v, now, step) for k, v in values.items() if (self.key(k), step) not in self.logged
        ]
        for start in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[start : start + 1000])
        self.logged.update((m.key, step) for m in metrics)

    def log_round(self, record: dict[str, Any]) -> None:
        self._log(numeric_items(record, skip=("round",)), int(record["round"]))

    def finish(self, summary: dict[str, Any]) -> None:
        values = {f"summary/{k}": v for k, v in numeric_items(summary).items()}
        self._log(values, int(summary.get("rounds") or 0))

    def close(self, failed: bool = False) -> None:
        if not self.closed and self.run_id is not None:
            self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")
        self.closed = True
