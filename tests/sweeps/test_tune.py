"""``pflbench tune``: studies planned from the grid and the space, trials as ordinary run
folders, the choice made on validation, the chosen setting over seeds, resume, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from pflbench.cli import cli
from pflbench.config.run_config import RunConfig
from pflbench.config.space import Choice, Range
from pflbench.errors import ConfigError
from pflbench.store.layout import SUMMARY_FILE
from pflbench.sweeps.grid import Grid
from pflbench.sweeps.tune import ReportToStudy, TrialPruned, TuneSettings, parse_space, plan_studies

pytest.importorskip("optuna")

BASE = RunConfig(model="mlp", num_clients=4, rounds=2, out="unused")
TINY = ["--model", "mlp", "--num-clients", "4", "--rounds", "3", "--alphas", "0.5"]


def plans(algos: tuple[str, ...], space: tuple[str, ...] = (), **settings):
    grid = Grid(algos, ("digits",), (0.5,), (0, 1))
    return plan_studies(BASE, grid, parse_space(space), TuneSettings(**settings))


def test_default_spaces_come_from_the_algorithms() -> None:
    fedavg, fedprox = plans(("fedavg", "fedprox"))
    lr = fedavg.cell.config.lr
    assert fedavg.space == {"lr": Range(lr / 10, lr * 10, log=True)}
    assert fedprox.space["mu"] == Choice((0.001, 0.01, 0.1, 1.0))  # FedProx's own grid
    assert fedavg.cell.config.seed == 0 and fedavg.seeds == (0, 1)  # trials on the first seed
    assert fedavg.name != fedprox.name


def test_a_user_space_applies_to_the_algorithms_that_have_each_setting() -> None:
    fedavg, fedprox = plans(("fedavg", "fedprox"), ("lr=log:0.01:0.5", "mu=0.1,1", "local_epochs=1:3"))
    assert set(fedavg.space) == {"lr", "local_epochs"}  # FedAvg has no μ
    assert fedprox.space["mu"] == Choice((0.1, 1.0))
    assert fedprox.space["local_epochs"] == Range(1, 3, integer=True)


@pytest.mark.parametrize(
    "space, settings, message",
    [
        (("nope=1,2",), {}, "'nope' is neither a run option nor a hyperparameter"),
        (("seed=1,2",), {}, "seed cannot be tuned"),
        (("lr=log:0.01:1",), {"sampler": "grid"}, "--sampler grid needs a list of values"),
        ((), {"objective": "pers_acc"}, "is a test metric"),
        ((), {"objective": "accuracy"}, "is not a metric to tune on"),
        (("optimizer=0:1",), {}, "optimizer is not numeric"),
        (("optimizer=sgd,rmsprop",), {}, "'rmsprop' is not one of: sgd, adam"),
    ],
)
def test_bad_plans(space: tuple[str, ...], settings: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        plans(("fedavg",), space, **settings)


def test_a_validation_objective_needs_a_validation_split() -> None:
    grid = Grid(("fedavg",), ("digits",), (0.5,), (0,))
    base = RunConfig(model="mlp", num_clients=4, rounds=2, out="unused", val_frac=0.0)
    with pytest.raises(ConfigError, match="needs a validation split; --val-frac is 0"):
        plan_studies(base, grid, {}, TuneSettings())


class FakeTrial:
    def __init__(self, prune_at: int) -> None:
        self.prune_at, self.reported = prune_at, []

    def report(self, value: float, step: int) -> None:
        self.reported.append((step, value))

    def should_prune(self) -> bool:
        return self.reported[-1][0] >= self.prune_at


def test_the_reporter_reports_evaluation_rounds_and_prunes() -> None:
    trial = FakeTrial(prune_at=3)
    reporter = ReportToStudy(trial, "val_pers_acc", prune=True)
    reporter.on_round_end({"round": 1, "val_pers_acc": 0.5})
    reporter.on_round_end({"round": 2})  # not an evaluation round: nothing reported
    with pytest.raises(TrialPruned, match="pruned at round 3"):
        reporter.on_round_end({"round": 3, "val_pers_acc": 0.25})
    assert trial.reported == [(1, 0.5), (3, 0.25)] and reporter.last == 0.25
    quiet = ReportToStudy(FakeTrial(prune_at=0), "val_pers_acc", prune=False)
    quiet.on_round_end({"round": 1, "val_pers_acc": 0.5})  # reports, never prunes


def test_tune_end_to_end_selects_on_validation_and_runs_the_choice_over_seeds(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = [
        "tune",
        "--algos",
        "fedavg",
        *TINY,
        "--seeds",
        "0,1",
        "--space",
        "lr=0.02,0.2",
        "--sampler",
        "grid",
        "--trials",
        "5",
        "--pruner",
        "none",
        "--out",
        str(out),
    ]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    (record_path,) = (out / "tune").glob("*.json")
    record = json.loads(record_path.read_text())
    trials = record["trials"]
    assert len(trials) == 2 and {t["params"]["lr"] for t in trials} == {0.02, 0.2}  # the grid, not 5 trials
    for trial in trials:  # each trial is an ordinary run folder whose validation metric is the trial's value
        summary = json.loads((out / "runs" / trial["run"] / SUMMARY_FILE).read_text())
        assert summary["val_pers_acc"] == trial["value"] and summary["seed"] == 0
        rounds = [json.loads(line) for line in (out / "runs" / trial["run"] / "rounds.jsonl").read_text().splitlines()]
        assert trial["per_round"] == {str(r["round"]): r["val_pers_acc"] for r in rounds}
    best = max(trials, key=lambda t: t["value"])
    assert record["best"]["params"] == best["params"] and record["selected_on"] == "validation"
    seeds = record["final"]["seeds"]
    assert [s["seed"] for s in seeds] == [0, 1] and seeds[0]["run"] == best["run"]  # the trial run is seed 0's
    test_values = [json.loads((out / "runs" / s["run"] / SUMMARY_FILE).read_text())["pers_acc"] for s in seeds]
    assert record["final"]["metrics"]["pers_acc"]["mean"] == pytest.approx(sum(test_values) / 2)
    assert "chose lr=" in result.output and "selected on validation" in result.output

    again = CliRunner().invoke(cli, args)  # the study is complete: nothing runs again
    assert again.exit_code == 0, again.output
    assert "2 trials already in" in again.output and "trial 0:" not in again.output
    assert json.loads(record_path.read_text())["trials"] == trials

    forced = CliRunner().invoke(cli, [*args, "--force"])  # the study starts over, every run is redone
    assert forced.exit_code == 0, forced.output
    assert "already in" not in forced.output and forced.output.count("(complete; done)") == 2
    redone = json.loads(record_path.read_text())
    assert [t["value"] for t in redone["trials"]] == [t["value"] for t in trials]  # same seed, same numbers


def test_tune_from_a_config_file_matches_the_command_line(tmp_path: Path) -> None:
    config = tmp_path / "tune.toml"
    config.write_text('algos = ["fedprox"]\n[space]\nlr = {low = 0.01, high = 0.3, log = true}\nmu = [0.01, 0.1]\n')
    result = CliRunner().invoke(cli, ["tune", "--config", str(config), *TINY, "--dry-run", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "lr=log:0.01:0.3 mu=0.01,0.1; 16 trials on seed 0" in result.output
    assert not (tmp_path / "runs").exists()


def test_tuning_on_test_needs_the_explicit_flag(tmp_path: Path) -> None:
    args = ["tune", "--algos", "fedavg", *TINY, "--objective", "pers_acc", "--out", str(tmp_path / "o")]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2 and result.output.count("\n") == 1 and "is a test metric" in result.output
    assert not (tmp_path / "o").exists()


def test_proposals_from_a_float_range_run_rounded_to_three_digits() -> None:
    from pflbench.sweeps.tune import rounded_setting

    space = {"lr": Range(0.001, 0.3, log=True), "mu": Choice((0.01, 0.1)), "local_epochs": Range(1, 5, integer=True)}
    setting = rounded_setting(space, {"lr": 0.087139456, "mu": 0.1, "local_epochs": 3})
    assert setting == {"lr": 0.0871, "mu": 0.1, "local_epochs": 3}
    assert rounded_setting(space, {"lr": 0.29996, "mu": 0.01, "local_epochs": 1})["lr"] == 0.3  # kept in range


def grid_of_two_lrs(out: Path, *extra: str) -> list[str]:
    """A FedAvg study on seed 0 over lr ∈ {0.05, 0.2} (grid sampler), into ``out``."""
    return [
        "tune",
        "--algos",
        "fedavg",
        *TINY,
        "--seeds",
        "0",
        "--space",
        "lr=0.05,0.2",
        "--sampler",
        "grid",
        *extra,
        "--out",
        str(out),
    ]


def test_trials_in_worker_processes_report_to_the_study(tmp_path: Path) -> None:
    """--jobs 2: two trials at once in spawned workers, each reopening the study's journal to
    report its per-round validation accuracy (what the median pruner reads)."""
    args = grid_of_two_lrs(tmp_path, "--pruner", "none", "--jobs", "2", "--threads", "2")
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    (record_path,) = (tmp_path / "tune").glob("*.json")
    trials = json.loads(record_path.read_text())["trials"]
    assert sorted(t["params"]["lr"] for t in trials) == [0.05, 0.2] and all(t["state"] == "complete" for t in trials)
    for trial in trials:
        rounds = [
            json.loads(line) for line in (tmp_path / "runs" / trial["run"] / "rounds.jsonl").read_text().splitlines()
        ]
        assert trial["per_round"] == {str(r["round"]): r["val_pers_acc"] for r in rounds}


def test_trials_as_ray_tasks(tmp_path: Path) -> None:
    """--ray: trials run as Ray tasks in batches of --jobs; their per-round values are read back
    from rounds.jsonl (a fresh interpreter: the Ray instance is the command's own)."""
    pytest.importorskip("ray")
    import subprocess
    import sys

    args = grid_of_two_lrs(tmp_path, "--ray", "--jobs", "2")
    done = subprocess.run(
        [sys.executable, "-c", "from pflbench.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("(complete; done on Ray)") == 2
    (record_path,) = (tmp_path / "tune").glob("*.json")
    record = json.loads(record_path.read_text())
    best = max(record["trials"], key=lambda t: t["value"])
    assert record["best"]["params"] == best["params"] and all(t["per_round"] for t in record["trials"])


def test_the_default_setting_is_the_first_trial_only_when_asked() -> None:
    (plain,) = plans(("fedprox",))
    (first,) = plans(("fedprox",), default_trial=True)
    assert plain.default is None and first.name != plain.name  # a study with it is another study
    config = first.cell.config
    assert first.default == {"lr": config.lr, "mu": 0.01}  # FedProx's resolved lr and its paper's μ
    assert first.is_default(first.run_of({"lr": config.lr, "mu": 0.01}))  # its run is never pruned
    assert not first.is_default(first.run_of({"lr": config.lr, "mu": 0.1})) and not plain.is_default(plain.cell)
    (outside,) = plans(("fedavg",), ("lr=log:0.5:0.9",), default_trial=True)
    assert outside.default is None  # the resolved default lr (0.05 or so) is not in the user's range
    with pytest.raises(ConfigError, match="--default-trial goes with --sampler tpe"):
        plans(("fedavg",), ("lr=0.1,0.2",), sampler="grid", default_trial=True)


def test_every_algorithms_default_lies_in_its_own_space() -> None:
    """The reference's studies start from the default (``default_trial``): every built-in
    algorithm's search space must hold its own defaults, or its study would start elsewhere."""
    from pflbench.registry import ALGORITHMS
    from pflbench.sweeps.reference import is_lora_only

    names = [name for name in ALGORITHMS.names() if not is_lora_only(name)]
    for plan in plans(tuple(names), default_trial=True):
        assert plan.default is not None, f"{plan.cell.config.algo}: its default is outside {plan.space}"


def test_tune_with_default_trial_runs_the_default_first(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["tune", "--algos", "fedavg", *TINY, "--seeds", "0", "--trials", "3", "--pruner", "none"]
    result = CliRunner().invoke(cli, [*args, "--default-trial", "--out", str(out)])
    assert result.exit_code == 0, result.output
    (record_path,) = (out / "tune").glob("*.json")
    record = json.loads(record_path.read_text())
    default_lr = record["default_trial"]["lr"]
    assert record["trials"][0]["params"] == {"lr": default_lr} and len(record["trials"]) == 3
    assert record["best"]["value"] >= record["trials"][0]["value"]  # never below the default on validation
