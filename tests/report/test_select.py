"""``select_by``: one setting per algorithm and column group, chosen on a validation metric and
shown with its test metrics; test metrics only when asked for (and marked); runs without the
metric are an error; a setting with a diverged run is never chosen; ties go to the first."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pandas as pd
import pytest

from pflbench.errors import ConfigError
from pflbench.report.leaderboard import cells, pivot
from pflbench.report.render import to_csv, to_markdown
from pflbench.report.select import select_settings
from pflbench.store.reader import load_runs


def _sibling(name: str):
    """A module next to this file (tests run with --import-mode=importlib, so no plain import)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_run = _sibling("fake_runs").make_run

# (alpha, lr) → per seed (validation accuracy, test accuracy): on validation lr=0.1 wins at α=0.1
# and lr=0.01 at α=1, while on test it is the other way round
SWEEP = {
    (0.1, 0.01): [(0.60, 0.80), (0.61, 0.81), (0.62, 0.82)],
    (0.1, 0.1): [(0.70, 0.75), (0.70, 0.76), (0.70, 0.77)],
    (1.0, 0.01): [(0.80, 0.60), (0.80, 0.61), (0.80, 0.62)],
    (1.0, 0.1): [(0.50, 0.90), (0.50, 0.90), (0.50, 0.90)],
}
A01, A1 = ("digits", "α=0.1", "pers_acc"), ("digits", "α=1", "pers_acc")


def write_sweep(out: Path) -> Path:
    for (alpha, lr), seeds in SWEEP.items():
        for seed, (val, test) in enumerate(seeds):
            make_run(out, "fedavg", seed, [test], alpha=alpha, lr=lr, summary={"val_pers_acc": val})
            if lr == 0.01:  # FedPer: one setting only
                make_run(out, "fedper", seed, [0.5], alpha=alpha, summary={"val_pers_acc": 0.5})
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sweep(tmp_path_factory.mktemp("sweep"))


@pytest.fixture(scope="module")
def frame(results: Path) -> pd.DataFrame:
    return load_runs(results)


def test_without_selection_each_setting_is_a_row(frame: pd.DataFrame) -> None:
    assert list(pivot(frame).index) == ["FedAvg (lr=0.01)", "FedAvg (lr=0.1)", "FedPer"]


def test_the_setting_with_the_best_validation_mean_is_shown_with_its_test_values(frame: pd.DataFrame) -> None:
    table = pivot(frame, select_by="val_pers_acc")
    assert list(table.index) == ["FedAvg", "FedPer"]
    marks = cells(table)
    assert marks["FedAvg", A01].mean == pytest.approx(76.0)  # lr=0.1: validation 0.70 > 0.61
    assert marks["FedAvg", A1].mean == pytest.approx(61.0)  # lr=0.01: validation 0.80 > 0.50
    assert marks["FedPer", A01].mean == pytest.approx(50.0)
    text = to_markdown(table)
    assert (
        "Settings selected per algorithm and column group by the best mean Validation personalized accuracy (%) "
        "over the seeds all its settings share (final value); the cells show the selected setting's values "
        "over all of its seeds." in text
    )
    assert (
        "Selected: FedAvg digits α=0.1: lr=0.1 (on seeds 0,1,2); FedAvg digits α=1: lr=0.01 (on seeds 0,1,2)." in text
    )
    assert "selected on test" not in text.lower()
    rows = pd.read_csv(StringIO(to_csv(table)))
    chosen = rows[(rows["algorithm"] == "FedAvg") & (rows["quantity"] == "pers_acc")].set_index("partition")
    assert chosen.loc["α=0.1", "selected"] == "lr=0.1" and chosen.loc["α=1", "selected"] == "lr=0.01"
    assert rows.loc[rows["algorithm"] == "FedPer", "selected"].isna().all()  # one setting: nothing chosen


def test_selecting_on_test_needs_the_flag_and_is_marked(frame: pd.DataFrame) -> None:
    with pytest.raises(ConfigError, match="--select-by pers_acc is a test metric; select on a validation metric"):
        pivot(frame, select_by="pers_acc")
    with pytest.raises(ConfigError, match="--select-by wall_time_s is not a validation metric"):
        pivot(frame, select_by="wall_time_s")
    table = pivot(frame, select_by="pers_acc", allow_test_selection=True)
    marks = cells(table)
    assert marks["FedAvg", A01].mean == pytest.approx(81.0) and marks["FedAvg", A1].mean == pytest.approx(90.0)
    text = to_markdown(table)
    assert "Metric: Personalized accuracy (%), final value (selected on test)." in text
    assert "Selected on test: Settings selected per algorithm" in text


