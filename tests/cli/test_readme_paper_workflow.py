"""The docs' paper workflow (tune → sweep → leaderboard; docs/guides/tuning.md, moved there from
the README by issue 38) against the program (issue 34, item 13: the README showed a note the
program no longer printed). Its three commands are read from the page and run on small settings
(2 trials, 3 rounds); the leaderboard's header line and rows must be the page's, and each note
the page shows must be one the program prints (and the reverse), compared by what each note is
about (its text before the first colon). Notes that depend on the numbers (ties, significance,
seeds that never reach the target) may differ."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from pflbench.cli import cli

pytest.importorskip("optuna", reason="pflbench tune needs Optuna (pip install -e '.[tune]')")

README = Path(__file__).resolve().parents[2] / "docs" / "guides" / "tuning.md"
SMALL = {"--trials": "2", "--rounds": "3"}
# notes present or not depending on the numbers of the runs
DEPENDS_ON_NUMBERS = ("Italic", "Underlined", "No significance marks", "— (k/n)", "†", "Not ranked")


def _section() -> str:
    text = README.read_text(encoding="utf-8")
    return text.split("## A paper workflow")[1].split("\n## ")[0]


def _blocks() -> list[tuple[str, str]]:
    """(language, text) of each fenced block of the section."""
    blocks, language, lines = [], None, []
    for line in _section().splitlines():
        if line.startswith("```"):
            if language is None:
                language, lines = line[3:].strip(), []
            else:
                blocks.append((language, "\n".join(lines)))
                language = None
        elif language is not None:
            lines.append(line)
    return blocks


def _commands(out: Path) -> list[list[str]]:
    block = next(text for language, text in _blocks() if language == "bash")
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line)
        assert words[0] == "pflbench", line
        args = [SMALL.get(words[i - 1], word) if i else word for i, word in enumerate(words)][1:]
        args = [
            str(out) if word == "paper" and (i == 1 or args[i - 1] == "--out") else word for i, word in enumerate(args)
        ]
        commands.append(args)
    return commands


def _shown_output() -> list[str]:
    table = next(text for language, text in _blocks() if language == "" and "| Algorithm |" in text)
    return [line for line in table.splitlines() if line.strip()]


def _note_key(line: str) -> str:
    head = line.split(":")[0]
    return head if len(head) <= 60 else " ".join(line.split()[:6])


def _notes(lines: list[str]) -> set[str]:
    notes = {_note_key(line) for line in lines if not line.startswith(("|", "Table:"))}
    return {key for key in notes if not key.startswith(DEPENDS_ON_NUMBERS)}


def test_paper_workflow_prints_what_the_readme_shows(tmp_path: Path) -> None:
    runner = CliRunner()
    *runs, leaderboard = _commands(tmp_path / "paper")
    for args in runs:
        result = runner.invoke(cli, [*args, "--quiet"] if args[0] == "sweep" else args)
        assert result.exit_code == 0, result.output
    result = runner.invoke(cli, leaderboard)
    assert result.exit_code == 0, result.output
    printed = [line for line in result.stdout.splitlines() if line.strip()]
    shown = _shown_output()
    assert printed[:2] == shown[:2]  # the caption and the header line
    assert {line.split(" | ")[0] for line in printed if line.startswith("| ")} == {
        line.split(" | ")[0] for line in shown if line.startswith("| ")
    }
    assert _notes(shown) == _notes(printed)
