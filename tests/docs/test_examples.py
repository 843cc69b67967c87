"""Every shell example marked runnable in the docs (and the README) is executed, and its shown
output compared, so the pages cannot drift from the program (issue 38).

Marking, in a page's Markdown: an HTML comment ``<!-- runnable -->`` on the line before a
```` ```bash ```` block runs the block; a ```` ```text ```` block right after it, preceded by
``<!-- output -->``, is the output it must print (stdout and stderr together). In a shown output
``[...]`` stands for any text within a line (a time, an absolute path, a hash of the code); every
other character must match. The blocks of one page run in order in one fresh folder (so a later
block reads what an earlier one wrote), with the repository's ``algorithms/``, ``datasets/`` and
``examples/`` beside it, on small settings chosen in the pages themselves."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
BLOCK = re.compile(
    r"^<!-- runnable -->\n```bash\n(?P<command>.*?)^```\n"
    r"(?:\n*<!-- output -->\n```text\n(?P<output>.*?)^```\n)?",
    re.S | re.M,
)


def examples(page: Path) -> list[tuple[str, str | None]]:
    return [(m["command"], m["output"]) for m in BLOCK.finditer(page.read_text(encoding="utf-8"))]


def matches(expected: str, actual: str) -> bool:
    """Line by line; ``[...]`` within an expected line matches any text."""
    want, got = expected.rstrip("\n").splitlines(), actual.rstrip("\n").splitlines()
    if len(want) != len(got):
        return False
    patterns = [re.compile(".*".join(map(re.escape, line.split("[...]"))) + r"\Z") for line in want]
    return all(p.match(line) for p, line in zip(patterns, got, strict=True))


def test_the_marker_parser_finds_commands_and_outputs() -> None:
    page = "<!-- runnable -->\n```bash\necho hi\n```\n\n<!-- output -->\n```text\nhi\n```\n"
    found = [(m["command"], m["output"]) for m in BLOCK.finditer(page)]
    assert found == [("echo hi\n", "hi\n")]
    assert matches("time [...]s\nok\n", "time 0.7s\nok\n") and not matches("time [...]s\n", "rate 0.7s\n")
    assert not matches("a\n", "a\nb\n")


RUNNABLE = [page for page in PAGES if examples(page)]


def test_the_docs_have_runnable_examples() -> None:
    assert len(RUNNABLE) >= 3 and sum(len(examples(p)) for p in RUNNABLE) >= 5


@pytest.mark.parametrize("page", RUNNABLE, ids=[str(p.relative_to(ROOT)) for p in RUNNABLE])
def test_runnable_examples_run_and_print_what_the_page_shows(page: Path, tmp_path: Path) -> None:
    for name in ("algorithms", "datasets", "examples"):
        (tmp_path / name).symlink_to(ROOT / name)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "OMP_NUM_THREADS": "1",
        "COLUMNS": "100",
    }
    for command, output in examples(page):
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", command],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        printed = done.stdout + done.stderr
        assert done.returncode == 0, f"{page.name}: {command}\nexit {done.returncode}\n{printed}"
        if output is not None:
            assert matches(output, printed), f"{page.name}: {command}\nshown:\n{output}\nprinted:\n{printed}"


def test_the_readme_tour_is_the_docs_executed_examples() -> None:
    """README.md's tour shows commands and outputs that the docs pages mark runnable (and so are
    executed above): each of its bash blocks is one of theirs, each shown output one of theirs."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "\n## A tour" in readme, "README.md has no tour section"
    tour = readme.split("\n## A tour", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"^```bash\n(.*?)^```", tour, re.S | re.M)
    outputs = re.findall(r"^```text\n(.*?)^```", tour, re.S | re.M)
    executed = [example for page in RUNNABLE if page.name != "README.md" for example in examples(page)]
    assert len(commands) >= 3 and outputs, "the tour shows its commands and their output"
    for command in commands:
        assert command in {c for c, _ in executed}, f"README tour command not executed from the docs:\n{command}"
    for output in outputs:
        assert output in {o for _, o in executed}, f"README tour output not checked in the docs:\n{output}"
