"""Observers installed for every run this process executes (``runs.execute``).

The seam for whoever cannot hand a run its observers because something else starts the run (a
CLI command, a sweep, a tuning study): ``install(factory)`` once, and each run gets
``factory()`` after its own observers. Tests use it to stop a run at a chosen round
(``pflbench.testing.kill_after_round``); nothing in pflbench installs one.
"""

from __future__ import annotations

from collections.abc import Callable

from pflbench.engine.observers import RunObserver

_FACTORIES: list[Callable[[], RunObserver]] = []


def install(factory: Callable[[], RunObserver]) -> None:
    """Give every later run of this process ``factory()`` as its last observer."""
    _FACTORIES.append(factory)


def uninstall(factory: Callable[[], RunObserver]) -> None:
    _FACTORIES.remove(factory)


def installed_observers() -> list[RunObserver]:
    """One fresh observer per installed factory, for a run about to start."""
    return [factory() for factory in _FACTORIES]
