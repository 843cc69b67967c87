"""Plugins read from their sources, without importing them.

``pflbench list``, ``run --help`` and ``leaderboard`` must not pay for torch (which every algorithm
module imports): what they need (names, docstrings, ``paper``, ``display_name``, the hyperparameter
dataclass's fields) is read with ``ast``. Whatever a source does not say plainly (a registration in
a loop, a dataclass from elsewhere, an inherited attribute) is read from the imported module instead.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib.util
import sys
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, NamedTuple

from pflbench.errors import ConfigError
from pflbench.registry import ALGORITHMS, Registry


class Hyperparameter(NamedTuple):
    """One field of an algorithm's hyperparameter dataclass: what its command-line option is made of."""

    name: str
    annotation: Any  # resolved: int, float | None, tuple[str, ...], ...
    default: Any
    metadata: Mapping[str, Any]  # help, choices, ...


def dataclass_hyperparameters(cls: type) -> tuple[Hyperparameter, ...]:
    """The fields of an (imported) hyperparameter dataclass."""
    hints = typing.get_type_hints(cls)
    return tuple(Hyperparameter(f.name, hints[f.name], f.default, dict(f.metadata)) for f in fields(cls))


_UNKNOWN: Any = object()  # what a source does not say plainly
_CLASS_VAR: Any = object()  # a ClassVar annotation: not a dataclass field
_BUILTIN_TYPES = {"int": int, "float": float, "str": str, "bool": bool}
_PLAIN_BASES = ("Algorithm", "Generic")  # bases whose class attributes are the documented defaults


@dataclass(frozen=True)
class StaticPlugin:
    """A ``@register_<kind>("name")`` as its source reads."""

    name: str
    doc: str  # the docstring's first sentence (``doc_summary``)
    attributes: Mapping[str, Any]  # the literal assignments of the class body (paper, display_name, ...)
    plain: bool  # a class whose only bases are Algorithm / Generic: an attribute it does not assign has the default
    hyperparameters: tuple[Hyperparameter, ...] | None  # None: not readable from the source

    def attribute(self, name: str, default: Any = None) -> Any:
        """The class attribute ``name`` (``default``: Algorithm's); KeyError when the source
        does not say (an attribute neither assigned a literal nor plainly inherited)."""
        if name in self.attributes:
            return self.attributes[name]
        if not self.plain:
            raise KeyError(name)
        return default

    @property
    def summary(self) -> str:
        """What ``pflbench list`` shows: the first docstring line and the paper, if assigned."""
        paper = self.attributes.get("paper", "")
        return f"{self.doc} [{paper!s}]" if isinstance(paper, str) and paper else self.doc


def _literal(node: ast.AST | None) -> Any:
    try:
        return ast.literal_eval(node) if node is not None else _UNKNOWN
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _UNKNOWN


