"""Whether a value read from a file (JSON, TOML, YAML) has the type of the setting it gives.

Files are not converted as command-line text is: a file that says ``rounds = 2.7``,
``rounds = "3"``, ``rounds = true`` or ``lr = "0.1"`` gave a value of the wrong type, and is
refused rather than truncated or parsed (a float for an int setting would silently lose its
fraction; a string for a number is a quoting mistake the file's own syntax makes visible). The
rules, one per annotation: ``int`` takes integers (not booleans); ``float`` takes integers and
floats (``lr = 1`` is exact); ``bool`` takes booleans only (not ``"false"`` or ``1``); ``str``
takes strings; ``X | None`` also null; ``tuple[X, ...]`` a list of X. Other annotations are not
checked here.
"""

from __future__ import annotations

import json
import types
import typing
from typing import Any

_WANTED = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def type_error(value: Any, annotation: Any) -> str | None:
    """None when ``value`` fits ``annotation`` (the rules above), else what was wanted and what
    was given, e.g. ``"must be an integer, got 2.7"``."""
    wanted = _wanted(value, annotation)
    if wanted is None:
        return None
    return f"must be {wanted}, got {_shown(value)}"


def _wanted(value: Any, annotation: Any) -> str | None:
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        arguments = typing.get_args(annotation)
        if value is None and type(None) in arguments:
            return None
        inner = [a for a in arguments if a is not type(None)]
        if len(inner) != 1:
            return None
        wanted = _wanted(value, inner[0])
        return None if wanted is None else f"{wanted} or null"
    if typing.get_origin(annotation) is tuple:
        element = typing.get_args(annotation)[0]
        if not isinstance(value, list):
            return f"a list of {_plural(element)}"
        return next((f"a list of {_plural(element)}" for v in value if _wanted(v, element) is not None), None)
    if annotation not in _WANTED:
        return None
    fits = {
        int: type(value) is int,
        float: type(value) in (int, float),
        bool: type(value) is bool,
        str: type(value) is str,
    }[annotation]
    return None if fits else _WANTED[annotation]


def json_kind(value: Any) -> str:
    """What a parsed JSON value is, in JSON's words with its article: "a list", "an object", "null"."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return {str: "a string", list: "a list", dict: "an object"}.get(type(value), f"a {type(value).__name__}")


def _plural(annotation: Any) -> str:
    return {int: "integers", float: "numbers", bool: "booleans", str: "strings"}.get(annotation, "values")


def _shown(value: Any) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 50 else text[:47] + "..."
