"""Search spaces of ``pflbench tune``: what each tuned setting may take, as data.

A space maps a setting's name (a run option such as ``lr`` or an algorithm hyperparameter such
as ``mu``) to a dimension: ``Choice`` (a finite set, the only kind a grid search takes) or
``Range`` (an interval, uniform or log-uniform; integer when the setting is an integer). The
text form, on the command line (``--space lr=log:0.001:0.3``) and in config files, is

- ``NAME=V1,V2,...``: a choice (``mu=0.001,0.01,0.1,1``),
- ``NAME=LOW:HIGH``: a uniform range (``alpha_init=0.1:0.9``),
- ``NAME=log:LOW:HIGH``: a log-uniform range (``lr=log:0.001:0.3``).

Values are converted to the setting's type by the caller (``typed``), so ``local_epochs=1:5`` is
an integer range because ``local_epochs`` is an ``int``. Pure data, no Optuna: the sampler
lives in ``sweeps.tune``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pflbench.errors import ConfigError


@dataclass(frozen=True)
class Choice:
    """One of ``values`` (in this order; a grid search visits them all)."""

    values: tuple[Any, ...]

    def text(self) -> str:
        return ",".join(_number_text(v) for v in self.values)


@dataclass(frozen=True)
class Range:
    """A value in [low, high]: uniform, or log-uniform when ``log``; an integer when ``integer``."""

    low: float
    high: float
    log: bool = False
    integer: bool = False

    def text(self) -> str:
        bounds = f"{_number_text(self.low)}:{_number_text(self.high)}"
        return f"log:{bounds}" if self.log else bounds


Dimension = Choice | Range


def _number_text(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def parse_dimension(name: str, text: str, convert: Callable[[str], Any] = str) -> Dimension:
    """``text`` of ``--space NAME=TEXT`` as a dimension; ``convert`` turns one value into the
    setting's type (choices) — ranges always read numbers."""
    text = text.strip()
    parts = [p.strip() for p in text.split(":")]
    if len(parts) == 3 and parts[0].lower() == "log":
        return _range(name, parts[1], parts[2], log=True)
    if len(parts) == 2:
        return _range(name, parts[0], parts[1], log=False)
    if ":" in text:
        raise ConfigError(f"--space {name}={text}: a range is LOW:HIGH or log:LOW:HIGH")
    values = []
    for item in (v.strip() for v in text.split(",")):
        if not item:
            continue
        try:
            value = convert(item)
        except (TypeError, ValueError):
            raise ConfigError(f"--space {name}: {item!r} is not a valid value") from None
        if value not in values:
            values.append(value)
    if not values:
        raise ConfigError(f"--space {name}= needs values (V1,V2,...), LOW:HIGH or log:LOW:HIGH")
    return Choice(tuple(values))


def _range(name: str, low_text: str, high_text: str, log: bool) -> Range:
    try:
        low, high = float(low_text), float(high_text)
    except ValueError:
        raise ConfigError(f"--space {name}: {low_text}:{high_text} is not a range of two numbers") from None
    if not (math.isfinite(low) and math.isfinite(high)) or not low < high:
        raise ConfigError(f"--space {name}: the range needs finite LOW < HIGH, got {low_text}:{high_text}")
    if log and low <= 0:
        raise ConfigError(f"--space {name}: a log range needs LOW > 0, got {low_text}")
    return Range(low, high, log)


def typed(dimension: Dimension, kind: type, name: str) -> Dimension:
    """``dimension`` for a setting of type ``kind`` (int, float, str, bool): an integer range
    for an int setting (its bounds must be whole numbers); a range on a non-numeric setting
    is an error."""
    if isinstance(dimension, Choice):
        return dimension
    if kind is int:
        if dimension.low != int(dimension.low) or dimension.high != int(dimension.high):
            raise ConfigError(f"--space {name}: {name} is an integer; give whole-number bounds, got {dimension.text()}")
        return Range(int(dimension.low), int(dimension.high), dimension.log, integer=True)
    if kind is not float:
        raise ConfigError(f"--space {name}: {name} is not numeric; list its values (V1,V2,...) instead of a range")
    return dimension


def space_text(space: dict[str, Dimension]) -> dict[str, str]:
    """The space in its text form, for records and messages."""
    return {name: dimension.text() for name, dimension in space.items()}


def grid_points(space: dict[str, Dimension]) -> int:
    """How many settings a grid search over ``space`` visits (every dimension a ``Choice``)."""
    ranges = [n for n, d in space.items() if isinstance(d, Range)]
    if ranges:
        raise ConfigError(
            f"--sampler grid needs a list of values for every tuned setting; {', '.join(ranges)} "
            "is a range (give V1,V2,... or use --sampler tpe)"
        )
    return math.prod(len(d.values) for d in space.values() if isinstance(d, Choice))


def around(value: float, factor: float = 10.0) -> Range:
    """A log-uniform range from value/factor to value·factor (a default space around a default)."""
    return Range(value / factor, value * factor, log=True)
