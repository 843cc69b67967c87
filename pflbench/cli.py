"""The ``pflbench`` command line: run, partition, list.

Options are generated from the config dataclasses (``RunConfig`` and each algorithm's
hyperparameters), so defaults and help live in one place. Bad input ends in one
``Error: ...`` line and exit code 2.
"""
from __future__ import annotations

import dataclasses
import sys
import types
import typing
from typing import Any

import click

from .config import RunConfig, field_types
from .errors import ConfigError
from .registry import ALGORITHMS, DATASETS, MODELS, PARTITIONERS, load_plugin_file

PARTITION_FIELDS = ("dataset", "dataset_option", "data_dir", "partition", "alpha",
                    "shards_per_client", "min_size", "test_frac", "num_clients", "seed", "public_frac")
PRETRAIN_FIELDS = ("dataset", "dataset_option", "data_dir", "model", "model_option", "public_frac",
                   "pretrain_epochs", "pretrain_lr", "seed", "device")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _click_type(annotation: Any, choices: tuple[str, ...] | None) -> tuple[Any, bool]:
    """(click type, multiple) for a dataclass field annotation."""
    if choices:
        return click.Choice(choices), False
    if typing.get_origin(annotation) is tuple:
        return typing.get_args(annotation)[0], True
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    return annotation, False


def dataclass_options(cls: type, names: tuple[str, ...] | None = None) -> list[click.Option]:
    hints = field_types(cls)
    options = []
    for f in dataclasses.fields(cls):
        if names is not None and f.name not in names:
            continue
        click_type, multiple = _click_type(hints[f.name], f.metadata.get("choices"))
        if click_type is bool:
            decls = [f"{_flag(f.name)}/--no-{f.name.replace('_', '-')}"]
            options.append(click.Option(decls, default=f.default, show_default=True, help=f.metadata["help"]))
            continue
        options.append(click.Option([_flag(f.name)], type=click_type, multiple=multiple,
                                    default=f.default, show_default=f.default is not None,
                                    help=f.metadata["help"]))
    return options


def algorithm_options() -> list[click.Option]:
    """One option per hyperparameter name over all registered algorithms (default: unset)."""
    seen: dict[str, tuple[click.Option, list[str]]] = {}
    run_fields = {f.name for f in dataclasses.fields(RunConfig)}
    for algo, server_class in sorted(ALGORITHMS.items.items()):
        for option, f in zip(dataclass_options(server_class.hyperparameters),
                             dataclasses.fields(server_class.hyperparameters)):
            if f.name in run_fields or f.name in ("quiet", "plugin"):
                raise ConfigError(f"algorithm {algo!r} hyperparameter {f.name!r} clashes with a run option")
            entry = seen.setdefault(f.name, (option, []))
            entry[1].append(f"{algo}: {f.default}")
    result = []
    for name, (option, defaults) in seen.items():
        option.default, option.show_default = None, False
        option.help = f"{option.help} [{'; '.join(defaults)}]"
        result.append(option)
    return result


def _load_plugins_from(args: list[str]) -> tuple[str, ...]:
    paths = []
    for i, arg in enumerate(args):
        if arg == "--plugin" and i + 1 < len(args):
            paths.append(args[i + 1])
        elif arg.startswith("--plugin="):
            paths.append(arg.split("=", 1)[1])
    for path in paths:
        load_plugin_file(path)
    return tuple(paths)


class RunCommand(click.Command):
    """``run`` gains each registered algorithm's hyperparameters as options (after --plugin)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        _load_plugins_from(args)
        return super().parse_args(ctx, args)

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        base = super().get_params(ctx)
        known = {p.name for p in base}
        return base[:-1] + [o for o in algorithm_options() if o.name not in known] + base[-1:]


class PflbenchGroup(click.Group):
    """Turns every usage error into one ``Error: ...`` line with exit code 2."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        code = 0
        try:
            result = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            code = result if isinstance(result, int) else 0
        except (click.ClickException, ConfigError) as error:
            message = error.format_message() if isinstance(error, click.ClickException) else str(error)
            click.echo(f"Error: {message}", err=True)
            code = 2
        except click.Abort:
            click.echo("Aborted!", err=True)
            code = 1
        if standalone_mode:
            sys.exit(code)
        return code


