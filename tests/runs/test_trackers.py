"""--log tensorboard / mlflow: what the trackers log, read back with each library's own reader."""

from __future__ import annotations

import dataclasses
import importlib.machinery
import importlib.util
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from pflbench.config.run_config import RunConfig
from pflbench.errors import ConfigError
from pflbench.runs.trackers import check_trackers, flatten, make_trackers, numeric_items


@dataclasses.dataclass(frozen=True)
class FakeHparams:
    mu: float = 0.01
    schedule: tuple[int, ...] = (1, 2)


RECORDS = [
    {
        "round": 1,
        "train_loss": 2.0,
        "pers_acc": None,
        "global_acc": None,
        "bytes_up": 1000,
        "round_time_s": 0.5,
        "client_ids": [0, 3],
        "note": "x",
        "flag": True,
    },
    {
        "round": 2,
        "train_loss": 1.5,
        "pers_acc": 0.25,
        "global_acc": 0.5,
        "bytes_up": 1000,
        "round_time_s": 0.25,
        "client_ids": [1, 2],
        "diverged": float("nan"),
    },
    {"round": 3, "train_loss": 1.0, "pers_acc": 0.75, "global_acc": 0.625, "bytes_up": 2000, "round_time_s": 0.125},
]
SUMMARY = {
    "algo": "fedprox",
    "pers_acc": 0.75,
    "rounds": 3,
    "bytes_up_total": 4000,
    "peak_mem_mb": None,
    "run_dir": "somewhere",
}


def _run(tmp_path: Path):
    config = RunConfig(
        algo="fedprox", rounds=3, lr=0.05, dataset_option=("num_samples=100",), out=str(tmp_path / "results")
    )
    run_dir = tmp_path / "results" / "runs" / "fedprox-digits-abc"
    run_dir.mkdir(parents=True)
    return SimpleNamespace(config=config, run_dir=run_dir, hparams=FakeHparams())


def _drive(tracker, run):
    tracker.on_run_start(run)
    for record in RECORDS:
        tracker.on_client_update(None, None)
        tracker.on_round_end(record)
    tracker.on_run_end(SUMMARY)


def test_numeric_items_and_flatten():
    assert numeric_items(RECORDS[0], skip=("round",)) == {"train_loss": 2.0, "bytes_up": 1000.0, "round_time_s": 0.5}
    assert "diverged" not in numeric_items(RECORDS[1])
    params = flatten({"a": {"b": 1, "c": None}, "d": (1, "x")})
    assert params == {"a.b": 1, "a.c": "None", "d": '[1, "x"]'}


def _installed(monkeypatch, present: tuple[str, ...], absent: tuple[str, ...]) -> None:
    """The tracker libraries ``present`` look installed (a stand-in spec) and ``absent`` do not,
    whichever extras this environment has: the checks below run on a ``[dev]``-only install too."""
    real = importlib.util.find_spec
    stand_ins = {name: importlib.machinery.ModuleSpec(name, None) for name in present}

    def find_spec(name, *args):
        if name in absent:
            return None
        return stand_ins.get(name) or real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_make_trackers_errors(tmp_path, monkeypatch):
    run = _run(tmp_path)
    with pytest.raises(
        ConfigError, match=r"--log 'nosuch' is not a tracker; choose from mlflow, tensorboard, wandb \("
    ):
        make_trackers(["nosuch"], run)
    _installed(monkeypatch, present=("tensorboard",), absent=("mlflow", "wandb"))
    with pytest.raises(ConfigError, match=r"--log mlflow needs the mlflow package: pip install 'pflbench\[mlflow\]'"):
        make_trackers(["mlflow"], run)
    with pytest.raises(ConfigError, match=r"--log wandb needs the wandb package: pip install 'pflbench\[wandb\]'"):
        make_trackers(["tensorboard,wandb"], run)
    assert not (run.run_dir / "tensorboard").exists()  # checked before any tracker is made
    assert make_trackers([], run) == []
    _installed(monkeypatch, present=("wandb",), absent=())
    monkeypatch.setenv("WANDB_MODE", "sometimes")
    with pytest.raises(
        ConfigError, match="WANDB_MODE='sometimes' is not a W&B mode for --log wandb; choose from offline"
    ):
        check_trackers(["wandb"])


