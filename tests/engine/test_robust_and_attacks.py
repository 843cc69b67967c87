"""Attacks (engine.attacks) and robust aggregation (engine.robust): the rules by hand (median
unchanged by an outlier, trimmed mean, Krum's hand-computed choice, norm bounding), the attacks
(label flipping flips exactly the attackers' train labels, sign flip negates the update, scale,
Gaussian, the backdoor's trigger and triggered test copies), the seam in the round loop (attack
→ rule, one round by hand), resume, vmap, the CLI and config file with asr in rounds, summary
and leaderboard, the refusals (one error line, nothing written) and "off changes nothing"."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from pflbench.cli import cli
from pflbench.config.groups import AttackSpec, RobustSpec
from pflbench.config.identity import identity_settings, run_name
from pflbench.config.run_config import RunConfig
from pflbench.data.dataset import TensorDataset
from pflbench.engine import ClientUpdate, Observer
from pflbench.engine.attacks import (
    TRIGGER_VALUE,
    attacker_count,
    choose_attackers,
    flip_labels,
    poison_data,
    poison_upload,
    stamp_trigger,
)
from pflbench.engine.robust import (
    RobustAggregation,
    coordinate_median,
    krum_scores,
    krum_selection,
    norm_bounded_mean,
    robust_aggregate,
    trimmed_mean,
)
from pflbench.registry import ALGORITHMS
from pflbench.runs.api import run_experiment
from pflbench.runs.prepare import plan_run, prepare
from pflbench.testing import Harness, assert_refused, killed_and_resumed, round_numbers
from pflbench.util.seeding import derive_seed

TINY = dict(dataset="digits", model="mlp", num_clients=4, rounds=2, optimizer="adam", lr=0.01, backbone="random")


def vectors(*values: list[float]) -> list[dict[str, torch.Tensor]]:
    return [{"w": torch.tensor(v, dtype=torch.float64)} for v in values]


# ---- the rules, by hand -------------------------------------------------------------------------
def test_median_is_unchanged_by_one_outlier() -> None:
    honest = [[1.0, -2.0], [2.0, 0.0], [3.0, 5.0], [4.0, 1.0]]
    clean = coordinate_median(vectors(*honest, [5.0, 2.0]))["w"]
    attacked = coordinate_median(vectors(*honest, [1e6, -1e6]))["w"]
    assert clean.tolist() == [3.0, 1.0]  # medians of (1,2,3,4,5) and (-2,0,5,1,2)
    assert attacked.tolist() == [3.0, 0.0]  # (1,2,3,4,1e6) → 3; (-2,0,5,1,-1e6) → 0: still an honest value
    assert coordinate_median(vectors(*honest, [1e6, 1.0]))["w"][0] == clean[0]  # the outlier moves nothing


def test_median_of_an_even_count_is_the_mean_of_the_middle_two() -> None:
    assert coordinate_median(vectors([1.0], [2.0], [3.0], [10.0]))["w"].tolist() == [2.5]


def test_trimmed_mean_by_hand() -> None:
    # β = 0.2 of 5 updates: ⌊1⌋ value cut on each side of each coordinate
    result = trimmed_mean(vectors([1.0, -50.0], [2.0, 0.0], [3.0, 1.0], [4.0, 2.0], [100.0, 3.0]), 0.2)["w"]
    assert result.tolist() == [3.0, 1.0]  # mean(2, 3, 4), mean(0, 1, 2)
    # β = 0.2 of 4: ⌊0.8⌋ = 0 cut: the plain mean
    assert trimmed_mean(vectors([1.0], [2.0], [3.0], [10.0]), 0.2)["w"].tolist() == [4.0]


def test_krum_picks_the_hand_computed_client() -> None:
    """x = 0, 1, 2, 10, 30 with f = 1: each score sums the n − f − 2 = 2 smallest squared distances
    to the others: 1+4=5, 1+1=2, 1+4=5, 64+81=145, 400+784=1184; Krum takes x = 1."""
    updates = vectors([0.0], [1.0], [2.0], [10.0], [30.0])
    assert krum_scores(updates, 1).tolist() == [5.0, 2.0, 5.0, 145.0, 1184.0]
    assert krum_selection(updates, 1, 1) == [1]
    aggregated, found = robust_aggregate(RobustSpec("krum", krum_f=1), updates, [1] * 5)
    assert aggregated["w"].tolist() == [1.0] and found["selected"] == [1]
    # Multi-Krum with m = 3: the three lowest scores (0, 1, 2), averaged uniformly
    aggregated, found = robust_aggregate(RobustSpec("multi-krum", krum_f=1, krum_select=3), updates, [1] * 5)
    assert aggregated["w"].tolist() == [1.0] and found["selected"] == [0, 1, 2]
    # the default --krum-select 0 = m − f = 4: the outlier at 30 is left out
    aggregated, found = robust_aggregate(RobustSpec("multi-krum", krum_f=1), updates, [1] * 5)
    assert found["selected"] == [0, 1, 2, 3] and aggregated["w"].tolist() == [3.25]


def test_norm_bound_clips_each_update_then_takes_the_weighted_mean() -> None:
    updates = vectors([3.0, 4.0], [0.3, 0.4])  # norms 5 and 0.5; M = 1
    mean, norms = norm_bounded_mean(updates, [0.75, 0.25], 1.0)
    assert norms == pytest.approx([5.0, 0.5])
    assert mean["w"].tolist() == pytest.approx([0.75 * 0.6 + 0.25 * 0.3, 0.75 * 0.8 + 0.25 * 0.4])
    aggregated, found = robust_aggregate(RobustSpec("norm-bound", norm_bound=1.0), updates, [30, 10])
    assert aggregated["w"].tolist() == pytest.approx(mean["w"].tolist()) and found["clipped"] == 1


def test_the_stream_adds_the_rule_of_the_updates_to_the_received_model() -> None:
    target = {"w": torch.tensor([10.0, 10.0])}
    stream = RobustAggregation(target, RobustSpec("median"))
    for k, upload in enumerate(([11.0, 9.0], [12.0, 10.0], [1000.0, 10.5])):
        stream.add(ClientUpdate(k, 5, {"w": torch.tensor(upload)}, {}))
    stream.finish()
    assert target["w"].tolist() == [12.0, 10.0]  # received + median(Δ) = 10 + (2, 0)


# ---- the attacks, by hand -----------------------------------------------------------------------
def test_attackers_are_a_seeded_fixed_choice_of_the_training_clients() -> None:
    training = [0, 1, 3, 4, 5, 6, 8, 9, 10, 11]  # 2 and 7 are new clients
    chosen = choose_attackers(7, training, 0.2)
    assert len(chosen) == attacker_count(10, 0.2) == 2 and set(chosen) <= set(training)
    assert chosen == choose_attackers(7, training, 0.2) and chosen == sorted(chosen)
    assert attacker_count(10, 0.0) == 0 and attacker_count(10, 0.01) == 1 and attacker_count(10, 0.25) == 3
    assert any(choose_attackers(seed, training, 0.2) != chosen for seed in range(5))


def small_images() -> tuple[TensorDataset, list[np.ndarray], list[np.ndarray]]:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randint(0, 200, (24, 1, 5, 5), dtype=torch.uint8, generator=generator)
    labels = torch.arange(24) % 4
    dataset = TensorDataset(inputs, labels, 4, "test")
    train = [np.arange(0, 6), np.arange(6, 12), np.arange(12, 18)]
    test = [np.arange(18, 20), np.arange(20, 22), np.arange(22, 24)]
    return dataset, train, test


def test_label_flipping_flips_exactly_the_attackers_train_labels() -> None:
    dataset, train, test = small_images()
    poisoned, backdoor = poison_data(dataset, train, test, [0, 1, 2], [1], AttackSpec("label-flip", 0.3), 0)
    assert backdoor is None and torch.equal(poisoned.inputs, dataset.inputs)
    changed = (poisoned.labels != dataset.labels).nonzero().flatten().tolist()
    # y → 3 − y on client 1's train samples (6..11: labels 2,3,0,1,2,3 → 1,0,3,2,1,0): all of them change
    assert changed == list(range(6, 12))
    assert poisoned.labels[6:12].tolist() == [1, 0, 3, 2, 1, 0]
    assert dataset.labels.tolist() == (torch.arange(24) % 4).tolist()  # the source is never modified
    assert flip_labels(torch.tensor([0, 1, 2]), np.array([2]), 3).tolist() == [0, 1, 0]


def test_a_label_flipping_run_trains_on_exactly_the_attackers_flipped_labels() -> None:
    """The wiring (runs.prepare): the run's data differs from the clean data exactly at the
    attackers' train samples, which hold C − 1 − y; the attackers are the Federation's."""
    clean = harness(rounds=1).prepared.data
    prepared = harness(rounds=1, attack="label-flip", attackers=0.5, new_clients=0.25)
    data, attackers = prepared.prepared.data, prepared.federation.attackers
    assert len(attackers) == 2 and not set(attackers) & set(prepared.prepared.partition.new_clients)
    assert prepared.prepared.resolved["attackers"] == attackers
    changed = set((data.labels != clean.labels).nonzero().flatten().tolist())
    poisoned = {int(i) for k in attackers for i in data.train_indices[k]}
    flippable = {i for i in poisoned if clean.labels[i] != 9 - clean.labels[i]}  # C = 10: no fixed point
    assert changed == flippable == poisoned
    assert all(int(data.labels[i]) == 9 - int(clean.labels[i]) for i in poisoned)


def test_backdoor_stamps_the_trigger_and_the_target_and_copies_the_test_samples() -> None:
    dataset, train, test = small_images()
    spec = AttackSpec("backdoor", 0.3, backdoor_target=1, backdoor_frac=0.5)
    poisoned, backdoor = poison_data(dataset, train, test, [0, 2], [2], spec, 0)
    assert backdoor is not None
    changed = sorted(set((poisoned.inputs[:24] != dataset.inputs).flatten(1).any(1).nonzero().flatten().tolist()))
    assert len(changed) == 3 and set(changed) <= set(range(12, 18))  # ⌈0.5·6⌉ of the attacker's train samples
    for i in changed:
        assert poisoned.labels[i] == 1 and bool((poisoned.inputs[i, :, -3:, -3:] == TRIGGER_VALUE).all())
        assert torch.equal(poisoned.inputs[i, :, :2], dataset.inputs[i, :, :2])  # outside the patch: as it was
    # triggered copies of the honest training clients' test samples whose class is not the target
    sources = [i for i in test[0] if dataset.labels[i] != 1]
    assert sources == [18, 19]  # labels 2, 3 (neither is the target 1)
    assert [len(s) for s in backdoor] == [2, 0, 0]  # client 1 is a new client, client 2 the attacker
    copies = np.concatenate(backdoor)
    assert len(copies) == len(sources) and len(poisoned.labels) == 24 + len(sources)
    assert bool((poisoned.labels[copies] == 1).all())
    assert torch.equal(poisoned.inputs[copies], stamp_trigger(dataset.inputs[sources]))


def test_sign_flip_negates_the_update_and_scale_multiplies_it() -> None:
    received = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.5])}
    upload = {"w": torch.tensor([1.5, 1.0]), "b": torch.tensor([0.0])}  # Δ = (0.5, −1), (−0.5)
    flipped = poison_upload("sign-flip", upload, received, 10.0)
    assert flipped["w"].tolist() == [0.5, 3.0] and flipped["b"].tolist() == [1.0]
    scaled = poison_upload("scale", upload, received, 10.0)
    assert scaled["w"].tolist() == [6.0, -8.0] and scaled["b"].tolist() == [-4.5]


def test_gaussian_attack_is_seeded_with_the_stated_scale() -> None:
    received = {"w": torch.zeros(20000)}
    upload = {"w": torch.ones(20000)}
    first = poison_upload("gaussian", upload, received, 3.0, torch.Generator().manual_seed(5))["w"]
    again = poison_upload("gaussian", upload, received, 3.0, torch.Generator().manual_seed(5))["w"]
    assert torch.equal(first, again)
    assert float(first.std()) == pytest.approx(3.0, rel=0.03) and abs(float(first.mean())) < 0.1


# ---- the round loop ---------------------------------------------------------------------------
def harness(**settings: Any) -> Harness:
    return Harness(prepare(RunConfig(out="unused", **{**TINY, **settings})))


class Uploads(Observer):
    def __init__(self) -> None:
        self.updates: list[ClientUpdate] = []

    def on_client_update(self, job: Any, update: ClientUpdate) -> None:
        self.updates.append(dataclasses.replace(update, params={n: t.clone() for n, t in update.params.items()}))


@pytest.mark.parametrize("rule", ["median", "trimmed-mean"])
def test_one_round_is_the_rule_of_the_honest_and_flipped_updates(rule: str) -> None:
    """At the seam: each attacker's Δ is negated, then the rule is applied to every Δ; the
    global model is received + rule(Δ) — computed here by hand from the honest uploads."""
    settings = dict(attack="sign-flip", attackers=0.25, robust_agg=rule, rounds=1)
    if rule == "trimmed-mean":
        settings["trim_frac"] = 0.25
    server = harness(**settings)
    (attacker,) = server.federation.attackers
    start = {n: t.clone() for n, t in server.global_state.items()}
    uploads = Uploads()
    server.observers.append(uploads)
    records: list[dict] = []
    server.run(records.append)
    deltas = []
    for update in uploads.updates:
        sign = -1.0 if update.client_id == attacker else 1.0
        deltas.append({n: sign * (t - start[n]) for n, t in update.params.items()})
    for name, value in server.global_state.items():
        stacked = torch.stack([d[name] for d in deltas]).sort(dim=0).values  # 4 updates
        middle = (stacked[1] + stacked[2]) / 2  # median of 4 = trimmed mean cutting 1 per side
        assert torch.allclose(value, start[name] + middle, atol=1e-6), name
    assert records[0]["attackers"] == [attacker]


def test_gaussian_attack_at_the_seam_uses_the_round_and_client_stream() -> None:
    server = harness(attack="gaussian", attackers=0.25, attack_scale=0.5, rounds=1)
    (attacker,) = server.federation.attackers
    start = {n: t.clone() for n, t in server.global_state.items()}
    uploads = Uploads()
    server.observers.append(uploads)
    server.run()
    generator = torch.Generator().manual_seed(derive_seed(0, "attacks.gaussian", 1, attacker))
    total = sum(u.num_samples for u in uploads.updates)
    for name in server.global_state:
        expected = torch.zeros_like(start[name])
        for update in uploads.updates:  # FedAvg's weighted mean, with the attacker's upload replaced
            upload = update.params[name]
            if update.client_id == attacker:
                upload = start[name] + torch.randn(upload.shape, generator=generator) * 0.5
            expected += upload * (update.num_samples / total)
        assert torch.allclose(server.global_state[name], expected, atol=1e-5), name


def test_off_by_default_changes_nothing() -> None:
    config = plan_run(RunConfig(**TINY)).config
    algorithm = ALGORITHMS.get("fedavg")
    hparams = algorithm.hyperparameters()
    identity = identity_settings(config, algorithm, hparams)
    assert config.attack_spec is None and config.robust_spec is None
    assert not {"attack", "attackers", "robust_agg", "trim_frac", "krum_f", "norm_bound"} & set(identity)
    attacked = dataclasses.replace(config, robust_agg="median")
    assert identity_settings(attacked, algorithm, hparams)["robust_agg"] == "median"
    assert run_name(attacked, algorithm, hparams) != run_name(config, algorithm, hparams)
    server = harness()
    assert server.federation.attackers == [] and server.federation.evaluator.sets.num_backdoor is None
    records: list[dict] = []
    server.run(records.append)
    assert not {"attackers", "asr", "robust_selected"} & set(records[-1])


def test_median_without_attackers_is_its_own_rule() -> None:
    """Without attackers the median is still a different rule than FedAvg's average: the numbers change."""
    plain, robust = harness(rounds=2), harness(rounds=2, robust_agg="median")
    plain.run()
    robust.run()
    assert any(not torch.equal(plain.global_state[n], robust.global_state[n]) for n in plain.global_state)


