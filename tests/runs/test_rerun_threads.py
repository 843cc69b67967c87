"""``rerun --check`` reruns with the thread count the run recorded (issue 25): the numbers
depend on it, so a run made with 2 threads reproduces only at 2 threads."""

from __future__ import annotations

import json

from click.testing import CliRunner

from pflbench.cli import cli


def test_rerun_check_uses_the_recorded_thread_count(tmp_path) -> None:
    args = ["run", "--algo", "fedavg", "--model", "mlp", "--dataset", "digits", "--num-clients", "3",
            "--rounds", "2", "--threads", "2", "--quiet", "--out", str(tmp_path / "a")]  # fmt: skip
    made = CliRunner().invoke(cli, args)
    assert made.exit_code == 0, made.output
    (run_dir,) = (tmp_path / "a" / "runs").iterdir()
    record = json.loads((run_dir / "config.json").read_text())
    assert record["threads"] == 2 and record["identity"]["threads"] == 2
    rerun = CliRunner().invoke(cli, ["rerun", str(run_dir), "--check", "--quiet", "--out", str(tmp_path / "b")])
    assert rerun.exit_code == 0, rerun.output
    (again,) = (tmp_path / "b" / "runs").iterdir()
    assert again.name == run_dir.name
    assert json.loads((again / "config.json").read_text())["threads"] == 2
