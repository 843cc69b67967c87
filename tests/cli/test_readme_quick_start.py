"""CI runs the README's Quick start verbatim (``.ci/readme_commands.py``, issue 34 item 9): the
two commands it reads from README.md are the install-and-run line with the ``[dev]`` extra only
and the test command, and its clean clone carries uncommitted changes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _ci_script():
    spec = importlib.util.spec_from_file_location("readme_commands", ROOT / ".ci" / "readme_commands.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ci_reads_the_two_quick_start_commands_from_the_readme() -> None:
    install, tests = _ci_script().quick_start_commands((ROOT / "README.md").read_text(encoding="utf-8"))
    assert install.startswith('python3 -m venv .venv && .venv/bin/pip install -e ".[dev]" && .venv/bin/pflbench run ')
    assert tests == ".venv/bin/pytest -q"
    assert "(Python ≥ 3.10)" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_fewer_than_two_blocks_is_an_error() -> None:
    script = _ci_script()
    with pytest.raises(SystemExit, match="has 1 bash blocks"):
        script.quick_start_commands("# x\n\n## Quick start\n\n```bash\nls\n```\n\n## Next\n\n```bash\npwd\n```\n")
    with pytest.raises(SystemExit, match="no '## Quick start' section"):
        script.quick_start_commands("# x\n")
