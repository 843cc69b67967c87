"""Differential privacy (engine.privacy): the math by hand, the noise's scale, per-sample
gradients against autograd, ε against Opacus' accountant for the run's (q, σ, steps, δ), the
round loop's seam (clipped updates, uniform mean, seeded noise), resume, Ray, the CLI and config
file, the refusals (one error line, nothing written) and "off changes nothing"."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

from pflbench.cli import cli
from pflbench.config.groups import AvailabilitySpec
from pflbench.config.identity import identity_settings, run_name
from pflbench.config.run_config import RunConfig
from pflbench.engine import ClientUpdate, Observer
from pflbench.engine.privacy import (
    PrivateMean,
    SampleLevelDP,
    adapted_clip,
    batches_per_epoch,
    client_level_refusal,
    client_sample_rate,
    clip_per_sample,
    clip_update,
    epsilon,
    global_norm,
    noised_mean,
    sample_level_refusal,
    update_noise_multiplier,
)
from pflbench.errors import ConfigError
from pflbench.registry import ALGORITHMS
from pflbench.runs.api import run_experiment
from pflbench.runs.prepare import plan_run, prepare
from pflbench.testing import Harness, assert_refused, killed_and_resumed, round_numbers
from pflbench.util.seeding import derive_seed

opacus = pytest.importorskip("opacus", reason="the accountant needs Opacus (pip install 'pflbench[dp]')")
from opacus.accountants import RDPAccountant  # noqa: E402

TINY = dict(dataset="digits", model="mlp", num_clients=4, rounds=2, optimizer="adam", lr=0.01, backbone="random")


# ---- the math, by hand ---------------------------------------------------------------------
def test_clip_update_scales_into_the_ball() -> None:
    """Δ = (3, 4) (norm 5) clipped to C = 1 is (0.6, 0.8); a norm below C is left as it is."""
    clipped, norm = clip_update({"w": torch.tensor([3.0, 4.0])}, 1.0)
    assert norm == pytest.approx(5.0)
    assert torch.allclose(clipped["w"], torch.tensor([0.6, 0.8]))
    small, norm = clip_update({"a": torch.tensor([0.3]), "b": torch.tensor([[0.4]])}, 1.0)
    assert norm == pytest.approx(0.5)  # the norm is over every tensor as one vector
    assert small["a"].item() == pytest.approx(0.3) and small["b"].item() == pytest.approx(0.4)


def test_a_clipped_update_norm_is_at_most_c() -> None:
    generator = torch.Generator().manual_seed(0)
    for clip in (0.01, 0.5, 3.0):
        for scale in (0.001, 1.0, 100.0):
            update = {n: torch.randn(s, generator=generator) * scale for n, s in (("a", (7, 3)), ("b", (5,)))}
            clipped, _ = clip_update(update, clip)
            assert float(global_norm(clipped)) <= clip * (1 + 1e-6)


def test_noised_mean_without_noise_is_the_mean() -> None:
    total = {"w": torch.tensor([3.0, -6.0])}
    mean = noised_mean(total, 3, 1.0, 0.0, torch.Generator().manual_seed(0))
    assert torch.allclose(mean["w"], torch.tensor([1.0, -2.0]))


def test_the_noise_has_the_stated_scale() -> None:
    """z = 1.5, C = 2, m = 4: every entry of the mean gets N(0, (z·C/m)²) = N(0, 0.75²)."""
    total = {"w": torch.zeros(100_000)}
    noisy = noised_mean(total, 4, 2.0, 1.5, torch.Generator().manual_seed(1))["w"]
    assert float(noisy.std()) == pytest.approx(0.75, rel=0.01)
    assert abs(float(noisy.mean())) < 0.01
    # DP-SGD: N(0, z²C²) on the sum of the clipped per-sample gradients, over the batch size
    dp = SampleLevelDP(clip=0.5, noise_multiplier=2.0)
    zeros = {"w": torch.zeros(1, 100_000)}
    gradients, _, _ = dp.private_gradients(
        lambda p, x, y: ((p["w"] * 0).sum() + x.sum() * 0, {}),
        zeros,
        torch.zeros(8, 1),
        torch.zeros(8),
        torch.Generator().manual_seed(2),
    )
    assert float(gradients["w"].std()) == pytest.approx(2.0 * 0.5 / 8, rel=0.01)


def test_update_noise_multiplier_hand_computed() -> None:
    """z = 1, σ_b = 1: z_Δ = (1 − 1/4)^(−1/2) = 1.1547; z ≥ 2σ_b is refused."""
    assert update_noise_multiplier(1.0, 1.0) == pytest.approx(1 / math.sqrt(0.75))
    assert update_noise_multiplier(0.0, 0.1) == 0.0
    with pytest.raises(ConfigError, match="--dp-count-noise"):
        update_noise_multiplier(1.0, 0.5)


def test_adapted_clip_hand_computed() -> None:
    """3 of 4 updates unclipped (b̃ = 0.75), γ = 0.5, η = 0.2: C·exp(−0.2·0.25) = 0.951229·C."""
    clip, fraction = adapted_clip(2.0, 3, 4, 0.5, 0.2, 0.0, torch.Generator().manual_seed(0))
    assert fraction == pytest.approx(0.75)
    assert clip == pytest.approx(2.0 * math.exp(-0.05))
    grows, _ = adapted_clip(1.0, 0, 4, 0.5, 0.2, 0.0, torch.Generator().manual_seed(0))
    assert grows == pytest.approx(math.exp(0.1))  # everything clipped: the clip grows


def test_clip_per_sample_hand_computed() -> None:
    """Samples (3, 4) and (0.3, 0.4), C = 1: (0.6, 0.8) + (0.3, 0.4) = (0.9, 1.2)."""
    summed = clip_per_sample({"w": torch.tensor([[3.0, 4.0], [0.3, 0.4]])}, 1.0)
    assert torch.allclose(summed["w"], torch.tensor([0.9, 1.2]))


def test_per_sample_gradients_match_autograd() -> None:
    """With a clip no gradient reaches and no noise, DP-SGD's gradient is the batch gradient; each
    per-sample gradient is clipped on its own (C small: each sample's gradient has norm C)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)
    params = dict(model.named_parameters())
    x, y = torch.randn(6, 5), torch.randint(0, 3, (6,))

    def loss_of(p: dict, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, dict]:
        out = torch.func.functional_call(model, p, (inputs,))
        loss = F.cross_entropy(out, targets)
        return loss, {"task": loss}

    wide = SampleLevelDP(clip=1e6, noise_multiplier=0.0)
    gradients, loss, terms = wide.private_gradients(loss_of, params, x, y, torch.Generator())
    expected = torch.autograd.grad(F.cross_entropy(model(x), y), list(params.values()))
    for (name, _), want in zip(params.items(), expected):
        assert torch.allclose(gradients[name], want, atol=1e-6)
    assert float(loss) == pytest.approx(F.cross_entropy(model(x), y).item(), rel=1e-5)
    assert float(terms["task"]) == pytest.approx(float(loss))
    narrow = SampleLevelDP(clip=1e-3, noise_multiplier=0.0)
    gradients, _, _ = narrow.private_gradients(loss_of, params, x, y, torch.Generator())
    per_sample = [
        torch.autograd.grad(F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]), list(params.values())) for i in range(6)
    ]
    for index, name in enumerate(params):
        clipped = sum(g[index] * (1e-3 / torch.sqrt(sum(t.pow(2).sum() for t in g))) for g in per_sample)
        assert torch.allclose(gradients[name], clipped / 6, atol=1e-8)


