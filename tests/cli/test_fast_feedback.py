"""What ``pflbench run`` tells a user, and how soon (issue 34, items 10 and 11): a bad value on
the command line is refused before torch is imported (each case in a fresh interpreter), and
the rounds' progress reaches a log file (stderr not a terminal) as plain lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

MARKER = "@@result@@"
# runs ``pflbench ARGS``; then one line: the exit code and whether torch was imported by then
PROBE = f"""
import json, sys
from pflbench.cli import cli
code = cli.main(sys.argv[1:], prog_name="pflbench", standalone_mode=False)
print({MARKER!r} + json.dumps({{"code": code, "torch": "torch" in sys.modules}}))
"""


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--alpha", "0"], "Error: --alpha must be a finite number > 0, got 0.0"),
        (["--frac", "1.5"], "Error: --frac must be in (0, 1], got 1.5"),
        (["--rounds", "0", "--algo", "fedprox", "--mu", "0.1"], "Error: --rounds must be ≥ 1, got 0"),
        (["--lr", "-1"], "Error: --lr must be a finite number > 0, got -1.0"),
        (["--algo", "fedavgg"], "Error: unknown algorithm 'fedavgg' (did you mean 'fedavg'?); valid choices: apfl,"),
    ],
)
def test_bad_values_are_refused_before_torch_is_imported(tmp_path: Path, args: list[str], error: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, "run", *args, "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output, _, tail = result.stdout.rpartition(MARKER)
    assert tail, result.stdout + result.stderr
    found = json.loads(tail)
    assert found == {"code": 2, "torch": False}, result.stderr
    assert result.stderr.splitlines() == [result.stderr.strip()] and result.stderr.startswith(error), result.stderr
    assert output == "" and not (tmp_path / "out").exists()


def test_round_progress_lines_reach_a_log_file(tmp_path: Path) -> None:
    """``2>log``: stderr is a file, so no live bar (it would write nothing until the end): one
    plain line per round here (``PFLBENCH_PROGRESS_EVERY=0``: every update), results on stdout."""
    stderr_path, stdout_path = tmp_path / "e", tmp_path / "o"
    args = ["run", "--algo", "fedrep", "--model", "mlp", "--dataset", "digits", "--num-clients", "3"]
    args += ["--rounds", "3", "--out", str(tmp_path / "out")]
    env = {**os.environ, "PFLBENCH_PROGRESS_EVERY": "0", "OMP_NUM_THREADS": "1"}
    with stderr_path.open("w") as stderr, stdout_path.open("w") as stdout:
        code = subprocess.run(
            [sys.executable, "-c", "from pflbench.cli import main; main()", *args],
            stdout=stdout,
            stderr=stderr,
            env=env,
            timeout=300,
            check=False,
        ).returncode
    log, results = stderr_path.read_text(), stdout_path.read_text()
    assert code == 0, log
    rounds = [line for line in log.splitlines() if line.startswith("fedrep on digits: ")]
    assert [line.split()[3] for line in rounds] == ["1/3", "2/3", "3/3"], log
    assert all("pers_acc 0." in line and "loss " in line and "elapsed" in line for line in rounds), log
    assert "ETA" in rounds[0] and "ETA" not in rounds[-1]
    assert "fedrep on digits" not in results and results.startswith("pers_acc "), results


# Optuna hidden from this interpreter, as on a machine without the ``tune`` extra
WITHOUT_OPTUNA = """
import importlib.util, sys
found = importlib.util.find_spec
importlib.util.find_spec = lambda name, package=None: None if name == "optuna" else found(name, package)
class NoOptuna:
    def find_spec(self, name, path=None, target=None):
        if name == "optuna" or name.startswith("optuna."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None
sys.meta_path.insert(0, NoOptuna())
"""


def test_tune_without_optuna_says_so_before_torch_is_imported(tmp_path: Path) -> None:
    args = ["tune", "--algos", "fedavg", "--model", "mlp", "--rounds", "2", "--out", str(tmp_path / "out")]
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_OPTUNA + PROBE, *args], capture_output=True, text=True, timeout=120, check=False
    )
    found = json.loads(result.stdout.rpartition(MARKER)[2] or "null")
    assert found == {"code": 2, "torch": False}, result.stdout + result.stderr
    assert result.stderr == "Error: pflbench tune needs Optuna: pip install 'pflbench[tune]'\n"
    assert not (tmp_path / "out").exists()


def test_data_that_cannot_be_had_is_not_announced_as_being_prepared(tmp_path: Path, monkeypatch) -> None:
    """A missing local copy is one Error line, without the "preparing dataset ... later runs read
    the cache" line before it (the loader fails before it reads anything)."""
    from click.testing import CliRunner

    from pflbench.cli import cli

    monkeypatch.setenv("PFLBENCH_CACHE", str(tmp_path / "cache"))
    missing = str(tmp_path / "nowhere")
    for dataset in ("cifar10", "kmnist"):
        result = CliRunner().invoke(cli, ["run", "--dataset", dataset, "--data-dir", missing, "--out", str(tmp_path)])
        assert result.exit_code == 2, result.output
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("Error: ") and missing in lines[0], result.stderr


def test_preparing_dataset_is_said_before_the_loader_reports(tmp_path: Path, monkeypatch) -> None:
    import torch

    from pflbench.data.dataset import TensorDataset, load_dataset
    from pflbench.errors import ConfigError
    from pflbench.registry import DATASETS, register_dataset
    from pflbench.util import progress

    class Recorder:  # a listening reporter (not Silent: progress.active() is then true)
        def __init__(self) -> None:
            self.events: list[str] = []

        def note(self, line: str) -> None:
            self.events.append(line.split(" (")[0])

        def start(self, name: str, total: int, unit: str) -> None:
            self.events.append(f"stage {name}")

        def update(self, handle: object, done: int, status: str) -> None:
            pass

        def finish(self, handle: object, status: str) -> None:
            pass

    def failing() -> TensorDataset:
        raise ConfigError("no data here")

    def decoding() -> TensorDataset:
        with progress.stage("decoding images", 1, "image"):
            pass
        return TensorDataset(torch.zeros(4, 1, 2, 2, dtype=torch.uint8), torch.tensor([0, 1, 0, 1]), 2, "test")

    monkeypatch.setenv("PFLBENCH_CACHE", str(tmp_path / "cache"))
    register_dataset("announce_fails")(failing)
    register_dataset("announce_decodes")(decoding)
    try:
        recorder = Recorder()
        with progress.reporting(recorder):
            with pytest.raises(ConfigError, match="no data here"):
                load_dataset("announce_fails")
            assert recorder.events == []
            load_dataset("announce_decodes")
            assert recorder.events == ["preparing dataset announce_decodes", "stage decoding images"]
            load_dataset("announce_decodes")  # from the cache: nothing to announce
            assert len(recorder.events) == 2
    finally:
        DATASETS._items.pop("announce_fails", None)
        DATASETS._items.pop("announce_decodes", None)
