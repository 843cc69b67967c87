"""The reference benchmark's pieces without running anything: scenario files, the artifacts from
(fake) run folders — missing cells marked, rows kept for runs made elsewhere — and the
comparison's refusals. The command end to end: tests/cli/test_reference_command.py."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from pflbench.config.reference import parse_scenario, read_scenario
from pflbench.errors import ConfigError
from pflbench.report.reference import (
    comparison_frame,
    late_move,
    reach,
    reference_frame,
    setting_renames,
    write_artifacts,
)
from pflbench.store.reader import load_runs

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("_fake_runs", ROOT / "tests" / "report" / "fake_runs.py")
_fake = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fake)
make_run = _fake.make_run

SCENARIO = """
name = "fake"
[run]
dataset = "digits"
alpha = 0.1
rounds = 4
model = "mlp"
[protocol]
algos = ["fedavg", "local"]
seeds = [0, 1, 2]
trials = 2
tune_rounds = 2
target = "pers_acc=0.7"
"""


def test_scenario_file_is_read_and_checked(tmp_path: Path) -> None:
    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "scenario.toml").write_text(SCENARIO)
    scenario = read_scenario(tmp_path / "fake")
    assert scenario.name == "fake" and scenario.dataset == "digits" and scenario.alpha == 0.1
    assert scenario.shared() == {"rounds": 4, "model": "mlp"}
    assert scenario.protocol.seeds == (0, 1, 2) and scenario.protocol.trials == 2
    assert scenario.protocol.algos == ("fedavg", "local")
    # the algorithm list is not part of the scenario's identity (adding one keeps the others)
    other = parse_scenario(
        {"run": dict(scenario.run), "protocol": {**scenario.protocol.to_json(), "algos": ["x"]}}, "fake"
    )
    assert other.identity() == scenario.identity()
    changed = parse_scenario(
        {"run": dict(scenario.run), "protocol": {**scenario.protocol.to_json(), "trials": 3}}, "fake"
    )
    assert changed.identity() != scenario.identity()


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"runs": {}}, "unknown key 'runs'"),
        ({"run": {"lr_typo": 1}}, "'lr_typo' is not a run option"),
        ({"run": {"seed": 1}}, "seed is set by the reference command"),
        ({"protocol": {"trials": 0}}, "trials and tune_rounds must be ≥ 1"),
        ({"protocol": {"seeds": []}}, "seeds must be a non-empty list"),
        ({"protocol": {"algos": "all"}}, "'all'; give 'non-lora' or a list"),
        ({"protocol": {"budget": 3}}, "unknown key 'budget'"),
        ({"algo_options": {"fedavg": 8}}, "[algo_options.NAME] tables"),
    ],
)
def test_bad_scenarios_are_refused(data: dict, expected: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(expected)):
        parse_scenario(data, "bad")


def test_late_move_is_the_range_of_the_last_tenth() -> None:
    assert late_move([0.1, 0.5, 0.8, 0.82, 0.81]) == pytest.approx(0.01)  # last two: 0.82, 0.81
    values = [0.0] * 15 + [0.80, 0.83, 0.79]  # 18 evaluations: the last ceil(1.8) = 2
    assert late_move(values) == pytest.approx(0.04)
    assert math.isnan(late_move([0.5]))


def test_reach_counts_rounds_and_mb_to_the_target(tmp_path: Path) -> None:
    make_run(tmp_path, "fedavg", 0, [0.5, 0.7, 0.9], mb_per_round=2.0)
    frame = load_runs(tmp_path)
    # 0.7 first reached at round 2; by then 2 rounds × (2 MB up + 2 MB down) = 8 MB
    assert reach(frame, "pers_acc=0.7") == (2.0, 8.0)
    rounds, mb = reach(frame, "pers_acc=0.95")
    assert math.isnan(rounds) and math.isnan(mb)
    with pytest.raises(ConfigError, match="absolute"):
        reach(frame, "90%")


def _scenario_folder(root: Path) -> Path:
    folder = root / "fake"
    folder.mkdir(parents=True)
    (folder / "scenario.toml").write_text(SCENARIO)
    return folder


def _fake_reference(tmp_path: Path) -> tuple[Path, Path, dict]:
    """Fake runs for fedavg (default, tuned) and local (default; tuned missing), seeds 0-2."""
    work = tmp_path / "work"
    curves = {("fedavg", "default"): [0.4, 0.6, 0.65, 0.66], ("fedavg", "tuned"): [0.5, 0.7, 0.75, 0.76]}
    curves[("local", "default")] = [0.6, 0.8, 0.85, 0.86]
    cells = []
    for (algo, setting), curve in curves.items():
        for seed in (0, 1, 2):
            lr = 0.05 if setting == "default" else 0.2
            values = [v + 0.01 * seed for v in curve]
            folder = make_run(
                work,
                algo,
                seed,
                values,
                lr=lr,
                summary={"pers_acc_last10": values[-1], "new_acc": 0.5, "val_pers_acc": 0.6},
            )
            params = {"lr": lr} if setting == "tuned" else {}
            cells.append(
                {"algo": algo, "setting": setting, "seed": seed, "run": folder.name, "params": params, "status": "done"}
            )
    cells += [
        {"algo": "local", "setting": "tuned", "seed": s, "run": None, "params": {}, "status": "missing"}
        for s in (0, 1, 2)
    ]
    record = {"cells": cells, "dataset_sha256": "ab" * 32, "studies": {"fedavg": {"best": {"params": {"lr": 0.2}}}}}
    return _scenario_folder(tmp_path / "reference"), work, record


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict, dict]:
    """The fake reference's artifacts, written once (folder, work folder, record, counts)."""
    folder, work, record = _fake_reference(tmp_path_factory.mktemp("reference"))
    counts = write_artifacts(read_scenario(folder), folder, record, work / "runs")
    return folder, work, record, counts