def test_tensorboard_tracker_reads_back(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    run = _run(tmp_path)
    (tracker,) = make_trackers(["tensorboard"], run)
    _drive(tracker, run)
    log_dir = run.run_dir / "tensorboard"
    (event_file,) = log_dir.glob("events.out.tfevents.*")
    assert event_file.name.endswith(".pflbench") and socket.gethostname() not in event_file.name
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert {"train_loss", "pers_acc", "global_acc", "bytes_up", "round_time_s"} <= scalars
    assert not {"round", "client_ids", "note", "flag", "diverged"} & scalars
    assert [(e.step, e.value) for e in events.Scalars("train_loss")] == [(1, 2.0), (2, 1.5), (3, 1.0)]
    assert [(e.step, e.value) for e in events.Scalars("pers_acc")] == [(2, 0.25), (3, 0.75)]
    assert [(e.step, e.value) for e in events.Scalars("summary/bytes_up_total")] == [(3, 4000.0)]
    assert "summary/peak_mem_mb" not in scalars and "summary/algo" not in scalars

    content = events.PluginTagToContent("hparams")
    start = next(
        plugin_data_pb2.HParamsPluginData.FromString(v).session_start_info
        for v in content.values()
        if plugin_data_pb2.HParamsPluginData.FromString(v).HasField("session_start_info")
    )
    hparams = start.hparams
    assert hparams["algo"].string_value == "fedprox"
    assert hparams["lr"].number_value == 0.05
    assert hparams["rounds"].number_value == 3
    assert hparams["algo_hparams.mu"].number_value == 0.01
    assert hparams["dataset_option"].string_value == '["num_samples=100"]'
    assert hparams["max_grad_norm"].string_value == "None"

    # Running the same run folder again replaces its event file (no mixed curves).
    (again,) = make_trackers(["tensorboard"], run)
    _drive(again, run)
    assert len(list(log_dir.glob("events.out.tfevents.*"))) == 1
    events = EventAccumulator(str(log_dir))
    events.Reload()
    assert [e.step for e in events.Scalars("train_loss")] == [1, 2, 3]


def test_mlflow_tracker_reads_back(tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    run = _run(tmp_path)
    (tracker,) = make_trackers(["mlflow"], run)
    assert tracker.tracking_uri == f"sqlite:///{(tmp_path / 'results' / 'mlflow.db').resolve()}"
    _drive(tracker, run)

    client = MlflowClient(tracking_uri=tracker.tracking_uri)
    experiment = client.get_experiment_by_name("pflbench")
    (found,) = client.search_runs([experiment.experiment_id])
    assert found.info.run_name == "fedprox-digits-abc" and found.info.status == "FINISHED"
    assert found.data.params["algo"] == "fedprox"
    assert float(found.data.params["lr"]) == 0.05
    assert found.data.params["algo_hparams.mu"] == "0.01"
    assert found.data.params["algo_hparams.schedule"] == "[1, 2]"
    assert found.data.tags["pflbench.run_dir"] == str(run.run_dir)
    history = client.get_metric_history(found.info.run_id, "train_loss")
    assert sorted((m.step, m.value) for m in history) == [(1, 2.0), (2, 1.5), (3, 1.0)]
    history = client.get_metric_history(found.info.run_id, "pers_acc")
    assert sorted((m.step, m.value) for m in history) == [(2, 0.25), (3, 0.75)]
    assert found.data.metrics["summary/bytes_up_total"] == 4000.0
    assert not {"round", "client_ids", "flag", "diverged", "summary/peak_mem_mb"} & set(found.data.metrics)

    assert (tmp_path / "results" / "mlflow.db").is_file()

    # A run that stops early is marked FAILED, in the same experiment of the same store.
    (tracker2,) = make_trackers(["mlflow"], run)
    tracker2.on_run_start(run)
    tracker2.on_round_end(RECORDS[0])
    tracker2.close(failed=True)
    tracker2.close()
    statuses = sorted(r.info.status for r in client.search_runs([experiment.experiment_id]))
    assert statuses == ["FAILED", "FINISHED"]


def test_mlflow_bad_uri_is_a_config_error(tmp_path):
    pytest.importorskip("mlflow")
    with pytest.raises(ConfigError, match="--mlflow-uri"):
        make_trackers(["mlflow"], _run(tmp_path), mlflow_uri="nosuchscheme://x")


def test_portable_trackers_name_no_local_folder(tmp_path):
    """--portable: the event file, its config text and the MLflow store name no local path."""
    pytest.importorskip("tensorboard")
    pytest.importorskip("mlflow")
    run = _run(tmp_path)
    run.config = dataclasses.replace(run.config, portable=True)
    trackers = make_trackers(["tensorboard", "mlflow"], run)
    for tracker in trackers:
        _drive(tracker, run)
    (event_file,) = (run.run_dir / "tensorboard").glob("events.out.tfevents.*")
    for path in (event_file, tmp_path / "results" / "mlflow.db"):
        data = path.read_bytes()
        assert str(tmp_path).encode() not in data and b"<local>/results" in data, path
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=trackers[1].tracking_uri)
    experiment = client.get_experiment_by_name("pflbench")
    assert experiment.artifact_location == "mlflow-artifacts:/pflbench"
    (found,) = client.search_runs([experiment.experiment_id])
    assert found.data.tags["pflbench.run_dir"] == "<local>/fedprox-digits-abc"