def test_batches_per_epoch() -> None:
    assert batches_per_epoch(64, 32) == 2
    assert batches_per_epoch(65, 32) == 2  # a trailing single sample joins the last batch
    assert batches_per_epoch(66, 32) == 3
    assert batches_per_epoch(5, 32) == 1


def test_epsilon_is_opacus_rdp_accountant() -> None:
    accountant = RDPAccountant()
    for _ in range(30):
        accountant.step(noise_multiplier=1.1, sample_rate=0.25)
    assert epsilon([(1.1, 0.25, 30)], 1e-5) == pytest.approx(accountant.get_epsilon(1e-5))
    assert epsilon([(0.0, 0.25, 3)], 1e-5) == math.inf  # no noise, no privacy
    assert epsilon([], 1e-5) == 0.0
    assert epsilon([(1.0, 0.1, 10)], 1e-5) < epsilon([(1.0, 0.1, 20)], 1e-5) < epsilon([(0.5, 0.1, 20)], 1e-5)


# ---- who can be made private ------------------------------------------------------------------
def test_which_algorithms_can_be_made_private() -> None:
    for name in ("fedavg", "fedprox", "fedper", "fedrep"):
        assert client_level_refusal(ALGORITHMS.get(name)) is None, name
        assert sample_level_refusal(ALGORITHMS.get(name)) is None, name
    assert "aggregate" in client_level_refusal(ALGORITHMS.get("scaffold"))  # control variates, its own rule
    assert client_level_refusal(ALGORITHMS.get("ditto")) is not None  # its own local update
    assert sample_level_refusal(ALGORITHMS.get("ditto")) is not None


