"""``pflbench reference`` end to end on a tiny digits scenario (2 algorithms, 1 trial, 2 rounds,
3 seeds), resumed and extended by one algorithm; then an example plugin run under the same
protocol (in a fresh interpreter: the plugin must not stay registered in this one) and put beside
the reference with ``pflbench leaderboard --reference``; then runs of another scenario refused."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from pflbench.cli import cli
from pflbench.testing import assert_refused

pytest.importorskip(
    "optuna", reason="pflbench reference tunes every algorithm: it needs Optuna (pip install -e '.[tune]')"
)

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "algorithms" / "example_loss_term.py"  # registers example_prox (FedProx's twin)
SCENARIO = """
name = "tiny"
[run]
dataset = "digits"
partition = "dirichlet"
alpha = 0.5
num_clients = 4
new_clients = 0.25
val_frac = 0.1
rounds = 2
batch_size = 32
model = "mlp"
threads = 1
[protocol]
algos = ["fedavg", "local"]
seeds = [0, 1, 2]
trials = 1
tune_rounds = 1
objective = "val_pers_acc"
target = "pers_acc=0.3"
"""


def invoke(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str, str]:
    """The tiny reference, first for fedavg alone, then whole (root, work, both outputs)."""
    tmp = tmp_path_factory.mktemp("reference")
    (tmp / "ref" / "tiny").mkdir(parents=True)
    (tmp / "ref" / "tiny" / "scenario.toml").write_text(SCENARIO)
    code, first = invoke("reference", tmp / "ref", "--work", tmp / "work", "--algo", "fedavg")
    assert code == 0, first
    code, second = invoke("reference", tmp / "ref", "--work", tmp / "work")
    assert code == 0, second
    return tmp / "ref", tmp / "work", first, second


def test_reference_runs_every_cell_once_and_writes_the_artifacts(reference: tuple[Path, Path, str, str]) -> None:
    root, work, first, second = reference
    assert "[tiny 1/1] fedavg: 6 of 6 cells done; tuned lr=" in first
    # the second invocation adds local: fedavg's trial and runs are read back, not run again
    fedavg_lines = [line for line in second.splitlines() if line.startswith("  [") and "fedavg digits" in line]
    assert fedavg_lines and all("already finished" in line for line in fedavg_lines), second
    assert "trials already in" in second and "[tiny 2/2] local: 6 of 6 cells done" in second
    # each algorithm's line and the command's last line state the wall time they took
    assert re.search(r"\[tiny 1/1\] fedavg: 6 of 6 cells done; tuned lr=\S+; \d+(s|m)", first), first
    assert re.search(r"reference tiny: 2 algorithms in \d+(s|m).*load average", second), second
    folder = root / "tiny"
    summary = pd.read_csv(folder / "summary.csv")
    assert len(summary) == 12 and (summary["status"] == "done").all()
    assert set(zip(summary["algo"], summary["setting"])) == {
        (a, s) for a in ("fedavg", "local") for s in ("default", "tuned")
    }
    assert summary["new_acc"].notna().all() and summary["pers_acc_worst10"].notna().all()
    for name in ("leaderboard.md", "leaderboard.tex", "leaderboard.csv", "hyperparameters.json", "manifest.json"):
        assert (folder / name).is_file(), name
    assert (folder / "curves_tuned.png").is_file() and (folder / "curves_default.png").is_file()
    manifest = json.loads((folder / "manifest.json").read_text())
    assert len(manifest["runs"]) == 12 and all(run["code"] for run in manifest["runs"])
    assert len(manifest["dataset_sha256"]) == 64 and manifest["scenario_settings"]["rounds"] == 2
    hyper = json.loads((folder / "hyperparameters.json").read_text())
    assert set(hyper["fedavg"]["tuned"]["params"]) == {"lr"} and hyper["fedavg"]["tuned"]["study"]["trials_asked"] == 1
    # tuned runs run the final rounds, not the trials' one round
    record = json.loads((work / "tiny" / "reference.json").read_text())
    tuned = [c["run"] for c in record["cells"] if c["setting"] == "tuned"]
    rounds = {
        json.loads((work / "tiny" / "runs" / run / "config.json").read_text())["identity"]["rounds"] for run in tuned
    }
    assert rounds == {2}
    table = (folder / "leaderboard.md").read_text()
    assert "| FedAvg (tuned) |" in table and "| Local (default) |" in table
    assert not list(folder.glob("*.pt")) and sum(p.stat().st_size for p in folder.iterdir()) < 2**20


def test_jobs_run_algorithms_side_by_side_with_the_same_numbers(
    reference: tuple[Path, Path, str, str], tmp_path: Path
) -> None:
    """``--jobs 2`` regenerates the two algorithms at once, each in its own process, and writes
    the numbers ``--jobs 1`` wrote: the same studies (trials one after another), the same runs."""
    root, _, _, _ = reference
    (tmp_path / "ref" / "tiny").mkdir(parents=True)
    (tmp_path / "ref" / "tiny" / "scenario.toml").write_text(SCENARIO)
    code, output = invoke("reference", tmp_path / "ref", "--work", tmp_path / "work", "--jobs", 2)
    assert code == 0, output
    # both start before either finishes; the workers' lines reach the command's output
    lines = output.splitlines()
    starts = [i for i, line in enumerate(lines) if "trials), then runs" in line]
    ends = [i for i, line in enumerate(lines) if re.search(r"\] (fedavg|local): 6 of 6 cells done", line)]
    assert len(starts) == 2 and len(ends) == 2 and max(starts) < min(ends), output
    assert sum("done, pers_acc" in line for line in lines) == 12, output
    assert any(line.startswith("  local | trial 0: ") for line in lines), output  # named: they interleave
    assert re.search(r"reference tiny: 2 algorithms in ", output), output
    timing = ["wall_time_s"]
    ours = pd.read_csv(tmp_path / "ref" / "tiny" / "summary.csv").drop(columns=timing)
    theirs = pd.read_csv(root / "tiny" / "summary.csv").drop(columns=timing)
    pd.testing.assert_frame_equal(ours, theirs)
    chosen = json.loads((tmp_path / "ref" / "tiny" / "hyperparameters.json").read_text())
    assert (
        chosen["fedavg"]["tuned"]["params"]
        == json.loads((root / "tiny" / "hyperparameters.json").read_text())["fedavg"]["tuned"]["params"]
    )


KILLER = """
import os, signal
from pflbench import ClientProgram, ProgramCapabilities, register_algorithm
from pflbench.algorithms.fedavg import FedAvg