def _name_of(node: ast.AST) -> str | None:
    """``X``, ``module.X`` or either subscripted (``Algorithm[H]``) → ``"X"``."""
    if isinstance(node, ast.Subscript):
        node = node.value
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def _annotation(node: ast.AST) -> Any:
    """The type an annotation names, for the types CLI options have (int, float, str, bool,
    ``X | None``, ``Optional[X]``, ``tuple[X, ...]``), ``_CLASS_VAR`` or ``_UNKNOWN``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a quoted annotation
        try:
            return _annotation(ast.parse(node.value, mode="eval").body)
        except SyntaxError:
            return _UNKNOWN
    if isinstance(node, ast.Constant) and node.value is None:
        return None
    if isinstance(node, ast.Name):
        return _BUILTIN_TYPES.get(node.id, _UNKNOWN)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        left, right = _annotation(node.left), _annotation(node.right)
        if _UNKNOWN in (left, right) or _CLASS_VAR in (left, right) or (left is None and right is None):
            return _UNKNOWN
        return left | right
    if isinstance(node, ast.Subscript):
        outer, inner = _name_of(node.value), node.slice
        if outer == "ClassVar":
            return _CLASS_VAR
        if outer == "Optional":
            item = _annotation(inner)
            return _UNKNOWN if item in (_UNKNOWN, _CLASS_VAR, None) else item | None
        if outer in ("tuple", "Tuple") and isinstance(inner, ast.Tuple) and len(inner.elts) == 2:
            item, rest = _annotation(inner.elts[0]), inner.elts[1]
            if item in _BUILTIN_TYPES.values() and isinstance(rest, ast.Constant) and rest.value is Ellipsis:
                return tuple[item, ...]  # type: ignore[valid-type]
    return _UNKNOWN


def _option_field(name: str, annotation: Any, value: ast.AST | None) -> Hyperparameter | None:
    """A field declared ``name: annotation = option(default, "help", key=value, ...)``."""
    if not isinstance(value, ast.Call) or _name_of(value.func) != "option" or len(value.args) > 2:
        return None
    given = dict(zip(("default", "help"), value.args))
    for keyword in value.keywords:
        if keyword.arg is None or keyword.arg in given:
            return None
        given[keyword.arg] = keyword.value
    literals = {key: _literal(node) for key, node in given.items()}
    default, help_text = literals.pop("default", _UNKNOWN), literals.pop("help", _UNKNOWN)
    if _UNKNOWN in (default, help_text, *literals.values()) or not isinstance(help_text, str):
        return None
    if isinstance(default, (list, dict, set)):  # option() refuses these: let the import say so
        return None
    return Hyperparameter(name, annotation, default, {"help": help_text, **literals})


def _read_dataclass(node: ast.ClassDef) -> tuple[Hyperparameter, ...] | None:
    """The fields of a ``@dataclass`` whose every field is an ``option(...)`` of a plain type."""
    if (
        node.bases
        or node.keywords
        or not any(_name_of(getattr(d, "func", d)) == "dataclass" for d in node.decorator_list)
    ):
        return None
    read = []
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign):
            annotation = _annotation(stmt.annotation)
            if annotation is _CLASS_VAR:
                continue
            field = _option_field(stmt.target.id, annotation, stmt.value) if isinstance(stmt.target, ast.Name) else None
            if annotation is _UNKNOWN or annotation is None or field is None:
                return None
            read.append(field)
        elif not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Assign, ast.Expr, ast.Pass)):
            return None  # anything cleverer (if-statements, nested classes, ...): import instead
    return tuple(read)


def _class_attributes(node: ast.ClassDef) -> tuple[dict[str, Any], dict[str, ast.AST]]:
    """(literal values, value nodes) of the simple assignments in a class body."""
    nodes: dict[str, ast.AST] = {}
    for stmt in node.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            nodes[stmt.targets[0].id] = stmt.value
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
            nodes[stmt.target.id] = stmt.value
    literals = {name: value for name, value in ((n, _literal(v)) for n, v in nodes.items()) if value is not _UNKNOWN}
    return literals, nodes


def _hyperparameters_named(
    declared: ast.AST | None, plain: bool, classes: Mapping[str, ast.ClassDef]
) -> tuple[Hyperparameter, ...] | None:
    """The fields of what a registered class's ``hyperparameters = X`` names: X read from the same
    source, () for none (not assigned, on a plain class), None when the source does not say."""
    if declared is None:
        return () if plain else None
    name = declared.id if isinstance(declared, ast.Name) else None
    if name is not None and name in classes:
        return _read_dataclass(classes[name])
    return () if name == "NoHyperparameters" else None


def _definitions(statements: list[Any]) -> Iterator[ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef]:
    """The class and function definitions among ``statements`` and the blocks nested in them
    (statements only: walking every expression node as well takes several times longer)."""
    for stmt in statements:
        if isinstance(stmt, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            yield stmt
        for block in ("body", "orelse", "finalbody", "handlers", "cases"):
            nested = getattr(stmt, block, None)
            if isinstance(nested, list):
                yield from _definitions(nested)


def read_plugins(source: str, kind: str) -> list[StaticPlugin]:
    """Every ``@register_<kind>("name")`` in ``source``, read without running it."""
    if f"register_{kind}" not in source:
        return []
    tree = ast.parse(source)
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    found = []
    for node in _definitions(tree.body):
        if isinstance(node, ast.AsyncFunctionDef):
            continue
        for decorator in node.decorator_list:
            if not isinstance(decorator, ast.Call) or _name_of(decorator.func) != f"register_{kind}":
                continue
            if not decorator.args or not isinstance(decorator.args[0], ast.Constant):
                continue
            doc = doc_summary(ast.get_docstring(node) or "")
            attributes: dict[str, Any] = {}
            plain = False
            hyperparameters: tuple[Hyperparameter, ...] | None = None
            if isinstance(node, ast.ClassDef):
                attributes, nodes = _class_attributes(node)
                plain = bool(node.bases) and all(_name_of(base) in _PLAIN_BASES for base in node.bases)
                hyperparameters = _hyperparameters_named(nodes.get("hyperparameters"), plain, classes)
            found.append(StaticPlugin(str(decorator.args[0].value), doc, attributes, plain, hyperparameters))
    return found


@functools.lru_cache(maxsize=256)
def _read_file(path: str, kind: str, stamp: tuple[int, int]) -> tuple[StaticPlugin, ...]:
    return tuple(read_plugins(Path(path).read_text(), kind))


def _static_plugins(origin: str | None, kind: str) -> list[StaticPlugin]:
    """What the file ``origin`` registers, as its source reads ([] when it cannot be read)."""
    if origin is None:
        return []
    try:
        stat = Path(origin).stat()
        return list(_read_file(origin, kind, (stat.st_mtime_ns, stat.st_size)))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return []


def _entry_point_sources(registry: Registry) -> list[tuple[str, str | None]]:
    """(module, its file) of each entry point of ``registry``; found without importing it."""
    return list(_entry_point_files(registry.entry_point_group))


@functools.cache
def _entry_point_files(group: str) -> tuple[tuple[str, str | None], ...]:
    # cached: scanning the installed distributions' entry points takes ~25 ms, and click asks
    # for a command's options several times while it shows help
    sources: list[tuple[str, str | None]] = []
    for entry_point in entry_points(group=group):
        module = entry_point.value.split(":")[0]
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        sources.append((module, spec.origin if spec and spec.origin else None))
    return tuple(sources)


def _import_plugin_module(registry: Registry, module: str) -> set[str]:
    """Import one plugin module (a broken one is a warning); the names it registered."""
    before = set(registry._items)
    try:
        importlib.import_module(module)
    except Exception as error:  # a broken plugin must not hide the others
        print(f"warning: could not load {registry.kind} plugin {module!r}: {error}", file=sys.stderr)
    return set(registry._items) - before


def _from_file(item: Any, path: str) -> bool:
    module = sys.modules.get(getattr(item, "__module__", ""), None)
    origin = getattr(module, "__file__", None)
    return origin is not None and Path(origin).resolve() == Path(path).resolve()


def _first_doc_line(item: Any) -> str:
    return doc_summary(item.__doc__ or "")


_ABBREVIATIONS = ("e.g.", "i.e.", "al.", "cf.", "vs.", "etc.")


def doc_summary(doc: str) -> str:
    """A docstring's first sentence on one line (what ``pflbench list`` shows): its first
    paragraph's lines joined, up to the first ``.``/``!``/``?`` that ends a sentence (followed by
    a space, outside parentheses, not ``e.g.`` and the like). Never cut mid-sentence at a line
    break of the source."""
    lines = []
    for line in doc.strip().splitlines():
        if not line.strip():
            break
        lines.append(line.strip())
    paragraph = " ".join(lines)
    depth = 0
    for index, char in enumerate(paragraph):
        depth += {"(": 1, ")": -1, "[": 1, "]": -1}.get(char, 0)
        ends = char in ".!?" and depth <= 0 and paragraph[index + 1 : index + 2] == " "
        if ends and not paragraph[: index + 1].endswith(_ABBREVIATIONS):
            return paragraph[: index + 1]
    return paragraph


def describe(registry: Registry, plugin_files: tuple[str, ...] = ()) -> dict[str, str]:
    """Name → one-line description of every plugin, read from the sources without importing
    them (``pflbench list`` must not pay for torch). A module whose registrations cannot be read
    statically is imported instead."""
    sources = _entry_point_sources(registry) + [(str(path), str(path)) for path in plugin_files]
    described: dict[str, str] = {}
    for module, origin in sources:
        if origin in plugin_files:  # loaded (and validated) already: read the registry
            items = registry._items.items()
            found = [(name, _first_doc_line(item)) for name, item in items if _from_file(item, origin)]
        else:
            found = [(plugin.name, plugin.summary) for plugin in _static_plugins(origin, registry.kind)]
            if not found:  # registered dynamically: import and read the registry
                imported = _import_plugin_module(registry, module)
                found = [(name, _first_doc_line(registry._items[name])) for name in imported]
        described.update(found)
    return dict(sorted(described.items()))


def algorithm_families(plugin_files: tuple[str, ...] = ()) -> dict[str, str]:
    """Algorithm name → its ``method_family`` literal ("" when its source does not assign one),
    read like ``describe`` (``--plugin`` files loaded already: from the registry)."""
    families: dict[str, str] = {}
    for _module, origin in _entry_point_sources(ALGORITHMS) + [(str(p), str(p)) for p in plugin_files]:
        if origin in plugin_files or not _static_plugins(origin, ALGORITHMS.kind):
            items = ALGORITHMS._items.items()
            families.update((n, str(getattr(c, "method_family", ""))) for n, c in items if n not in families)
            continue
        for plugin in _static_plugins(origin, ALGORITHMS.kind):
            family = plugin.attributes.get("method_family", "")
            families[plugin.name] = family if isinstance(family, str) else ""
    return families


def _static_algorithms() -> tuple[dict[str, tuple[str, StaticPlugin]], list[str]]:
    """(name → (module, what its source says) of every algorithm an entry point registers
    readably, the modules whose registrations cannot be read)."""
    found: dict[str, tuple[str, StaticPlugin]] = {}
    unread = []
    for module, origin in _entry_point_sources(ALGORITHMS):
        plugins = _static_plugins(origin, ALGORITHMS.kind)
        if not plugins:
            unread.append(module)
        found.update((plugin.name, (module, plugin)) for plugin in plugins)
    return found, unread


def algorithm_hyperparameters() -> dict[str, tuple[Hyperparameter, ...]]:
    """Name → hyperparameter fields of every registered algorithm. Until the entry points are
    loaded anyway, they are read from the sources (``pflbench run --help`` must not pay for
    torch); a module whose algorithms cannot be read that way is imported."""
    hyperparameters: dict[str, tuple[Hyperparameter, ...]] = {}
    if not ALGORITHMS._entry_points_loaded:
        found, unread = _static_algorithms()
        for module in dict.fromkeys(unread + [m for m, plugin in found.values() if plugin.hyperparameters is None]):
            _import_plugin_module(ALGORITHMS, module)
        hyperparameters = {
            name: plugin.hyperparameters for name, (_, plugin) in found.items() if plugin.hyperparameters is not None
        }
    for name, item in ALGORITHMS._items.items():  # imported (all of them once loaded): these win
        hyperparameters[name] = dataclass_hyperparameters(item.hyperparameters)
    return dict(sorted(hyperparameters.items()))


def declared_method_family(name: str) -> str:
    """The ``method_family`` algorithm ``name``'s class declares ("" when none, or when no
    registered algorithm has that name: a results folder from elsewhere), read like
    ``declared_display_name``."""
    if name not in ALGORITHMS._items and not ALGORITHMS._entry_points_loaded:
        found, unread = _static_algorithms()
        if name in found:
            family = found[name][1].attributes.get("method_family", "")
            return family if isinstance(family, str) else ""
        if not unread:
            return ""
    if name not in ALGORITHMS.items:
        return ""
    return str(getattr(ALGORITHMS.get(name), "method_family", "") or "")


def declared_display_name(name: str) -> Any:
    """The ``display_name`` algorithm ``name``'s class declares (None: none), read from its
    source while it can be (``pflbench leaderboard`` must not pay for torch); ConfigError for
    an unknown name."""
    if name not in ALGORITHMS._items and not ALGORITHMS._entry_points_loaded:
        found, unread = _static_algorithms()
        if name in found:
            with contextlib.suppress(KeyError):
                return found[name][1].attribute("display_name")
        elif not unread:  # every entry point's registrations read: no import can find it
            raise ConfigError(f"unknown algorithm {name!r}")
    return getattr(ALGORITHMS.get(name), "display_name", None)
