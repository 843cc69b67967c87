"""Client availability, dropout, stragglers, a deadline and over-selection (engine.availability):
the pure functions by hand, the draws' statistics, the round loop's bookkeeping (who reports,
bytes, private state, step caps, an empty round), resume, the CLI and the leaderboard column."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from click.testing import CliRunner

from pflbench.cli import cli
from pflbench.config.groups import AvailabilitySpec
from pflbench.config.identity import identity_settings, run_name
from pflbench.config.run_config import RunConfig, resolve
from pflbench.engine import Observer, tensor_bytes
from pflbench.engine.availability import (
    SystemModel,
    bernoulli_probabilities,
    choose_reporters,
    client_seconds,
    cyclic_online,
    over_selected_count,
    partial_step_cap,
    round_seconds,
    speed_factors,
)
from pflbench.registry import ALGORITHMS
from pflbench.report.targets import MB, ROUNDS, SIM_TIME, Target, target_values
from pflbench.runs.api import run_experiment
from pflbench.runs.prepare import prepare
from pflbench.testing import Harness, assert_refused, killed_and_resumed, round_numbers

TINY = dict(dataset="digits", model="mlp", num_clients=4, rounds=2, optimizer="adam", lr=0.01, backbone="random")


# ---- pure functions, by hand ------------------------------------------------------------------
def test_over_selected_count() -> None:
    assert over_selected_count(10, 0.1, 100) == 11  # 10·1.1 = 11.000000000000002 is still 11
    assert over_selected_count(10, 0.25, 100) == 13  # ceil(12.5)
    assert over_selected_count(10, 0.5, 12) == 12  # no more than are online
    assert over_selected_count(3, 0.0, 5) == 3
    assert over_selected_count(3, 0.0, 0) == 0


def test_client_seconds_hand_computed() -> None:
    """300 samples · 0.01 s · compute factor 2 = 6 s; 2 MB at 1 MB/s · bandwidth factor 0.5 = 4 s."""
    assert client_seconds(300, 0.01, 2.0, 2 * 2**20, 1.0, 0.5) == pytest.approx(10.0)
    assert client_seconds(0, 0.01, 2.0, 2**19, 2.0, 1.0) == pytest.approx(0.25)


def test_partial_step_cap_hand_computed() -> None:
    """(10 − 4) s / (32 · 0.01 · 2 = 0.64 s per step) = 9.375 → 9 steps."""
    assert partial_step_cap(10.0, 4.0, 32, 0.01, 2.0) == 9
    assert partial_step_cap(10.0, 3.6, 32, 0.01, 2.0) == 10  # exactly 6.4 / 0.64
    assert partial_step_cap(10.0, 10.0, 32, 0.01, 2.0) == 0  # the network alone takes the deadline
    assert partial_step_cap(10.0, 12.0, 32, 0.01, 2.0) == 0


def test_choose_reporters() -> None:
    times = {0: 5.0, 1: 2.0, 2: 9.0, 3: 2.0}
    assert choose_reporters(times, 8.0, None) == [0, 1, 3]  # 2 is late
    assert choose_reporters(times, 8.0, 2) == [1, 3]  # the first two on time
    assert choose_reporters(times, None, 3) == [0, 1, 3]
    assert choose_reporters({0: 1.0, 1: 1.0, 2: 1.0}, None, 2) == [0, 1]  # ties by client id
    assert choose_reporters(times, 1.0, None) == []


def test_round_seconds() -> None:
    assert round_seconds([1.0, 3.0], False, 5.0) == 3.0  # the slowest reporter
    assert round_seconds([1.0, 3.0], True, 5.0) == 5.0  # someone missing: the server waits until D
    assert round_seconds([2.0], True, None) == 2.0  # no deadline: a dropout is noticed at once
    assert round_seconds([], True, None) == 0.0


def test_cyclic_trace_hand_computed() -> None:
    """Round 6 of a 24-round day: positions 0.25 + φ mod 1 = 0.25, 0.75, 0.15 → online iff < 0.5."""
    online = cyclic_online(np.array([0.0, 0.5, 0.9]), 6, 24, 0.5)
    assert online.tolist() == [True, False, True]


def test_cyclic_trace_is_online_its_share_of_every_day() -> None:
    phases = np.random.default_rng(0).uniform(size=30)
    days = np.stack([cyclic_online(phases, t, 24, 0.25) for t in range(1, 25)])
    assert days.sum(axis=0).tolist() == [6] * 30  # exactly 24 · 0.25 rounds online per client


def test_bernoulli_probabilities_mean_and_range() -> None:
    rng = np.random.default_rng(0)
    high = bernoulli_probabilities(0.8, rng, 20000)
    assert high.min() >= 0.6 and high.max() <= 1.0  # U[0.6, 1.0]
    assert high.mean() == pytest.approx(0.8, abs=0.005)
    low = bernoulli_probabilities(0.3, rng, 20000)
    assert low.min() >= 0.0 and low.max() <= 0.6
    assert bernoulli_probabilities(1.0, rng, 5).tolist() == [1.0] * 5


def test_speed_factors() -> None:
    rng = np.random.default_rng(0)
    compute, bandwidth = speed_factors("none", 1.0, rng, 4)
    assert compute.tolist() == [1.0] * 4 and bandwidth.tolist() == [1.0] * 4
    compute, bandwidth = speed_factors("lognormal", 0.0, rng, 4)
    assert compute.tolist() == [1.0] * 4
    compute, bandwidth = speed_factors("lognormal", 0.5, rng, 40000)
    for factors in (compute, bandwidth):  # log of a lognormal(0, σ): mean 0, std σ; median 1
        assert np.log(factors).mean() == pytest.approx(0.0, abs=0.01)
        assert np.log(factors).std() == pytest.approx(0.5, abs=0.01)
    assert abs(np.corrcoef(np.log(compute), np.log(bandwidth))[0, 1]) < 0.02  # independent draws


# ---- the draws' statistics ---------------------------------------------------------------------
def test_dropout_statistics_match_the_rate() -> None:
    """20 clients × 2000 rounds at rate 0.2: the share that drops out is 0.2 within 4 standard
    errors (0.0056), every client's own share too (4·sqrt(0.16/2000) = 0.036)."""
    model = SystemModel(AvailabilitySpec(dropout=0.2), 20, seed=3, batch_size=32)
    masks = np.stack([model.dropouts(r) for r in range(1, 2001)])
    assert masks.mean() == pytest.approx(0.2, abs=4 * math.sqrt(0.16 / 40000))
    assert np.abs(masks.mean(axis=0) - 0.2).max() < 4 * math.sqrt(0.16 / 2000)
    # derived from (seed, round): the same again, another round or seed differs
    again = SystemModel(AvailabilitySpec(dropout=0.2), 20, seed=3, batch_size=32)
    assert (again.dropouts(7) == masks[6]).all()
    other = SystemModel(AvailabilitySpec(dropout=0.2), 20, seed=4, batch_size=32)
    assert not all((other.dropouts(r) == masks[r - 1]).all() for r in range(1, 11))