def test_killed_run_resumes_with_the_same_attack(tmp_path: Path) -> None:
    settings = dict(
        **{**TINY, "rounds": 3},
        frac=0.5,
        checkpoint_every=1,
        attack="gaussian",
        attackers=0.5,
        attack_scale=0.05,
        robust_agg="trimmed-mean",
        trim_frac=0.0,
    )
    resumed, whole = killed_and_resumed(
        run_experiment, lambda out: RunConfig(out=str(out), **settings), tmp_path, after_round=2
    )
    assert round_numbers(resumed) == round_numbers(whole)
    assert any(record["attackers"] for record in round_numbers(whole))


def test_vmap_executor_serves_the_backdoor_and_a_robust_rule() -> None:
    server = harness(
        attack="backdoor", attackers=0.25, robust_agg="norm-bound", norm_bound=0.5, executor="vmap", rounds=1
    )
    records: list[dict] = []
    server.run(records.append)
    assert 0 <= records[-1]["asr"] <= 1 and "robust_clipped_frac" in records[-1]


# ---- CLI, config file, refusals ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--attack", "poison"], "'poison' is not one of"),
        (["--robust-agg", "mean"], "'mean' is not one of"),
        (["--attack", "label-flip", "--attackers", "1"], "--attackers must be a fraction in [0, 1)"),
        (["--attack", "label-flip", "--attackers", "-0.2"], "--attackers must be a fraction in [0, 1)"),
        (["--attack", "sign-flip"], "--attack sign-flip needs malicious clients: give --attackers FRAC > 0"),
        (["--attack", "label-flip", "--attackers", "0.9"], "makes 4 of the 4 training clients malicious"),
        (["--robust-agg", "median", "--algo", "scaffold"], "--robust-agg median cannot replace the aggregation"),
        (["--attack", "scale", "--attackers", "0.25", "--algo", "ditto"], "--attack scale poisons model updates"),
        (["--robust-agg", "krum"], "needs more than 2f + 2 = 4 clients per round"),
        (["--robust-agg", "trimmed-mean", "--trim-frac", "0.5"], "--trim-frac is the fraction trimmed"),
        (["--robust-agg", "norm-bound", "--norm-bound", "0"], "--norm-bound must be a finite number > 0"),
        (["--robust-agg", "median", "--dp", "client"], "--robust-agg median replaces the mean"),
        (["--attack", "backdoor", "--attackers", "0.25", "--backdoor-target", "10"], "is not a class of"),
        (["--attackers", "0.25"], "--attackers 0.25 would be ignored: no --attack is set"),
        (["--krum-f", "2"], "--krum-f 2 would be ignored: only --robust-agg krum or multi-krum reads it"),
        (
            ["--robust-agg", "median", "--algo", "local"],
            "cannot replace the aggregation of --algo local: it uploads nothing",
        ),
        (
            ["--attack", "sign-flip", "--attackers", "0.25", "--algo", "local"],
            "--algo local has none to poison: it uploads nothing",
        ),
    ],
)
def test_bad_input_is_one_error_line_and_nothing_written(args: list[str], message: str, tmp_path: Path) -> None:
    base = ["run", "--model", "mlp", "--num-clients", "4", "--rounds", "1", "--quiet", "--out", str(tmp_path / "out")]
    assert_refused(CliRunner().invoke(cli, [*base, *args]), tmp_path / "out", message)


