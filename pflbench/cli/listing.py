"""``pflbench list``: the registered plugins, described from their sources (torch is not loaded)."""

from __future__ import annotations

import click

from pflbench.plugin_sources import algorithm_families, describe
from pflbench.registry import ALGORITHMS, DATASETS, MODELS, PARTITIONERS, TRACKERS, load_plugin_file
from pflbench.report.families import METHOD_FAMILIES, family_of, family_title


@click.command("list")
@click.argument(
    "kind", required=False, type=click.Choice(["algorithms", "datasets", "models", "partitioners", "trackers"])
)
@click.option("--plugin", multiple=True, help="Python file that registers plugins (repeatable).")
def list_command(kind: str | None, plugin: tuple[str, ...]) -> None:
    """List the registered plugins (all kinds, or one)."""
    for path in plugin:  # a broken plugin is one error before anything is listed
        load_plugin_file(path)
    registries = {
        "algorithms": ALGORITHMS,
        "datasets": DATASETS,
        "models": MODELS,
        "partitioners": PARTITIONERS,
        "trackers": TRACKERS,
    }
    listed = {
        name: describe(registry, plugin) for name, registry in registries.items() if kind in (None, name)
    }  # plugins load (or fail) before anything is printed
    for name, items in listed.items():
        click.echo(f"{name}:")
        if name == "algorithms":
            _echo_by_family(items, algorithm_families(plugin))
            continue
        for item_name, line in items.items():
            click.echo(f"  {item_name:<18} {line}")
        if name == "models":
            click.echo(f"  {'<timm name>':<18} any timm model, e.g. vit_tiny_patch16_224, resnet18")


def _echo_by_family(items: dict[str, str], families: dict[str, str]) -> None:
    """Algorithms under the survey's families (``report.families``), in its order."""
    order = [*METHOD_FAMILIES, "other"]
    grouped: dict[str, list[str]] = {}
    for name in items:
        grouped.setdefault(family_of(families.get(name, "")), []).append(name)
    for family in sorted(grouped, key=order.index):
        click.echo(f"  {family_title(family)} [{family}]:")
        for item_name in grouped[family]:
            click.echo(f"    {item_name:<16} {items[item_name]}")