def test_bernoulli_availability_follows_each_client_s_probability() -> None:
    model = SystemModel(AvailabilitySpec(availability="bernoulli", availability_rate=0.6), 10, seed=1, batch_size=32)
    online = np.stack([model.online(r) for r in range(1, 3001)])
    assert np.abs(online.mean(axis=0) - model.probabilities).max() < 4 * math.sqrt(0.25 / 3000)


def test_sampling_takes_only_online_clients_and_all_of_them_when_few() -> None:
    spec = AvailabilitySpec(availability="cyclic", availability_rate=0.25, availability_period=8)
    model = SystemModel(spec, 12, seed=0, batch_size=32)
    rng = np.random.default_rng(0)
    for round_index in range(1, 17):
        online = set(np.flatnonzero(model.online(round_index)).tolist())
        sampled = model.sample(rng, list(range(12)), 6, round_index)
        assert set(sampled) <= online and len(sampled) == min(6, len(online))


# ---- the round loop -------------------------------------------------------------------------------
class Updates(Observer):
    def __init__(self) -> None:
        self.seen: list[Any] = []

    def on_client_update(self, job, update) -> None:
        self.seen.append((job, update))


def harness(**settings: Any) -> Harness:
    return Harness(prepare(RunConfig(out="unused", **{**TINY, **settings})))


def test_off_by_default_changes_nothing() -> None:
    """The defaults leave the identity, the folder name and the records as they were."""
    algorithm = ALGORITHMS.get("fedavg")
    hparams = algorithm.hyperparameters()
    config, _ = resolve(RunConfig(**TINY), algorithm, hparams)
    assert not config.availability_spec.active
    identity = identity_settings(config, algorithm, hparams)
    assert not {"dropout", "availability", "straggler_model", "deadline", "over_select", "sample_time"} & set(identity)
    with_dropout = dataclasses.replace(config, dropout=0.1)
    assert identity_settings(with_dropout, algorithm, hparams)["dropout"] == 0.1
    assert run_name(with_dropout, algorithm, hparams) != run_name(config, algorithm, hparams)
    server = harness()
    assert server.federation.system is None
    records: list[dict] = []
    server.run(records.append)
    assert not {"sim_time", "reported", "sampled"} & set(records[-1])


