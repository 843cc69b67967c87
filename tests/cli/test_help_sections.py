"""``run``/``sweep``/``tune --help`` fit on a screen (issue 36): the shared options in titled
sections, one line each; an algorithm's own options only for ``--algo NAME`` (``--algos``);
``--help-all`` prints everything in full. Every option is still accepted as before."""

from __future__ import annotations

import dataclasses
import re

import click
import pytest
from click.testing import CliRunner

from pflbench.cli import cli
from pflbench.cli.controls import CommandOption
from pflbench.cli.help import OTHER, SECTION_OF, summary
from pflbench.config.run_config import RunConfig
from pflbench.plugin_sources import algorithm_hyperparameters

COMMANDS = ("run", "sweep", "tune")
SCREEN = 150  # lines


def help_text(*args: str, width: int = 80) -> str:
    result = CliRunner().invoke(cli, list(args), terminal_width=width)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("width", [60, 80, 100, 200])
@pytest.mark.parametrize("command", COMMANDS)
def test_help_fits_on_a_screen(command: str, width: int) -> None:
    text = help_text(command, "--help", width=width)
    lines = text.splitlines()
    assert len(lines) <= SCREEN, (command, width, len(lines))
    terms = ("    pflbench", "  --attack [", "  --robust-agg [")  # examples and long choices overflow 60 columns
    assert max(len(line) for line in lines if not line.startswith(terms)) <= width
    for title in ("Data and partition:", "Local training:", "Differential privacy:", "Output:", "Control:"):
        assert title in lines, title
    assert OTHER + ":" not in lines
    words = " ".join(text.split())
    assert "--help-all" in words and ("--algos NAME,... --help" if command != "run" else "--algo NAME --help") in words


def test_every_run_setting_has_a_titled_section() -> None:
    """A setting added to RunConfig must be placed in help.SECTIONS (else it lands in OTHER)."""
    assert sorted(f.name for f in dataclasses.fields(RunConfig) if f.name not in SECTION_OF) == []


def listed(option: str, text: str) -> bool:
    """Whether help lists ``option`` (a line of its own, not a mention in a sentence)."""
    return re.search(rf"^\s+{re.escape(option)}\b", text, re.M) is not None


def test_an_algorithms_options_show_only_for_it() -> None:
    plain = help_text("run", "--help")
    assert not listed("--mu", plain) and not listed("--head-epochs", plain) and "[default: 0.5]" in plain
    fedprox = help_text("run", "--algo", "fedprox", "--help")
    assert "Options of fedprox:" in fedprox and listed("--mu", fedprox) and "[default: 0.01]" in fedprox
    assert not listed("--head-epochs", fedprox)
    assert not listed("--mu", help_text("run", "--algo", "fedavg", "--help"))
    assert listed("--mu", help_text("run", "--help", "--algo=fedprox"))  # the order does not matter
    grid = help_text("sweep", "--algos", "fedprox,fedrep", "--help")
    assert "Options of fedprox:" in grid and "Options of fedrep:" in grid and listed("--head-epochs", grid)
    assert listed("--mu", help_text("tune", "--algos", "fedprox", "--help"))
    assert "'nope' is not a registered algorithm" in help_text("run", "--algo", "nope", "--help")


def test_an_algorithm_named_in_the_config_file_shows_its_options(tmp_path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('algo = "fedprox"\n')
    assert listed("--mu", help_text("run", "--config", str(config), "--help"))


def test_help_all_prints_every_option_in_full() -> None:
    text = help_text("run", "--help-all", width=100)
    assert len(text.splitlines()) > 500
    assert "Options of fedprox:" in text and "Options of fedrep:" in text
    sizes = next(f for f in dataclasses.fields(RunConfig) if f.name == "sizes").metadata["help"]
    assert " ".join(sizes.split())[-40:] in " ".join(text.split())  # the whole help, not its first sentence
    assert "Exit code 0: completed" in text  # the whole description
    assert "Exit code 0" not in help_text("run", "--help")


def test_every_option_is_still_accepted_by_every_command() -> None:
    """Help shows fewer options; parsing takes every algorithm's hyperparameters as before."""
    names = {f.name for fields in algorithm_hyperparameters().values() for f in fields}
    for name in COMMANDS:
        command = cli.commands[name]
        params = {p.name for p in command.get_params(click.Context(command))}
        assert names <= params, sorted(names - params)
        settings = {f.name for f in dataclasses.fields(RunConfig)} - {"algo", "dataset", "alpha", "seed"}
        assert settings <= params


def test_controls_are_declared_not_listed() -> None:
    """Every option of run/sweep/tune is a run setting, an algorithm's hyperparameter or a
    CommandOption (the commands tell their controls by class, not by hand-kept tuples)."""
    settings = {f.name for f in dataclasses.fields(RunConfig)}
    hyper = {f.name for fields in algorithm_hyperparameters().values() for f in fields}
    for name in COMMANDS:
        command = cli.commands[name]
        ctx = click.Context(command)
        for param in command.get_params(ctx):
            if param is command.get_help_option(ctx) or param.name in settings | hyper:
                continue
            assert isinstance(param, CommandOption), (name, param.name)
    own = {p.name for p in cli.commands["run"].params if isinstance(p, CommandOption)}
    assert own == {"config", "quiet", "force", "resume", "plugin", "help_all"}


def test_help_all_is_no_config_key(tmp_path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("help_all = true\n")
    result = CliRunner().invoke(cli, ["run", "--config", str(config)])
    assert result.exit_code == 2 and "unknown key 'help_all'" in result.output


@pytest.mark.parametrize(
    ("text", "first"),
    [
        ("Communication rounds.", "Communication rounds."),
        ("Dataset option KEY=VALUE, repeatable (e.g. x=1). More.", "Dataset option KEY=VALUE, repeatable (e.g. x=1)."),
        ("Rate, e.g. 0.1 or more. Second.", "Rate, e.g. 0.1 or more."),
        ("No period", "No period"),
    ],
)
def test_summary_is_the_first_sentence(text: str, first: str) -> None:
    assert summary(text) == first
