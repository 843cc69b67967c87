"""The generated reference (docs/hooks/reference.py) against the registry: every registered
algorithm has its page, its index row and its navigation entry; every command has its section."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]'")

ROOT = Path(__file__).resolve().parents[2]


def hook():
    spec = importlib.util.spec_from_file_location("docs_reference_hook", ROOT / "docs" / "hooks" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    return hook().generated_pages()


def test_every_registered_algorithm_has_a_page_an_index_row_and_a_nav_entry(pages: dict[str, str]) -> None:
    from pflbench.registry import ALGORITHMS

    names = set(ALGORITHMS.names())
    documented = {m for m in re.findall(r"reference/algorithms/([a-z0-9_.-]+)\.md", " ".join(pages)) if m != "index"}
    assert documented == names
    index = pages["reference/algorithms/index.md"]
    assert set(re.findall(r"\]\(([a-z0-9_.-]+)\.md\) \(`", index)) == names
    assert f"Every registered algorithm ({len(names)})" in index
    nav = hook().on_config({"nav": [{"Reference": [{"Algorithms": "reference/algorithms/index.md"}]}]})["nav"]
    entries = nav[0]["Reference"][0]["Algorithms"]
    assert entries[0] == "reference/algorithms/index.md"
    assert {e.split("/")[-1][:-3] for e in entries[1:]} == names


def test_an_algorithm_page_says_family_paper_hyperparameters_and_new_client_rule(pages: dict[str, str]) -> None:
    page = pages["reference/algorithms/fedprox.md"]
    assert page.startswith("# FedProx (`fedprox`)")
    assert "| paper | Li et al., MLSys 2020 |" in page
    assert "Model interpolation and regularisation (`regularization`)" in page
    assert "| `--mu` | float | `0.01` |" in page
    assert "New clients (`--new-clients`): served by the global model" in page
    assert "| `--dp client`, model-poisoning `--attack`, `--robust-agg` | yes |" in page
    local = pages["reference/algorithms/local.md"]
    assert "nothing (clients never communicate)" in local and "no (`global_acc` is null)" in local


def test_every_command_and_registry_entry_is_documented(pages: dict[str, str]) -> None:
    from pflbench.cli import cli
    from pflbench.registry import DATASETS, MODELS, PARTITIONERS, TRACKERS

    for command in cli.commands:
        assert f"## `pflbench {command}`" in pages["reference/cli.md"], command
    assert "`--num-clients`" in pages["reference/cli.md"] and "`--mu`" in pages["reference/cli.md"]
    for page, registry in (
        ("datasets", DATASETS),
        ("models", MODELS),
        ("partitioners", PARTITIONERS),
        ("trackers", TRACKERS),
    ):
        for name in registry.names():
            assert f"## `{name}`" in pages[f"reference/{page}.md"], (page, name)


def test_repository_links_become_paths() -> None:
    module = hook()
    text = module.repo_links_as_paths("see [the guide](algorithms/README.md) and [x](https://a.b)", ROOT / "X.md")
    assert text == "see the guide (`algorithms/README.md`) and [x](https://a.b)"


def test_angle_brackets_in_docstrings_stay_text_outside_code() -> None:
    module = hook()
    assert module.escape_tags("emnist-<split> `OUT/<name>`") == "emnist-&lt;split> `OUT/<name>`"
    assert module.escape_tags("    y < x") == "    y < x"  # an indented code block is left as it is
