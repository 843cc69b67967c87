"""The built-in plugins are the subpackages pflbench.algorithms / pflbench.datasets; nothing shadows
Hugging Face ``datasets``, in editable and in plain (wheel) installs."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pflbench

REPO = Path(__file__).resolve().parents[1]
BUILTIN_ALGORITHMS = ("fedavg", "fedprox", "local")


def python(code: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_hugging_face_datasets_is_not_shadowed_from_the_repo_root() -> None:
    # `python -c` puts the current directory (the repo root) first on sys.path.
    location = python("import datasets; print(datasets.__file__); print(datasets.load_dataset)", REPO)
    assert "site-packages" in location and str(REPO / "datasets") not in location


def test_plugin_folders_are_the_package_modules() -> None:
    import pflbench.algorithms.fedavg as fedavg
    import pflbench.datasets.builtin as builtin

    assert Path(fedavg.__file__).resolve() == REPO / "pflbench" / "algorithms" / "fedavg.py"
    assert Path(builtin.__file__).resolve() == REPO / "pflbench" / "datasets" / "builtin.py"
    # the top-level folders hold example plugins loaded with --plugin, never a package (no __init__.py)
    assert not (REPO / "algorithms" / "__init__.py").exists() and not (REPO / "datasets" / "__init__.py").exists()
    assert Path(pflbench.__file__).resolve().parent == REPO / "pflbench"


def test_plain_wheel_install_lists_every_builtin_plugin(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("pflbench-*.whl")
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    names = zipfile.ZipFile(wheel).namelist()
    assert "pflbench/algorithms/fedavg.py" in names and "pflbench/datasets/builtin.py" in names
    listing = python(
        "import pflbench, pflbench.cli as c; from pflbench.registry import ALGORITHMS, DATASETS;"
        "print(pflbench.__file__); print(' '.join(ALGORITHMS.names())); print(' '.join(DATASETS.names()))",
        cwd=tmp_path,
        env={"PYTHONPATH": str(site)},
    )
    location, algorithms, datasets = listing.splitlines()
    assert location.startswith(str(site))
    assert set(BUILTIN_ALGORITHMS) <= set(algorithms.split())
    assert {"digits", "synthetic", "mnist", "cifar100"} <= set(datasets.split())
