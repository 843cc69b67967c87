from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="session")
def isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Dataset conversions are cached in a throwaway folder, never in ~/.cache."""
    mp = pytest.MonkeyPatch()
    mp.setenv("PFLBENCH_CACHE", str(tmp_path_factory.mktemp("cache")))
    mp.setenv("HF_DATASETS_OFFLINE", "1")
    mp.setenv("HF_HUB_OFFLINE", "1")
    yield
    mp.undo()
