"""``pflbench run``, ``pflbench list`` and ``pflbench partition``.

Options are generated from the config dataclasses, so defaults and help live in one place.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import click

from pflbench.cli.config_file import config_option
from pflbench.cli.options import RunCommand, dataclass_options
from pflbench.config.run_config import RunConfig
from pflbench.registry import ALGORITHMS, DATASETS, MODELS, PARTITIONERS

PARTITION_FIELDS = (
    "dataset",
    "dataset_option",
    "data_dir",
    "partition",
    "alpha",
    "shards_per_client",
    "min_size",
    "test_frac",
    "num_clients",
    "seed",
    "public_frac",
    "dirichlet_cut",
    "partition_file",
)


def _run_callback(quiet: bool, plugin: tuple[str, ...], force: bool, resume: bool, **values: Any) -> int:
    from pathlib import Path

    from pflbench.cli.options import refuse_inert_options
    from pflbench.runs.execute import RunDiverged, execute
    from pflbench.runs.prepare import plan_run, prepare
    from pflbench.store.layout import RunPaths, check_writable, guard_run

    run_fields = {f.name for f in dataclasses.fields(RunConfig)}
    config = RunConfig(**{k: v for k, v in values.items() if k in run_fields})
    algo_options = {k: v for k, v in values.items() if k not in run_fields and v is not None}
    check_writable(config.out)
    check_writable(Path(config.out) / "runs")
    plan = plan_run(config, algo_options)  # unset settings take the algorithm's run defaults
    refuse_inert_options([(plan.config, plan.hparams)])
    # a finished or claimed run is refused before the partition and any pretraining
    prepared = prepare(plan, guard=lambda run_dir: guard_run(RunPaths(run_dir), force))
    try:
        if quiet:
            summary = execute(prepared, plugins=plugin, force=force, resume=resume)
        else:
            summary = _execute_with_progress(prepared, plugin, execute, force=force, resume=resume)
    except RunDiverged as diverged:
        click.echo(f"Error: {diverged}", err=True)
        return 1
    if "backbone_pers_acc" in summary:
        backbone = prepared.resolved["backbone"]
        click.echo(
            f"before fine-tuning: pers_acc {summary['backbone_pers_acc']:.4f}; backbone "
            f"{backbone['source']}; head {backbone['head']}"
        )
    click.echo(_summary_line(summary))
    if prepared.config.save_model:
        click.echo(f"models: {prepared.run_dir / 'models'}")
    return 0


class ProgressObserver:
    """The progress bar: round, personalized accuracy, training loss (a run observer)."""

    def __init__(self, progress: Any, task: Any) -> None:
        self.progress, self.task, self.accuracy = progress, task, "-"

    def on_run_start(self, run: Any) -> None:
        pass

    def on_client_update(self, job: Any, update: Any) -> None:
        pass

    def on_round_end(self, record: dict[str, Any]) -> None:
        if record.get("pers_acc") is not None:
            self.accuracy = f"{record['pers_acc']:.4f}"
        status = f"round {record['round']}  pers_acc {self.accuracy}  loss {record['train_loss']:.4f}"
        self.progress.update(self.task, advance=1, status=status)

    def on_run_end(self, summary: dict[str, Any]) -> None:
        pass


def _execute_with_progress(prepared: Any, plugin: tuple[str, ...], execute: Any, **flags: Any) -> dict[str, Any]:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    config = prepared.config
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, transient=False) as progress:
        task = progress.add_task(f"{config.algo} on {config.dataset}", total=config.rounds, status="")
        return execute(prepared, plugins=plugin, observers=[ProgressObserver(progress, task)], **flags)


def _summary_line(summary: dict[str, Any]) -> str:
    def fmt(value: Any) -> str:
        return "null" if value is None else f"{value:.4f}"

    return (
        f"pers_acc {fmt(summary['pers_acc'])}  pers_acc_weighted {fmt(summary['pers_acc_weighted'])}  "
        f"worst10 {fmt(summary['pers_acc_worst10'])}  global_acc {fmt(summary['global_acc'])}  "
        + (f"pers_acc_ft {fmt(summary['pers_acc_ft'])}  " if "pers_acc_ft" in summary else "")
        + f"up {summary['bytes_up_total'] / 2**20:.2f} MB  time {summary['wall_time_s']:.1f}s\n"
        f"results: {summary['run_dir']}"
    )


run_command = RunCommand(
    "run",
    callback=_run_callback,
    help="Run one federated experiment and write its results folder OUT/runs/<name>/ (built in "
    "OUT/runs/.tmp-<name>/ and moved into place when complete).\n\nExit code 0: completed; 1: "
    "diverged (a non-finite loss or parameter; partial results kept with status diverged); "
    "2: bad input, or a finished run without --force (one Error: line, nothing written).\n\n"
    "Options can come from a TOML/YAML file (--config FILE; keys = option names); options "
    "given on the command line override the file.",
    params=[
        config_option(),
        *dataclass_options(RunConfig),
        click.Option(["--quiet", "-q"], is_flag=True, help="No progress bar."),
        click.Option(
            ["--force"],
            is_flag=True,
            help="Redo a run that already finished in --out (the earlier result is "
            "replaced only when the new run completes).",
        ),
        click.Option(
            ["--resume"],
            is_flag=True,
            help="Continue an unfinished run of the same settings from its last "
            "checkpoint (see --checkpoint-every); without one, start it anew.",
        ),
        click.Option(
            ["--plugin"],
            multiple=True,
            type=str,
            help="Python file that registers an algorithm/dataset/model (repeatable).",
        ),
    ],
)


@click.command("list")
@click.argument("kind", required=False, type=click.Choice(["algorithms", "datasets", "models", "partitioners"]))
@click.option("--plugin", multiple=True, help="Python file that registers plugins (repeatable).")
def list_command(kind: str | None, plugin: tuple[str, ...]) -> None:
    """List the registered plugins (all kinds, or one)."""
    from pflbench.registry import describe, load_plugin_file

    for path in plugin:  # a broken plugin is one error before anything is listed
        load_plugin_file(path)
    registries = {"algorithms": ALGORITHMS, "datasets": DATASETS, "models": MODELS, "partitioners": PARTITIONERS}
    listed = {
        name: describe(registry, plugin) for name, registry in registries.items() if kind in (None, name)
    }  # plugins load (or fail) before anything is printed
    for name, items in listed.items():
        click.echo(f"{name}:")
        for item_name, line in items.items():
            click.echo(f"  {item_name:<18} {line}")
        if name == "models":
            click.echo(f"  {'<timm name>':<18} any timm model, e.g. vit_tiny_patch16_224, resnet18")


@click.command("partition")
@click.option("--plot", type=click.Path(dir_okay=False), help="Save a label-distribution plot (PNG/PDF).")
@click.option("--save", type=click.Path(dir_okay=False), help="Save indices and statistics as JSON.")
@click.option(
    "--export",
    type=click.Path(dir_okay=False),
    help="Export the exact train/test indices per client (JSON) for `run --partition-file`.",
)
def partition_command(plot: str | None, save: str | None, export: str | None, **values: Any) -> None:
    """Partition a dataset and print per-client statistics."""
    from pflbench.config.run_config import validate, with_base_defaults
    from pflbench.data.dataset import load_dataset
    from pflbench.data.partition import fit_num_clients, make_partition
    from pflbench.data.presets import export_partition, partition_document
    from pflbench.store.layout import check_writable, writing
    from pflbench.store.writer import write_json

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
            else f"partition={config.partition} alpha={config.alpha:g} K={config.num_clients} seed={config.seed}"
            + (f" cut={config.dirichlet_cut}" if config.partition == "dirichlet" else "")
        )
        + (f"; {len(split.public)} held out as public data" if len(split.public) else "")
    )
    click.echo(
        f"samples/client mean {stats['samples_mean']:.1f} std {stats['samples_std']:.1f} "
        f"min {stats['samples_min']} max {stats['samples_max']}; "
        f"classes/client mean {stats['classes_per_client_mean']:.2f}"
    )
    click.echo(f"{'client':>6} {'train':>6} {'test':>5} {'classes':>7}  label histogram")
    for k in range(config.num_clients):
        click.echo(
            f"{k:>6} {stats['train_samples'][k]:>6} {stats['test_samples'][k]:>5} "
            f"{stats['classes_per_client'][k]:>7}  {stats['label_histogram'][k]}"
        )
    if save:
        from pathlib import Path

        with writing(save):
            write_json(Path(save), {"config": dataclasses.asdict(config), **split.to_json()})
        click.echo(f"saved {save}")
    if export:
        with writing(export):
            export_partition(export, partition_document(config, dataset, split.train, split.test, split.public))
        click.echo(f"exported {export}")
    if plot:
        from pflbench.report.plots import plot_label_distribution

        with writing(plot):
            path = plot_label_distribution(
                stats["label_histogram"],
                plot,
                title=f"{config.dataset}, {config.partition}, α={config.alpha:g}, K={config.num_clients}",
            )
        click.echo(f"plot: {path}")


def refuse_partition_inert(values: dict[str, Any]) -> None:
    """The partition options the chosen partitioner would not read, given explicitly: refused."""
    from pflbench.cli.options import _flag, explicit_options
    from pflbench.config.identity import partition_inert
    from pflbench.errors import ConfigError

    inert = partition_inert(RunConfig(**values))
    for name in sorted(explicit_options(inert)):
        raise ConfigError(f"{_flag(name)} {values[name]} would be ignored: {inert[name]}; leave it out")


partition_command.params[:0] = dataclass_options(RunConfig, PARTITION_FIELDS)
