"""Light commands stay light: ``run --help``, ``sweep --help``, ``list``, ``leaderboard`` and the
plugin command ``gates`` never import torch (each command runs in a fresh interpreter), and the
algorithm options that help shows are read from the plugin sources exactly as importing them
would give them."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from click.testing import CliRunner

from pflbench.cli import cli
from pflbench.plugin_sources import _static_algorithms, dataclass_hyperparameters, read_plugins
from pflbench.registry import ALGORITHMS

HEAVY = ("torch", "torchvision", "timm")
MARKER = "@@modules@@"
# the command's own output comes first, then one line: its exit code and which heavy modules it loaded
PROBE = f"""
import json, sys
sys.argv = ["pflbench", *sys.argv[1:]]
from pflbench.cli import main
try:
    main()
    code = 0
except SystemExit as exit:
    code = exit.code
sys.stdout.flush()
print({MARKER!r} + json.dumps({{"code": code, "loaded": [m for m in {HEAVY!r} if m in sys.modules]}}))
"""


def probe(*args: str) -> tuple[int, list[str], str]:
    """(exit code, heavy modules loaded, output) of ``pflbench ARGS`` in a fresh interpreter."""
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120, check=False
    )
    output, _, tail = result.stdout.rpartition(MARKER)
    assert tail, f"no result line; stdout: {result.stdout[-2000:]} stderr: {result.stderr[-2000:]}"
    found = json.loads(tail)
    return found["code"], found["loaded"], output + result.stderr


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results folder with one tiny finished run."""
    out = tmp_path_factory.mktemp("results")
    args = ["run", "--dataset", "digits", "--model", "mlp", "--num-clients", "3", "--rounds", "1", "--quiet"]
    result = CliRunner().invoke(cli, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("run", "--help"), ("[default: 0.5]", "--algo NAME --help")),
        (("run", "--algo", "fedprox", "--help"), ("  --mu ", "[default: 0.01]")),
        (("run", "--help-all"), ("  --mu ", "Options of fedprox:", "--head-epochs")),
        (("sweep", "--algos", "fedprox", "--help"), ("--algos", "  --mu ", "[default: 0.01]")),
        (("tune", "--algos", "fedprox", "--help"), ("--space", "--objective", "--allow-test-selection", "  --mu ")),
        (("run", "--algo", "fedrep", "--help"), ("--head-epochs",)),
        (("list",), ("fedprox", "digits")),
        (("list", "algorithms"), ("scaffold",)),
        (("gates", "--help"), ("RUN_DIR",)),
        (("--help",), ("leaderboard",)),
    ],
)
def test_help_and_list_do_not_import_torch(args: tuple[str, ...], expected: tuple[str, ...]) -> None:
    code, loaded, output = probe(*args)
    assert code == 0, output
    assert loaded == [], f"`pflbench {' '.join(args)}` imported {loaded}"
    for text in expected:
        assert text in output, text


@pytest.mark.parametrize("fmt", ["md", "csv"])
def test_leaderboard_does_not_import_torch(results: Path, fmt: str) -> None:
    code, loaded, output = probe("leaderboard", str(results), "--format", fmt)
    assert code == 0, output
    assert loaded == [], f"`pflbench leaderboard --format {fmt}` imported {loaded}"
    assert "FedAvg" in output  # the display name, read from the algorithm's source


def test_running_imports_torch_only_once_the_arguments_hold(results: Path) -> None:
    """Parsing reads the algorithms' sources too (issue 34): a bad name or value is refused
    without torch; a run that starts imports its algorithm (and torch)."""
    code, loaded, output = probe("run", "--algo", "nope", "--out", str(results))
    assert code == 2 and "unknown algorithm 'nope'" in output, output
    assert loaded == []
    code, loaded, output = probe("run", "--algo", "fedavg", "--mu", "0.1", "--out", str(results))
    assert code == 2 and "--mu" in output, output  # not fedavg's option: known only once it is imported
    assert "torch" in loaded


def test_sources_read_as_importing_them() -> None:
    """Every built-in algorithm is read from its source (no import needed for help), with the
    same hyperparameters (name, type, default, help, choices) and display name as imported."""
    found, unread = _static_algorithms()
    assert unread == []
    imported = ALGORITHMS.items  # may also hold plugins other tests loaded: compare the installed ones
    installed = {entry.name for entry in entry_points(group="pflbench.algorithms")}
    assert installed <= set(found) <= set(imported)
    for name, (_, plugin) in found.items():
        assert plugin.hyperparameters == dataclass_hyperparameters(imported[name].hyperparameters), name
        assert plugin.attribute("display_name") == imported[name].display_name, name


PLUGIN = '''
from dataclasses import dataclass
from typing import ClassVar, Optional

from pflbench import Algorithm, option, register_algorithm
from elsewhere import Borrowed, Base


@dataclass(frozen=True)
class Plain:
    """Hyperparameters."""

    limit: ClassVar[int] = 3
    rate: float = option(-1e-3, "Rate " "(joined).", choices=(-1e-3, 0.5))
    count: Optional[int] = option(None, help="Count.")
    names: tuple[str, ...] = option(("a",), "Names.")
    on: "bool" = option(True, "On.")

    def validate(self) -> None:
        pass


@dataclass(frozen=True)
class Computed:
    size: int = option(2 * 3, "Not a literal.")


@register_algorithm("plain")
class PlainAlgorithm(Algorithm[Plain]):
    """Plain."""

    hyperparameters = Plain
    display_name = "PLAIN"
    paper: ClassVar[str] = "Someone 2024"


@register_algorithm("none")
class NoneAlgorithm(Algorithm):
    """None."""


@register_algorithm("borrowed")
class BorrowedAlgorithm(Algorithm):
    hyperparameters = Borrowed


@register_algorithm("computed")
class ComputedAlgorithm(Algorithm):
    hyperparameters = Computed


@register_algorithm("inherits")
class Inherits(Base):
    """From a base the source does not show."""


if True:

    @register_algorithm("nested")
    class Nested(Algorithm):
        pass
'''


def test_read_plugins_reads_what_is_plain_and_leaves_the_rest_to_import() -> None:
    plugins = {plugin.name: plugin for plugin in read_plugins(PLUGIN, "algorithm")}
    assert list(plugins) == ["plain", "none", "borrowed", "computed", "inherits", "nested"]
    plain = plugins["plain"]
    assert [(h.name, h.annotation, h.default) for h in plain.hyperparameters or ()] == [
        ("rate", float, -1e-3),
        ("count", int | None, None),
        ("names", tuple[str, ...], ("a",)),
        ("on", bool, True),
    ]
    assert plain.hyperparameters[0].metadata == {"help": "Rate (joined).", "choices": (-1e-3, 0.5)}
    assert plain.attribute("display_name") == "PLAIN" and plain.summary == "Plain. [Someone 2024]"
    assert plugins["none"].hyperparameters == () and plugins["none"].attribute("display_name") is None
    # not readable: a dataclass from another module, a computed default, an unseen base class
    assert plugins["borrowed"].hyperparameters is None and plugins["computed"].hyperparameters is None
    assert plugins["inherits"].hyperparameters is None
    with pytest.raises(KeyError):  # not said in the source: importing it will tell
        plugins["inherits"].attribute("display_name")
    assert plugins["nested"].hyperparameters == ()
    assert read_plugins("x = 1", "algorithm") == []