class KilledProgram(ClientProgram):
    capabilities = ProgramCapabilities.of_defaults()

    def loss_terms(self, forward, params, inputs, targets, received):
        os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would


@register_algorithm("killed")
class Killed(FedAvg):
    program_class = KilledProgram
"""


def test_a_killed_algorithm_worker_fails_its_algorithms_in_one_line_and_they_resume(tmp_path: Path) -> None:
    (tmp_path / "ref" / "tiny").mkdir(parents=True)
    (tmp_path / "ref" / "tiny" / "scenario.toml").write_text(SCENARIO)
    (tmp_path / "killed.py").write_text(KILLER)
    command = [sys.executable, "-c", "from pflbench.cli import main; main()", "reference", str(tmp_path / "ref")]
    command += ["--work", str(tmp_path / "work"), "--jobs", "2", "--no-artifacts"]
    plugin = ["--algo", "killed", "--plugin", str(tmp_path / "killed.py")]
    done = subprocess.run([*command, "--algo", "fedavg", *plugin], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "killed: FAILED: a worker process died (killed: out of memory?)" in done.stderr, done.stderr
    again = subprocess.run([*command, "--algo", "fedavg"], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "fedavg: 6 of 6 cells done" in again.stdout, again.stdout + again.stderr


def test_a_plugin_beside_the_reference_and_runs_of_another_scenario(
    reference: tuple[Path, Path, str, str], tmp_path: Path
) -> None:
    root, _, _, _ = reference
    shipped = (root / "tiny" / "summary.csv").read_text()
    command = [sys.executable, "-c", "from pflbench.cli import main; main()", "reference", str(root)]
    command += ["--work", str(tmp_path / "mine"), "--algo", "example_prox", "--plugin", str(PLUGIN), "--no-artifacts"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (root / "tiny" / "summary.csv").read_text() == shipped  # --no-artifacts: the reference is untouched
    code, table = invoke("leaderboard", tmp_path / "mine", "--reference", root / "tiny")
    assert code == 0, table
    for row in ("example_prox (default)", "example_prox (tuned)", "FedAvg (tuned)", "Local (default)"):
        assert f"| {row} |" in table, table
    assert "Underlined: not significantly worse" in table  # paired over the 3 seeds both share
    assert "Rounds to target" in table  # the scenario's target

    # a run of another scenario (1 round, not 2): one Error line naming the setting, nothing written
    code, output = invoke(
        "run", "--algo", "fedavg", "--dataset", "digits", "--alpha", "0.5", "--num-clients", "4",
        "--new-clients", "0.25", "--val-frac", "0.1", "--model", "mlp", "--rounds", "1", "--out", tmp_path / "other", "-q",
    )  # fmt: skip
    assert code == 0, output
    result = CliRunner().invoke(
        cli,
        ["leaderboard", str(tmp_path / "other"), "--reference", str(root / "tiny"), "--output", str(tmp_path / "t.md")],
    )
    assert_refused(result, tmp_path / "t.md", "differs from scenario tiny in rounds: 1 (reference: 2)")
    # the plugin's runs under another protocol (its work record says 2 trials)
    record_path = tmp_path / "mine" / "tiny" / "reference.json"
    record = json.loads(record_path.read_text())
    record["protocol"]["trials"] = 2
    record_path.write_text(json.dumps(record))
    result = CliRunner().invoke(cli, ["leaderboard", str(tmp_path / "mine"), "--reference", str(root / "tiny")])
    assert_refused(result, tmp_path / "nothing", "another protocol: trials = 2 (reference tiny: 1)")


def test_bad_reference_inputs_are_refused(reference: tuple[Path, Path, str, str], tmp_path: Path) -> None:
    root = reference[0]
    result = CliRunner().invoke(cli, ["reference", str(root), "--scenario", "nope", "--work", str(tmp_path / "w")])
    assert_refused(result, tmp_path / "w", "--scenario 'nope' is not under")
    result = CliRunner().invoke(cli, ["reference", str(tmp_path), "--work", str(tmp_path / "w")])
    assert_refused(result, tmp_path / "w", "holds no scenario")
    result = CliRunner().invoke(cli, ["reference", str(root), "--algo", "nosuch", "--work", str(tmp_path / "w")])
    assert_refused(result, tmp_path / "w", "nosuch")
    result = CliRunner().invoke(cli, ["leaderboard", str(root), "--reference", str(tmp_path)])
    assert_refused(result, tmp_path / "nothing", "holds no scenario.toml")


def test_non_lora_means_every_registered_algorithm_but_the_lora_only_ones() -> None:
    from pflbench.config.reference import parse_scenario
    from pflbench.registry import ALGORITHMS
    from pflbench.sweeps.reference import scenario_algorithms

    scenario = parse_scenario({"protocol": {"algos": "non-lora", "exclude": ["fedbn"]}}, "s")
    names = scenario_algorithms(scenario)
    assert "fedavg" in names and "pfedhn" in names
    assert not {"fedsdg", "flexlora", "fedbn"} & set(names)
    assert set(names) == set(ALGORITHMS.names()) - {"fedsdg", "flexlora", "fedbn"}  # new ones join by themselves
    assert scenario_algorithms(scenario, ("fedsdg",)) == ["fedsdg"]  # --algo picks any registered one


def test_a_new_work_folder_resumes_from_the_shipped_artifacts(
    reference: tuple[Path, Path, str, str], tmp_path: Path
) -> None:
    """The work folder is not kept between sessions or machines (it holds checkpoints): a
    regeneration with a fresh one reads the committed artifacts' finished cells back instead of
    running them again, and an invocation for one algorithm keeps the others' shipped rows."""
    import shutil

    root, _, _, _ = reference
    shutil.copytree(root, tmp_path / "ref")
    before = pd.read_csv(tmp_path / "ref" / "tiny" / "summary.csv")
    code, output = invoke("reference", tmp_path / "ref", "--work", tmp_path / "work1", "--algo", "local")
    assert code == 0, output
    assert "[tiny 1/1] local: all 6 cells shipped" in output and "local: tuning" not in output, output
    after = pd.read_csv(tmp_path / "ref" / "tiny" / "summary.csv")
    assert len(after) == 12 and (after["status"] == "done").all()  # fedavg's rows kept, not dropped
    pd.testing.assert_frame_equal(
        before.sort_values(["algo", "setting", "seed"]).reset_index(drop=True),
        after.sort_values(["algo", "setting", "seed"]).reset_index(drop=True),
    )
    code, output = invoke("reference", tmp_path / "ref", "--work", tmp_path / "work2")
    assert code == 0, output
    assert "fedavg: all 6 cells shipped" in output and "local: all 6 cells shipped" in output, output
    assert not (tmp_path / "work2" / "tiny" / "runs").exists() or not any(
        (tmp_path / "work2" / "tiny" / "runs").iterdir()
    )


