"""Malformed files given to the commands that read them (issue 27): a partition file
(``--partition-file``), a run folder's ``config.json`` (``rerun``), ``summary.json`` (``gates``)
and ``--config`` files with values of the wrong type or options the run would ignore. Each is
one ``Error:`` line naming the file and what is wrong, exit code 2, nothing written.
(``benchmarks/probe_bad_inputs.py`` runs the larger space and counts.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pflbench.cli import cli
from pflbench.config.value_types import type_error
from pflbench.errors import ConfigError

DEEP = "[" * 10000 + "]" * 10000
RUN = ["run", "--dataset", "digits", "--model", "mlp", "--num-clients", "3", "--rounds", "1", "--quiet"]


def _partition(**changes: Any) -> dict[str, Any]:
    clients = [
        {"train": list(range(k * 500, k * 500 + 400)), "test": list(range(k * 500 + 400, k * 500 + 500))}
        for k in range(3)
    ]
    document = {
        "format": "pflbench-partition",
        "version": 1,
        "dataset": {"name": "digits", "size": 1797},
        "clients": clients,
    }
    for key, value in changes.items():
        if key == "train":
            clients[0]["train"] = value
        else:
            document[key] = value
    return document


def snapshot(root: Path) -> dict[str, float]:
    return {str(p.relative_to(root)): p.stat().st_mtime for p in root.rglob("*")}


def assert_one_error_line(result: Any, *pieces: str) -> None:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    for piece in pieces:
        assert piece in lines[0], lines[0]


# ----------------------------------------------------------------------------- value types


@pytest.mark.parametrize(
    "value, annotation, problem",
    [
        (2.7, int, "must be an integer, got 2.7"),
        ("3", int, 'must be an integer, got "3"'),
        (True, int, "must be an integer, got true"),
        (3, int, None),
        (1, float, None),
        ("0.1", float, 'must be a number, got "0.1"'),
        (False, float, "must be a number, got false"),
        ("false", bool, 'must be true or false, got "false"'),
        (1, bool, "must be true or false, got 1"),
        (5, str, "must be a string, got 5"),
        (None, int | None, None),
        (None, int, "must be an integer, got null"),
        (2.5, int | None, "must be an integer or null, got 2.5"),
        (["a", "b"], tuple[str, ...], None),
        ("tensorboard", tuple[str, ...], 'must be a list of strings, got "tensorboard"'),
        ([1], tuple[str, ...], "must be a list of strings, got [1]"),
    ],
)
def test_a_file_value_is_checked_not_converted(value: Any, annotation: Any, problem: str | None) -> None:
    assert type_error(value, annotation) == problem


# ----------------------------------------------------------------------------- partition files

PARTITION_CASES = [
    ("not json", "is not a JSON file"),
    (DEEP, "nested too deeply"),
    (json.dumps(_partition(train="@")).replace('"@"', DEEP), "nested too deeply"),
    (json.dumps(_partition(train=[[1, 2], [3]])), "found a nested list"),
    (json.dumps(_partition(train=[1.0, 2.0])), "found 1.0 (a number)"),
    (json.dumps(_partition(train=[True])), "found true (a boolean)"),
    (json.dumps(_partition(train=["1"])), 'found "1" (a string)'),
    (json.dumps(_partition(train=[2**63])), "client 0 train index 9223372036854775808 is out of range"),
    (json.dumps(_partition(train=[1, 2**64])), "is out of range"),
    (json.dumps(_partition(dataset="digits")), "'dataset' must be an object"),
    (json.dumps(_partition(dataset={"size": "1797"})), 'dataset.size must be an integer ≥ 0, got "1797"'),
    (json.dumps(_partition(num_clients=3.0)), "num_clients must be an integer, got 3.0"),
    (json.dumps(_partition(version=True)), "has format version True"),
    (json.dumps(_partition(clients=[{"train": [1]}])), "client 0 has no 'test' list"),
    (json.dumps(_partition(clients=[{"train": [1], "test": [2], "tset": [3]}])), "client 0 has unknown key 'tset'"),
    (json.dumps({"train_indices": 5, "test_indices": [[1]]}), "'train_indices' must be one list of indices per client"),
    (json.dumps({"train_indices": [[[1, 2], [3]]], "test_indices": [[4]]}), "found a nested list"),
    (json.dumps({"train_indices": [[1]], "test_indices": [[2]], "config": "digits"}), "'config' must be an object"),
]


@pytest.mark.parametrize("text, message", PARTITION_CASES)
def test_a_malformed_partition_file_is_one_error(text: str, message: str, tmp_path: Path) -> None:
    from pflbench.data.presets import read_partition_file

    path = tmp_path / "part.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=None) as error:
        read_partition_file(path)
    assert message in str(error.value) and str(path) in str(error.value)


@pytest.mark.parametrize("command", ["run", "partition"])
@pytest.mark.parametrize("text, message", [PARTITION_CASES[1], PARTITION_CASES[3], PARTITION_CASES[-1]])
def test_the_commands_reading_partition_files_answer_one_line(
    command: str, text: str, message: str, tmp_path: Path
) -> None:
    path = tmp_path / "part.json"
    path.write_text(text)
    argv = [*RUN, "--out", str(tmp_path / "out")] if command == "run" else ["partition", "--dataset", "digits"]
    before = snapshot(tmp_path)
    result = CliRunner().invoke(cli, [*argv, "--partition-file", str(path)])
    assert_one_error_line(result, message)
    assert snapshot(tmp_path) == before


# ----------------------------------------------------------------------------- rerun and gates


@pytest.fixture(scope="module")
def fedsdg_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fedsdg")
    argv = [*RUN, "--algo", "fedsdg", "--lora-targets", "fc1", "--out", str(out)]
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 0, result.output
    return next((out / "runs").iterdir())


RERUN_CASES: list[tuple[Any, str]] = [
    (None, "holds null, not a run's settings object"),
    ([], "holds a list"),
    (DEEP, "nested too deeply"),
    ({"rounds": "1"}, """'rounds' must be an integer, got "1\""""),
    ({"rounds": 1.7}, "'rounds' must be an integer, got 1.7"),
    ({"rounds": True}, "'rounds' must be an integer, got true"),
    ({"lr": "0.1"}, """'lr' must be a number or null, got "0.1\""""),
    ({"algo": 5}, "'algo' must be a string, got 5"),
    ({"save_model": "false"}, """'save_model' must be true or false, got "false\""""),
    ({"log": "tensorboard"}, """'log' must be a list of strings, got "tensorboard\""""),
    ({"algo_hparams": [1]}, "'algo_hparams' must be an object of hyperparameters, not a list"),
    ({"algo_hparams": {"lambda1": "abc"}}, """algo_hparams 'lambda1' must be a number, got "abc\""""),
    ({"plugins": 5}, "'plugins' must be a list of plugin files, not a number"),
    ({"code": [1]}, "'code' must be an object, not a list"),
    ({"code": {"plugin_files": "x"}}, "code.plugin_files must be a list"),
    ({"identity_hash": 5}, "'identity_hash' must be a string, not a number"),
    ({"rounds": None}, "'rounds' must be an integer, got null"),
    ("-rounds", "setting 'rounds' is missing"),
    ("-algo", "setting 'algo' is missing"),
]


