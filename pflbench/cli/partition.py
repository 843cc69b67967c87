"""``pflbench partition``: partition a dataset and print (plot, save, export) per-client statistics."""

from __future__ import annotations

import dataclasses
from typing import Any

import click

from pflbench.cli.options import _flag, dataclass_options, explicit_options
from pflbench.config.identity import partition_identity, partition_inert, partition_settings
from pflbench.config.run_config import RunConfig
from pflbench.errors import ConfigError
from pflbench.store.reader import partition_of

PARTITION_FIELDS = (
    "dataset",
    "dataset_option",
    "data_dir",
    "partition",
    "alpha",
    "shards_per_client",
    "min_size",
    "test_frac",
    "val_frac",
    "num_clients",
    "seed",
    "public_frac",
    "dirichlet_cut",
    "holdout_domain",
    "sizes",
    "size_param",
    "feature_shift",
    "shift_groups",
    "partition_file",
)


@click.command("partition")
@click.option("--plot", type=click.Path(dir_okay=False), help="Save a label-distribution plot (PNG/PDF).")
@click.option("--save", type=click.Path(dir_okay=False), help="Save indices and statistics as JSON.")
@click.option(
    "--export",
    type=click.Path(dir_okay=False),
    help="Export the exact train/validation/test indices per client (JSON) for `run --partition-file`.",
)
@click.option(
    "--plugin",
    multiple=True,
    help="Python file that registers a dataset or partitioner (repeatable), as for `run --plugin`.",
)
def partition_command(
    plot: str | None, save: str | None, export: str | None, plugin: tuple[str, ...], **values: Any
) -> None:
    """Partition a dataset and print per-client statistics."""
    from pflbench.config.run_config import validate, with_base_defaults
    from pflbench.data.dataset import load_dataset
    from pflbench.data.partition import fit_num_clients, make_partition
    from pflbench.data.presets import export_partition, partition_document
    from pflbench.registry import load_plugin_file
    from pflbench.store.layout import check_writable, writing
    from pflbench.store.writer import write_json

    for plugin_file in plugin:  # before the names are checked: a plugin's dataset or partitioner is then known
        load_plugin_file(plugin_file)
    for path in (save, export, plot):
        if path:
            check_writable(path, kind="file")
    refuse_partition_inert(values)
    config = RunConfig(**values)
    config = with_base_defaults(config)
    validate(config)
    dataset = load_dataset(config.dataset, config.dataset_options())
    config = fit_num_clients(config, dataset)
    split = make_partition(config, dataset)
    stats = split.stats
    click.echo(
        f"{config.dataset}: {len(dataset.labels)} samples, {dataset.num_classes} classes, "
        + (
            f"partition file {config.partition_file} K={config.num_clients}"
            if config.partition_file
            else f"partition={partition_text(config)} K={config.num_clients} seed={config.seed}"
            + (f" cut={config.dirichlet_cut}" if "dirichlet_cut" in partition_settings(config) else "")
        )
        + (f"; {len(split.public)} held out as public data" if len(split.public) else "")
        + (f"; {len(split.ood)} samples of the held-out domain (ood_acc)" if len(split.ood) else "")
    )
    click.echo(
        f"samples/client mean {stats['samples_mean']:.1f} std {stats['samples_std']:.1f} "
        f"min {stats['samples_min']} max {stats['samples_max']}; "
        f"classes/client mean {stats['classes_per_client_mean']:.2f}"
    )
    domains = split.domain_labels
    click.echo(
        f"{'client':>6} {'train':>6} {'val':>5} {'test':>5} {'classes':>7}  label histogram"
        + ("  domain" if domains is not None else "")
    )
    for k in range(config.num_clients):
        click.echo(
            f"{k:>6} {stats['train_samples'][k]:>6} {stats['val_samples'][k]:>5} {stats['test_samples'][k]:>5} "
            f"{stats['classes_per_client'][k]:>7}  {stats['label_histogram'][k]}"
            + (f"  {domains[k]}" if domains is not None else "")
        )
    if save:
        from pathlib import Path

        with writing(save):
            write_json(Path(save), {"config": dataclasses.asdict(config), **split.to_json()})
        click.echo(f"saved {save}")
    if export:
        with writing(export):
            document = partition_document(
                config,
                dataset,
                split.train,
                split.test,
                split.public,
                split.val,
                ood=split.ood,
                client_domains=split.client_domains,
            )
            export_partition(export, document)
        click.echo(f"exported {export}")
    if plot:
        from pflbench.report.plots import plot_label_distribution

        with writing(plot):
            path = plot_label_distribution(
                stats["label_histogram"],
                plot,
                title=f"{config.dataset}, {partition_text(config)}, K={config.num_clients}",
                client_domains=domains,
            )
        click.echo(f"plot: {path}")
        if split.feature_shift is not None:  # the shift itself: one sample under every domain
            from pathlib import Path

            from pflbench.data.feature_shift import domain_examples
            from pflbench.report.plots import plot_domain_examples

            shown = Path(path).with_name(f"{Path(path).stem}-domains{Path(path).suffix}")
            check_writable(str(shown), kind="file")
            sample = int(split.test[0][0])
            with writing(str(shown)):
                plot_domain_examples(
                    domain_examples(split.feature_shift, dataset, sample),
                    [split.feature_shift.domain_label(g) for g in range(len(split.feature_shift.domains))],
                    shown,
                    title=f"{config.dataset} sample {sample} in each domain ({config.feature_shift})",
                )
            click.echo(f"domains: {shown}")


def refuse_partition_inert(values: dict[str, Any]) -> None:
    """The partition options the chosen partitioner would not read, given explicitly: refused."""
    inert = partition_inert(RunConfig(**values))
    for name in sorted(explicit_options(inert)):
        raise ConfigError(f"{_flag(name)} {values[name]} would be ignored: {inert[name]}; leave it out")


partition_command.params[:0] = dataclass_options(RunConfig, PARTITION_FIELDS)


def partition_text(config: RunConfig) -> str:
    """The partition as leaderboards name it: only the settings its partitioner reads (no α for iid)."""
    label = partition_of({"identity": partition_identity(config.partition_spec)})
    return f"dirichlet {label}" if label.startswith("α=") else label
