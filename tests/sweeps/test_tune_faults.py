"""``pflbench tune`` under faults (issue 34): two commands on one study, a damaged journal, a
continued study's budget of distinct settings, and the std over seeds the leaderboard shows."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from pflbench.cli import cli
from pflbench.config.run_config import RunConfig
from pflbench.config.space import Choice, Range
from pflbench.store.layout import SUMMARY_FILE, process_start
from pflbench.sweeps import tune
from pflbench.sweeps.grid import Grid
from pflbench.testing import killed_after_round

pytest.importorskip("optuna")

TINY = ["--model", "mlp", "--num-clients", "4", "--rounds", "2", "--alphas", "0.5", "--pruner", "none"]


def tune_args(out: Path, *extra: str) -> list[str]:
    return ["tune", "--algos", "fedavg", *TINY, "--seeds", "0", *extra, "--out", str(out)]


def study_record(out: Path) -> dict:
    (path,) = (out / "tune").glob("*.json")
    return json.loads(path.read_text())


def settings_of(record: dict, state: str = "complete") -> list[str]:
    return [json.dumps(t["params"], sort_keys=True) for t in record["trials"] if t["state"] == state]


def journal_of(out: Path, args: list[str]) -> Path:
    """The study journal ``args`` would use (from ``--dry-run``'s line ``... → OUT/tune/NAME.json``)."""
    result = CliRunner().invoke(cli, [*args, "--dry-run"])
    assert result.exit_code == 0, result.output
    return Path(result.output.split("→ ")[1].split()[0]).with_suffix(".journal")


# ---- 6. the std over seeds: the leaderboard's sample std ----------------------------------------


def test_the_study_record_gives_the_sample_std_of_the_leaderboard(tmp_path: Path) -> None:
    from pflbench.report import stats

    assert tune.sample_std is stats.sample_std  # one definition (pflbench.util.seed_stats)
    base = RunConfig(model="mlp", num_clients=4, rounds=2, out=str(tmp_path))
    (plan,) = tune.plan_studies(base, Grid(("fedavg",), ("digits",), (0.5,), (0, 1, 2)), {}, tune.TuneSettings())
    runs = [plan.run_of({"lr": 0.1}, seed) for seed in (0, 1, 2)]
    for run, value in zip(runs, (0.5, 0.625, 0.75)):
        run.run_dir.mkdir(parents=True)
        summary = {"status": "completed", "pers_acc": value, "val_pers_acc": value}
        (run.run_dir / SUMMARY_FILE).write_text(json.dumps(summary))
    pers = tune.final_record(plan, runs)["metrics"]["pers_acc"]
    # mean 0.625; Σ(x − x̄)² = 2·0.125² = 0.03125: sample std √(0.03125/2) = 0.125 (pstdev would be 0.1021)
    assert pers == {"mean": 0.625, "std": 0.125, "n": 3}
    single = tune.final_record(plan, runs[:1])["metrics"]["pers_acc"]
    assert single == {"mean": 0.5, "std": None, "n": 1}  # no spread from one seed (the leaderboard shows none)


# ---- 4. a damaged journal -------------------------------------------------------------------


RECORD = b'{"op_code":0,"worker_id":"w","study_name":"s","directions":[1]}\n'


@pytest.mark.parametrize(
    "data, expected",
    [
        (b"", (0, None)),
        (RECORD * 2, (2 * len(RECORD), None)),
        (RECORD + b'{"op_code":5,"trial_id":0,"user_a', (len(RECORD), None)),  # a torn tail: cut off
        (RECORD + b'{"op_code":5,"text":"caf\xc3', (len(RECORD), None)),  # torn inside a UTF-8 character
        (RECORD + b"not json\n" + RECORD, (len(RECORD), "line 2 is not JSON")),
        (RECORD + b'{"op_code":0,"x":"caf\xe9"}\n', (len(RECORD), "line 2 is not UTF-8 text")),
        (RECORD + b"[1, 2]\n", (len(RECORD), "line 2 is not an Optuna journal record")),
        (RECORD + b"\x8f\x00\xfe\x13\x9c", (len(RECORD), "line 2 is not a journal record")),  # random bytes
        (b"\n", (0, "line 1 is not JSON")),
    ],
)
def test_journal_damage(data: bytes, expected: tuple) -> None:
    assert tune.journal_damage(data) == expected


@pytest.mark.parametrize(
    "damage, expected",
    [
        (b"garbage line\n", "line 2 is not JSON"),
        (random.Random(34).randbytes(2000), "line 2 is not"),  # random bytes (newlines among them)
        (b'{"op_code":4,"note":"\xe9t\xe9"}\n', "line 2 is not UTF-8 text"),  # latin-1
        (b"\x8f\x00\xfe\x13\x9c", "line 2 is not a journal record"),  # bytes after the last newline, not a torn record
    ],
)
def test_a_damaged_journal_is_refused_naming_the_file(tmp_path: Path, damage: bytes, expected: str) -> None:
    args = tune_args(tmp_path, "--space", "lr=0.05,0.2", "--sampler", "grid")
    journal = journal_of(tmp_path, args)
    journal.parent.mkdir(parents=True)
    journal.write_bytes(RECORD + damage)
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: study journal ") and str(journal) in lines[0], lines
    assert expected in lines[0] and "move it aside" in lines[0]
    assert journal.read_bytes() == RECORD + damage and not (tmp_path / "runs").exists()  # nothing written


def test_a_journal_optuna_cannot_replay_is_refused(tmp_path: Path) -> None:
    args = tune_args(tmp_path, "--space", "lr=0.05,0.2", "--sampler", "grid")
    journal = journal_of(tmp_path, args)
    journal.parent.mkdir(parents=True)
    journal.write_bytes(b'{"op_code":0}\n')  # JSON and an op code, but not a record Optuna can replay
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert result.output.startswith(f"Error: study journal {journal} cannot be read by Optuna")


def test_a_torn_last_line_is_cut_off_and_the_study_goes_on(tmp_path: Path) -> None:
    args = tune_args(tmp_path, "--space", "lr=0.05,0.2", "--sampler", "grid")
    first = CliRunner().invoke(cli, [*args, "--trials", "1"])
    assert first.exit_code == 0, first.output
    journal = journal_of(tmp_path, args)
    sound = journal.read_bytes()
    journal.write_bytes(sound + b'{"op_code":6,"worker_id":"x","trial_id":0,"inter')  # killed mid-append
    again = CliRunner().invoke(cli, [*args, "--trials", "2"])  # appends: must not glue onto the torn line
    assert again.exit_code == 0, again.output
    assert f"warning: study journal {journal} ended in a torn line" in again.output
    assert journal.read_bytes().startswith(sound) and tune.journal_damage(journal.read_bytes())[1] is None
    assert sorted(settings_of(study_record(tmp_path))) == ['{"lr": 0.05}', '{"lr": 0.2}']
    third = CliRunner().invoke(cli, [*args, "--trials", "2"])  # the journal opens again
    assert third.exit_code == 0 and "2 trials already in" in third.output, third.output


# ---- 5. --trials buys distinct settings -----------------------------------------------------------


def test_distinct_settings_after_rounding() -> None:
    assert tune.distinct_settings({"mu": Choice((0.1, 1.0, 0.1)), "local_epochs": Range(1, 5, integer=True)}, 100) == 10
    assert tune.distinct_settings({"lr": Range(1.0, 2.0)}, 1000) == 101  # 1.00, 1.01, ..., 2.00
    assert tune.distinct_settings({"lr": Range(0.001, 0.01, log=True)}, 1000) == 901  # 0.00100 ... 0.00999, 0.0100
    assert tune.distinct_settings({"lr": Range(0.1001, 0.1004)}, 10) == 1  # every proposal rounds to 0.1 → 0.1001
    assert tune.distinct_settings({"lr": Range(0.001, 0.01, log=True)}, 50) is None  # more than asked about
    assert tune.distinct_settings({"x": Range(-1.0, 1.0)}, 10**6) is None  # around 0: every magnitude


def test_a_continued_study_proposes_new_settings(tmp_path: Path) -> None:
    args = tune_args(tmp_path, "--space", "lr=log:0.01:0.5")
    first = CliRunner().invoke(cli, [*args, "--trials", "2"])
    assert first.exit_code == 0, first.output
    more = CliRunner().invoke(cli, [*args, "--trials", "4"])  # the same study, two more trials
    assert more.exit_code == 0, more.output
    assert "read back" not in more.output and more.output.count("(complete; done)") == 2
    record = study_record(tmp_path)
    assert len(record["trials"]) == 4 and len(set(settings_of(record))) == 4


def test_a_study_killed_and_resumed_ends_with_its_trials_in_distinct_settings(tmp_path: Path) -> None:
    args = tune_args(tmp_path, "--space", "lr=log:0.01:0.5", "--trials", "3")
    assert CliRunner().invoke(cli, [*args[:-3], "1", *args[-2:]]).exit_code == 0  # trial 0 finished
    killed_after_round(1, lambda: CliRunner().invoke(cli, args))  # SIGKILLed inside trial 1
    resumed = CliRunner().invoke(cli, args)
    assert resumed.exit_code == 0, resumed.output
    assert "trial 1: interrupted (its process is gone)" in resumed.output
    record = study_record(tmp_path)
    complete = settings_of(record)
    assert len(complete) == 3 and len(set(complete)) == 3  # 3 settings bought, none read back twice
    (interrupted,) = settings_of(record, "interrupted")
    assert interrupted in complete  # its setting ran again (resumed from its checkpoint)


def test_a_space_smaller_than_the_budget_ends_at_its_size(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, tune_args(tmp_path, "--space", "optimizer=sgd,adam", "--trials", "5"))
    assert result.exit_code == 0, result.output
    assert "the space holds 2 distinct settings" in result.output and "2 trials, not 5" in result.output
    assert sorted(settings_of(study_record(tmp_path))) == ['{"optimizer": "adam"}', '{"optimizer": "sgd"}']


def test_proposals_that_keep_repeating_stop_the_study_with_a_line(tmp_path: Path, monkeypatch) -> None:
    """The bounded retry when the space's size is not known in advance (here pretended)."""
    monkeypatch.setattr(tune, "distinct_settings", lambda space, at_most: None, raising=False)
    monkeypatch.setattr(tune, "MAX_REPEATS", 4, raising=False)
    base = RunConfig(model="mlp", num_clients=4, rounds=1, out=str(tmp_path))
    grid = Grid(("fedavg",), ("digits",), (0.5,), (0,))
    settings = tune.TuneSettings(trials=4, pruner="none")
    (plan,) = tune.plan_studies(base, grid, tune.parse_space(("optimizer=sgd,adam",)), settings)
    lines: list[str] = []
    record = tune.run_study(plan, report=lines.append)
    assert sorted(settings_of(record)) == ['{"optimizer": "adam"}', '{"optimizer": "sgd"}']
    duplicates = [t for t in record["trials"] if t["state"] == "duplicate"]
    assert len(duplicates) >= 4 and all(t["run"] and t["value"] is None for t in duplicates)
    stops = [line for line in lines if "proposals in a row repeated settings already tried" in line]
    assert len(stops) == 1 and "holds only 2 distinct settings" in stops[0], lines


# ---- 3. two commands on one study --------------------------------------------------------------


def fake_live_claim(claim: Path, pid: int) -> None:
    """A claim as ``store.layout.Claim`` writes it, held by the live process ``pid``."""
    owner = {"pid": pid, "host": socket.gethostname(), "started": time.time(), "proc_start": process_start(pid)}
    claim.write_text(json.dumps(owner))


def test_a_trial_another_live_process_runs_is_left_to_it_and_waited_for(tmp_path: Path, monkeypatch) -> None:
    """Process A (a second study handle and a claim held by a live process) runs trial 0; this
    process's study leaves it alone, runs the other setting, waits for trial 0, then ends."""
    monkeypatch.setattr(tune, "CLAIM_POLL_S", 0.1, raising=False)
    base = RunConfig(model="mlp", num_clients=4, rounds=1, out=str(tmp_path))
    grid = Grid(("fedavg",), ("digits",), (0.5,), (0,))
    settings = tune.TuneSettings(trials=2, sampler="grid", pruner="none")
    (plan,) = tune.plan_studies(base, grid, tune.parse_space(("lr=0.05,0.2",)), settings)
    study_a = tune.open_study(plan)
    trial_a = study_a.ask(tune.distributions(plan.space))
    setting_a = tune.rounded_setting(plan.space, trial_a.params)
    trial_a.set_user_attr("setting", setting_a)
    holder = subprocess.Popen(["sleep", "300"])
    try:
        claim = plan.path(f".trial-{trial_a.number}.claim")
        fake_live_claim(claim, holder.pid)
        lines: list[str] = []
        records: list[dict] = []
        b = threading.Thread(target=lambda: records.append(tune.run_study(plan, report=lines.append)), daemon=True)
        b.start()
        deadline = time.monotonic() + 120
        while not any("waiting for trials another process is running: 0 (pid" in line for line in lines):
            assert b.is_alive() and time.monotonic() < deadline, lines
            time.sleep(0.1)
        study_a.tell(trial_a, 0.99)  # A finishes its trial and lets go of it
        claim.unlink()
        b.join(60)
        assert not b.is_alive() and records, lines
    finally:
        holder.kill()
        holder.wait()
    record = records[0]
    assert not any("interrupted" in line for line in lines), lines
    assert [t["state"] for t in record["trials"]] == ["complete", "complete"]
    assert sorted(settings_of(record)) == ['{"lr": 0.05}', '{"lr": 0.2}']
    assert record["best"]["number"] == trial_a.number  # A's result is in the choice


def test_a_dead_process_s_trial_is_taken_over(tmp_path: Path) -> None:
    base = RunConfig(model="mlp", num_clients=4, rounds=1, out=str(tmp_path))
    grid = Grid(("fedavg",), ("digits",), (0.5,), (0,))
    settings = tune.TuneSettings(trials=2, sampler="grid", pruner="none")
    (plan,) = tune.plan_studies(base, grid, tune.parse_space(("lr=0.05,0.2",)), settings)
    study_a = tune.open_study(plan)
    trial_a = study_a.ask(tune.distributions(plan.space))
    gone = subprocess.Popen(["true"])
    gone.wait()
    fake_live_claim(plan.path(f".trial-{trial_a.number}.claim"), gone.pid)  # its process has ended
    lines: list[str] = []
    record = tune.run_study(plan, report=lines.append)
    assert f"  trial {trial_a.number}: interrupted (its process is gone); its setting runs again" in lines
    assert [t["state"] for t in record["trials"]] == ["interrupted", "complete", "complete"]
    assert sorted(settings_of(record)) == ['{"lr": 0.05}', '{"lr": 0.2}']
    assert not list(plan.path("").parent.glob("*.claim"))  # every claim released


def test_two_tune_commands_on_one_out_both_finish(tmp_path: Path) -> None:
    args = tune_args(tmp_path, "--space", "lr=0.03,0.1,0.3", "--sampler", "grid", "--trials", "3")
    args[args.index("--seeds") + 1] = "0,1"
    command = [sys.executable, "-c", "from pflbench.cli import main; main()", *args]
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    both = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment)]
    both.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment))
    try:
        outputs = [p.communicate(timeout=300)[0] for p in both]
    finally:
        for p in both:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
    assert [p.returncode for p in both] == [0, 0], outputs
    record = study_record(tmp_path)
    states = [t["state"] for t in record["trials"]]
    assert "failed" not in states and "interrupted" not in states, record["trials"]
    complete = settings_of(record)
    assert len(complete) == 3 and len(set(complete)) == 3, record["trials"]  # no setting twice
    assert [s["status"] for s in record["final"]["seeds"]] == ["completed", "completed"]
    assert not any("Traceback" in output for output in outputs), outputs
