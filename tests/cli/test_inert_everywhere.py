"""Every entry point refuses an option the run would not read, as ``run`` does (issue 36): ``tune``
(one ``Error:`` line, exit code 2, nothing written) and the library's ``run_experiment``
(``ConfigError`` with the same message)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pflbench.cli import cli
from pflbench.config.run_config import RunConfig
from pflbench.errors import ConfigError
from pflbench.runs.api import run_experiment

TINY = ["--model", "mlp", "--num-clients", "3", "--rounds", "1", "--quiet"]
TUNE = ["tune", "--algos", "fedavg", "--datasets", "digits", *TINY, "--trials", "2", "--dry-run"]


def invoke(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args))


def one_error_line(result: Any) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--optimizer", "adam", "--momentum", "0.9"],
            "--momentum 0.9 would be ignored: --optimizer adam has no momentum",
        ),
        (["--lora-alpha", "8"], "--lora-alpha 8.0 would be ignored"),
        (["--shards-per-client", "3"], "--shards-per-client 3 would be ignored"),
        (["--mlflow-uri", "sqlite:///x.db"], "--mlflow-uri sqlite:///x.db would be ignored"),
        (["--cpus-per-run", "2"], "--cpus-per-run would be ignored: only Ray tasks declare resources"),
    ],
)
def test_tune_refuses_an_inert_option_like_run(extra: list[str], message: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    line = one_error_line(invoke(*TUNE, *extra, "--out", str(out)))
    assert message in line, line
    assert not out.exists()
    if "--cpus-per-run" not in extra:  # run says the same (--cpus-per-run is a grid's option)
        run = one_error_line(invoke("run", "--dataset", "digits", *TINY, *extra, "--out", str(out)))
        assert run == line


def test_tune_refuses_an_inert_hyperparameter_of_the_algorithm(tmp_path: Path) -> None:
    args = [*TUNE[:2], "perfedavg", *TUNE[3:], "--hvp-delta", "0.01", "--out", str(tmp_path)]
    assert "--hvp-delta 0.01 would be ignored: --hvp exact" in one_error_line(invoke(*args))


def test_tune_keeps_an_option_that_a_trial_reads(tmp_path: Path) -> None:
    """--momentum with --optimizer adam is inert for the cell, but the space's sgd trials read it."""
    args = ["--optimizer", "adam", "--momentum", "0.9", "--space", "optimizer=sgd,adam", "--out", str(tmp_path)]
    result = invoke(*TUNE, *args)
    assert result.exit_code == 0, result.output
    assert "1 studies (dry run" in result.output


def test_tune_refuses_an_inert_option_of_its_config_file(tmp_path: Path) -> None:
    config = tmp_path / "tune.toml"
    config.write_text('optimizer = "adam"\nmomentum = 0.9\n')
    line = one_error_line(invoke(*TUNE, "--config", str(config), "--out", str(tmp_path / "out")))
    assert "--momentum 0.9 would be ignored" in line and "of the --config file" in line


SMALL = dict(dataset="digits", model="mlp", num_clients=3, rounds=1)


@pytest.mark.parametrize(
    ("settings", "options", "flags"),
    [
        ({"optimizer": "adam", "momentum": 0.9}, None, ["--optimizer", "adam", "--momentum", "0.9"]),
        ({"lora_targets": "fc1"}, None, ["--lora-targets", "fc1"]),
        ({"ray_workers": 4}, None, ["--ray-workers", "4"]),
        ({"algo": "perfedavg"}, {"hvp_delta": 0.01}, ["--algo", "perfedavg", "--hvp-delta", "0.01"]),
    ],
)
def test_run_experiment_refuses_an_inert_setting_like_run(
    settings: dict[str, Any], options: dict[str, Any] | None, flags: list[str], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    with pytest.raises(ConfigError) as refused:
        run_experiment(RunConfig(**{**SMALL, **settings}, out=str(out)), options)
    assert not out.exists()  # refused before anything is read or written
    line = one_error_line(invoke("run", "--dataset", "digits", *TINY, *flags, "--out", str(out)))
    assert line == f"Error: {refused.value}"
