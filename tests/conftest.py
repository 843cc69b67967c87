from __future__ import annotations

import os

import pytest

# Before anything imports huggingface_hub/timm (they read these once, at import): no hub calls.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
# Tiny models on a small, possibly shared machine: one intra-op thread is fastest and never
# collapses when another process is busy (and keeps the numbers of a test independent of cores).
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True, scope="session")
def isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Dataset conversions are cached in a throwaway folder, never in ~/.cache."""
    mp = pytest.MonkeyPatch()
    mp.setenv("PFLBENCH_CACHE", str(tmp_path_factory.mktemp("cache")))
    yield
    mp.undo()


@pytest.fixture
def record_traffic():
    """Watch a ``pflbench.testing.Harness``: the keys each client received and uploaded."""

    def install(harness) -> tuple[list[set[str]], list[set[str]]]:
        observer = harness.watch_traffic()
        return observer.received, observer.uploaded

    return install