def test_runs_without_the_metric_are_an_error_naming_them(tmp_path: Path) -> None:
    write_sweep(tmp_path)
    lacking = make_run(tmp_path, "fedavg", 5, [0.7], lr=0.1)  # e.g. run with --val-frac 0
    with pytest.raises(ConfigError) as caught:
        pivot(load_runs(tmp_path), select_by="val_pers_acc")
    assert str(caught.value) == (
        f"--select-by val_pers_acc: 1 run has no value of it (runs without a validation split: --val-frac 0): "
        f"{lacking.name}"
    )


def test_a_setting_with_a_diverged_run_is_never_selected(tmp_path: Path) -> None:
    write_sweep(tmp_path)
    for seed in range(3):  # lr=1: the best validation mean of the seeds that finished
        status = "diverged" if seed == 2 else "completed"
        make_run(tmp_path, "fedavg", seed, [0.3], lr=1.0, status=status, summary={"val_pers_acc": 0.99})
    frame = load_runs(tmp_path, include_abnormal=True, warn=lambda message: None)
    table = pivot(frame, select_by="val_pers_acc")
    assert cells(table)["FedAvg", A01].mean == pytest.approx(76.0)  # lr=0.1 still
    assert "Never selected (a run diverged): FedAvg digits α=0.1: lr=1." in to_markdown(table)


def test_ties_go_to_the_first_setting_and_lower_is_better_metrics_pick_the_least(tmp_path: Path) -> None:
    for lr, test in ((0.01, 0.8), (0.1, 0.6)):
        for seed in range(3):
            make_run(tmp_path, "fedavg", seed, [test], lr=lr, summary={"val_pers_acc": 0.7, "val_pers_acc_std": lr})
    frame = load_runs(tmp_path)
    _, selection = select_settings(frame, "val_pers_acc")
    assert [c.setting for c in selection.choices] == ["lr=0.01"]  # equal means: the first in sorted order
    _, by_spread = select_settings(frame, "val_pers_acc_std")
    assert by_spread.choices[0].setting == "lr=0.01" and by_spread.choices[0].value == pytest.approx(0.01)


def test_settings_are_compared_on_the_seeds_they_share(tmp_path: Path) -> None:
    """As ``pflbench tune`` leaves them: trials on seed 0, the chosen setting also on seeds 1, 2.
    Compared on the shared seed 0, lr=0.01 (0.65) beats lr=0.1 (0.64); over its own three seeds
    lr=0.01 would average 0.61 and lose to a setting that has only its one lucky seed."""
    for seed, (val, test) in enumerate([(0.65, 0.80), (0.60, 0.81), (0.58, 0.82)]):
        make_run(tmp_path, "fedavg", seed, [test], alpha=0.1, lr=0.01, summary={"val_pers_acc": val})
    make_run(tmp_path, "fedavg", 0, [0.5], alpha=0.1, lr=0.1, summary={"val_pers_acc": 0.64})
    table = pivot(load_runs(tmp_path), select_by="val_pers_acc")
    marks = cells(table)
    # on the shared seed 0: lr=0.01 0.65 > lr=0.1 0.64 (over its own seeds lr=0.01 would be 0.61 < 0.64)
    assert marks["FedAvg", A01].mean == pytest.approx(81.0) and marks["FedAvg", A01].n == 3
    assert "FedAvg digits α=0.1: lr=0.01 (on seed 0)" in to_markdown(table)


def test_a_tie_on_the_shared_seeds_goes_to_the_setting_with_more_seeds(tmp_path: Path) -> None:
    """Two tune trials with equal validation accuracy on seed 0: tune ran the earlier one (lr=0.2)
    on every seed; the table shows that one, not the other's single run (first in sorted order)."""
    for seed in range(3):
        make_run(tmp_path, "fedavg", seed, [0.9], alpha=0.1, lr=0.2, summary={"val_pers_acc": 0.7 - 0.1 * seed})
    make_run(tmp_path, "fedavg", 0, [0.5], alpha=0.1, lr=0.1, summary={"val_pers_acc": 0.7})
    table = pivot(load_runs(tmp_path), select_by="val_pers_acc")
    assert cells(table)["FedAvg", A01].n == 3 and cells(table)["FedAvg", A01].mean == pytest.approx(90.0)