@click.group(cls=PflbenchGroup, context_settings={"help_option_names": ["-h", "--help"],
                                                   "max_content_width": 100})
@click.version_option(package_name="pflbench")
def cli() -> None:
    """pflbench — personalized federated learning benchmarks."""


def _run_callback(quiet: bool, plugin: tuple[str, ...], **values: Any) -> None:
    from click.core import ParameterSource

    from .runner import execute, prepare

    run_fields = {f.name for f in dataclasses.fields(RunConfig)}
    config = RunConfig(**{k: v for k, v in values.items() if k in run_fields})
    algo_options = {k: v for k, v in values.items() if k not in run_fields and v is not None}
    context = click.get_current_context()
    explicit = {n for n in run_fields if context.get_parameter_source(n) is not ParameterSource.DEFAULT}
    prepared = prepare(config, algo_options, explicit)  # LoRA runs fill what is not explicit
    if quiet:
        summary = execute(prepared, plugins=plugin)
    else:
        summary = _execute_with_progress(prepared, plugin, execute)
    if "backbone_pers_acc" in summary:
        backbone = prepared.resolved["backbone"]
        click.echo(f"before fine-tuning: pers_acc {summary['backbone_pers_acc']:.4f}; backbone "
                   f"{backbone['source']}; head {backbone['head']}")
    click.echo(_summary_line(summary))


def _execute_with_progress(prepared: Any, plugin: tuple[str, ...], execute: Any) -> dict[str, Any]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    config = prepared.config
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[status]}"), TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, transient=False) as progress:
        task = progress.add_task(f"{config.algo} on {config.dataset}", total=config.rounds, status="")
        last_accuracy = ["-"]

        def on_round(record: dict[str, Any]) -> None:
            if record.get("pers_acc") is not None:
                last_accuracy[0] = f"{record['pers_acc']:.4f}"
            status = f"round {record['round']}  pers_acc {last_accuracy[0]}  loss {record['train_loss']:.4f}"
            progress.update(task, advance=1, status=status)

        return execute(prepared, on_round, plugins=plugin)


def _summary_line(summary: dict[str, Any]) -> str:
    def fmt(value: Any) -> str:
        return "null" if value is None else f"{value:.4f}"

    return (f"pers_acc {fmt(summary['pers_acc'])}  pers_acc_weighted {fmt(summary['pers_acc_weighted'])}  "
            f"worst10 {fmt(summary['pers_acc_worst10'])}  global_acc {fmt(summary['global_acc'])}  "
            f"up {summary['bytes_up_total'] / 2**20:.2f} MB  time {summary['wall_time_s']:.1f}s\n"
            f"results: {summary['run_dir']}")


run = RunCommand(
    "run", callback=_run_callback, help="Run one federated experiment and write its results folder.",
    params=[*dataclass_options(RunConfig),
            click.Option(["--quiet", "-q"], is_flag=True, help="No progress bar."),
            click.Option(["--plugin"], multiple=True, type=str,
                         help="Python file that registers an algorithm/dataset/model (repeatable).")])
cli.add_command(run)


@cli.command("list")
@click.argument("kind", required=False,
                type=click.Choice(["algorithms", "datasets", "models", "partitioners"]))
@click.option("--plugin", multiple=True, help="Python file that registers plugins (repeatable).")
def list_command(kind: str | None, plugin: tuple[str, ...]) -> None:
    """List the registered plugins (all kinds, or one)."""
    for path in plugin:
        load_plugin_file(path)
    registries = {"algorithms": ALGORITHMS, "datasets": DATASETS, "models": MODELS,
                  "partitioners": PARTITIONERS}
    for name, registry in registries.items():
        if kind not in (None, name):
            continue
        click.echo(f"{name}:")
        for item_name, item in sorted(registry.items.items()):
            doc = (item.__doc__ or "").strip().splitlines()
            click.echo(f"  {item_name:<18} {doc[0] if doc else ''}")
        if name == "models":
            click.echo(f"  {'<timm name>':<18} any timm model, e.g. vit_tiny_patch16_224, resnet18")


