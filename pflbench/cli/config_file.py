"""``--config FILE`` for ``pflbench run``, ``sweep`` and ``tune``: the options in a file.

A config file is a flat table (TOML, or YAML when PyYAML is installed) whose keys are the
command's option names, with ``-`` or ``_`` (``local-epochs`` = ``local_epochs``): every
``RunConfig`` setting, the algorithms' hyperparameters (``mu``, ``head_epochs``, ...),
``plugin``; for ``sweep`` also ``algos``, ``datasets``, ``alphas``, ``seeds`` (lists or
comma-separated strings) and ``set`` (a table ``{name = [values]}``); for ``tune`` also ``space``
(a table ``{lr = {low = 0.001, high = 0.3, log = true}, mu = [0.01, 0.1]}``). Options given on the
command line override the file: the file's values become click's ``default_map``, so click
converts and validates them like typed options, and ``ctx.get_parameter_source`` tells
``DEFAULT_MAP`` (from the file) from ``COMMANDLINE``. An unknown key is one ``ConfigError``
line naming it and the valid keys.

Example (``examples/paper_digits.toml``)::

    algos = ["fedavg", "fedper", "fedrep"]
    alphas = [0.1, 1.0]
    seeds = [0, 1, 2]
    rounds = 50
    [set]
    lr = [0.05]
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import click

from pflbench.cli.controls import CommandOption
from pflbench.config.value_types import type_error
from pflbench.errors import ConfigError

SUFFIXES = {".toml": "toml", ".yaml": "yaml", ".yml": "yaml"}
# keys whose option name differs from the key (``set`` is the --set option, parameter ``sets``)
RENAMED = {"set": "sets"}
LIST_AS_TEXT = ("algos", "datasets", "alphas", "seeds")  # comma-separated options of sweep


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The file's table, keys normalised (``-`` → ``_``). Format from the suffix."""
    path = Path(path)
    kind = SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise ConfigError(f"--config {path}: unknown format {path.suffix or '(no suffix)'!r}; use .toml, .yaml or .yml")
    try:
        text = path.read_text(encoding="utf-8")  # TOML is UTF-8 by definition; not the locale's
    except OSError as error:
        raise ConfigError(f"--config {path}: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        line = error.object[: error.start].count(b"\n") + 1
        raise ConfigError(
            f"--config {path}: not UTF-8 text (byte 0x{error.object[error.start]:02x} on line {line}); "
            "save the file as UTF-8"
        ) from None
    data = _parse_toml(text, path) if kind == "toml" else _parse_yaml(text, path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: the file must hold a table of options, not a {type(data).__name__}")
    table: dict[str, Any] = {}
    for key, value in data.items():
        name = str(key).strip().lstrip("-").replace("-", "_")
        if name in table:
            raise ConfigError(f"--config {path}: {key!r} is given twice")
        table[name] = value
    return table


def _parse_toml(text: str, path: Path) -> Any:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise ConfigError(f"--config {path}: reading TOML on Python 3.10 needs tomli (pip install tomli)") from None
    try:
        return tomllib.loads(text)
    except RecursionError:
        raise ConfigError(f"--config {path}: nested too deeply to be a table of options") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"--config {path}: not valid TOML: {error}") from None


def _parse_yaml(text: str, path: Path) -> Any:
    try:
        import yaml
    except ModuleNotFoundError:
        raise ConfigError(f"--config {path}: YAML needs PyYAML (pip install pyyaml), or use a .toml file") from None
    try:
        data = yaml.safe_load(text)
    except RecursionError:
        raise ConfigError(f"--config {path}: nested too deeply to be a table of options") from None
    except yaml.YAMLError as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else "parse error"
        raise ConfigError(f"--config {path}: not valid YAML: {first}") from None
    if _expanded_size(data, {}) > MAX_CONFIG_VALUES:
        raise ConfigError(
            f"--config {path}: the file expands to more than {MAX_CONFIG_VALUES:,} values "
            "(YAML aliases repeating one another?); a config file is a table of options"
        )
    return data


MAX_CONFIG_VALUES = 100_000  # a config holds tens of values; a YAML alias bomb expands to billions


def _expanded_size(value: Any, sizes: dict[int, int]) -> int:
    """How many values ``value`` holds once YAML aliases are expanded. PyYAML loads an alias as
    the same object again, so the loaded document is small while anything that walks it (or
    prints it) walks every repetition; counted once per distinct object (memoised by id)."""
    if not isinstance(value, (list, dict)):
        return 1
    known = sizes.get(id(value))
    if known is not None:
        return known
    sizes[id(value)] = MAX_CONFIG_VALUES + 1  # a self-referencing alias is infinite
    children = value.values() if isinstance(value, dict) else value
    total = 1
    for child in children:
        total += _expanded_size(child, sizes)
        if total > MAX_CONFIG_VALUES:
            break
    sizes[id(value)] = total
    return total


def _as_strings(value: Any) -> tuple[str, ...]:
    """``["a=1"]``, ``"a=1"`` or ``{a: 1}`` → ``("a=1",)`` (repeatable KEY=VALUE options)."""
    if isinstance(value, dict):
        return tuple(f"{k}={_text(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return tuple(_text(v) for v in value)
    return (_text(value),)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)  # the shortest text that reads back as the same float
    return str(value)


def _sets(value: Any, path: Path) -> tuple[str, ...]:
    """The ``set`` table ``{mu = [0.01, 0.1]}`` → ``("mu=0.01,0.1",)`` (also a list of strings)."""
    if isinstance(value, dict):
        items = []
        for name, values in value.items():
            listed = values if isinstance(values, (list, tuple)) else [values]
            items.append(f"{name}=" + ",".join(_text(v) for v in listed))
        return tuple(items)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ConfigError(f"--config {path}: 'set' must be a table of NAME = [VALUES] (e.g. set = {{mu = [0.01, 0.1]}})")


def _space(value: Any, path: Path) -> tuple[str, ...]:
    """The ``space`` table of ``pflbench tune`` → ``--space`` texts: ``mu = [0.01, 0.1]`` (choices),
    ``lr = {low = 0.001, high = 0.3, log = true}`` (a range) or ``lr = "log:0.001:0.3"``."""
    if not isinstance(value, dict):
        raise ConfigError(f"--config {path}: 'space' must be a table of NAME = [VALUES] | {{low, high, log}} | TEXT")
    items = []
    for name, spec in value.items():
        if isinstance(spec, (list, tuple)):
            items.append(f"{name}=" + ",".join(_text(v) for v in spec))
        elif isinstance(spec, dict):
            unknown = sorted(set(spec) - {"low", "high", "log"})
            if unknown or "low" not in spec or "high" not in spec:
                raise ConfigError(
                    f"--config {path}: space.{name} takes low, high and optionally log (got {sorted(spec)})"
                )
            prefix = "log:" if spec.get("log") else ""
            items.append(f"{name}={prefix}{_text(spec['low'])}:{_text(spec['high'])}")
        else:
            items.append(f"{name}={_text(spec)}")
    return tuple(items)


def default_map(
    table: dict[str, Any],
    params: list[click.Parameter],
    path: Path,
    ignore: tuple[str, ...] = ("config", "help", "help_all"),
) -> dict[str, Any]:
    """The file's values keyed by the command's parameter names, shaped for click's
    ``default_map`` (lists for repeatable options, text for comma-separated ones)."""
    # click's own internal parameters (e.g. ``_click_default_help``) are not options of the file
    by_name = {p.name: p for p in params if p.name and p.name not in ignore and not p.name.startswith("_")}
    mapped: dict[str, Any] = {}
    for key, value in table.items():
        name = RENAMED.get(key, key)
        param = by_name.get(name)
        if param is None:
            valid = sorted({next((k for k, v in RENAMED.items() if v == n), n) for n in by_name})
            close = difflib.get_close_matches(key, valid, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"--config {path}: unknown key {key!r}{hint}; valid keys: {', '.join(valid)}")
        if name == "sets":
            mapped[name] = _sets(value, path)
        elif name == "space":
            mapped[name] = _space(value, path)
        elif name in LIST_AS_TEXT:
            mapped[name] = ",".join(_text(v) for v in value) if isinstance(value, (list, tuple)) else _text(value)
        elif getattr(param, "multiple", False):
            mapped[name] = _as_strings(value)
        elif isinstance(value, (list, dict)):
            raise ConfigError(f"--config {path}: {key!r} takes one value, got {_text(value)!r}")
        else:
            problem = type_error(value, _annotation(param))
            if problem:
                raise ConfigError(f"--config {path}: {key!r} {problem}")
            mapped[name] = value
    return mapped


def _annotation(param: click.Parameter) -> Any:
    """The file value's type for a single-valued option (``config.value_types``): its click type's
    Python type, optional (null) only where the option's default is unset (None). Values are
    checked, not converted: click would turn 2.7 into 2 and "yes" into True."""
    kinds = ((click.types.BoolParamType, bool), (click.types.IntParamType, int), (click.types.FloatParamType, float))
    kind = next((k for t, k in kinds if isinstance(param.type, t)), str)
    return kind | None if param.default is None else kind


def config_path_from(args: list[str]) -> str | None:
    """The value of ``--config`` in raw arguments (read before click parses them, so that the
    file's plugins can register their algorithms' options first)."""
    found = None
    for i, arg in enumerate(args):
        if arg == "--":
            break
        if arg == "--config" and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith("--config="):
            found = arg.split("=", 1)[1]
    return found


def plugins_of(table: dict[str, Any]) -> list[str]:
    value = table.get("plugin", [])
    return [str(v) for v in (value if isinstance(value, (list, tuple)) else [value])]


CONFIG_OPTION_HELP = (
    "TOML or YAML file of options (keys = option names, `-` or `_`); options given on the command line override it."
)


def config_option() -> click.Option:
    return CommandOption(
        ["--config"],
        type=click.Path(dir_okay=False),
        default=None,
        help=CONFIG_OPTION_HELP,
        expose_value=False,
        is_eager=True,
    )
