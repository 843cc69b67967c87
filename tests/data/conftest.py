"""Fixtures shared by the dataset tests."""

from __future__ import annotations

from pathlib import Path

import huggingface_hub
import pytest

import datasets


@pytest.fixture
def offline_hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Hub offline, empty Hugging Face cache and pflbench cache, all under tmp_path (a test module
    takes it with ``pytestmark = pytest.mark.usefixtures("offline_hub")``).

    ``datasets`` read the environment when first imported, so its config is patched as well.
    """
    hf_home = tmp_path / "hf"
    monkeypatch.setenv("PFLBENCH_CACHE", str(tmp_path / "pflbench-cache"))
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(hf_home / "datasets"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", hf_home / "datasets")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hf_home / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