@pytest.mark.parametrize("change, message", RERUN_CASES, ids=[m[:40] for _, m in RERUN_CASES])
def test_rerun_of_a_damaged_config_json_is_one_error(
    change: Any, message: str, fedsdg_run: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "received"
    shutil.copytree(fedsdg_run, folder)
    config = json.loads((folder / "config.json").read_text())
    if isinstance(change, dict):
        text = json.dumps({**config, **change})
    elif isinstance(change, str) and change.startswith("-"):
        text = json.dumps({k: v for k, v in config.items() if k != change[1:]})
    else:
        text = change if isinstance(change, str) else json.dumps(change)
    (folder / "config.json").write_text(text)
    before = snapshot(tmp_path)
    result = CliRunner().invoke(cli, ["rerun", str(folder), "--quiet", "--out", str(tmp_path / "rerun")])
    assert_one_error_line(result, message, "config.json")
    assert snapshot(tmp_path) == before


def test_rerun_refuses_an_mlflow_uri_it_would_not_use(fedsdg_run: Path, tmp_path: Path) -> None:
    argv = ["rerun", str(fedsdg_run), "--quiet", "--out", str(tmp_path / "rerun"), "--mlflow-uri", "sqlite:///x.db"]
    result = CliRunner().invoke(cli, argv)
    assert_one_error_line(result, "--mlflow-uri sqlite:///x.db would be ignored")
    assert not (tmp_path / "rerun").exists()


GATES_CASES: list[tuple[Any, str]] = [
    (DEEP, "nested too deeply"),
    ({"gates": "x"}, "'gates' must be a non-empty clients × blocks list of lists"),
    ({"gates": [0.1, 0.2]}, "'gates' must be a non-empty clients × blocks list of lists"),
    ({"gates": [[0.1, 0.2], [0.3]]}, "'gates' must be a non-empty clients × blocks list of lists"),
    ({"gates": [["a"]]}, "'gates' must hold gate values m in [0, 1]"),
    ({"gates": [[1.5]]}, "'gates' must hold gate values m in [0, 1]"),
    ({"gate_frac_below_0.1": "x"}, """'gate_frac_below_0.1' must be a fraction in [0, 1], got "x\""""),
    ({"gate_frac_above_0.9": None}, "'gate_frac_above_0.9' must be a fraction in [0, 1], got null"),
    ({"gates_clients_trained": [1]}, "'gates_clients_trained' must be an integer ≥ 0, got [1]"),
    ({"gate_blocks": 5}, "'gate_blocks' must list one block name per gate column"),
    ({"gate_blocks": ["a"] * 50}, "'gate_blocks' must list one block name per gate column"),
]


@pytest.mark.parametrize("change, message", GATES_CASES, ids=[m[:40] for _, m in GATES_CASES])
def test_gates_on_a_damaged_summary_json_is_one_error(
    change: Any, message: str, fedsdg_run: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "received"
    shutil.copytree(fedsdg_run, folder)
    summary = json.loads((folder / "summary.json").read_text())
    text = json.dumps({**summary, **change}) if isinstance(change, dict) else change
    (folder / "summary.json").write_text(text)
    before = snapshot(tmp_path)
    result = CliRunner().invoke(cli, ["gates", str(folder), "--plot", str(tmp_path / "gates.png")])
    assert_one_error_line(result, message, "summary.json")
    assert snapshot(tmp_path) == before


# ----------------------------------------------------------------------------- config files

CONFIG_CASES = [
    ("rounds = 2.7", "'rounds' must be an integer, got 2.7"),
    ('rounds = "1"', """'rounds' must be an integer, got "1\""""),
    ("rounds = true", "'rounds' must be an integer, got true"),
    ('lr = "0.1"', """'lr' must be a number or null, got "0.1\""""),
    ('save_model = "yes"', """'save_model' must be true or false, got "yes\""""),
    ("save_model = 1", "'save_model' must be true or false, got 1"),
    ("dataset = 5", "'dataset' must be a string, got 5"),
    ('algo = "fedprox"\nmu = "0.1"', """'mu' must be a number or null, got "0.1\""""),
    ('optimizer = "adam"\nmomentum = 0.9', "--momentum 0.9 would be ignored: --optimizer adam has no momentum"),
    ("lora_alpha = 8.0", "--lora-alpha 8.0 would be ignored"),
    ("head_layers = 2", "--head-layers 2 would be ignored"),
    ('partition = "iid"\nalpha = 0.1', "--alpha 0.1 would be ignored"),
    # an algorithm's hyperparameter its other settings do not read (Algorithm.inert_hyperparameters)
    ('algo = "perfedavg"\nvariant = "fo"\nhvp = "finite-difference"', "--hvp finite-difference would be ignored"),
    ('algo = "fedkd"\ncompression = "none"\nenergy_start = 0.9', "--energy-start 0.9 would be ignored"),
    ('algo = "apfl"\nadaptive_alpha = false\nalpha_lr = 0.1', "--alpha-lr 0.1 would be ignored"),
    ("straggler_sigma = 2.0", "--straggler-sigma 2.0 would be ignored"),
    ('straggler_model = "lognormal"\nstraggler_sigma = inf', "--straggler-sigma must be in [0, 20], got inf"),
    ('feature_shift = ",,"', "--feature-shift ',,' names no transform"),
    ('algo = "ifca"\nclusters = 100', "--clusters 100 is more than the 3 clients"),
]


@pytest.mark.parametrize("text, message", CONFIG_CASES)
def test_a_config_file_value_of_the_wrong_type_or_ignored_is_one_error(text: str, message: str, tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(text + "\n")
    argv = [*RUN, "--out", str(tmp_path / "out"), "--config", str(path)]
    if "rounds" in text:
        argv.remove("--rounds")
        argv.remove("1")
    before = snapshot(tmp_path)
    result = CliRunner().invoke(cli, argv)
    assert_one_error_line(result, message)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "text, message",
    [
        ("rounds: 2.7", "must be an integer, got 2.7"),
        ("rounds: yes", "got true"),
        ("save_model: 'false'", "true or false"),
    ],
)
def test_yaml_values_are_checked_like_toml(text: str, message: str, tmp_path: Path) -> None:
    pytest.importorskip("yaml")
    path = tmp_path / "config.yaml"
    path.write_text(text + "\n")
    argv = [a for a in RUN if a not in ("--rounds", "1")] + ["--out", str(tmp_path / "out"), "--config", str(path)]
    result = CliRunner().invoke(cli, argv)
    assert_one_error_line(result, message)


def test_a_config_file_with_values_of_their_types_still_runs(tmp_path: Path) -> None:
    """The checks refuse only wrong types: an int for a float setting and null for an unset one
    are fine."""
    path = tmp_path / "config.toml"
    path.write_text('lr = 1\nsave_model = false\nalgo = "fedprox"\nmu = 0\nrounds = 1\n')
    result = CliRunner().invoke(cli, [*RUN[:-3], "--quiet", "--out", str(tmp_path / "out"), "--config", str(path)])
    assert result.exit_code == 0, result.output
