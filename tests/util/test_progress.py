"""The progress facility: ETA arithmetic, line format, and when a reporter writes."""

from __future__ import annotations

import io

import pytest

from pflbench.util import progress
from pflbench.util.progress import LineReporter, eta_seconds, format_duration, format_rate, progress_line


def test_eta_is_the_time_left_at_the_rate_so_far() -> None:
    assert eta_seconds(1, 60, 50.0) == pytest.approx(59 * 50.0)  # 1 of 60 epochs in 50 s: 49m10s left
    assert eta_seconds(30, 40, 15.0) == pytest.approx(5.0)
    assert eta_seconds(40, 40, 15.0) == 0.0
    assert eta_seconds(0, 40, 15.0) is None  # nothing done yet: no estimate
    assert format_duration(59 * 50.0) == "49m10s"
    assert format_duration(42.4) == "42s"
    assert format_duration(2 * 3600 + 7 * 60 + 3) == "2h07m"
    assert format_rate(100, 4.0, "image") == "25.0 image/s"
    assert format_rate(2, 100.0, "epoch") == "50.0 s/epoch"


def test_progress_line_names_stage_count_status_rate_and_eta() -> None:
    line = progress_line("pretraining", 250, 1000, "sample", 10.0, "epoch 1/4")
    assert line == "pretraining: 250/1000 sample (25%)  epoch 1/4  25.0 sample/s  elapsed 10s  ETA 30s"
    assert "ETA" not in progress_line("pretraining", 1000, 1000, "sample", 40.0)


def test_a_log_gets_lines_at_a_bounded_rate_and_a_short_stage_none(monkeypatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    monkeypatch.delenv("PFLBENCH_PROGRESS_EVERY", raising=False)
    stream = io.StringIO()
    reporter = LineReporter(stream, tty=False)
    with progress.reporting(reporter), progress.stage("quick", 10, "item") as stage:
        clock[0] = 1.0
        stage.advance(10)
    assert stream.getvalue() == ""  # under SHOW_AFTER_S: silent
    with progress.reporting(reporter), progress.stage("decoding", 100, "image") as stage:
        for _ in range(1, 101):  # one image per second: 100 s
            clock[0] += 1.0
            stage.advance(1)
    lines = stream.getvalue().splitlines()
    # first line after 2 s, then at most one per 30 s, and the finished count once
    assert [line.split()[1] for line in lines] == ["2/100", "32/100", "62/100", "92/100", "100/100"]
    assert "ETA" in lines[0] and "ETA" not in lines[-1]


def test_nothing_is_reported_without_a_reporter(capsys) -> None:
    assert not progress.active()
    with progress.stage("pretraining", 3, "epoch") as stage:
        stage.advance(3)
    progress.note("not shown")
    assert capsys.readouterr() == ("", "")