# ---- the round loop -----------------------------------------------------------------------------
def harness(**settings: Any) -> Harness:
    return Harness(prepare(RunConfig(out="unused", **{**TINY, **settings})))


class Uploads(Observer):
    def __init__(self) -> None:
        self.updates: list[ClientUpdate] = []

    def on_client_update(self, job: Any, update: ClientUpdate) -> None:
        self.updates.append(dataclasses.replace(update, params={n: t.clone() for n, t in update.params.items()}))


def test_client_level_round_is_the_clipped_uniform_mean_plus_seeded_noise() -> None:
    """One round by hand: w ← w + (1/m)·Σ clip(Δ_k) + N(0, (z·C/m)²), the noise from the round's
    derived generator (so a second run draws the same)."""
    server = harness(dp="client", dp_clip=0.05, dp_noise=0.7, rounds=1)
    start = {n: t.clone() for n, t in server.global_state.items()}
    uploads = Uploads()
    server.observers.append(uploads)
    records: list[dict] = []
    server.run(records.append)
    assert len(uploads.updates) == 4
    expected_total: dict[str, torch.Tensor] = {}
    for update in uploads.updates:
        clipped, norm = clip_update({n: t - start[n] for n, t in update.params.items()}, 0.05)
        assert norm > 0.05  # this clip binds
        for n, t in clipped.items():
            expected_total[n] = expected_total.get(n, 0) + t
    generator = torch.Generator().manual_seed(derive_seed(0, "privacy.noise", 1))
    mean = noised_mean(expected_total, 4, 0.05, 0.7, generator)
    for name, value in server.global_state.items():
        assert torch.allclose(value, start[name] + mean[name], atol=1e-6)
    assert records[0]["dp_clipped_frac"] == 1.0 and records[0]["dp_clip"] == 0.05


def test_private_mean_without_updates_changes_nothing() -> None:
    target = {"w": torch.ones(3)}
    stream = PrivateMean(target, 1.0, 1.0, torch.Generator())
    stream.finish()
    assert torch.equal(target["w"], torch.ones(3))


def test_client_sample_rate() -> None:
    """M/K; over-selection samples ⌈M·1.5⌉ = 3 of 4; an availability trace claims no amplification."""
    assert client_sample_rate(2, 4, AvailabilitySpec()) == 0.5
    assert client_sample_rate(2, 4, AvailabilitySpec(dropout=0.3)) == 0.5
    assert client_sample_rate(2, 4, AvailabilitySpec(over_select=0.5)) == 0.75
    assert client_sample_rate(2, 4, AvailabilitySpec(availability="cyclic")) == 1.0


def test_run_epsilon_equals_opacus_for_the_run_s_q_sigma_steps_delta() -> None:
    """Client level: q = M/K = 2/4, σ, one step per round, δ; each round's ε is the accountant's."""
    server = harness(dp="client", dp_noise=1.3, dp_delta=1e-4, frac=0.5, rounds=3, eval_every=3)
    records: list[dict] = []
    server.run(records.append)
    accountant = RDPAccountant()
    for record in records:
        accountant.step(noise_multiplier=1.3, sample_rate=0.5)
        assert record["dp_epsilon"] == pytest.approx(accountant.get_epsilon(1e-4), rel=1e-9)


