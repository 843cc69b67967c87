"""What code computed a run (``config.json`` → ``code``): a plugin file's sha256, a built-in
module's hash and pflbench's version, a distribution's name and version, the git checkout; the code
identity (what makes a finished run stale) and how two code records differ."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
from click.testing import CliRunner

import pflbench.algorithms.fedavg
import pflbench.algorithms.fedprox
from pflbench import registry
from pflbench._version import __version__
from pflbench.cli import cli
from pflbench.config import provenance
from pflbench.config.provenance import code_changes, code_identity, defining_modules, git_state, module_source

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "algorithms" / "example_loss_term.py"
TINY = ["--dataset", "digits", "--model", "mlp", "--num-clients", "3", "--rounds", "1", "--quiet"]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run(*args: object) -> dict:
    """``pflbench run ARGS``; the run's config.json."""
    result = CliRunner().invoke(cli, ["run", *map(str, args)])
    assert result.exit_code == 0, result.output
    (line,) = [line for line in result.output.splitlines() if line.startswith("results: ")]
    folder = Path(line.removeprefix("results: "))
    return json.loads((folder / "config.json").read_text())


def test_a_plugin_run_records_the_files_sha256_its_absolute_path_and_a_copy(tmp_path: Path, monkeypatch) -> None:
    plugin = tmp_path / "plugins_here" / "my_prox.py"
    plugin.parent.mkdir()
    plugin.write_text(EXAMPLE.read_text().replace('"example_prox"', '"code_record_prox"'))
    monkeypatch.chdir(plugin.parent)  # given relative to the working directory, recorded absolute
    config = run("--plugin", "my_prox.py", "--algo", "code_record_prox", *TINY, "--out", tmp_path / "out")
    digest = sha256(plugin)
    code = config["code"]
    assert config["plugins"] == [str(plugin)]
    assert code["plugins"]["algorithm"] == {
        "name": "code_record_prox",
        "sources": [{"plugin_file": str(plugin), "sha256": digest}],
    }
    assert code["plugin_files"] == [{"path": str(plugin), "sha256": digest, "copy": "plugins/my_prox.py"}]
    (folder,) = (tmp_path / "out" / "runs").iterdir()
    assert (folder / "plugins" / "my_prox.py").read_bytes() == plugin.read_bytes()
    assert code["pflbench"] == __version__ and len(code["identity"]) == 16


def test_a_built_in_run_records_the_version_and_each_modules_hash(tmp_path: Path) -> None:
    config = run("--algo", "fedprox", *TINY, "--out", tmp_path)
    code = config["code"]
    fedprox, fedavg = Path(pflbench.algorithms.fedprox.__file__), Path(pflbench.algorithms.fedavg.__file__)
    assert code["pflbench"] == __version__ and config["versions"]["pflbench"] == __version__
    assert code["plugins"]["algorithm"] == {  # FedProx subclasses FedAvg: both files count
        "name": "fedprox",
        "sources": [
            {
                "module": "pflbench.algorithms.fedprox",
                "file": "pflbench/algorithms/fedprox.py",
                "sha256": sha256(fedprox),
            },
            {"module": "pflbench.algorithms.fedavg", "file": "pflbench/algorithms/fedavg.py", "sha256": sha256(fedavg)},
        ],
    }
    partitioners = ROOT / "pflbench" / "data" / "partitioners.py"
    assert code["plugins"]["partitioner"]["sources"][0]["sha256"] == sha256(partitioners)
    assert code["plugins"]["model"]["name"] == "mlp" and code["plugins"]["dataset"]["name"] == "digits"
    assert code["plugin_files"] == [] and config["plugins"] == []
    assert code["identity"] == code_identity(code["plugins"])
    assert config["git_commit"] == (code["git"] or {}).get("commit")


def test_the_core_and_other_packages_are_not_plugin_code() -> None:
    """FedAvg builds on pflbench.engine's Algorithm (the core: its version counts) and typing's
    Generic: only the plugin's own module is listed."""
    assert defining_modules(pflbench.algorithms.fedavg.FedAvg) == ["pflbench.algorithms.fedavg"]