@cli.command("partition")
@click.option("--plot", type=click.Path(dir_okay=False), help="Save a label-distribution plot (PNG/PDF).")
@click.option("--save", type=click.Path(dir_okay=False), help="Save indices and statistics as JSON.")
def partition_command(plot: str | None, save: str | None, **values: Any) -> None:
    """Partition a dataset and print per-client statistics."""
    from .config import validate
    from .data import load_dataset
    from .results import write_json
    from .runner import make_partition

    config = RunConfig(**values)
    validate(config)
    dataset = load_dataset(config.dataset, config.dataset_options())
    split = make_partition(config, dataset)
    stats = split.stats
    click.echo(f"{config.dataset}: {len(dataset.labels)} samples, {dataset.num_classes} classes, "
               f"partition={config.partition} alpha={config.alpha:g} K={config.num_clients} seed={config.seed}"
               + (f"; {len(split.public)} held out as public data" if len(split.public) else ""))
    click.echo(f"samples/client mean {stats['samples_mean']:.1f} std {stats['samples_std']:.1f} "
               f"min {stats['samples_min']} max {stats['samples_max']}; "
               f"classes/client mean {stats['classes_per_client_mean']:.2f}")
    click.echo(f"{'client':>6} {'train':>6} {'test':>5} {'classes':>7}  label histogram")
    for k in range(config.num_clients):
        click.echo(f"{k:>6} {stats['train_samples'][k]:>6} {stats['test_samples'][k]:>5} "
                   f"{stats['classes_per_client'][k]:>7}  {stats['label_histogram'][k]}")
    if save:
        from pathlib import Path

        write_json(Path(save), {"config": dataclasses.asdict(config), **split.to_json()})
        click.echo(f"saved {save}")
    if plot:
        from .plots import plot_label_distribution

        path = plot_label_distribution(stats["label_histogram"], plot,
                                       title=f"{config.dataset}, {config.partition}, α={config.alpha:g}, K={config.num_clients}")
        click.echo(f"plot: {path}")


partition_command.params[:0] = dataclass_options(RunConfig, PARTITION_FIELDS)


SWEEP_SHARED = tuple(f.name for f in dataclasses.fields(RunConfig) if f.name not in ("algo", "dataset", "alpha", "seed"))


def _sweep_axes(sets: tuple[str, ...], values: dict[str, Any], run_fields: set[str]) -> dict[str, tuple[Any, ...]]:
    """--set axes plus single-valued algorithm options (--mu 0.1); an option given both ways is an error."""
    from click.core import ParameterSource

    from .sweep import parse_sets

    axes: dict[str, tuple[Any, ...]] = dict(parse_sets(sets))
    context = click.get_current_context()
    for name, value in values.items():
        explicit = context.get_parameter_source(name) is ParameterSource.COMMANDLINE
        if name in axes and explicit:
            raise ConfigError(f"{_flag(name)} and --set {name} are both given; use one")
        if name not in run_fields and value is not None:
            axes[name] = (value,)
    return axes


