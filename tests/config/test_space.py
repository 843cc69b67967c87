"""Search spaces of ``pflbench tune``: the text form, typing against a setting, grid sizes."""

from __future__ import annotations

import pytest

from pflbench.config.space import Choice, Range, around, grid_points, parse_dimension, space_text, typed
from pflbench.errors import ConfigError


def test_text_forms() -> None:
    assert parse_dimension("mu", "0.01, 0.1,0.01", float) == Choice((0.01, 0.1))  # de-duplicated, in order
    assert parse_dimension("lr", "log:0.001:0.3") == Range(0.001, 0.3, log=True)
    assert parse_dimension("a", "0.1:0.9") == Range(0.1, 0.9)
    assert parse_dimension("opt", "sgd,adam") == Choice(("sgd", "adam"))
    space = {"lr": Range(0.001, 0.3, log=True), "mu": Choice((0.01, 1.0))}
    assert space_text(space) == {"lr": "log:0.001:0.3", "mu": "0.01,1.0"}


@pytest.mark.parametrize(
    "text, message",
    [
        ("log:0:1", "a log range needs LOW > 0"),
        ("0.5:0.1", "finite LOW < HIGH"),
        ("a:b", "is not a range of two numbers"),
        ("log:1:2:3", "a range is LOW:HIGH or log:LOW:HIGH"),
        (",", "needs values"),
    ],
)
def test_bad_text(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_dimension("lr", text)


def test_typed_integer_and_non_numeric() -> None:
    assert typed(Range(1.0, 5.0), int, "local_epochs") == Range(1, 5, integer=True)
    with pytest.raises(ConfigError, match="whole-number bounds"):
        typed(Range(1.0, 2.5), int, "local_epochs")
    with pytest.raises(ConfigError, match="not numeric"):
        typed(Range(0.0, 1.0), str, "optimizer")
    assert typed(Choice(("sgd",)), str, "optimizer") == Choice(("sgd",))


def test_grid_points_and_around() -> None:
    assert grid_points({"lr": Choice((0.01, 0.1, 1.0)), "mu": Choice((0.0, 1.0))}) == 6
    with pytest.raises(ConfigError, match="lr is a range"):
        grid_points({"lr": Range(0.01, 1.0, log=True)})
    assert around(0.05) == Range(0.005, 0.5, log=True)  # 0.05/10, 0.05·10
