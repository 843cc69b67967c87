"""`pflbench rerun RUN_DIR`: the same run from its config.json, identical metrics, new folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from pflbench.cli import cli
from pflbench.config import defaults
from pflbench.errors import ConfigError
from pflbench.runs.rerun import (
    compare_rounds,
    default_rerun_out,
    is_timing,
    prepare_rerun,
    read_recorded_run,
)

TINY = ["--dataset", "digits", "--model", "mlp", "--num-clients", "4", "--rounds", "3", "--quiet"]


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def rounds(folder: Path) -> list[dict]:
    return [
        {k: v for k, v in json.loads(line).items() if not is_timing(k)}
        for line in (folder / "rounds.jsonl").read_text().splitlines()
    ]


def test_rerun_reproduces_the_metrics_in_a_new_folder(tmp_path: Path) -> None:
    code, output = invoke(
        "run",
        "--algo",
        "fedrep",
        "--head-epochs",
        "2",
        "--alpha",
        "0.3",
        "--momentum",
        "0.5",
        *TINY,
        "--out",
        str(tmp_path),
    )
    assert code == 0, output
    (original,) = list((tmp_path / "runs").iterdir())
    before = {p.name: p.read_bytes() for p in original.iterdir() if p.is_file()}

    code, output = invoke("rerun", str(original), "--quiet", "--check")
    assert code == 0, output
    assert "metrics identical" in output
    (reruns,) = list((tmp_path / "reruns").iterdir())
    assert reruns.name.startswith(original.name)
    rerun = reruns / "runs" / original.name  # same settings → same name, under the new OUT
    assert rounds(rerun) == rounds(original) and len(rounds(rerun)) == 3
    assert (rerun / "clients.csv").read_text() == (original / "clients.csv").read_text()
    assert {p.name: p.read_bytes() for p in original.iterdir() if p.is_file()} == before
    old, new = (json.loads((d / "config.json").read_text()) for d in (original, rerun))
    assert new["identity"] == old["identity"] and new["algo_hparams"] == {"head_epochs": 2}
    assert new["out"] == str(reruns)
    assert compare_rounds(original, rerun) == []


def test_rerun_into_out_and_never_over_the_original(tmp_path: Path) -> None:
    code, output = invoke("run", "--algo", "fedprox", "--mu", "0.1", *TINY, "--out", str(tmp_path / "a"))
    assert code == 0, output
    (original,) = list((tmp_path / "a" / "runs").iterdir())
    code, output = invoke("rerun", str(original), "--out", str(tmp_path / "a"))
    assert code == 2 and "would overwrite the original run" in output
    code, output = invoke("rerun", str(original), "--out", str(tmp_path / "b"), "--quiet")
    assert code == 0 and "metrics identical" in output, output
    assert rounds(tmp_path / "b" / "runs" / original.name) == rounds(original)
    code, output = invoke("rerun", str(original), "--out", str(tmp_path / "b"))
    assert code == 2 and "already holds a run" in output


def test_rerun_uses_the_recorded_values_not_todays_defaults(tmp_path: Path, monkeypatch) -> None:
    code, output = invoke("run", "--algo", "fedavg", *TINY, "--out", str(tmp_path))  # lr left unset
    assert code == 0, output
    (original,) = list((tmp_path / "runs").iterdir())
    recorded = json.loads((original / "config.json").read_text())
    assert recorded["resolved"]["run_defaults"]["lr"] == recorded["lr"]
    monkeypatch.setitem(defaults.DEFAULTS_BY_FAMILY, "small", {"lr": 0.5})  # defaults change later
    prepared, run = prepare_rerun(original, tmp_path / "again")
    assert prepared.config.lr == recorded["lr"] and run.config.lr == recorded["lr"]
    assert prepared.resolved["run_defaults"] == {}  # nothing left to fill: config.json is complete


def test_compare_rounds_reports_differences(tmp_path: Path) -> None:
    for name, loss in (("a", 1.0), ("b", 1.5)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "rounds.jsonl").write_text(
            json.dumps({"round": 1, "train_loss": loss, "round_time_s": len(name) * loss, "pers_acc": float("nan")})
            + "\n"
        )
    assert compare_rounds(tmp_path / "a", tmp_path / "a") == []
    assert compare_rounds(tmp_path / "a", tmp_path / "b") == ["round 1: train_loss differ"]


def test_read_run_errors_and_default_out(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a run folder"):
        read_recorded_run(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read"):
        read_recorded_run(tmp_path)
    run_dir = tmp_path / "out" / "runs" / "fedavg__digits__x"
    target = default_rerun_out(run_dir)
    assert target.parent == (tmp_path / "out" / "reruns").resolve()
    assert target.name.startswith("fedavg__digits__x-")


def test_rerun_check_of_a_finetuned_run_compares_no_timing(tmp_path: Path) -> None:
    """Every timing key is left out of the comparison, ``finetune_time_s`` included."""
    code, output = invoke("run", *TINY, "--finetune-epochs", "1", "--out", str(tmp_path))
    assert code == 0, output
    (original,) = list((tmp_path / "runs").iterdir())
    assert "finetune_time_s" in (original / "rounds.jsonl").read_text()
    code, output = invoke("rerun", str(original), "--quiet", "--check")
    assert code == 0 and "metrics identical" in output, output


def test_rerun_runs_no_code_and_contacts_no_tracker_named_in_the_folder(tmp_path: Path) -> None:
    """A received run folder names a plugin file (whose import would leave a mark) and an MLflow
    address: rerun imports nothing it was not given and logs to no recorded tracker."""
    marker = tmp_path / "imported"
    plugin = tmp_path / "evil_plugin.py"
    plugin.write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).touch()\n"
        "from pflbench import register_algorithm\nfrom pflbench.algorithms.fedavg import FedAvg\n\n\n"
        '@register_algorithm("test_rerun_evil")\nclass Evil(FedAvg):\n    """x"""\n'
    )
    code, output = invoke("run", *TINY, "--out", str(tmp_path / "out"))
    assert code == 0, output
    (original,) = list((tmp_path / "out" / "runs").iterdir())
    record = json.loads((original / "config.json").read_text())
    record.update(plugins=[str(plugin)], log=["mlflow"], mlflow_uri="http://192.0.2.1:5000")
    (original / "config.json").write_text(json.dumps(record))
    code, output = invoke("rerun", str(original), "--quiet")
    assert code == 2 and "--plugin FILE" in output and not marker.exists(), output
    prepared, _ = prepare_rerun(original, tmp_path / "again", plugins=(str(plugin),))
    assert marker.exists()  # given explicitly: loaded
    assert prepared.config.log == () and prepared.config.mlflow_uri is None