def test_a_distributions_module_records_its_name_version_and_hash(tmp_path: Path, monkeypatch) -> None:
    file = tmp_path / "fakepkg_algo.py"
    file.write_text("VALUE = 1\n")
    module = types.ModuleType("fakepkg.algo")
    module.__file__ = str(file)
    monkeypatch.setitem(sys.modules, "fakepkg.algo", module)
    monkeypatch.setitem(registry._entry_point_distributions, "fakepkg", ("fake-dist", "1.2.3"))
    assert module_source("fakepkg.algo") == {
        "module": "fakepkg.algo",
        "distribution": "fake-dist",
        "version": "1.2.3",
        "sha256": sha256(file),
    }


PLUGINS = {"algorithm": {"name": "x", "sources": [{"plugin_file": "/home/a/x.py", "sha256": "aa"}]}}


def test_the_code_identity_is_what_the_code_is_not_where_it_lies() -> None:
    moved = {"algorithm": {"name": "x", "sources": [{"plugin_file": "/elsewhere/x.py", "sha256": "aa"}]}}
    edited = {"algorithm": {"name": "x", "sources": [{"plugin_file": "/home/a/x.py", "sha256": "bb"}]}}
    assert code_identity(PLUGINS) == code_identity(moved)
    assert code_identity(PLUGINS) != code_identity(edited)
    assert code_identity(PLUGINS, "0.1.0") != code_identity(PLUGINS, "0.2.0")


def test_code_changes_name_what_differs() -> None:
    old = {"identity": "1", "pflbench": "0.1.0", "plugins": PLUGINS}
    new = {
        "identity": "2",
        "pflbench": "0.2.0",
        "plugins": {
            "algorithm": {"name": "x", "sources": [{"plugin_file": "/moved/x.py", "sha256": "bbbbbbbbbb"}]},
            "model": {"name": "vit_tiny", "sources": [{"distribution": "timm", "version": "1.0"}]},
        },
    }
    assert code_changes(old, new) == [
        "pflbench 0.1.0 → 0.2.0",
        "algorithm x: x.py changed (sha256 aa → bbbbbbbb)",
        "model vit_tiny added",
    ]
    assert code_changes(old, {**old}) == []
    assert code_changes(None, new) == ["the run was recorded before pflbench recorded code"]


def git(folder: Path, *args: str) -> str:
    command = ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(command, cwd=folder, check=True, capture_output=True, text=True).stdout.strip()


def test_git_state_of_a_checkout_clean_dirty_and_none(tmp_path: Path, monkeypatch) -> None:
    checkout = tmp_path / "checkout"
    (checkout / "pflbench").mkdir(parents=True)
    monkeypatch.setattr(provenance, "PACKAGE_DIR", checkout / "pflbench")
    assert git_state() is None  # not a git checkout (an installed pflbench)
    git(checkout, "init", "-q")
    assert git_state() is None  # no commit yet
    (checkout / "pflbench" / "core.py").write_text("A = 1\n")
    git(checkout, "add", ".")
    git(checkout, "commit", "-q", "-m", "first")
    commit = git(checkout, "rev-parse", "HEAD")
    (checkout / "notes.txt").write_text("untracked files do not make it dirty\n")
    assert git_state() == {"commit": commit, "dirty": False}
    (checkout / "pflbench" / "core.py").write_text("A = 2\n")
    assert git_state() == {"commit": commit, "dirty": True}
    monkeypatch.setenv("PATH", str(tmp_path / "no-git-here"))
    assert git_state() is None  # no git program: null, never an error


@pytest.mark.parametrize("portable", [False, True])
def test_portable_runs_keep_the_copy_and_name_no_local_plugin_path(tmp_path: Path, portable: bool) -> None:
    name = f"code_portable_{portable}".lower()
    plugin = tmp_path / f"{name}.py"
    plugin.write_text(EXAMPLE.read_text().replace('"example_prox"', f'"{name}"'))
    args = ["--plugin", plugin, "--algo", name, *TINY, "--out", tmp_path / "out"]
    config = run(*args, *(["--portable"] if portable else []))
    (folder,) = (tmp_path / "out" / "runs").iterdir()
    text = (folder / "config.json").read_text()
    assert (str(tmp_path) in text) is not portable
    expected = f"<local>/{plugin.name}" if portable else str(plugin)
    assert config["code"]["plugin_files"][0]["path"] == expected and config["plugins"] == [expected]
    assert config["code"]["plugin_files"][0]["copy"] == f"plugins/{plugin.name}"
    assert (folder / "plugins" / plugin.name).read_bytes() == plugin.read_bytes()
