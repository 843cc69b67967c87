"""`pflbench list algorithms` groups the algorithms under the survey's method families."""

from __future__ import annotations

from click.testing import CliRunner

from pflbench.cli import cli
from pflbench.plugin_sources import algorithm_families
from pflbench.registry import ALGORITHMS
from pflbench.report.families import METHOD_FAMILIES, UNGROUPED, family_of


def test_every_built_in_algorithm_names_a_known_family() -> None:
    families = algorithm_families()
    built_in = [n for n in ALGORITHMS.names() if ALGORITHMS.get(n).__module__.startswith("pflbench.algorithms.")]
    unknown = {n: families.get(n) for n in built_in if families.get(n) not in METHOD_FAMILIES}
    assert not unknown, unknown
    # the literal the listing reads is the attribute the class has
    assert all(ALGORITHMS.get(n).method_family == families[n] for n in built_in)


def test_list_groups_algorithms_by_family_in_the_survey_order() -> None:
    result = CliRunner().invoke(cli, ["list", "algorithms"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    headers = [line.strip() for line in lines if line.startswith("  ") and not line.startswith("    ")]
    keys = [header.rsplit("[", 1)[1].rstrip("]:") for header in headers]
    assert keys == [k for k in METHOD_FAMILIES if k in keys]  # survey order, each family once
    below = {}
    for line in lines[1:]:
        if not line.startswith("    "):
            current = line.strip().rsplit("[", 1)[1].rstrip("]:")
        else:
            below[line.split()[0]] = current
    assert below["fedavg"] == "global" and below["fedper"] == "decoupling" and below["perfedavg"] == "meta_learning"


def test_a_plugin_without_a_family_is_listed_under_other() -> None:
    assert family_of("") == family_of("no-such-family") == UNGROUPED and family_of("clustering") == "clustering"
