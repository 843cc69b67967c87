"""Observers see a run without changing it: progress bar, result writer, tests."""

from __future__ import annotations

from typing import Any, Protocol

from pflbench.engine.types import ClientJob, ClientUpdate


class RunObserver(Protocol):
    def on_run_start(self, run: Any) -> None: ...
    def on_client_update(self, job: ClientJob, update: ClientUpdate) -> None: ...
    def on_round_end(self, record: dict[str, Any]) -> None: ...
    def on_run_end(self, summary: dict[str, Any]) -> None: ...


class Observer:
    """A ``RunObserver`` that ignores every event; subclass and override what you need."""

    def on_run_start(self, run: Any) -> None:
        pass

    def on_client_update(self, job: ClientJob, update: ClientUpdate) -> None:
        pass

    def on_round_end(self, record: dict[str, Any]) -> None:
        pass

    def on_run_end(self, summary: dict[str, Any]) -> None:
        pass


class RoundCallback(Observer):
    """Adapts a ``record -> None`` function (the old ``on_round`` argument)."""

    def __init__(self, function: Any) -> None:
        self.function = function

    def on_round_end(self, record: dict[str, Any]) -> None:
        self.function(record)