def test_dropout_alone_keeps_the_client_sequence() -> None:
    plain, dropping = (
        harness(num_clients=6, frac=0.5, rounds=1),
        harness(num_clients=6, frac=0.5, rounds=1, dropout=0.5),
    )
    assert [plain.federation.sample_clients(r) for r in range(1, 6)] == [
        dropping.federation.sample_clients(r) for r in range(1, 6)
    ]


def test_dropped_clients_send_nothing_and_keep_their_state() -> None:
    """FedPer (a private head): a dropped-out client's head is unchanged, bytes_up counts the
    reporters' uploads only, bytes_down every sampled client's download."""
    server = harness(algo="fedper", num_clients=6, rounds=4, dropout=0.5)
    observer = Updates()
    server.observers.append(observer)
    heads = {k: {n: t.clone() for n, t in server.store.get(k).items()} for k in range(6)}
    upload = tensor_bytes(server.global_state)  # FedPer uploads its body: the global state
    saw_a_dropout = False
    for round_index in range(1, 5):
        sampled = server.federation.sample_clients(round_index)
        server.federation.train_round(round_index, sampled)
        plan = server.federation.round_plan
        assert plan is not None and sorted(plan.reported + plan.dropped_out) == sampled
        assert server.federation.traffic.up == len(plan.reported) * upload
        assert server.federation.traffic.down == len(sampled) * upload
        assert sorted(job.client_id for job, _ in observer.seen) == plan.reported
        observer.seen.clear()
        for k in plan.dropped_out:
            saw_a_dropout = True
            assert all(torch.equal(server.store.get(k)[n], heads[k][n]) for n in heads[k])
        for k in plan.reported:
            assert not all(torch.equal(server.store.get(k)[n], heads[k][n]) for n in heads[k])
        heads = {k: {n: t.clone() for n, t in server.store.get(k).items()} for k in range(6)}
    assert saw_a_dropout


def test_nobody_reporting_leaves_the_global_model_as_it_is() -> None:
    server = harness(deadline=1e-6, rounds=2)
    before = {n: t.clone() for n, t in server.global_state.items()}
    records: list[dict] = []
    server.run(records.append)
    assert all(torch.equal(server.global_state[n], before[n]) for n in before)
    for record in records:
        assert record["reported"] == [] and record["bytes_up"] == 0 and record["sim_time"] == 1e-6
        assert math.isnan(record["train_loss"])
    assert records[-1]["sim_time_cum"] == pytest.approx(2e-6)


def test_partial_work_caps_the_local_steps() -> None:
    """Each client does ⌊(D − 2·download / bandwidth) / (batch · τ · c_k)⌋ steps when that is
    fewer than its epoch (computed here from the drawn factors), else all of them."""
    deadline, batch = 0.6, 8
    server = harness(
        deadline=deadline, deadline_policy="partial", straggler_model="lognormal", batch_size=batch, sample_time=0.01
    )
    observer = Updates()
    server.observers.append(observer)
    system = server.federation.system
    records: list[dict] = []
    server.run(records.append)
    capped = 0
    download = tensor_bytes(server.global_state)
    for job, update in observer.seen:
        k = job.client_id
        network = 2 * download / (2**20 * system.bandwidth_factors[k])
        fits = math.floor((deadline - network) / (batch * 0.01 * system.compute_factors[k]) + 1e-9)
        full = -(-server.data.num_train[k] // batch)
        assert update.local_steps == min(fits, full) and job.max_steps == (fits if fits < full else None)
        capped += fits < full
    assert capped > 0
    assert all(r["sim_time"] <= deadline for r in records)


def test_over_selection_keeps_the_first_m() -> None:
    server = harness(num_clients=8, frac=0.5, over_select=0.5, straggler_model="lognormal", rounds=3)
    records: list[dict] = []
    server.run(records.append)
    system = server.federation.system
    for record in records:
        assert len(record["sampled"]) == 6 and len(record["reported"]) == 4  # ceil(4·1.5) = 6, keep M = 4
    plan = server.federation.round_plan
    slowest_kept = max(plan.times[k] for k in plan.reported)
    assert all(plan.times[k] >= slowest_kept for k in plan.sampled if k not in plan.reported)
    assert plan.sim_time == pytest.approx(slowest_kept)
    assert system is not None


# ---- resume, CLI, config file, leaderboard --------------------------------------------------------
def test_killed_run_resumes_with_the_same_draws(tmp_path: Path) -> None:
    settings = dict(
        **{**TINY, "rounds": 4, "num_clients": 6},
        frac=0.5,
        checkpoint_every=2,
        dropout=0.3,
        straggler_model="lognormal",
        deadline=2.0,
        deadline_policy="partial",
        over_select=0.34,
    )
    resumed, whole = killed_and_resumed(
        run_experiment, lambda out: RunConfig(out=str(out), **settings), tmp_path, after_round=3
    )
    assert round_numbers(resumed) == round_numbers(whole)
    assert resumed["sim_time_total"] == whole["sim_time_total"] > 0


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--dropout", "-0.1", "--dropout must be a probability in [0, 1)"),
        ("--dropout", "1.5", "--dropout must be a probability in [0, 1)"),
        ("--availability-rate", "1.2", "--availability-rate must be in (0, 1]"),
        ("--over-select", "-1", "--over-select must be ≥ 0"),
        ("--deadline", "-3", "--deadline must be > 0 seconds"),
        ("--bandwidth", "0", "--bandwidth must be > 0"),
    ],
)
def test_bad_values_are_one_error_line_and_nothing_written(
    option: str, value: str, message: str, tmp_path: Path
) -> None:
    result = CliRunner().invoke(cli, ["run", "--model", "mlp", "--out", str(tmp_path / "out"), option, value])
    assert_refused(result, tmp_path / "out", message)


