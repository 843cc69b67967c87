"""``pflbench rerun`` of a run that used a plugin file: from any folder, after the file moved
(the run folder's copy), never loading a run folder's code unasked, and saying when the code
differs from what made the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from pflbench.cli import cli

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "algorithms" / "example_loss_term.py"
TINY = ["--dataset", "digits", "--model", "mlp", "--num-clients", "3", "--rounds", "2", "--quiet"]


def invoke(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result.exit_code, result.output


@pytest.fixture
def plugin_run(tmp_path: Path, request: pytest.FixtureRequest) -> tuple[Path, Path]:
    """(plugin file, run folder) of a run made with a copy of the example loss-term plugin,
    registered under a name of the test's own (one name from two files would be refused)."""
    name = "rerun_" + request.node.name.removeprefix("test_")[:40]
    plugin = tmp_path / "code" / "my_prox.py"
    plugin.parent.mkdir()
    plugin.write_text(EXAMPLE.read_text().replace('"example_prox"', f'"{name}"'))
    code, output = invoke(
        "run", "--plugin", plugin, "--algo", name, "--prox-mu", "0.5", *TINY, "--out", tmp_path / "out"
    )
    assert code == 0, output
    (folder,) = (tmp_path / "out" / "runs").iterdir()
    return plugin, folder


def test_rerun_from_another_folder_loads_the_recorded_file(plugin_run, tmp_path, monkeypatch) -> None:
    plugin, folder = plugin_run
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, output = invoke("rerun", folder, "--quiet", "--check")
    assert code == 2 and "--trust-plugins" in output and f"copies in {folder / 'plugins'}" in output, output
    code, output = invoke("rerun", folder, "--quiet", "--check", "--trust-plugins")
    assert code == 0, output
    assert f"plugin my_prox.py: loaded {plugin} (the file the run used, unchanged)" in output
    assert "code identical to what made the run" in output and "metrics identical" in output
    code, output = invoke("rerun", folder, "--trust-plugins", "--plugin", plugin)
    assert code == 2 and "either --plugin FILE or --trust-plugins" in output


RERUN = "import sys\nfrom pflbench.cli import cli\nsys.argv = ['pflbench', *sys.argv[1:]]\ncli()\n"


def test_rerun_after_the_file_moved_loads_the_run_folders_copy(plugin_run, tmp_path) -> None:
    """In a fresh interpreter: this test process registered the algorithm from the original file."""
    plugin, folder = plugin_run
    plugin.rename(tmp_path / "moved.py")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    command = [sys.executable, "-c", RERUN, "rerun", str(folder), "--quiet", "--check", "--trust-plugins"]
    done = subprocess.run(command, cwd=elsewhere, capture_output=True, text=True, env=os.environ.copy())
    assert done.returncode == 0, done.stdout + done.stderr
    copy = folder / "plugins" / "my_prox.py"
    assert f"plugin my_prox.py: {plugin} is not found; loaded the run folder's copy {copy}" in done.stdout
    assert "code identical to what made the run" in done.stdout and "metrics identical" in done.stdout
    (rerun,) = (folder.parent.parent / "reruns").glob("*/runs/*")
    assert json.loads((rerun / "config.json").read_text())["plugins"] == [str(copy)]


def test_a_copy_that_does_not_hold_the_recorded_content_is_refused(plugin_run, tmp_path) -> None:
    plugin, folder = plugin_run
    plugin.write_text(plugin.read_text() + "\n# changed since the run\n")
    (folder / "plugins" / "my_prox.py").write_text("raise SystemExit('must never run')\n")
    code, output = invoke("rerun", folder, "--quiet", "--trust-plugins")
    assert code == 2 and "neither" in output and "holds the content the run used" in output, output
    assert not (folder.parent.parent / "reruns").exists()


def test_rerun_with_an_edited_plugin_says_the_code_differs(plugin_run) -> None:
    plugin, folder = plugin_run
    plugin.write_text(plugin.read_text() + "\n# an edit that changes no number\n")
    code, output = invoke("rerun", folder, "--quiet", "--check", "--plugin", plugin)
    assert code == 0 and "metrics identical" in output, output  # --check judges the numbers
    assert "code DIFFERS from what made the run: algorithm " in output and "my_prox.py changed (sha256 " in output


def test_a_run_recorded_before_code_records(plugin_run, tmp_path) -> None:
    plugin, folder = plugin_run
    config = json.loads((folder / "config.json").read_text())
    del config["code"]
    (folder / "config.json").write_text(json.dumps(config))
    code, output = invoke("rerun", folder, "--quiet", "--trust-plugins")
    assert code == 2 and "recorded before pflbench kept its plugin files' hashes" in output, output
    code, output = invoke("rerun", folder, "--quiet", "--plugin", plugin, "--out", tmp_path / "again")
    assert code == 0 and "code: unknown (the run was recorded before pflbench recorded code)" in output, output


def test_a_run_recorded_before_validation_splits_reruns_without_one(tmp_path: Path) -> None:
    """config.json of a run made before --val-frac existed has no val_frac: rerun takes 0 (what
    that run did), not today's default 0.1, which would change its partition and numbers."""
    from pflbench.runs.rerun import read_recorded_run

    settings = '"algo": "fedavg", "dataset": "digits", "partition": "dirichlet", "rounds": 2, "seed": 3'
    (tmp_path / "config.json").write_text("{" + settings + "}")
    assert read_recorded_run(tmp_path).config.val_frac == 0.0
    (tmp_path / "config.json").write_text("{" + settings + ', "val_frac": 0.2}')
    assert read_recorded_run(tmp_path).config.val_frac == 0.2
