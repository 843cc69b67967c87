"""Name → object registries for algorithms, datasets, models, partitioners and trackers.

Built-in and third-party plugins register the same way: a module decorated with
``@register_algorithm("name")`` (etc.) is imported through the entry-point group
``pflbench.<kind>`` (loaded lazily on first lookup) or from a file with ``load_plugin_file``.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.util
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pflbench.errors import ConfigError

_registration_log: list[tuple[str, str]] = []


@dataclass(frozen=True)
class PluginFile:
    """A ``--plugin`` file as it was loaded (what a run records of the code it ran)."""

    path: str  # absolute path it was loaded from
    recorded_as: str  # absolute path a run records for it (a Ray sweep's driver path for a shipped copy)
    source: bytes  # its content when loaded
    sha256: str  # of ``source``
    module: str  # the module name it was loaded under


_plugin_files: dict[str, PluginFile] = {}  # module name -> the file it was loaded from (the latest load)
# top-level package -> (distribution, version) of the entry points loaded from it
_entry_point_distributions: dict[str, tuple[str, str]] = {}


def plugin_file_of_module(module: str) -> PluginFile | None:
    """The ``--plugin`` file that module ``module`` was loaded from, else None."""
    return _plugin_files.get(module)


def loaded_plugin_file(path: str | Path) -> PluginFile | None:
    """The ``--plugin`` file loaded from (or recorded as) ``path``, else None (the latest load wins)."""
    wanted = os.path.abspath(path)
    found = [p for p in _plugin_files.values() if wanted in (p.path, p.recorded_as)]
    return found[-1] if found else None


def entry_point_distribution(module: str) -> tuple[str, str] | None:
    """(distribution, version) whose entry points were loaded from ``module``'s top-level package."""
    return _entry_point_distributions.get(module.split(".")[0])


# Names end up in file names, folder names, CLI options and Markdown/HTML tables: lower-case
# letters, digits and ``_ . -``, starting with a letter or digit, at most 64 characters.
# (timm models are not registered; they are looked up by timm's own name, e.g. resnet18.)
NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")