def test_artifacts_hold_every_cell_and_mark_the_missing_ones(reference: tuple[Path, Path, dict, dict]) -> None:
    folder, _, _, counts = reference
    assert counts == {"done": 9, "missing": 3}
    summary = pd.read_csv(folder / "summary.csv")
    assert len(summary) == 12
    for column in (
        "pers_acc",
        "pers_acc_last10",
        "pers_acc_worst10",
        "new_acc",
        "comm_mb",
        "rounds_to_target",
        "mb_to_target",
    ):
        assert column in summary.columns
    row = summary[(summary["algo"] == "fedavg") & (summary["setting"] == "tuned") & (summary["seed"] == 0)].iloc[0]
    assert row["pers_acc"] == pytest.approx(0.76)
    assert row["comm_mb"] == pytest.approx(8.0)  # 4 rounds × (1 MB up + 1 MB down)
    assert row["rounds_to_target"] == 2 and row["mb_to_target"] == pytest.approx(4.0)
    assert row["pers_acc_move_last10"] == pytest.approx(0.01)  # 0.75 → 0.76
    missing = summary[summary["status"] == "missing"]
    assert set(zip(missing["algo"], missing["setting"])) == {("local", "tuned")}
    assert missing["pers_acc"].isna().all()
    table = (folder / "leaderboard.md").read_text()
    assert "| FedAvg (default) |" in table and "| FedAvg (tuned) |" in table and "| Local (default) |" in table
    assert "Cells not finished (3 of 12): local tuned seed 0,1,2 (missing)." in table
    assert (
        "Underlined: not significantly worse" in table
    )  # 3 shared seeds: the paired test marks rows not significantly worse
    for name in ("leaderboard.tex", "leaderboard.csv", "curves_default.png", "curves_tuned.png", "curves.csv"):
        assert (folder / name).is_file(), name
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["dataset_sha256"] == "ab" * 32 and len(manifest["runs"]) == 9
    assert {"algo", "setting", "seed", "run", "identity", "code"} <= set(manifest["runs"][0])
    assert manifest["scenario_settings"]["rounds"] == 4 and "lr" not in manifest["scenario_settings"]
    hyper = json.loads((folder / "hyperparameters.json").read_text())
    assert hyper["fedavg"]["default"]["lr"] == 0.05 and hyper["fedavg"]["tuned"]["params"] == {"lr": 0.2}
    assert sum(folder.stat().st_size for folder in folder.iterdir()) < 2**20  # small enough for git

    # the frame read back from the CSVs gives the same final numbers as the run folders
    frame = reference_frame(folder)
    finals = frame[frame["round"].isna() & (frame["metric"] == "pers_acc")]
    assert len(finals) == 9 and finals["value"].max() == pytest.approx(0.88)
    assert setting_renames(frame)["FedAvg (setting=tuned)"] == "FedAvg (tuned)"
    assert setting_renames(frame)["Local"] == "Local (default)"  # one setting only: still named


