"""Feature shift (``--feature-shift``, ``data.feature_shift``): each transform by hand, the
domains, the shift applied once per client, determinism, export/import, identity, plot and CLI."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from pflbench.cli import cli
from pflbench.cli.config_file import read_config_file
from pflbench.config.identity import partition_identity, partition_label
from pflbench.config.run_config import RunConfig, validate, with_base_defaults
from pflbench.data.dataset import TensorDataset, load_dataset
from pflbench.data.feature_shift import (
    APPLY_ORDER,
    blur,
    color,
    contrast,
    domain_strengths,
    gaussian_kernel,
    invert,
    noise,
    parameter_at,
    plan_feature_shift,
    rotate,
    shift_images,
    to_pixels,
)
from pflbench.data.partition import make_partition
from pflbench.data.presets import export_partition, partition_document
from pflbench.errors import ConfigError
from pflbench.store.reader import partition_of

SHIFT = "rotate,contrast,noise,invert"


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def config(**values) -> RunConfig:
    return with_base_defaults(RunConfig(**{"partition": "iid", "num_clients": 6, **values}))


# ---- the transforms, by hand ------------------------------------------------------------------


def test_rotate_quarter_turn_is_rot90_and_zero_is_identity() -> None:
    image = torch.arange(64, dtype=torch.float32).view(1, 1, 8, 8)
    # a quarter turn counter-clockwise moves the top-right pixel to the top-left
    assert torch.allclose(rotate(image, 90.0), torch.rot90(image, 1, dims=(2, 3)), atol=1e-3)
    assert torch.allclose(rotate(image, 0.0), image, atol=1e-4)
    assert torch.allclose(rotate(image, 180.0), torch.rot90(image, 2, dims=(2, 3)), atol=1e-3)


def test_gaussian_kernel_by_hand() -> None:
    kernel = gaussian_kernel(1.0)  # radius 3: e^{-i²/2}, i = -3..3
    raw = torch.tensor([math.exp(-(i**2) / 2) for i in range(-3, 4)])
    assert len(kernel) == 7 and torch.allclose(kernel, raw / raw.sum())
    assert len(gaussian_kernel(0.2)) == 3  # radius at least 1


def test_blur_keeps_a_constant_image_and_spreads_a_point_by_the_kernel() -> None:
    flat = torch.full((1, 3, 5, 5), 77.0)
    assert torch.allclose(blur(flat, 1.3), flat)
    point = torch.zeros(1, 1, 15, 15)
    point[0, 0, 7, 7] = 1.0
    kernel = gaussian_kernel(1.0)
    assert torch.allclose(blur(point, 1.0)[0, 0, 4:11, 4:11], torch.outer(kernel, kernel), atol=1e-6)


def test_contrast_color_invert_noise_and_rounding_by_hand() -> None:
    pair = torch.tensor([0.0, 100.0]).view(1, 1, 1, 2)  # mean 50
    assert contrast(pair, 0.5).flatten().tolist() == [25.0, 75.0]
    rgb = torch.full((1, 3, 1, 1), 100.0)
    assert color(rgb, 1, 0.4).flatten().tolist() == [100.0, 40.0, 100.0]
    assert invert(torch.tensor([0.0, 255.0, 55.0])).tolist() == [255.0, 0.0, 200.0]
    zeros = torch.zeros(2000)
    first = noise(zeros, 0.1, torch.Generator().manual_seed(3))
    assert torch.equal(first, noise(zeros, 0.1, torch.Generator().manual_seed(3)))
    assert abs(first.std().item() - 25.5) < 1.5  # 255 · 0.1
    assert to_pixels(torch.tensor([-3.0, 254.6, 300.0, 12.4])).tolist() == [0, 255, 255, 12]


def test_parameters_at_strength() -> None:
    assert parameter_at("rotate", 0.5, 8) == 45.0
    assert parameter_at("blur", 1.0, 8) == 1.0 and parameter_at("blur", 0.5, 32) == 1.0  # s · max(1, H/16)
    assert parameter_at("contrast", 1.0, 8) == 0.3 and parameter_at("color", 0.5, 8) == 0.7
    assert parameter_at("invert", 0.5, 8) == 0.0 and parameter_at("invert", 2 / 3, 8) == 1.0
    assert parameter_at("noise", 0.5, 8) == 0.1
    with pytest.raises(ConfigError, match="not a transform"):
        parameter_at("warp", 0.5, 8)


def test_shift_images_applies_a_domain_once_and_skips_identities() -> None:
    images = torch.randint(0, 256, (3, 1, 8, 8), dtype=torch.uint8)
    generator = torch.Generator().manual_seed(0)
    original = {"rotate": 0.0, "contrast": 1.0, "noise": 0.0, "invert": 0.0}
    assert torch.equal(shift_images(images, original, 0, generator), images)
    inverted = shift_images(images, {"invert": 1.0}, 0, generator)
    assert torch.equal(inverted, 255 - images)
    both = shift_images(images, {"rotate": 90.0, "invert": 1.0}, 0, generator)  # rotate first, then invert
    assert torch.equal(both, 255 - torch.rot90(images, 1, dims=(2, 3)))


# ---- domains and the shifted data -----------------------------------------------------------------


def test_domain_strengths_deal_evenly_spaced_levels() -> None:
    strengths = domain_strengths(("noise", "rotate"), 4, np.random.default_rng(0))
    for transform in ("rotate", "noise"):
        assert sorted(s[transform] for s in strengths) == pytest.approx([0, 1 / 3, 2 / 3, 1])
    assert set(strengths[0]) == {"rotate", "noise"}
    assert domain_strengths(("noise", "rotate"), 4, np.random.default_rng(0)) == strengths


def test_plan_gives_client_k_domain_k_mod_g_and_checks_its_input() -> None:
    digits = load_dataset("digits")
    shift = plan_feature_shift(config(feature_shift=SHIFT, shift_groups=3).partition_spec, digits, 7)
    assert shift is not None and shift.client_domain == (0, 1, 2, 0, 1, 2, 0)
    assert len(shift.domains) == 3 and all(set(d) == {"rotate", "contrast", "noise", "invert"} for d in shift.domains)
    per_client = plan_feature_shift(config(feature_shift="blur").partition_spec, digits, 5)
    assert per_client is not None and per_client.client_domain == (0, 1, 2, 3, 4)
    assert plan_feature_shift(config().partition_spec, digits, 5) is None
    with pytest.raises(ConfigError, match="--shift-groups 9 needs 2 to 5 domains"):
        plan_feature_shift(config(feature_shift="blur", shift_groups=9).partition_spec, digits, 5)
    features = TensorDataset(torch.zeros(10, 4), torch.zeros(10, dtype=torch.long), 2, "test")
    with pytest.raises(ConfigError, match="--feature-shift transforms images"):
        plan_feature_shift(config(feature_shift="noise").partition_spec, features, 2)


def test_each_clients_samples_are_shifted_to_its_domain_once_and_nothing_else() -> None:
    digits = load_dataset("digits")
    before = digits.inputs.clone()
    split = make_partition(config(feature_shift=SHIFT, shift_groups=3, public_frac=0.1), digits)
    shifted = split.shifted(digits)
    assert torch.equal(digits.inputs, before)  # the loaded (cached) dataset is not touched
    assert torch.equal(shifted.inputs[split.public], before[split.public])  # public: as it was
    shift = split.feature_shift
    assert shift is not None
    for k in range(6):
        indices = torch.as_tensor(np.concatenate([split.train[k], split.val[k], split.test[k]]))
        domain = shift.domains[shift.client_domain[k]]
        changed = not torch.equal(shifted.inputs[indices], before[indices])
        identity = domain == {"rotate": 0.0, "contrast": 1.0, "noise": 0.0, "invert": 0.0}
        assert changed != identity
        if domain["invert"] == 1.0 and domain["noise"] == 0.0 and domain["rotate"] == 0.0:
            assert torch.equal(shifted.inputs[indices].float().mean(), 255 - before[indices].float().mean())
    again = make_partition(config(feature_shift=SHIFT, shift_groups=3, public_frac=0.1), digits).shifted(digits)
    assert torch.equal(again.inputs, shifted.inputs)  # same seed, same bytes
    other = make_partition(config(feature_shift=SHIFT, shift_groups=3, public_frac=0.1, seed=1), digits)
    assert not torch.equal(other.shifted(digits).inputs, shifted.inputs)
    assert make_partition(config(), digits).shifted(digits) is digits  # off: the dataset itself


def test_recorded_in_partition_json_exported_and_reimported_identically(tmp_path: Path) -> None:
    digits = load_dataset("digits")
    run = config(feature_shift=SHIFT, shift_groups=2)
    split = make_partition(run, digits)
    recorded = split.to_json()
    assert recorded["client_domains"] == split.feature_shift.client_labels()
    assert recorded["client_domains"][0].startswith("d0") and recorded["client_domains"][1].startswith("d1")
    assert recorded["feature_shift"]["client_domain"] == [0, 1, 0, 1, 0, 1]
    assert "client_domains" not in make_partition(config(), digits).to_json()
    file = export_partition(
        tmp_path / "split.json", partition_document(run, digits, split.train, split.test, split.public, split.val)
    )
    document = json.loads(file.read_text())
    assert document["settings"]["feature_shift"] == SHIFT and "client_domains" not in document  # a run setting
    again = make_partition(dataclasses.replace(run, partition_file=str(file)), digits)
    assert again.to_json()["client_domains"] == recorded["client_domains"]
    assert [t.tolist() for t in again.train] == [t.tolist() for t in split.train]
    assert torch.equal(again.shifted(digits).inputs, split.shifted(digits).inputs)


def test_a_shifted_runs_partition_json_as_partition_file_does_not_carry_the_shift(tmp_path: Path) -> None:
    digits = load_dataset("digits")
    run = config(feature_shift="invert,blur", shift_groups=2)
    file = tmp_path / "partition.json"
    file.write_text(json.dumps({"config": {"dataset": "digits"}, **make_partition(run, digits).to_json()}))
    assert json.loads(file.read_text())["feature_shift"]["data_domains"] is None
    plain = make_partition(config(partition_file=str(file)), digits)
    assert plain.feature_shift is None and plain.domain_labels is None and "client_domains" not in plain.to_json()
    shifted = make_partition(dataclasses.replace(run, partition_file=str(file)), digits)
    assert shifted.domain_labels == make_partition(run, digits).domain_labels  # not "d0 … d0 …"


# ---- identity, leaderboard column, validation, CLI ---------------------------------------------


def test_feature_shift_joins_the_identity_only_when_on() -> None:
    off = config().partition_spec
    assert "feature_shift" not in partition_identity(off) and partition_label(off) == "iid"
    on = config(feature_shift="rotate,noise", shift_groups=4).partition_spec
    identity = partition_identity(on)
    assert identity["feature_shift"] == "rotate,noise" and identity["shift_groups"] == 4
    assert partition_label(on) == "iid-shift"
    assert partition_of({"identity": identity}) == "iid shift=rotate,noise×4"
    reordered = partition_identity(config(feature_shift="noise, rotate", shift_groups=4).partition_spec)
    assert reordered == identity  # the same domains (drawn in a fixed order): the same run
    per_client = partition_identity(config(partition="dirichlet", feature_shift="blur").partition_spec)
    assert partition_of({"identity": per_client}) == "α=0.5 shift=blur"


@pytest.mark.parametrize(
    "values,message",
    [
        ({"feature_shift": "rotate,warp"}, "--feature-shift 'warp' is not a transform; valid: rotate, contrast"),
        ({"feature_shift": "blur,blur"}, "names a transform twice"),
        ({"feature_shift": "blur", "shift_groups": 1}, "--shift-groups must be 0 (one domain per client) or ≥ 2"),
    ],
)
def test_bad_shift_settings_are_refused(values: dict, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        validate(config(**values))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_apply_order_covers_every_transform() -> None:
    from pflbench.config.run_config import FEATURE_SHIFTS

    assert sorted(APPLY_ORDER) == sorted(FEATURE_SHIFTS)


def test_cli_plots_the_domains_and_refuses_bad_input_writing_nothing(tmp_path: Path) -> None:
    plot = tmp_path / "p.png"
    code, output = invoke(
        "partition", "--dataset", "digits", "--partition", "iid", "--num-clients", "4", "--feature-shift",
        "rotate,invert", "--shift-groups", "2", "--plot", str(plot),
    )  # fmt: skip
    assert code == 0, output
    assert "iid shift=rotate,invert×2" in output and "d0 " in output and "d1 " in output
    assert plot.stat().st_size > 0 and (tmp_path / "p-domains.png").stat().st_size > 0
    for args, message in [
        (["--feature-shift", "rotate,warp"], "--feature-shift 'warp' is not a transform"),
        (["--shift-groups", "2"], "--shift-groups 2 would be ignored: without --feature-shift"),
        (["--feature-shift", "blur", "--shift-groups", "9"], "--shift-groups 9 needs 2 to 4 domains"),
    ]:
        target = tmp_path / "bad.png"
        code, output = invoke("partition", "--dataset", "digits", "--partition", "iid", "--num-clients", "4",
                              *args, "--plot", str(target))  # fmt: skip
        assert code == 2 and message in output and output.count("\n") == 1, output
        assert not target.exists()


def test_a_run_with_feature_shift_from_the_cli(tmp_path: Path) -> None:
    code, output = invoke(
        "run", "--dataset", "digits", "--partition", "iid", "--num-clients", "3", "--feature-shift", "contrast,blur",
        "--model", "mlp", "--rounds", "1", "--quiet", "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0, output
    (run,) = (tmp_path / "runs").iterdir()
    assert run.name.startswith("fedavg__digits__iid-shift__s0__")
    partition = json.loads((run / "partition.json").read_text())
    assert len(partition["client_domains"]) == 3 and partition["feature_shift"]["transforms"] == ["contrast", "blur"]


@pytest.mark.parametrize(
    "scenario,runs",
    [("label_skew", 30), ("feature_shift", 15), ("quantity_skew", 15), ("combined", 30)],
)
def test_the_scenario_files_are_valid_sweeps(scenario: str, runs: int, tmp_path: Path) -> None:
    """examples/scenario_*.toml (label skew, feature shift, quantity skew, all three): each a
    sweep that runs offline on digits (checked without training: --dry-run builds its partitions)."""
    file = Path(__file__).resolve().parents[2] / "examples" / f"scenario_{scenario}.toml"
    code, output = invoke("sweep", "--config", str(file), "--dry-run", "--out", str(tmp_path))
    assert code == 0, output
    assert f"sweep: {runs} runs (dry run" in output
    assert not (tmp_path / "runs").exists()
    settings = read_config_file(file)  # a dry run builds no partition: build each one here
    fields = {f.name for f in dataclasses.fields(RunConfig)} - {"out", "model", "lr", "optimizer"}
    shared = {k: v for k, v in settings.items() if k in fields}
    for alpha in settings.get("alphas", [0.5]):
        split = make_partition(with_base_defaults(RunConfig(**shared, alpha=alpha)), load_dataset("digits"))
        assert len(split.train) == 20 and (split.feature_shift is not None) == bool(shared.get("feature_shift"))