def check_name(kind: str, name: Any) -> str:
    """``name`` if it is a safe registry name, else ConfigError saying what is allowed."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ConfigError(
            f"{kind} name {name!r} is not allowed: use 1-64 lower-case letters, digits, "
            "'_', '.' or '-', starting with a letter or digit (e.g. 'my_algo')"
        )
    return name


def _origin(obj: Any) -> str:
    """Where ``obj`` comes from: ``module.qualname (file)``."""
    module_name = getattr(obj, "__module__", None) or "?"
    origin = f"{module_name}.{getattr(obj, '__qualname__', repr(obj))}"
    file = getattr(sys.modules.get(module_name), "__file__", None)
    return f"{origin} ({file})" if file else origin


class Registry:
    """A private dict behind a read-only view; entry points are loaded on first use."""

    def __init__(self, kind: str, entry_point_group: str) -> None:
        self.kind = kind
        self.entry_point_group = entry_point_group
        self._items: dict[str, Any] = {}
        self._entry_points_loaded = False

    def register(self, name: str) -> Callable[[Any], Any]:
        check_name(self.kind, name)

        def decorator(obj: Any) -> Any:
            existing = self._items.get(name)
            if existing is not None and _origin(existing) != _origin(obj):
                raise ConfigError(
                    f"{self.kind} {name!r} is registered twice: by {_origin(existing)} "
                    f"and by {_origin(obj)}; rename one of them"
                )
            self._items[name] = obj  # re-importing the same file replaces its own entry
            _registration_log.append((self.kind, name))
            return obj

        return decorator

    def load_entry_points(self) -> None:
        if self._entry_points_loaded:
            return
        self._entry_points_loaded = True
        for entry_point in entry_points(group=self.entry_point_group):
            dist = getattr(entry_point, "dist", None)
            if dist is not None:  # which distribution registers what (a run's code record)
                _entry_point_distributions[entry_point.module.split(".")[0]] = (dist.name, dist.version)
            try:
                entry_point.load()
            except Exception as error:  # a broken third-party plugin must not hide the others
                print(f"warning: could not load {self.kind} plugin {entry_point.value!r}: {error}", file=sys.stderr)

    @property
    def items(self) -> Mapping[str, Any]:
        self.load_entry_points()
        return MappingProxyType(self._items)

    def names(self) -> list[str]:
        return sorted(self.items)

    def get(self, name: str) -> Any:
        items = self.items
        if name not in items:
            raise unknown_name(self.kind, name, items)
        return items[name]


def unknown_name(kind: str, name: str, known: Iterable[str]) -> ConfigError:
    """The error for a ``kind`` name that is not registered: the closest name, the valid ones."""
    names = sorted(known)
    close = difflib.get_close_matches(name, names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(
        f"unknown {kind} {name!r}{hint}; valid choices: {', '.join(names)} "
        f"(a {kind} of your own: load its file with --plugin FILE)"
    )


ALGORITHMS = Registry("algorithm", "pflbench.algorithms")
DATASETS = Registry("dataset", "pflbench.datasets")
MODELS = Registry("model", "pflbench.models")
PARTITIONERS = Registry("partitioner", "pflbench.partitioners")
TRACKERS = Registry("tracker", "pflbench.trackers")  # --log NAME: experiment trackers (runs.trackers)

register_algorithm = ALGORITHMS.register
register_dataset = DATASETS.register
register_model = MODELS.register
register_partitioner = PARTITIONERS.register
register_tracker = TRACKERS.register


def _forget(module_name: str, log_start: int) -> None:
    """Undo what a plugin module registered before it failed, so no half plugin stays usable."""
    registries = {registry.kind: registry for registry in REGISTRIES}
    for kind, name in _registration_log[log_start:]:
        items = registries[kind]._items
        if getattr(items.get(name), "__module__", None) == module_name:
            del items[name]
    del _registration_log[log_start:]


def load_plugin_file(path: str | Path, recorded_as: str | Path | None = None) -> None:
    """Import a single ``.py`` file so that its ``@register_*`` decorators run. Its content is
    kept (``loaded_plugin_file``) so that a run records the code it ran; ``recorded_as``: the
    path a run records for it (default: ``path`` made absolute)."""
    path = Path(path)
    if not path.is_file() or path.suffix != ".py":
        raise ConfigError(f"--plugin {str(path)!r} is not a readable .py file")
    try:
        source = path.read_bytes()  # read before it runs: the content a run records
    except OSError as error:
        raise ConfigError(f"--plugin {str(path)!r} is not a readable .py file ({error.strerror})") from None
    for registry in REGISTRIES:
        registry.load_entry_points()
    log_start = len(_registration_log)
    # One module name per file: two plugin files that share a stem are two sources, not one.
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]
    module_name = f"pflbench_plugin_{re.sub(r'[^0-9A-Za-z_]', '_', path.stem)}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"--plugin {str(path)!r} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        try:
            spec.loader.exec_module(module)
        except BaseException:
            _forget(module_name, log_start)
            raise
    except ConfigError as error:  # a bad or duplicate name: the message already says which
        sys.modules.pop(module_name, None)
        raise ConfigError(f"--plugin {str(path)!r}: {error}") from error
    except SystemExit as error:  # sys.exit()/exit() at import time must not end pflbench
        sys.modules.pop(module_name, None)
        raise ConfigError(
            f"--plugin {str(path)!r} called sys.exit({error.code!r}) while being "
            "imported; a plugin file must only define and register"
        ) from None
    except Exception as error:
        sys.modules.pop(module_name, None)
        message = " ".join(str(error).split())[:300]
        raise ConfigError(f"--plugin {str(path)!r} failed to import: {type(error).__name__}: {message}") from error
    if len(_registration_log) == log_start:
        raise ConfigError(
            f"--plugin {str(path)!r} registers nothing; decorate a class with "
            "@register_algorithm('name') (or register_dataset / register_model / register_tracker)"
        )
    _plugin_files[module_name] = PluginFile(
        os.path.abspath(path),
        os.path.abspath(recorded_as if recorded_as is not None else path),
        source,
        hashlib.sha256(source).hexdigest(),
        module_name,
    )


REGISTRIES = (ALGORITHMS, DATASETS, MODELS, PARTITIONERS, TRACKERS)
