"""A Ray worker killed mid-run (SIGTERM/SIGKILL skip its TemporaryDirectory clean-up) leaves its
temporary run folder; the next task on the machine deletes the folders of dead workers only."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pflbench.sweeps.on_ray import RUN_FOLDER_PREFIX, remove_orphaned_run_folders


def test_only_the_folders_of_dead_workers_are_removed(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)  # exited: its pid no longer runs (reuse within the test is negligible)
    orphan = tmp_path / f"{RUN_FOLDER_PREFIX}{dead_pid}-abc"
    (orphan / "run").mkdir(parents=True)
    (orphan / "run" / "rounds.jsonl").write_text("{}\n")
    live = tmp_path / f"{RUN_FOLDER_PREFIX}{os.getpid()}-def"
    live.mkdir()
    other = tmp_path / "pflbench-plugins"
    other.mkdir()
    assert remove_orphaned_run_folders(tmp_path) == [orphan]
    assert not orphan.exists() and live.is_dir() and other.is_dir()
