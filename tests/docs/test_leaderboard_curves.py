"""The HTML leaderboard's per-row curves (issue 38): ``row_curves`` averages a row's runs per
round, and the page carries them in display units for its script (drawn in tests/docs/test_browser.py)."""

from __future__ import annotations

import json
import math
import re

import pandas as pd

from pflbench.report.leaderboard import row_curves
from pflbench.report.render import curve_data


def test_row_curves_average_a_rows_runs_per_round_and_skip_other_metrics() -> None:
    frame = pd.DataFrame(
        [
            # run, round, metric, value: two seeds of FedAvg, one of FedPer; NaN round = a final value
            ("a0", 1.0, "pers_acc", 0.5),
            ("a0", 2.0, "pers_acc", 0.7),
            ("a1", 1.0, "pers_acc", 0.3),
            ("a1", 2.0, "pers_acc", 0.9),
            ("a1", 2.0, "train_loss", 9.0),
            ("a1", math.nan, "pers_acc", 0.9),
            ("p0", 2.0, "pers_acc", 0.6),
        ],
        columns=["run", "round", "metric", "value"],
    ).assign(dataset="digits", partition="α=0.1")
    labels = {"a0": "FedAvg", "a1": "FedAvg", "p0": "FedPer"}
    curves = row_curves(frame, "pers_acc_last10", labels)
    assert curves == {"FedAvg": {"digits α=0.1": [[1.0, 0.4], [2.0, 0.8]]}, "FedPer": {"digits α=0.1": [[2.0, 0.6]]}}
    assert row_curves(frame, "comm", labels) == {}


def test_the_page_carries_the_curves_in_percent_by_row_position_and_escaped() -> None:
    table = pd.DataFrame(index=pd.Index(["FedPer", "</script><b>x"], name="algorithm"))
    table.attrs.update(metric="pers_acc", curves={"</script><b>x": {"d<img> α=0.1": [[1.0, 0.25]]}})
    block = curve_data(table)
    assert "</script><b>" not in block and block.count("<") == 2  # its own two tags only
    payload = json.loads(re.search(r'id="curves">(.*)</script>', block).group(1))
    assert payload == {"label": "Personalized accuracy (%)", "rows": {"1": {"d<img> α=0.1": [[1.0, 25.0]]}}}
