"""Saved run models (safetensors / weights_only torch files) and peft adapter export."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch import nn

from pflbench.models.lora import LoRALinear, apply_lora, lora_layers
from pflbench.models.saving import base_model_state, export_peft_adapter, load_run_models, save_run_models


def _states():
    torch.manual_seed(0)
    global_state = {
        "fc1.weight": torch.randn(4, 3),
        "fc1.bias": torch.randn(4),
        "bn.num_batches_tracked": torch.tensor(7),
        "half": torch.randn(2, 2).half(),
    }
    clients = {
        3: {"head.weight": torch.randn(2, 4)},
        0: {"head.weight": torch.randn(2, 4), "head.bias": torch.zeros(2)},
    }
    return global_state, clients


@pytest.mark.parametrize("fmt", ["safetensors", "torch"])
def test_save_run_models_round_trip(tmp_path, fmt):
    global_state, clients = _states()
    global_state["view"] = global_state["fc1.weight"].t()  # non-contiguous, shares storage
    models = save_run_models(tmp_path, global_state, clients, {"algo": "fedper"}, fmt=fmt)
    suffix = ".safetensors" if fmt == "safetensors" else ".pt"
    assert sorted(p.name for p in (models / "clients").iterdir()) == [f"0{suffix}", f"3{suffix}"]
    assert not list(models.rglob("*.tmp"))
    loaded_global, loaded_clients, meta = load_run_models(tmp_path)
    assert meta == {"algo": "fedper"}
    assert loaded_global.keys() == global_state.keys()
    for name, tensor in global_state.items():
        assert loaded_global[name].dtype == tensor.dtype
        assert torch.equal(loaded_global[name], tensor)
    assert loaded_clients.keys() == {0, 3}
    for k in clients:
        assert clients[k].keys() == loaded_clients[k].keys()
        assert all(torch.equal(clients[k][n], loaded_clients[k][n]) for n in clients[k])
    if fmt == "torch":  # the safe loader reads the files as they are
        direct = torch.load(models / "global.pt", weights_only=True)
        assert torch.equal(direct["fc1.weight"], global_state["fc1.weight"])
    else:
        from safetensors.torch import load_file

        assert torch.equal(load_file(models / "clients" / "3.safetensors")["head.weight"], clients[3]["head.weight"])


def test_save_run_models_without_global_and_rewrite(tmp_path):
    global_state, clients = _states()
    save_run_models(tmp_path, global_state, clients, {})
    save_run_models(tmp_path, None, {0: clients[0]}, {"note": 1})  # e.g. a rerun as `local`
    loaded_global, loaded_clients, meta = load_run_models(tmp_path / "models")
    assert loaded_global is None and list(loaded_clients) == [0] and meta == {"note": 1}
    assert sorted(p.name for p in (tmp_path / "models").rglob("*.safetensors")) == ["0.safetensors"]
    recorded = json.loads((tmp_path / "models" / "meta.json").read_text())
    assert recorded["client_tensors"] == ["head.bias", "head.weight"]


def test_load_run_models_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="save-model"):
        load_run_models(tmp_path)


def test_save_run_models_rejects_objects(tmp_path):
    with pytest.raises(TypeError):
        save_run_models(tmp_path, {"w": [1, 2]}, {}, {})
    with pytest.raises(ValueError, match="format"):
        save_run_models(tmp_path, {}, {}, {}, fmt="pickle")


# --------------------------------------------------------------------------- peft


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.block = nn.Sequential(nn.Linear(16, 16), nn.ReLU())
        self.fc2 = nn.Linear(16, 12)
        self.head = nn.Linear(12, 5)

    def forward(self, x):
        return self.head(torch.relu(self.fc2(self.block(torch.relu(self.fc1(x))))))


def _lora_model(rank=4, alpha=8.0, targets=("fc1", "block.0", "fc2")):
    torch.manual_seed(1)
    base = MLP()
    model = copy.deepcopy(base)
    apply_lora(model, rank, alpha, list(targets))
    with torch.no_grad():
        for layer in lora_layers(model).values():
            layer.lora_A.normal_(0, 0.5)
            layer.lora_B.normal_(0, 0.5)  # nonzero: the adapter changes the output
        model.head.weight.add_(torch.randn_like(model.head.weight))  # a "trained" head
        model.head.bias.add_(1.0)
    return base, model


def _peft_outputs(base, folder, x):
    peft = pytest.importorskip("peft")
    loaded = peft.PeftModel.from_pretrained(copy.deepcopy(base), str(folder))
    loaded.eval()
    with torch.no_grad():
        return loaded(x)


def test_peft_adapter_matches_pflbench_outputs(tmp_path):
    pytest.importorskip("peft")
    base, model = _lora_model()
    x = torch.randn(7, 6)
    with torch.no_grad():
        expected, plain = model(x), base(x)
    assert not torch.allclose(expected, plain, atol=1e-3)
    export_peft_adapter(
        model,
        tmp_path,
        lora_layers(model),
        rank=4,
        alpha=8.0,
        target_modules=["fc1", "block.0", "fc2"],
        base_model_name="mlp",
    )
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", 4, 8)
    assert config["target_modules"] == ["block.0", "fc1", "fc2"]
    assert config["modules_to_save"] == ["head"]
    from safetensors.torch import load_file

    weights = load_file(tmp_path / "adapter_model.safetensors")
    assert weights["base_model.model.fc1.lora_A.weight"].shape == (4, 6)
    assert weights["base_model.model.fc2.lora_B.weight"].shape == (12, 4)
    assert "base_model.model.head.weight" in weights
    torch.testing.assert_close(_peft_outputs(base, tmp_path, x), expected, atol=1e-5, rtol=0)

    # The comparison can fail: a wrong α in the config, or a missing head, changes the output.
    config["lora_alpha"] = 16
    (tmp_path / "adapter_config.json").write_text(json.dumps(config))
    assert not torch.allclose(_peft_outputs(base, tmp_path, x), expected, atol=1e-3)
    export_peft_adapter(
        model,
        tmp_path,
        lora_layers(model),
        rank=4,
        alpha=8.0,
        target_modules=["fc1", "block.0", "fc2"],
        modules_to_save=[],
    )
    assert not torch.allclose(_peft_outputs(base, tmp_path, x), expected, atol=1e-3)


def test_peft_adapter_active_rank_and_rank_pattern(tmp_path):
    """Only the first active_rank components are exported, scaled α/active_rank; a layer whose
    rank differs goes into peft's rank_pattern; a tensor active_rank (a buffer) works too."""
    pytest.importorskip("peft")
    base, model = _lora_model(rank=6, alpha=3.0)
    layers = lora_layers(model)
    for layer in layers.values():  # active_rank is a buffer (the rank actually used)
        layer.set_active_rank(4)
    layers["fc2"].set_active_rank(2)
    x = torch.randn(5, 6)
    with torch.no_grad():
        expected = model(x)
    export_peft_adapter(model, tmp_path, layers, rank=6, alpha=3.0, target_modules=["fc1", "block.0", "fc2"])
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["rank_pattern"] == {"fc2": 2} and config["lora_alpha"] == 3
    torch.testing.assert_close(_peft_outputs(base, tmp_path, x), expected, atol=1e-5, rtol=0)