def _sweep_callback(algos: str, datasets: str, alphas: str, seeds: str, sets: tuple[str, ...],
                    quiet: bool, plugin: tuple[str, ...], **values: Any) -> int:
    from pathlib import Path

    from click.core import ParameterSource

    from .sweep import Grid, count_statuses, expand_grid, run_sweep, split_values, sweep_record_path

    run_fields = {f.name for f in dataclasses.fields(RunConfig)}
    base = RunConfig(**{k: v for k, v in values.items() if k in run_fields})
    grid = Grid(split_values(algos, str, "--algos"), split_values(datasets, str, "--datasets"),
                split_values(alphas, float, "--alphas"), split_values(seeds, int, "--seeds"),
                _sweep_axes(sets, values, run_fields))
    context = click.get_current_context()
    explicit = {n for n in run_fields if context.get_parameter_source(n) is not ParameterSource.DEFAULT}
    runs = expand_grid(base, grid, explicit)  # LoRA grids fill what is not explicit, for every run
    record = sweep_record_path(base.out, grid, base)

    def report(index: int, run: Any, summary: dict[str, Any] | None) -> None:
        if quiet:
            return
        if summary is not None:
            detail = f"done, pers_acc {summary['pers_acc']:.4f}, {summary['wall_time_s']:.1f}s"
        else:
            detail = "skipped (already finished)" if run.status == "skipped" else f"FAILED {run.error}"
        click.echo(f"[{index + 1}/{len(runs)}] {run.describe()}: {detail}")

    if not quiet:
        click.echo(f"sweep: {len(runs)} runs into {Path(base.out) / 'runs'}")
    try:
        run_sweep(runs, record, grid, base, plugin, report)
    except KeyboardInterrupt:
        counts = count_statuses(runs)
        click.echo(f"sweep interrupted: {counts['done']} done, {counts['skipped']} skipped, "
                   f"{counts['interrupted'] + counts['pending']} not finished; rerun the same command "
                   f"to finish them. record: {record}", err=True)
        raise
    counts = count_statuses(runs)
    click.echo(f"sweep: {counts['done']} done, {counts['skipped']} skipped (already finished), "
               f"{counts['failed']} failed; record: {record}")
    for run in runs:
        if run.status == "failed":
            click.echo(f"  failed {run.name}: {run.error} (see {run.run_dir / 'error.json'})", err=True)
    return 1 if counts["failed"] else 0


sweep = RunCommand(
    "sweep", callback=_sweep_callback,
    help="Run a grid of experiments: algorithms × datasets × α × seeds × --set axes.\n\n"
         "Every other option is shared by all runs. Runs already finished in --out are skipped, so "
         "rerunning the command resumes the sweep; a failed run gets error.json in its folder and "
         "the sweep goes on (exit code 1 at the end). The sweep's grid and each run's status go to "
         "OUT/sweeps/<time>-<hash>.json.\n\n"
         "\b\nExample:\n  pflbench sweep --algos fedavg,fedprox --alphas 0.1,1 --seeds 0,1,2 --set mu=0.01,0.1",
    params=[click.Option(["--algos"], default=RunConfig.algo, show_default=True,
                         help="Algorithms, comma-separated."),
            click.Option(["--datasets"], default=RunConfig.dataset, show_default=True,
                         help="Datasets, comma-separated."),
            click.Option(["--alphas"], default=f"{RunConfig.alpha:g}", show_default=True,
                         help="Dirichlet concentrations, comma-separated."),
            click.Option(["--seeds"], default=str(RunConfig.seed), show_default=True,
                         help="Seeds, comma-separated."),
            click.Option(["--set", "sets"], multiple=True, metavar="NAME=V1,V2",
                         help="Another grid axis: a run option (lr=0.01,0.05) or an algorithm "
                              "hyperparameter (mu=0.01,0.1; only for the algorithms that have it). Repeatable."),
            *dataclass_options(RunConfig, SWEEP_SHARED),
            click.Option(["--quiet", "-q"], is_flag=True, help="Print only the final summary."),
            click.Option(["--plugin"], multiple=True, type=str,
                         help="Python file that registers an algorithm/dataset/model (repeatable).")])
cli.add_command(sweep)

FORMAT_CHOICES = ("md", "latex", "csv", "html", "all")


@cli.command("leaderboard")
@click.argument("dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--metric", default="pers_acc", show_default=True,
              help="Final value from summary.json: pers_acc, pers_acc_last10, global_acc, pers_acc_worst10, ...")
@click.option("--format", "fmt", type=click.Choice(FORMAT_CHOICES), default="md", show_default=True,
              help="Output format; all = md, latex, csv and html.")
@click.option("--extra", default="", metavar="comm,time,worst10",
              help="Extra columns: comm (MB up + down), time (wall seconds), worst10 (worst-10% clients' accuracy).")
@click.option("--output", type=click.Path(), help="File, or folder for leaderboard_<metric>.<ext> "
              "(needed by --format all). Default: print to stdout.")
@click.option("--plots", type=click.Path(file_okay=False),
              help="Folder for accuracy-vs-round and accuracy-vs-communication plots (PNG and PDF).")