def test_config_file_backdoor_run_reports_asr_in_rounds_summary_and_leaderboard(tmp_path: Path) -> None:
    config = tmp_path / "attacked.toml"
    config.write_text(
        'algo = "fedavg"\nmodel = "mlp"\nnum-clients = 4\nrounds = 2\nbackbone = "random"\n'
        'attack = "backdoor"\nattackers = 0.25\nbackdoor-target = 3\nrobust-agg = "multi-krum"\nkrum-f = 0\n'
    )
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["run", "--config", str(config), "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    (run,) = (out / "runs").iterdir()
    records = [json.loads(line) for line in (run / "rounds.jsonl").read_text().splitlines()]
    written = json.loads((run / "config.json").read_text())
    attackers = written["resolved"]["attackers"]
    assert len(attackers) == 1 and written["attack"] == "backdoor"
    assert all(r["attackers"] == attackers and 0 <= r["asr"] <= 1 for r in records)
    assert all(r["robust_selected"] == [0, 1, 2, 3] for r in records)  # f = 0: m − f = every client
    summary = json.loads((run / "summary.json").read_text())
    assert summary["asr"] == records[-1]["asr"]
    board = CliRunner().invoke(cli, ["leaderboard", str(out), "--metrics", "pers_acc,asr", "--format", "csv"])
    assert board.exit_code == 0, board.output
    assert "Attack success rate" in board.output
