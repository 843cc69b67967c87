"""Click plumbing shared by the ``pflbench`` commands.

Options are generated from the config dataclasses (``RunConfig`` and each algorithm's
hyperparameters), so defaults and help live in one place. ``PflbenchGroup`` turns every usage
error into one ``Error: ...`` line and exit code 2.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from pathlib import Path
from typing import Any

import click

from pflbench.cli.config_file import config_path_from, default_map, plugins_of, read_config_file
from pflbench.config.run_config import RunConfig, field_types
from pflbench.errors import ConfigError
from pflbench.registry import ALGORITHMS, load_plugin_file


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
        options.append(
            click.Option(
                [_flag(f.name)],
                type=click_type,
                multiple=multiple,
                default=f.default,
                show_default=f.default is not None,
                help=f.metadata["help"],
            )
        )
    return options


def algorithm_options() -> list[click.Option]:
    """One option per hyperparameter name over all registered algorithms (default: unset)."""
    seen: dict[str, tuple[click.Option, list[str]]] = {}
    run_fields = {f.name for f in dataclasses.fields(RunConfig)}
    for algo, server_class in sorted(ALGORITHMS.items.items()):
        for option, f in zip(
            dataclass_options(server_class.hyperparameters), dataclasses.fields(server_class.hyperparameters)
        ):
            if f.name in run_fields or f.name in ("quiet", "plugin"):
                raise ConfigError(f"algorithm {algo!r} hyperparameter {f.name!r} clashes with a run option")
            entry = seen.setdefault(f.name, (option, []))
            entry[1].append(f"{algo}: {f.default}")
    result = []
    for option, defaults in seen.values():
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


def inert_settings(config: RunConfig, algorithm: Any, hyperparameters: Any) -> dict[str, str]:
    """The settings a resolved run would not read, each with why: given explicitly they are
    refused (``--momentum`` with Adam, LoRA options without LoRA, ...), never recorded as if
    they applied. (``run_identity`` leaves them out.)"""
    lora = algorithm.lora_rank(config, hyperparameters) is not None
    inert: dict[str, str] = {}
    if config.optimizer is not None and config.optimizer != "sgd":
        inert["momentum"] = f"--optimizer {config.optimizer} has no momentum (use --optimizer sgd)"
    if not lora:
        for name in ("lora_alpha", "lora_targets"):
            inert[name] = f"--algo {config.algo} without --lora-rank trains no LoRA layers"
    if not (getattr(algorithm, "uses_head_layers", False) or lora):
        inert["head_layers"] = f"--algo {config.algo} has no private head (fedper, fedrep or LoRA runs use it)"
    partitioned_here = config.partition_file is None
    if partitioned_here and config.partition != "shards":
        inert["shards_per_client"] = f"--partition {config.partition} has no shards (use --partition shards)"
    if partitioned_here and not config.partition.startswith("dirichlet"):
        inert["alpha"] = f"--partition {config.partition} has no concentration α (use --partition dirichlet)"
    if partitioned_here and config.partition != "dirichlet":
        inert["dirichlet_cut"] = f"--partition {config.partition} is not dirichlet"
    if not config.init_spec.pretrains(lora):
        for name in ("pretrain_epochs", "pretrain_lr"):
            inert[name] = "this run pretrains no backbone (LoRA runs or --backbone public do)"
    return inert


def explicit_options(names: Any) -> set[str]:
    """Which of ``names`` the user gave on the command line (not defaults)."""
    from click.core import ParameterSource

    context = click.get_current_context()
    return {n for n in names if context.get_parameter_source(n) is ParameterSource.COMMANDLINE}


def refuse_inert_options(configs: list[tuple[RunConfig, Any]]) -> None:
    """ConfigError for an option given on the command line that no run of ``configs`` (resolved
    config, hyperparameters) would read."""
    inert: dict[str, str] | None = None
    for config, hparams in configs:
        found = inert_settings(config, ALGORITHMS.get(config.algo), hparams)
        inert = found if inert is None else {k: v for k, v in inert.items() if k in found}
    for name in sorted(explicit_options(inert or {})):
        value = getattr(configs[0][0], name)
        raise ConfigError(f"{_flag(name)} {value} would be ignored: {inert[name]}; leave it out")


class RunCommand(click.Command):
    """``run`` gains each registered algorithm's hyperparameters as options (after --plugin), and
    ``--config FILE`` supplies defaults for every option (``config_file.py``)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        _load_plugins_from(args)
        path = config_path_from(args)
        if path is not None and not any(a in ("--help", "-h") for a in args):
            # the file's values become click's defaults: command-line options override them
            table = read_config_file(path)
            for plugin in plugins_of(table):
                load_plugin_file(plugin)
            values = default_map(table, self.get_params(ctx), Path(path))
            ctx.default_map = {**(ctx.default_map or {}), **values}
        return super().parse_args(ctx, args)

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        base = super().get_params(ctx)
        known = {p.name for p in base}
        return base[:-1] + [o for o in algorithm_options() if o.name not in known] + base[-1:]


class PflbenchGroup(click.Group):
    """Turns every usage error into one ``Error: ...`` line with exit code 2."""

    def main(
        self,
        args: Any = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        code = 0
        try:
            result = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            code = result if isinstance(result, int) else 0
        except (click.ClickException, ConfigError) as error:
            message = error.format_message() if isinstance(error, click.ClickException) else str(error)
            click.echo(f"Error: {' '.join(message.split())}", err=True)
            code = 2
        except OSError as error:  # outputs are checked up front; what slips through is still one line
            where = f"{error.filename}: " if error.filename is not None else ""
            click.echo(f"Error: {where}{error.strerror or error}", err=True)
            code = 2
        except click.Abort:
            click.echo("Aborted!", err=True)
            code = 1
        if standalone_mode:
            sys.exit(code)
        return code
