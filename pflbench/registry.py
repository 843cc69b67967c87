"""Name → object registries for algorithms, datasets, models and partitioners.

Built-in and third-party plugins register the same way: a module decorated with
``@register_algorithm("name")`` (etc.) is imported through the entry-point group
``pflbench.<kind>`` (loaded lazily on first lookup) or from a file with ``load_plugin_file``.
"""
from __future__ import annotations

import difflib
import importlib.util
import sys
from importlib.metadata import entry_points
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping

from .errors import ConfigError


_registration_log: list[tuple[str, str]] = []


def _origin(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


class Registry:
    """A private dict behind a read-only view; entry points are loaded on first use."""

    def __init__(self, kind: str, entry_point_group: str) -> None:
        self.kind = kind
        self.entry_point_group = entry_point_group
        self._items: dict[str, Any] = {}
        self._entry_points_loaded = False

    def register(self, name: str) -> Callable[[Any], Any]:
        def decorator(obj: Any) -> Any:
            existing = self._items.get(name)
            if existing is not None and _origin(existing) != _origin(obj):
                raise ValueError(f"{self.kind} {name!r} is already registered by {_origin(existing)}")
            self._items[name] = obj  # re-importing the same file replaces its own entry
            _registration_log.append((self.kind, name))
            return obj

        return decorator

    def load_entry_points(self) -> None:
        if self._entry_points_loaded:
            return
        self._entry_points_loaded = True
        for entry_point in entry_points(group=self.entry_point_group):
            try:
                entry_point.load()
            except Exception as error:  # a broken third-party plugin must not hide the others
                print(f"warning: could not load {self.kind} plugin {entry_point.value!r}: {error}",
                      file=sys.stderr)

    @property
    def items(self) -> Mapping[str, Any]:
        self.load_entry_points()
        return MappingProxyType(self._items)

    def names(self) -> list[str]:
        return sorted(self.items)

    def get(self, name: str) -> Any:
        items = self.items
        if name not in items:
            close = difflib.get_close_matches(name, list(items), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"unknown {self.kind} {name!r}{hint}; valid choices: {', '.join(sorted(items))}")
        return items[name]


ALGORITHMS = Registry("algorithm", "pflbench.algorithms")
DATASETS = Registry("dataset", "pflbench.datasets")
MODELS = Registry("model", "pflbench.models")
PARTITIONERS = Registry("partitioner", "pflbench.partitioners")

register_algorithm = ALGORITHMS.register
register_dataset = DATASETS.register
register_model = MODELS.register
register_partitioner = PARTITIONERS.register


def load_plugin_file(path: str | Path) -> None:
    """Import a single ``.py`` file so that its ``@register_*`` decorators run."""
    path = Path(path)
    if not path.is_file() or path.suffix != ".py":
        raise ConfigError(f"--plugin {str(path)!r} is not a readable .py file")
    for registry in REGISTRIES:
        registry.load_entry_points()
    log_start = len(_registration_log)
    module_name = f"pflbench_plugin_{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        sys.modules.pop(module_name, None)
        raise ConfigError(
            f"--plugin {str(path)!r} failed to import: {type(error).__name__}: {error}") from error
    if len(_registration_log) == log_start:
        raise ConfigError(f"--plugin {str(path)!r} registers nothing; decorate a class with "
                          "@register_algorithm('name') (or register_dataset / register_model)")


REGISTRIES = (ALGORITHMS, DATASETS, MODELS, PARTITIONERS)
