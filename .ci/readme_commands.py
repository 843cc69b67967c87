"""CI: the README's Quick start as a new user runs it (issue 34): its two commands, read from
README.md (the first two ```bash blocks under "## Quick start", so they cannot drift from what
CI runs), run verbatim in a clean clone of this checkout, where the first creates a virtual
environment with the ``[dev]`` extra only. Both must pass: a test that needs another extra
skips there. Uncommitted changes are carried into the clone (none in CI's clean checkout), so
the check can be run before committing. Prints each command's wall time."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def quick_start_commands(readme: str) -> list[str]:
    """The first two bash blocks of the README's "## Quick start" section."""
    if "\n## Quick start\n" not in readme:
        raise SystemExit("README.md has no '## Quick start' section")
    section = readme.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```bash\n(.*?)^```", section, re.S | re.M)
    if len(blocks) < 2:
        raise SystemExit(f"README.md's Quick start has {len(blocks)} bash blocks, not two commands")
    return [block.strip() for block in blocks[:2]]


def git_files(*options: str) -> list[str]:
    listed = subprocess.run(["git", "ls-files", "-z", *options], cwd=ROOT, capture_output=True, check=True).stdout
    return [name for name in listed.decode().split("\0") if name]


def clean_clone(destination: Path) -> None:
    """A fresh clone of the checkout with its uncommitted changes (edits, new files, deletions)."""
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(destination)], check=True)
    for name in git_files("--modified", "--others", "--exclude-standard"):
        source, target = ROOT / name, destination / name
        if source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target, follow_symlinks=False)
    for name in git_files("--deleted"):
        (destination / name).unlink(missing_ok=True)


def main() -> int:
    commands = quick_start_commands((ROOT / "README.md").read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory(prefix="pflbench-readme-") as folder:
        clone = Path(folder) / "pflbench"
        clean_clone(clone)
        for command in commands:
            print(f"README Quick start, in a clean clone: {command}", flush=True)
            started = time.monotonic()
            code = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=clone, check=False).returncode
            print(f"  exit {code} after {time.monotonic() - started:.0f} s", flush=True)
            if code != 0:
                return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
