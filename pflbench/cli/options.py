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
from collections.abc import Collection
from pathlib import Path
from typing import Any

import click

from pflbench.cli.config_file import config_path_from, default_map, plugins_of, read_config_file
from pflbench.cli.controls import CONTROLS
from pflbench.cli.help import HELP_ALGOS, algos_from, format_sections, shortened_help
from pflbench.config.run_config import RunConfig, field_types
from pflbench.errors import ConfigError
from pflbench.plugin_sources import algorithm_hyperparameters
from pflbench.registry import ALGORITHMS, load_plugin_file
from pflbench.runs.inert import ignored, inert_options


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


def field_option(name: str, annotation: Any, default: Any, metadata: Any) -> click.Option:
    """The option of one dataclass field (its resolved annotation, default and metadata)."""
    if "help" not in metadata:
        raise ConfigError(
            f"option {_flag(name)} has no help text: declare its field as "
            f'{name}: ... = option(default, "what it does") (from pflbench import option)'
        )
    click_type, multiple = _click_type(annotation, metadata.get("choices"))
    if click_type is bool:
        decls = [f"{_flag(name)}/--no-{name.replace('_', '-')}"]
        return click.Option(decls, default=default, show_default=True, help=metadata["help"])
    return click.Option(
        [_flag(name)],
        type=click_type,
        multiple=multiple,
        default=default,
        show_default=default is not None,
        help=metadata["help"],
    )


def dataclass_options(cls: type, names: tuple[str, ...] | None = None) -> list[click.Option]:
    hints = field_types(cls)
    return [
        field_option(f.name, hints[f.name], f.default, f.metadata)
        for f in dataclasses.fields(cls)
        if names is None or f.name in names
    ]


def algorithm_options(from_sources: bool = False) -> list[click.Option]:
    """One option per hyperparameter name over all registered algorithms (default: unset).
    ``from_sources``: the algorithm modules not imported yet are read, not imported
    (``plugin_sources.algorithm_hyperparameters``), so that parsing does not pay for torch."""
    if not from_sources:
        ALGORITHMS.load_entry_points()
    seen: dict[str, tuple[click.Option, list[str]]] = {}
    run_fields = {f.name for f in dataclasses.fields(RunConfig)}
    for algo, fields in algorithm_hyperparameters().items():
        for f in fields:
            if f.name in run_fields or f.name in CONTROLS or f.name in ("config", "help"):
                raise ConfigError(f"algorithm {algo!r} hyperparameter {f.name!r} clashes with a run option")
            entry = seen.setdefault(f.name, (field_option(f.name, f.annotation, f.default, f.metadata), []))
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


def explicit_options(names: Any) -> set[str]:
    """Which of ``names`` the user gave, on the command line or in the ``--config`` file (whose
    values are click's ``default_map``), not defaults."""
    from click.core import ParameterSource

    context = click.get_current_context()
    given = (ParameterSource.COMMANDLINE, ParameterSource.DEFAULT_MAP)
    return {n for n in names if context.get_parameter_source(n) in given}


def refuse_inert_options(configs: list[tuple[RunConfig, Any]], swept: Collection[str] = ()) -> None:
    """ConfigError for an option given (command line, --config file, or a sweep's ``--set`` axis
    named in ``swept``) that no run of ``configs`` (resolved config, hyperparameters) would read."""
    from click.core import ParameterSource

    inert: dict[str, str] | None = None
    command = click.get_current_context().info_name or ""
    for config, hparams in configs:
        found = inert_options(config, hparams, command)
        inert = found if inert is None else {k: v for k, v in inert.items() if k in found}
    inert = inert or {}
    for name in sorted(explicit_options(inert) | {n for n in swept if n in inert}):
        config, hparams = configs[0]
        # a run setting, else one of the algorithm's hyperparameters (Algorithm.inert_hyperparameters)
        value = getattr(config, name) if hasattr(config, name) else getattr(hparams, name)
        source = click.get_current_context().get_parameter_source(name)
        where = " of the --config file" if source is ParameterSource.DEFAULT_MAP else ""
        if name in swept and source not in (ParameterSource.COMMANDLINE, ParameterSource.DEFAULT_MAP):
            where = " of --set"
        raise ignored(name, value, inert[name], where)


class RunCommand(click.Command):
    """``run`` gains each registered algorithm's hyperparameters as options (after --plugin), and
    ``--config FILE`` supplies defaults for every option (``config_file.py``)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        _load_plugins_from(args)
        path = config_path_from(args)
        helps = (*ctx.help_option_names, "--help-all")
        wants_help = any(a in helps for a in args[: args.index("--") if "--" in args else None])
        if wants_help:  # help lists the options of the algorithms named (on the line, else in the file)
            ctx.meta[HELP_ALGOS] = algos_from(args, _table_or_none(path))
        elif path is not None:
            # the file's values become click's defaults: command-line options override them
            table = read_config_file(path)
            for plugin in plugins_of(table):
                load_plugin_file(plugin)
            values = default_map(table, self.get_params(ctx), Path(path))
            ctx.default_map = {**(ctx.default_map or {}), **values}
        return super().parse_args(ctx, args)

    def format_help_text(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with shortened_help(self, ctx):  # compact help: the first paragraph and the examples
            super().format_help_text(ctx, formatter)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        format_sections(self, ctx, formatter)  # titled sections; an algorithm's options for --algo NAME

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        base = super().get_params(ctx)
        known = {p.name for p in base}
        # read from the algorithms' sources, not imported: parsing (and refusing a bad value,
        # cli.run) must not pay for torch; ``plan_run`` imports the one algorithm the run uses
        extra = algorithm_options(from_sources=True)
        return base[:-1] + [o for o in extra if o.name not in known] + base[-1:]


def _table_or_none(path: str | None) -> dict[str, Any] | None:
    """The ``--config`` file's table for help (a file that cannot be read: none; running says why)."""
    if path is None:
        return None
    try:
        return read_config_file(path)
    except ConfigError:
        return None


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
        except click.Abort:  # Ctrl-C: the shell's code for SIGINT, and how to continue
            click.echo(
                "Interrupted: an unfinished run continues with --resume (a sweep resumes when run again)", err=True
            )
            code = 130
        if standalone_mode:
            sys.exit(code)
        return code