def test_sample_level_epsilon_composes_each_client_s_steps() -> None:
    """Sample level: client k takes epochs × batches steps per round it is sampled, at q_k = B/n_k;
    the round reports the worst client's ε, which is Opacus' for that client's (q_k, σ, steps)."""
    server = harness(
        dp="sample", dp_noise=1.1, dp_clip=1.0, frac=0.5, rounds=2, batch_size=48, local_epochs=2, eval_every=2
    )
    num_train = server.prepared.data.num_train
    steps: dict[int, int] = {}
    records: list[dict] = []
    server.run(records.append)
    for record in records:
        for k in record["clients"]:
            steps[k] = steps.get(k, 0) + 2 * batches_per_epoch(num_train[k], 48)
        expected = []
        for k, count in steps.items():
            accountant = RDPAccountant()
            accountant.history = [(1.1, 48 / num_train[k], count)]
            expected.append(accountant.get_epsilon(1e-5))
        assert record["dp_epsilon"] == pytest.approx(max(expected), rel=1e-9)
    assert server.federation.privacy.steps == steps


def test_sample_level_training_is_seeded_and_noised() -> None:
    """The same job gives the same update twice (the noise comes from the job's seed); σ changes it."""
    first, again, louder = (harness(dp="sample", dp_noise=z, rounds=1) for z in (1.0, 1.0, 3.0))
    received = {n: t.clone() for n, t in first.global_state.items()}
    a, b, c = (h.train_client(0, received) for h in (first, again, louder))
    assert all(torch.equal(a.params[n], b.params[n]) for n in a.params)
    assert not all(torch.equal(a.params[n], c.params[n]) for n in a.params)


def test_adaptive_clip_follows_the_quantile() -> None:
    """Every update is clipped at a tiny C: b̃ ≈ 0 < γ, so the clip grows each round (geometric)."""
    server = harness(dp="client", dp_clip=1e-4, dp_noise=0.5, dp_adaptive_quantile=0.5, dp_count_noise=0.5, rounds=3)
    records: list[dict] = []
    server.run(records.append)
    clips = [r["dp_clip"] for r in records]
    assert clips[0] == 1e-4 and clips[0] < clips[1] < clips[2]
    assert server.federation.privacy.update_multiplier == pytest.approx((0.5**-2 - 1.0**-2) ** -0.5)


def test_off_by_default_changes_nothing() -> None:
    config = plan_run(RunConfig(**TINY)).config
    algorithm = ALGORITHMS.get("fedavg")
    hparams = algorithm.hyperparameters()
    identity = identity_settings(config, algorithm, hparams)
    assert config.privacy_spec is None and not any(key.startswith("dp") for key in identity)
    private = dataclasses.replace(config, dp="client")
    assert identity_settings(private, algorithm, hparams)["dp"] == "client"
    assert run_name(private, algorithm, hparams) != run_name(config, algorithm, hparams)
    server = harness()
    assert server.federation.privacy is None and server.federation.sample_privacy is None
    records: list[dict] = []
    server.run(records.append)
    assert not any(key.startswith("dp_") for key in records[-1])


# ---- resume, Ray, CLI, config file --------------------------------------------------------------
@pytest.mark.parametrize(
    "dp",
    [
        dict(dp="client", dp_clip=1e-3, dp_noise=0.3, dp_adaptive_quantile=0.5, dp_count_noise=0.5),
        dict(dp="sample", dp_noise=0.8, batch_size=64),
    ],
    ids=["client-adaptive", "sample"],
)
def test_killed_run_resumes_with_the_same_noise_and_privacy(dp: dict, tmp_path: Path) -> None:
    settings = dict(**TINY, frac=0.5, checkpoint_every=1, eval_every=2, **dp)
    resumed, whole = killed_and_resumed(
        run_experiment, lambda out: RunConfig(out=str(out), **settings), tmp_path, after_round=1
    )
    assert round_numbers(resumed) == round_numbers(whole)
    assert resumed["dp_epsilon"] == whole["dp_epsilon"] > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dp", "client", "--dp-noise", "-1"], "--dp-noise must be a finite number ≥ 0, got -1.0"),
        (["--dp", "client", "--dp-clip", "0"], "--dp-clip must be a finite number > 0, got 0.0"),
        (["--dp", "sample", "--dp-clip", "-2"], "--dp-clip must be a finite number > 0"),
        (["--dp", "client", "--dp-delta", "1"], "--dp-delta must be in (0, 1), got 1.0"),
        (["--dp", "client", "--dp-delta", "0"], "--dp-delta must be in (0, 1)"),
        (["--dp", "maybe"], "'maybe' is not one of"),
        (["--dp", "client", "--algo", "scaffold"], "--dp client cannot make --algo scaffold private"),
        (["--dp", "client", "--algo", "ditto"], "--dp client cannot make --algo ditto private"),
        (["--dp", "sample", "--algo", "ditto"], "--dp sample cannot make --algo ditto private"),
        (["--dp", "sample", "--executor", "vmap"], "use --executor sequential or ray"),
        (["--dp", "sample", "--model", "cnn_bn"], "--dp sample cannot clip per-sample gradients through BatchNorm"),
        (["--dp", "sample", "--dp-adaptive-quantile", "0.5"], "use it with --dp client"),
        (
            ["--dp", "client", "--algo", "local"],
            "--dp: --algo local uploads nothing, so there is nothing to make private",
        ),
        (
            ["--dp", "client", "--model", "cnn_bn"],
            "--dp client cannot noise the running statistics --algo fedavg uploads",
        ),
        (
            ["--dp", "client", "--dp-adaptive-quantile", "0.5", "--dp-noise", "1"],
            "--dp-noise 1 with adaptive clipping needs --dp-count-noise > 0.5",
        ),
        (["--dp-noise", "2"], "--dp-noise 2.0 would be ignored: no --dp (client or sample) is set"),
        (["--dp", "client", "--dp-clip-lr", "0.5"], "adaptive clipping is off"),
    ],
)
def test_bad_input_is_one_error_line_and_nothing_written(args: list[str], message: str, tmp_path: Path) -> None:
    base = ["run", "--model", "mlp", "--num-clients", "4", "--rounds", "1", "--quiet", "--out", str(tmp_path / "out")]
    if "--model" in args:
        base = base[:1] + base[3:]
    assert_refused(CliRunner().invoke(cli, [*base, *args]), tmp_path / "out", message)