def test_settings_that_would_be_ignored_are_refused(tmp_path: Path) -> None:
    runner = CliRunner()
    out = str(tmp_path / "out")
    result = runner.invoke(cli, ["run", "--model", "mlp", "--out", out, "--deadline-policy", "partial"])
    assert result.exit_code == 2 and "no --deadline is set" in result.output
    result = runner.invoke(
        cli,
        ["run", "--model", "mlp", "--out", out, "--algo", "ditto", "--deadline", "1", "--deadline-policy", "partial"],
    )
    assert result.exit_code == 2 and "its own local update" in result.output
    result = runner.invoke(
        cli,
        [
            "run",
            "--model",
            "mlp",
            "--out",
            out,
            "--executor",
            "vmap",
            "--deadline",
            "1",
            "--deadline-policy",
            "partial",
        ],
    )
    assert result.exit_code == 2 and "--executor vmap cannot" in result.output
    assert not (tmp_path / "out").exists()


def test_config_file_run_records_who_reported_and_the_simulated_time(tmp_path: Path) -> None:
    config = tmp_path / "straggle.toml"
    config.write_text(
        'algo = "fedavg"\nmodel = "mlp"\nnum-clients = 4\nrounds = 2\nbackbone = "random"\n'
        'dropout = 0.25\nstraggler-model = "lognormal"\ndeadline = 1.5\n'
    )
    result = CliRunner().invoke(cli, ["run", "--config", str(config), "--out", str(tmp_path / "out"), "--quiet"])
    assert result.exit_code == 0, result.output
    (run,) = (tmp_path / "out" / "runs").iterdir()
    records = [json.loads(line) for line in (run / "rounds.jsonl").read_text().splitlines()]
    assert [set(r["reported"]) | set(r["dropped_out"]) <= set(r["sampled"]) for r in records] == [True, True]
    assert records[-1]["sim_time_cum"] == pytest.approx(sum(r["sim_time"] for r in records))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["sim_time_total"] == pytest.approx(records[-1]["sim_time_cum"])
    identity = json.loads((run / "config.json").read_text())["identity"]
    assert identity["dropout"] == 0.25 and identity["deadline"] == 1.5 and identity["straggler_sigma"] == 1.0


def test_simulated_time_to_target_beside_rounds_to_target() -> None:
    """Run a reaches 0.5 at round 2 (after 7 simulated seconds), run b, which simulates no
    time, at round 1: b has rounds and MB to target but no simulated time."""
    rows = []
    for run, curve in (("a", [(1, 0.3, 3.0), (2, 0.6, 7.0)]), ("b", [(1, 0.55, None), (2, 0.7, None)])):
        for number, accuracy, seconds in curve:
            rows += [(run, number, "pers_acc", accuracy), (run, number, "bytes_up_cum", 2**20 * number)]
            rows += [(run, number, "bytes_down_cum", 2**20 * number)]
            if seconds is not None:
                rows.append((run, number, "sim_time_cum", seconds))
    frame = pd.DataFrame(rows, columns=["run", "round", "metric", "value"])
    runs = pd.DataFrame(
        {"row": ["A", "B"], "dataset": ["digits"] * 2, "partition": ["a0.5"] * 2, "seed": [0, 0]},
        index=pd.Index(["a", "b"], name="run"),
    )
    values, _ = target_values(frame, Target("pers_acc", 0.5, False, True), runs)
    found = {(r.run, r.quantity): r.value for r in values.itertuples()}
    assert found == {("a", ROUNDS): 2.0, ("a", MB): 4.0, ("a", SIM_TIME): 7.0, ("b", ROUNDS): 1.0, ("b", MB): 2.0}