def test_a_tuned_setting_that_diverges_over_the_full_schedule_gives_way_to_the_next(tmp_path: Path) -> None:
    """choose_tuned: the study's best, unless its trial-seed run over the full schedule diverged
    (a training signal, no test number read); then the next best complete trial."""
    from types import SimpleNamespace

    from pflbench.sweeps.reference import choose_tuned

    def runs_of(params: dict) -> list:
        folder = tmp_path / f"lr{params['lr']}"
        return [SimpleNamespace(name=folder.name, run_dir=folder)]

    def finish(lr: float, status: str) -> None:
        folder = tmp_path / f"lr{lr}"
        folder.mkdir()
        (folder / "summary.json").write_text(json.dumps({"status": status}))

    trials = [
        {"number": 0, "state": "complete", "params": {"lr": 0.1}, "value": 0.70},
        {"number": 1, "state": "complete", "params": {"lr": 0.4}, "value": 0.80},
        {"number": 2, "state": "pruned", "params": {"lr": 0.9}, "value": 0.90},  # pruned: never chosen
        {"number": 3, "state": "complete", "params": {"lr": 0.2}, "value": 0.75},
    ]
    study = {"trials": trials, "best": trials[1]}
    assert choose_tuned(study, runs_of) == ({"lr": 0.4}, [])  # not run yet: the best
    finish(0.4, "diverged")
    params, rejected = choose_tuned(study, runs_of)
    assert params == {"lr": 0.2} and [r["params"] for r in rejected] == [{"lr": 0.4}]
    finish(0.2, "completed")
    assert choose_tuned(study, runs_of)[0] == {"lr": 0.2}  # a completed run is kept
    finish(0.1, "diverged")
    assert choose_tuned({"trials": trials[1:2]}, runs_of) == (None, rejected)  # nothing left
    assert choose_tuned(None, runs_of) == (None, [])