def test_without_opacus_dp_is_one_line_naming_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "opacus", None)
    monkeypatch.setitem(sys.modules, "opacus.accountants", None)
    result = CliRunner().invoke(cli, ["run", "--model", "mlp", "--dp", "client", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert result.output.strip() == "Error: --dp needs Opacus for its privacy accountant: pip install 'pflbench[dp]'"
    assert not (tmp_path / "out").exists()


def test_config_file_run_reports_epsilon_in_rounds_summary_and_leaderboard(tmp_path: Path) -> None:
    config = tmp_path / "private.toml"
    config.write_text(
        'algo = "fedavg"\nmodel = "mlp"\nnum-clients = 4\nrounds = 2\nbackbone = "random"\n'
        'dp = "client"\ndp-clip = 0.5\ndp-noise = 1.2\ndp-delta = 1e-4\n'
    )
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["run", "--config", str(config), "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    (run,) = (out / "runs").iterdir()
    records = [json.loads(line) for line in (run / "rounds.jsonl").read_text().splitlines()]
    accountant = RDPAccountant()
    for record in records:
        accountant.step(noise_multiplier=1.2, sample_rate=1.0)
        assert record["dp_epsilon"] == pytest.approx(accountant.get_epsilon(1e-4))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["dp_epsilon"] == records[-1]["dp_epsilon"]
    assert json.loads((run / "config.json").read_text())["dp"] == "client"
    board = CliRunner().invoke(cli, ["leaderboard", str(out), "--metrics", "pers_acc,dp_epsilon", "--format", "csv"])
    assert board.exit_code == 0, board.output
    assert "Privacy ε" in board.output and repr(summary["dp_epsilon"])[:8] in board.output


def test_per_sample_gradients_do_not_import_torch_dynamo() -> None:
    """DP-SGD's vmap(grad) runs under ``func_grad.autograd_without_dynamo`` (the import of
    torch._dynamo costs seconds on the first step). In a fresh interpreter: one private batch
    gradient, then torch._dynamo is still absent."""
    script = (
        "import sys, torch\n"
        "import torch.nn.functional as F\n"
        "from pflbench.engine.privacy import SampleLevelDP\n"
        "model = torch.nn.Linear(5, 3)\n"
        "params = dict(model.named_parameters())\n"
        "def loss_of(p, x, y):\n"
        "    loss = F.mse_loss(torch.func.functional_call(model, p, (x,)), y)\n"
        "    return loss, {'task': loss}\n"
        "dp = SampleLevelDP(clip=1.0, noise_multiplier=1.0)\n"
        "dp.private_gradients(loss_of, params, torch.randn(4, 5), torch.randn(4, 3), torch.Generator())\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    import subprocess

    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "False"