def leaderboard_command(dirs: tuple[str, ...], metric: str, fmt: str, extra: str, output: str | None,
                        plots: str | None) -> None:
    """Tabulate the finished runs under DIRS: rows = algorithms, columns = (dataset, α),
    cells = mean ± std over seeds. Unfinished, failed or unreadable run folders are skipped with
    a warning; runs that differ in other settings get separate rows."""
    from pathlib import Path

    from .leaderboard import load_runs, pivot, write_plots
    from .sweep import split_values
    from .tables import FORMATS

    if fmt == "all" and output is None:
        raise ConfigError("--format all writes one file per format; give --output FOLDER")
    frame = load_runs(dirs, warn=lambda message: click.echo(f"warning: {message}", err=True))
    if frame.empty:
        raise ConfigError(f"no finished runs under {', '.join(dirs)}")
    table = pivot(frame, metric, split_values(extra, str, "--extra") if extra else ())
    if output is None:
        click.echo(FORMATS[fmt][0](table), nl=False)
    else:
        target = Path(output)
        into_folder = fmt == "all" or target.is_dir() or not target.suffix
        for name in (FORMATS if fmt == "all" else [fmt]):
            render, suffix = FORMATS[name]
            path = target / f"leaderboard_{metric}{suffix}" if into_folder else target
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(render(table))
            click.echo(f"wrote {path}")
    if plots:
        for path in write_plots(frame, metric, plots):
            click.echo(f"plot: {path}")


@cli.command("pretrain")
def pretrain_command(**values: Any) -> None:
    """Pretrain a backbone on a public fraction of the data (given to no client) and cache it.

    Runs with the same dataset, model, model options, --public-frac, --seed and pretraining
    settings find it in the cache: LoRA runs by default, any run with --backbone public.
    """
    from .config import validate
    from .data import load_dataset
    from .pretrain import pretrain_backbone, public_split
    from .runner import resolve_device

    config = RunConfig(**values)
    validate(config)
    if config.public_frac <= 0:
        raise ConfigError("--public-frac must be > 0: the backbone is trained on that public fraction")
    dataset = load_dataset(config.dataset, config.dataset_options())
    _, public = public_split(dataset.labels.numpy(), config.public_frac, config.seed)
    backbone = pretrain_backbone(config, dataset, public, resolve_device(config.device))
    click.echo(f"{'found cached' if backbone.from_cache else 'pretrained'} {config.model} on "
               f"{len(public)} public samples of {config.dataset} ({backbone.num_train} train / "
               f"{backbone.num_val} held back): held-back accuracy {backbone.val_accuracy:.4f}")
    click.echo(f"weights: {backbone.path}")


def _pretrain_options() -> list[click.Option]:
    """The pretraining fields of RunConfig, defaulting to what a LoRA run uses."""
    from .config import LORA_RUN_DEFAULTS

    options = dataclass_options(RunConfig, PRETRAIN_FIELDS)
    for option in options:
        if option.name in LORA_RUN_DEFAULTS:
            option.default, option.show_default = LORA_RUN_DEFAULTS[option.name], True
    return options


pretrain_command.params[:0] = _pretrain_options()


@cli.command("gates")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--plot", type=click.Path(dir_okay=False), help="Save the client × block heatmap (PNG/PDF).")
def gates_command(run_dir: str, plot: str | None) -> None:
    """Print (and plot) the per-client gate values of a FedSDG run."""
    import json
    from pathlib import Path

    from .plots import plot_gate_heatmap

    summary_path = Path(run_dir) / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    if "gates" not in summary:
        raise ConfigError(f"{run_dir} has no gate values (a finished fedsdg run folder has them in summary.json)")
    gates = summary["gates"]
    click.echo(f"gates < 0.1: {summary['gate_frac_below_0.1']:.1%}   > 0.9: {summary['gate_frac_above_0.9']:.1%}"
               f"   in [0.4, 0.6]: {summary['gate_frac_0.4_to_0.6']:.1%}   (clients trained: "
               f"{summary['gates_clients_trained']})")
    for client, row in enumerate(gates):
        click.echo(f"{client:>4}  " + " ".join(f"{m:.2f}" for m in row))
    if plot:
        labels = [name.removesuffix(".gate") for name in summary.get("gate_blocks", [])] or None
        click.echo(f"plot: {plot_gate_heatmap(gates, plot, labels)}")


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