def test_peft_adapter_exact_names_when_targets_overmatch(tmp_path):
    """--lora-targets that peft would match more widely are replaced by the exact module names."""
    pytest.importorskip("peft")
    base, model = _lora_model(targets=("fc1",))
    x = torch.randn(3, 6)
    with torch.no_grad():
        expected = model(x)
    export_peft_adapter(model, tmp_path, lora_layers(model), 4, 8.0, target_modules=["fc1", "fc2"])
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert config["target_modules"] == ["fc1"]
    torch.testing.assert_close(_peft_outputs(base, tmp_path, x), expected, atol=1e-5, rtol=0)


def test_peft_adapter_timm_vit(tmp_path):
    """A timm ViT (random weights) with LoRA on qkv/proj/fc2: ``proj`` would also match peft's
    ``patch_embed.proj`` (a Conv2d), so the full names are written; outputs agree."""
    pytest.importorskip("peft")
    timm = pytest.importorskip("timm")
    torch.manual_seed(3)
    base = timm.create_model(
        "vit_tiny_patch16_224",
        pretrained=False,
        img_size=8,
        patch_size=2,
        depth=2,
        embed_dim=32,
        num_heads=2,
        num_classes=10,
    ).eval()
    model = copy.deepcopy(base)
    apply_lora(model, 4, 16.0, ["qkv", "proj", "fc2"])
    with torch.no_grad():
        for layer in lora_layers(model).values():
            layer.lora_B.normal_(0, 0.3)
        model.head.weight.normal_()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        expected = model(x)
        assert not torch.allclose(expected, base(x), atol=1e-3)
    export_peft_adapter(
        model, tmp_path, lora_layers(model), 4, 16.0, ["qkv", "proj", "fc2"], base_model_name="vit_tiny_patch16_224"
    )
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert "blocks.1.attn.proj" in config["target_modules"] and len(config["target_modules"]) == 6
    torch.testing.assert_close(_peft_outputs(base, tmp_path, x), expected, atol=1e-5, rtol=0)