def test_rows_of_runs_made_elsewhere_are_kept(reference: tuple[Path, Path, dict, dict], tmp_path: Path) -> None:
    """A cell whose run folder is not here keeps the row the artifacts already ship."""
    shipped, _, record, _ = reference
    folder = tmp_path / "fake"
    shutil.copytree(shipped, folder)
    elsewhere = tmp_path / "empty"
    elsewhere.mkdir()
    write_artifacts(read_scenario(folder), folder, record, elsewhere, plots=False)
    for name in ("summary.csv", "curves.csv", "manifest.json", "leaderboard.md"):
        assert (folder / name).read_text() == (shipped / name).read_text(), name


def test_runs_of_another_scenario_are_refused(reference: tuple[Path, Path, dict, dict], tmp_path: Path) -> None:
    folder = reference[0]
    mine = tmp_path / "mine"
    for seed in (0, 1, 2):
        make_run(mine, "myalgo", seed, [0.7, 0.8, 0.9, 0.9 + 0.01 * seed], lr=0.3)
    frame = comparison_frame([mine], folder)
    assert {"fedavg", "local", "myalgo"} == set(frame["algo"])
    other = tmp_path / "other"
    make_run(other, "myalgo", 0, [0.7, 0.8, 0.9])  # 3 rounds, the reference ran 4
    with pytest.raises(ConfigError, match=r"differs from scenario fake in rounds: 3 \(reference: 4\)"):
        comparison_frame([other], folder)
    # runs of pflbench reference under another protocol
    (mine / "reference.json").write_text(
        json.dumps({"cells": [], "protocol": {**record_protocol(folder), "trials": 5}})
    )
    with pytest.raises(ConfigError, match=r"another protocol: trials = 5 \(reference fake: 2\)"):
        comparison_frame([mine], folder)
    (mine / "reference.json").write_text(
        json.dumps({"cells": [], "protocol": record_protocol(folder), "dataset_sha256": "cd" * 32})
    )
    with pytest.raises(ConfigError, match="used other data: dataset content sha256"):
        comparison_frame([mine], folder)


def record_protocol(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())["protocol"]


def test_the_shipped_scenarios_share_one_protocol() -> None:
    from pflbench.config.reference import scenario_folders

    scenarios = {
        read_scenario(folder).name: read_scenario(folder) for folder in scenario_folders(ROOT / "results" / "reference")
    }
    assert {"fmnist-dir0.1", "fmnist-dir0.5", "fmnist-featureshift", "fmnist-lora-dir0.1"} <= set(scenarios)
    for scenario in scenarios.values():
        p = scenario.protocol
        assert scenario.dataset == "fashion_mnist" and p.seeds == (0, 1, 2)
        assert (p.objective, p.sampler, p.pruner) == ("val_pers_acc_last10", "tpe", "median")  # selection on validation
        assert scenario.run["val_frac"] > 0 and scenario.run["new_clients"] > 0 and p.target
    mlp = [scenarios[name] for name in ("fmnist-dir0.1", "fmnist-dir0.5", "fmnist-featureshift")]
    assert all(s.protocol.algos == "non-lora" for s in mlp)
    shapes = {
        (s.protocol.trials, s.protocol.tune_rounds, s.run["rounds"], s.run["model"], tuple(s.run["model_option"]))
        for s in mlp
    }
    assert shapes == {(6, 8, 25, "mlp", ("hidden=100",))}  # the budget in results/reference/README.md
    assert scenarios["fmnist-dir0.1"].alpha == 0.1 and scenarios["fmnist-dir0.5"].alpha == 0.5
    assert scenarios["fmnist-featureshift"].run["feature_shift"]
    lora = scenarios["fmnist-lora-dir0.1"]
    assert set(lora.protocol.algos) == {"fedsdg", "flexlora", "fedavg", "fedper"}
    assert lora.algo_options == {"fedavg": {"lora_rank": 8}, "fedper": {"lora_rank": 8}}
    # the resized budget of results/reference/README.md: 7×7 patches, 24 rounds, evaluation every 2nd
    assert "patch_size=7" in lora.run["model_option"]
    budget = (lora.protocol.trials, lora.protocol.tune_rounds, lora.run["rounds"], lora.run["eval_every"])
    assert budget == (4, 8, 24, 2)
