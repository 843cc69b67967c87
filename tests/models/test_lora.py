"""The LoRA layer, applying it to a ViT, weight loading, and LoRA runs of any algorithm."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from pflbench.config.run_config import RunConfig
from pflbench.errors import ConfigError
from pflbench.models.lora import LoRALinear, apply_lora, lora_layers
from pflbench.models.zoo import build_model, head_parameter_names, load_weights, vit_patch_size
from pflbench.runs.execute import execute
from pflbench.runs.prepare import prepare
from pflbench.testing import Harness

TINY_VIT = ("depth=2", "embed_dim=16", "num_heads=2")


def tiny_vit(num_classes: int = 10) -> nn.Module:
    torch.manual_seed(0)
    return build_model("vit_tiny_patch16_224", (1, 8, 8), num_classes, depth=2, embed_dim=16, num_heads=2)


def randomized(layer: LoRALinear) -> LoRALinear:
    with torch.no_grad():
        layer.lora_B.normal_()
    return layer


def test_lora_layer_equals_base_layer_at_init() -> None:
    torch.manual_seed(0)
    base = nn.Linear(6, 5)
    layer = LoRALinear(base, rank=3, alpha=16)
    x = torch.randn(4, 6)
    assert torch.equal(layer(x), base(x))
    assert layer.lora_A.shape == (3, 6) and layer.lora_B.shape == (5, 3) and layer.lora_A.abs().sum() > 0
    assert not base.weight.requires_grad and layer.lora_A.requires_grad and layer.lora_B.requires_grad


def test_merge_and_delta_weight_reproduce_the_forward() -> None:
    torch.manual_seed(0)
    layer = randomized(LoRALinear(nn.Linear(6, 5), rank=3, alpha=6))
    x = torch.randn(4, 6)
    expected_delta = (6 / 3) * layer.lora_B @ layer.lora_A
    assert torch.allclose(layer.delta_weight(), expected_delta)
    merged = layer.merge()
    assert isinstance(merged, nn.Linear)
    assert torch.allclose(merged(x), layer(x), atol=1e-5)
    assert torch.allclose(layer(x), x @ (layer.base.weight + expected_delta).T + layer.base.bias, atol=1e-5)


def test_active_rank_uses_the_leading_components_with_scaling_alpha_over_r() -> None:
    torch.manual_seed(0)
    layer = randomized(LoRALinear(nn.Linear(6, 5), rank=4, alpha=8))
    layer.set_active_rank(2)
    assert layer.scaling == 4
    assert torch.allclose(layer.delta_weight(), 4 * layer.lora_B[:, :2] @ layer.lora_A[:2])
    x = torch.randn(3, 6)
    layer(x).sum().backward()
    assert layer.lora_A.grad[2:].abs().sum() == 0 and layer.lora_B.grad[:, 2:].abs().sum() == 0
    with pytest.raises(ValueError):
        layer.set_active_rank(5)


def test_rank_above_the_layer_size_is_rejected() -> None:
    with pytest.raises(ConfigError, match="rank 5"):
        LoRALinear(nn.Linear(4, 8), rank=5, alpha=16)


def test_apply_lora_wraps_the_targets_and_trains_only_lora_and_head() -> None:
    model = tiny_vit()
    x = torch.randn(2, 1, 8, 8)
    before = model(x)
    adapted = apply_lora(model, 4, 16.0, ["attn.proj", "mlp.fc2"])
    assert adapted == ["blocks.0.attn.proj", "blocks.0.mlp.fc2", "blocks.1.attn.proj", "blocks.1.mlp.fc2"]
    assert set(lora_layers(model)) == set(adapted)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    lora = {f"{name}.lora_{part}" for name in adapted for part in "AB"}
    assert trainable == lora | {"head.weight", "head.bias"}
    assert torch.allclose(model(x), before)


def test_apply_lora_names_the_linear_layers_when_a_target_matches_nothing() -> None:
    with pytest.raises(ConfigError, match=r"'nope'.*attn\.qkv.*mlp\.fc1"):
        apply_lora(tiny_vit(), 4, 16.0, ["nope"])
    with pytest.raises(ConfigError, match="head is never adapted"):
        apply_lora(build_model("mlp", (1, 8, 8), 10), 4, 16.0, ["fc3"])


@pytest.mark.parametrize("size, patch", [(8, 2), (28, 4), (32, 4), (224, 16)])
def test_vit_patch_size_gives_a_sensible_token_grid(size: int, patch: int) -> None:
    assert vit_patch_size(size, size) == patch


def test_vit_is_adapted_to_image_size_classes_and_model_options() -> None:
    model = build_model("vit_tiny_patch16_224", (1, 8, 8), 7, depth=3, embed_dim=24, num_heads=2)
    assert len(model.blocks) == 3 and model.head.out_features == 7
    assert model.patch_embed.num_patches == 16
    assert model(torch.randn(2, 1, 8, 8)).shape == (2, 7)
    with pytest.raises(ConfigError, match="model-option"):
        build_model("mlp", (1, 8, 8), 10, depth=3)


def test_weights_file_loads_and_a_head_of_another_shape_is_skipped(tmp_path: Path) -> None:
    source = tiny_vit(num_classes=10)
    path = tmp_path / "backbone.pt"
    torch.save(source.state_dict(), path)
    torch.manual_seed(1)
    target = build_model("vit_tiny_patch16_224", (1, 8, 8), 5, depth=2, embed_dim=16, num_heads=2)
    fresh_head = target.head.weight.detach().clone()
    info = load_weights(target, path)
    assert "skipped" in info["head"] and len(info["sha256"]) == 64
    assert torch.equal(target.blocks[1].mlp.fc2.weight, source.blocks[1].mlp.fc2.weight)
    assert torch.equal(target.head.weight, fresh_head)
    same = tiny_vit(num_classes=10)
    with torch.no_grad():
        same.head.weight.zero_()
    assert load_weights(same, path)["head"] == "loaded" and torch.equal(same.head.weight, source.head.weight)
    with pytest.raises(ConfigError, match="does not fit"):
        load_weights(build_model("vit_tiny_patch16_224", (1, 8, 8), 10, depth=3, embed_dim=16, num_heads=2), path)


def test_pretrained_offline_is_a_clear_error_not_a_random_init() -> None:
    # conftest sets HF_HUB_OFFLINE=1, so the hub is unreachable here
    with pytest.raises(ConfigError, match=r"--pretrained.*pflbench pretrain.*--weights"):
        build_model("vit_tiny_patch16_224", (1, 8, 8), 10, pretrained=True, depth=2)


def lora_config(tmp_path: Path, **changes) -> RunConfig:
    settings = dict(
        algo="fedavg",
        dataset="digits",
        model="vit_tiny_patch16_224",
        model_option=TINY_VIT,
        lora_rank=4,
        backbone="random",
        num_clients=3,
        rounds=1,
        optimizer="adam",
        lr=1e-3,
        alpha=0.5,
        out=str(tmp_path),
    )
    return RunConfig(**{**settings, **changes})


def test_lora_run_shares_and_uploads_only_lora_and_head(tmp_path: Path) -> None:
    prepared = prepare(lora_config(tmp_path))
    server = Harness(prepared)
    assert set(server.shared_names) == {n for n, p in server.model.named_parameters() if p.requires_grad}
    assert all(".lora_" in n or n.startswith("head.") for n in server.shared_names)
    proj = server.model.blocks[0].attn.proj
    frozen, lora_B = proj.base.weight.detach().clone(), proj.lora_B.detach().clone()
    summary = execute(prepared)
    shared_bytes = sum(server.state[n].numel() * 4 for n in server.shared_names)
    folder = Path(summary["run_dir"])
    record = json.loads((folder / "rounds.jsonl").read_text().splitlines()[0])
    assert record["bytes_up"] == record["bytes_down"] == 3 * shared_bytes
    resolved = json.loads((folder / "config.json").read_text())["resolved"]
    assert resolved["backbone"]["source"] == "random init" and resolved["lora"]["rank"] == 4
    assert torch.equal(proj.base.weight, frozen) and not torch.equal(proj.lora_B, lora_B)


def test_lora_with_fedper_keeps_the_head_private(tmp_path: Path) -> None:
    server = Harness(prepare(lora_config(tmp_path, algo="fedper")))
    assert server.private_names == ["head.weight", "head.bias"]
    assert server.shared_names and all(".lora_" in n for n in server.shared_names)
    assert head_parameter_names(server.model) == {"head.weight", "head.bias"}