class TwoBranchLoRA(LoRALinear):
    """A layer with an extra branch, as FedSDG's gated layer: exported through delta_weight()."""

    def __init__(self, base, rank, alpha):
        super().__init__(base, rank, alpha)
        self.lora_A_private = nn.Parameter(torch.randn_like(self.lora_A))
        self.lora_B_private = nn.Parameter(torch.randn_like(self.lora_B))

    def adapter(self, x):
        return self.branch(x, self.lora_A, self.lora_B) + 0.3 * self.branch(x, self.lora_A_private, self.lora_B_private)

    def delta_weight(self):
        return self.branch_delta(self.lora_A, self.lora_B) + 0.3 * self.branch_delta(
            self.lora_A_private, self.lora_B_private
        )


def test_peft_adapter_extra_branches(tmp_path):
    pytest.importorskip("peft")
    torch.manual_seed(2)
    base = MLP()
    model = copy.deepcopy(base)
    apply_lora(model, 2, 4.0, ["fc1", "fc2"], layer_class=TwoBranchLoRA)
    with torch.no_grad():
        for layer in lora_layers(model).values():
            layer.lora_B.normal_()
    x = torch.randn(4, 6)
    with torch.no_grad():
        expected = model(x)
    export_peft_adapter(model, tmp_path, lora_layers(model), 2, 4.0, ["fc1", "fc2"])
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 4  # rank 2 + 2, scaling 1
    torch.testing.assert_close(_peft_outputs(base, tmp_path, x), expected, atol=1e-5, rtol=0)


def test_peft_adapter_rejects_disagreeing_alpha(tmp_path):
    _, model = _lora_model()
    with pytest.raises(ValueError, match="alpha"):
        export_peft_adapter(model, tmp_path, lora_layers(model), rank=4, alpha=16.0)
    with pytest.raises(ValueError, match="no LoRA layers"):
        export_peft_adapter(model, tmp_path, {}, rank=4, alpha=8.0)


def test_base_model_state_rebuilds_the_base(tmp_path):
    """The base weights saved from the LoRA model + the adapter reproduce it from a fresh model."""
    pytest.importorskip("peft")
    base, model = _lora_model()
    x = torch.randn(4, 6)
    with torch.no_grad():
        expected = model(x)
    state = base_model_state(model, lora_layers(model))
    assert not any("lora_" in k or ".base." in k for k in state)
    save_run_models(tmp_path, state, {}, {})
    fresh = MLP()  # other random weights
    fresh.load_state_dict(load_run_models(tmp_path)[0])  # strict: exactly the base's names
    assert torch.equal(fresh.fc1.weight, base.fc1.weight)
    export_peft_adapter(model, tmp_path / "adapter", lora_layers(model), 4, 8.0, ["fc1", "block.0", "fc2"])
    torch.testing.assert_close(_peft_outputs(fresh, tmp_path / "adapter", x), expected, atol=1e-5, rtol=0)
