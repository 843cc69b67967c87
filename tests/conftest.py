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


@pytest.fixture
def run_config_file():
    """``run_config_file(tmp_path, name, text)``: ``pflbench run --config TMP/NAME.toml --out TMP/out
    --quiet`` on ``text``; asserts it succeeds and returns the one finished run's config.json."""
    import json

    from click.testing import CliRunner

    from pflbench.cli import cli
    from pflbench.store.layout import CONFIG_FILE, runs_folder

    def run(tmp_path, name: str, text: str) -> dict:
        config_file, out = tmp_path / f"{name}.toml", tmp_path / "out"
        config_file.write_text(text)
        result = CliRunner().invoke(cli, ["run", "--config", str(config_file), "--out", str(out), "--quiet"])
        assert result.exit_code == 0, result.output
        (folder,) = runs_folder(out).iterdir()
        return json.loads((folder / CONFIG_FILE).read_text())

    return run
