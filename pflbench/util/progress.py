"""Progress of the long stages (decoding a dataset, pretraining a backbone, evaluation,
fine-tuning): one small facility every layer may use without knowing who listens.

A stage reports to the *current reporter* (a context variable): silent unless the caller
installs one with ``reporting(reporter)``, so library use, tests and sweep workers stay quiet and
the engine never learns about the command line; ``pflbench run`` installs ``LineReporter``
(stderr) unless ``--quiet``. ``LineReporter`` shows nothing for a stage's first
``SHOW_AFTER_S`` seconds (short stages stay silent), then rewrites one line on a terminal or,
in a log file, prints plain lines at most every ``LOG_INTERVAL_S`` seconds, so a long job's log
is never silent for an hour and never floods. ``PFLBENCH_PROGRESS_EVERY=S`` sets that interval
(and shows stages from their start when S < 2; tests use 0).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol, TextIO

SHOW_AFTER_S = 2.0  # a stage shorter than this prints nothing
LOG_INTERVAL_S = 30.0  # not a terminal: at most one line per stage this often
TTY_INTERVAL_S = 0.2  # a terminal: the line is rewritten at most this often


class Reporter(Protocol):
    """Where stages report to. ``handle`` is whatever ``start`` returned."""

    def note(self, line: str) -> None: ...
    def start(self, name: str, total: int, unit: str) -> Any: ...
    def update(self, handle: Any, done: int, status: str) -> None: ...
    def finish(self, handle: Any, status: str) -> None: ...


class Silent:
    """The default reporter: nothing is shown."""

    def note(self, line: str) -> None:
        pass

    def start(self, name: str, total: int, unit: str) -> Any:
        return None

    def update(self, handle: Any, done: int, status: str) -> None:
        pass

    def finish(self, handle: Any, status: str) -> None:
        pass


SILENT = Silent()
_current: ContextVar[Reporter] = ContextVar("pflbench_progress_reporter", default=SILENT)


@contextmanager
def reporting(reporter: Reporter) -> Iterator[Reporter]:
    """Stages started inside this block (in this thread) report to ``reporter``."""
    token = _current.set(reporter)
    try:
        yield reporter
    finally:
        _current.reset(token)


def current() -> Reporter:
    return _current.get()


def active() -> bool:
    """Whether anyone listens (a stage may skip work done only to be shown, e.g. an extra
    accuracy per pretraining epoch, when nobody does)."""
    return not isinstance(current(), Silent)


def note(line: str) -> None:
    """One line for the user now (e.g. what a long stage will do, or that a cache was reused)."""
    current().note(line)


class Stage:
    """``done`` of ``total`` units of one named stage; ``advance`` after each piece of work."""

    def __init__(self, reporter: Reporter, name: str, total: int, unit: str) -> None:
        self.reporter, self.done, self.total = reporter, 0, total
        self.handle = reporter.start(name, total, unit)

    def advance(self, count: int = 1, status: str = "") -> None:
        self.done += count
        self.reporter.update(self.handle, self.done, status)


@contextmanager
def stage(name: str, total: int, unit: str = "item") -> Iterator[Stage]:
    """A stage of ``total`` units reported to the current reporter; finished when the block ends
    (also on an error: the line is closed, not left half-written)."""
    reporter = current()
    handle = Stage(reporter, name, total, unit)
    try:
        yield handle
    finally:
        reporter.finish(handle.handle, "")


def eta_seconds(done: float, total: float, elapsed: float) -> float | None:
    """Seconds left at the rate so far (None before the first unit is done)."""
    if done <= 0 or elapsed <= 0:
        return None
    return max(0.0, elapsed / done * (total - done))


def format_duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def format_rate(done: float, elapsed: float, unit: str) -> str:
    """``12.5 image/s``, or ``48.0 s/epoch`` when a unit takes longer than a second."""
    if done <= 0 or elapsed <= 0:
        return ""
    rate = done / elapsed
    return f"{rate:.1f} {unit}/s" if rate >= 1 else f"{elapsed / done:.1f} s/{unit}"


def progress_line(name: str, done: int, total: int, unit: str, elapsed: float, status: str = "") -> str:
    """``NAME done/total unit (pct%)  STATUS  RATE  elapsed E  ETA T``."""
    percent = f" ({100 * done / total:.0f}%)" if total > 0 else ""
    parts = [f"{name}: {done}/{total} {unit}{percent}"]
    if status:
        parts.append(status)
    rate = format_rate(done, elapsed, unit)
    if rate:
        parts.append(rate)
    parts.append(f"elapsed {format_duration(elapsed)}")
    eta = eta_seconds(done, total, elapsed)
    if eta is not None and done < total:
        parts.append(f"ETA {format_duration(eta)}")
    return "  ".join(parts)


class _LineStage:
    def __init__(self, name: str, total: int, unit: str) -> None:
        self.name, self.total, self.unit = name, total, unit
        self.started = time.monotonic()
        self.shown_at: float | None = None
        self.done, self.status, self.shown_done = 0, "", -1


class LineReporter:
    """Progress lines on ``stream`` (looked up at each write when None: ``sys.stderr``)."""

    def __init__(self, stream: TextIO | None = None, tty: bool | None = None, interval: float | None = None) -> None:
        self._stream = stream
        self.tty = tty if tty is not None else bool(getattr(self.stream, "isatty", lambda: False)())
        every = os.environ.get("PFLBENCH_PROGRESS_EVERY")
        if interval is None and every is not None:
            interval = float(every)
        self.interval = interval if interval is not None else (TTY_INTERVAL_S if self.tty else LOG_INTERVAL_S)
        self.show_after = min(SHOW_AFTER_S, self.interval) if every is not None else SHOW_AFTER_S
        self._partial = False  # a terminal line is being rewritten

    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stderr

    def _write(self, text: str, final: bool) -> None:
        if self.tty:
            self.stream.write("\r\x1b[K" + text + ("\n" if final else ""))
            self._partial = not final
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def note(self, line: str) -> None:
        if self._partial:
            self.stream.write("\n")
            self._partial = False
        self.stream.write(line + "\n")
        self.stream.flush()

    def start(self, name: str, total: int, unit: str) -> _LineStage:
        return _LineStage(name, total, unit)

    def _line(self, stage: _LineStage, now: float) -> str:
        return progress_line(stage.name, stage.done, stage.total, stage.unit, now - stage.started, stage.status)

    def update(self, handle: Any, done: int, status: str) -> None:
        stage: _LineStage = handle
        stage.done, stage.status = done, status or stage.status
        now = time.monotonic()
        if now - stage.started < self.show_after:
            return
        if stage.shown_at is not None and now - stage.shown_at < self.interval:
            return
        stage.shown_at, stage.shown_done = now, done
        self._write(self._line(stage, now), final=False)

    def finish(self, handle: Any, status: str) -> None:
        stage: _LineStage = handle
        stage.status = status or stage.status
        now = time.monotonic()
        if stage.shown_at is None and now - stage.started < self.show_after:
            return  # a short stage stays silent
        if not self.tty and stage.shown_done == stage.done:
            return  # its last line is already in the log
        self._write(self._line(stage, now), final=True)
