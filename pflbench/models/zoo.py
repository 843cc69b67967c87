"""The model zoo (``mlp``, ``cnn``, ``lenet``, ``cnn_bn``, ``char_lstm``), timm models by name, and the body/head split.

Every model declares its layer order from input to output (``layer_names``); the head is the
last ``head_layers`` of them (the final classifier by default), so FedPer/FedRep never guess
from parameter names. timm models get the same declaration from their module tree.
"""

from __future__ import annotations

import hashlib
import io
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pflbench.errors import ConfigError
from pflbench.registry import MODELS, register_model
from pflbench.util.cache import verified


class LayeredModel(nn.Module):
    """Base for zoo models: ``layer_names`` lists the parametrised layers, input → output.

    ``stages()`` gives one function per layer (the layer and what follows it up to the next one),
    so that ``forward`` is their composition and the model splits into a body (the first stages)
    and a head (the rest): ``run_stages(x, 0, s)`` then ``run_stages(features, s)``. Evaluation of
    personal heads uses this to run the shared body once for every client's samples."""

    layer_names: tuple[str, ...] = ()

    def stages(self) -> tuple[Callable[[torch.Tensor], torch.Tensor], ...]:
        raise NotImplementedError

    def run_stages(self, x: torch.Tensor, start: int = 0, stop: int | None = None) -> torch.Tensor:
        for stage in self.stages()[start:stop]:
            x = stage(x)
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.run_stages(x)


def _conv_padding(height: int) -> int:
    # Valid 5×5 convolutions as in the papers for CIFAR-sized inputs; "same" padding keeps
    # small images (8×8 digits) from shrinking to nothing.
    return 0 if height >= 20 else 2


def _pooled_size(size: int, padding: int) -> int:
    for _ in range(2):
        size = (size + 2 * padding - 4) // 2
    return size


def _relu(x: torch.Tensor) -> torch.Tensor:
    """ReLU of a layer's fresh output; in place when no gradient is recorded (evaluation), where
    allocating a new activation costs more than the ReLU itself (the same values either way)."""
    return torch.relu(x) if torch.is_grad_enabled() else torch.relu_(x)


def _max_pool(pool: nn.MaxPool2d, x: torch.Tensor) -> torch.Tensor:
    """``pool(x)`` for the zoo's 2×2, stride-2 pools. Without gradients on the CPU, for even
    height and width, the maximum of the four strided quarter grids: the same values (max is
    exact, NaN propagates as in max_pool2d), about 7× faster than torch's NCHW max_pool2d
    kernel, which set most of ``cnn_bn``'s evaluation time. With gradients, ``pool`` itself:
    its backward sends a tied window's gradient to the first maximum, ``torch.maximum`` splits it."""
    if torch.is_grad_enabled() or x.device.type != "cpu" or x.dim() != 4 or x.shape[-1] % 2 or x.shape[-2] % 2:
        return pool(x)
    top = torch.maximum(x[..., ::2, ::2], x[..., ::2, 1::2])
    return torch.maximum(top, torch.maximum(x[..., 1::2, ::2], x[..., 1::2, 1::2]))


@register_model("mlp")
class MLP(LayeredModel):
    """FedAvg's 2NN: flatten → 200 → 200 → classes, ReLU."""

    layer_names = ("fc1", "fc2", "fc3")

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, hidden: int = 200) -> None:
        super().__init__()
        self.fc1 = nn.Linear(math.prod(input_shape), hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, num_classes)

    def stages(self) -> tuple[Callable[[torch.Tensor], torch.Tensor], ...]:
        return (lambda x: _relu(self.fc1(x.flatten(1))), lambda x: _relu(self.fc2(x)), self.fc3)


class _TwoConvNet(LayeredModel):
    """conv5 → pool → conv5 → pool → fc → fc → fc (classifier), ReLU."""

    layer_names = ("conv1", "conv2", "fc1", "fc2", "fc3")

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, widths: tuple[int, int, int, int]) -> None:
        super().__init__()
        channels, height, width = input_shape
        padding = _conv_padding(min(height, width))
        c1, c2, f1, f2 = widths
        self.conv1 = nn.Conv2d(channels, c1, 5, padding=padding)
        self.conv2 = nn.Conv2d(c1, c2, 5, padding=padding)
        self.pool = nn.MaxPool2d(2, 2)
        flat = c2 * _pooled_size(height, padding) * _pooled_size(width, padding)
        if flat <= 0:
            raise ConfigError(f"input {height}×{width} is too small for this CNN (need ≥ 4×4)")
        self.fc1 = nn.Linear(flat, f1)
        self.fc2 = nn.Linear(f1, f2)
        self.fc3 = nn.Linear(f2, num_classes)

    def stages(self) -> tuple[Callable[[torch.Tensor], torch.Tensor], ...]:
        return (
            lambda x: _max_pool(self.pool, _relu(self.conv1(x))),
            lambda x: _max_pool(self.pool, _relu(self.conv2(x))).flatten(1),
            lambda x: _relu(self.fc1(x)),
            lambda x: _relu(self.fc2(x)),
            self.fc3,
        )


@register_model("cnn")
class CNN(_TwoConvNet):
    """FedRep's CIFAR CNN: conv 64 → conv 128 → fc 256 → fc 128 → classes (5×5 kernels)."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__(input_shape, num_classes, (64, 128, 256, 128))


@register_model("lenet")
class LeNet(_TwoConvNet):
    """LeNet-5: conv 6 → conv 16 → fc 120 → fc 84 → classes."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__(input_shape, num_classes, (6, 16, 120, 84))


@register_model("cnn_bn")
class BatchNormCNN(LayeredModel):
    """Small CNN with BatchNorm: conv3 32-BN → pool → conv3 64-BN → pool → fc 128-BN → classes."""

    layer_names = ("conv1", "bn1", "conv2", "bn2", "fc1", "bn3", "fc2")

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, width: int = 32) -> None:
        super().__init__()
        if len(input_shape) != 3:
            raise ConfigError(f"cnn_bn needs image inputs, the data has shape {input_shape}")
        channels, height, width_px = input_shape
        self.conv1, self.bn1 = nn.Conv2d(channels, width, 3, padding=1), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width)
        self.pool = nn.MaxPool2d(2, 2, ceil_mode=True)
        flat = 2 * width * math.ceil(height / 4) * math.ceil(width_px / 4)
        self.fc1, self.bn3 = nn.Linear(flat, 128), nn.BatchNorm1d(128)
        self.fc2 = nn.Linear(128, num_classes)

    def stages(self) -> tuple[Callable[[torch.Tensor], torch.Tensor], ...]:
        return (
            self.conv1,
            lambda x: _max_pool(self.pool, _relu(self.bn1(x))),
            self.conv2,
            lambda x: _max_pool(self.pool, _relu(self.bn2(x))).flatten(1),
            self.fc1,
            lambda x: _relu(self.bn3(x)),
            self.fc2,
        )


@register_model("char_lstm")
class CharLSTM(LayeredModel):
    """Next-character LSTM (LEAF's Shakespeare model): embed 8 → 2× LSTM 256 → classes.

    Takes token ids [B, L] (floats holding integers are fine) and predicts the next token
    from the last position. The vocabulary is the label set (``vocab_size`` overrides). On a
    CPU, ``--model-option hidden=64`` trains about 10× faster.
    """

    layer_names = ("embedding", "lstm", "fc")

    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_classes: int,
        hidden: int = 256,
        layers: int = 2,
        embed_dim: int = 8,
        vocab_size: int | None = None,
    ) -> None:
        super().__init__()
        if len(input_shape) != 1:
            raise ConfigError(f"char_lstm needs token sequences [L], the data has shape {input_shape}")
        self.embedding = nn.Embedding(vocab_size or num_classes, embed_dim)
        self.lstm = nn.LSTM(embed_dim, hidden, num_layers=layers, batch_first=True)
        self.fc = nn.Linear(hidden, num_classes)

    def stages(self) -> tuple[Callable[[torch.Tensor], torch.Tensor], ...]:
        return (lambda x: self.embedding(x.long()), lambda x: self.lstm(x)[0][:, -1], self.fc)


def vit_patch_size(height: int, width: int) -> int:
    """Smallest patch size dividing both sides with a grid side ≤ min(14, max(4, side // 4)).

    8×8 → 2 (4×4 tokens), 28×28 → 4 (7×7), 32×32 → 4 (8×8), 64×64 → 8, 224×224 → 16 (14×14).
    """
    side = min(height, width)
    limit = min(14, max(4, side // 4))
    return next(p for p in range(1, side + 1) if height % p == 0 and width % p == 0 and side // p <= limit)


def check_model_name(name: str) -> None:
    """ConfigError for a name that is neither a zoo model nor a timm model: checked before any
    data is prepared, so an unknown model fails first."""
    if name in MODELS.items:
        return
    import timm

    if not timm.is_model(name):
        raise ConfigError(
            f"unknown model {name!r}; valid choices: {', '.join(MODELS.names())} "
            "or a timm model name (see timm.list_models())"
        )


def build_model(
    name: str, input_shape: tuple[int, ...], num_classes: int, pretrained: bool = False, **options: Any
) -> nn.Module:
    """A zoo model, or any timm model name, adapted to ``input_shape`` and ``num_classes``.

    ``options`` go to the model's constructor (``--model-option``); timm ViTs (``vit_*``) also
    get a patch size that gives small images a sensible token grid (``vit_patch_size``).
    ``pretrained`` loads timm's hub weights; failing to reach them is an error, never a
    silent random init.
    """
    if name in MODELS.items:
        if pretrained:
            raise ConfigError(
                f"--pretrained: zoo model {name!r} has no hub weights; use a timm model "
                "name, --weights FILE, or --backbone public"
            )
        try:
            return MODELS.get(name)(input_shape, num_classes, **options)
        except ConfigError:
            raise
        except (TypeError, ValueError, RuntimeError, AssertionError, ZeroDivisionError) as error:
            raise _model_option_error(name, options, error) from error
    import timm

    check_model_name(name)
    if len(input_shape) != 3:
        raise ConfigError(f"timm model {name!r} needs image inputs, the data has shape {input_shape}")
    channels, height, width = input_shape
    if name.startswith("vit_"):
        options.setdefault("patch_size", vit_patch_size(height, width))
    kwargs = dict(pretrained=pretrained, num_classes=num_classes, in_chans=channels, **options)
    try:
        try:  # ViTs and friends take the image size; CNNs adapt by global pooling
            return timm.create_model(name, img_size=height, **kwargs)
        except TypeError:
            return timm.create_model(name, **kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError, AssertionError, ZeroDivisionError) as error:
        raise _model_option_error(name, options, error) from error
    except (OSError, RuntimeError) as error:
        if not pretrained:
            if isinstance(error, RuntimeError):
                raise _model_option_error(name, options, error) from error
            raise
        raise ConfigError(
            f"--pretrained: could not load timm hub weights for {name!r} ({type(error).__name__}); "
            "offline, pretrain a backbone on a public fraction of the data instead "
            "(`pflbench pretrain`, or run with --backbone public --public-frac 0.2) or pass "
            "--weights FILE"
        ) from error


def _model_option_error(name: str, options: dict[str, Any], error: BaseException) -> ConfigError:
    """A model constructor's failure on its options, as one usage error naming them."""
    given = " ".join(f"{k}={v}" for k, v in options.items() if k != "patch_size") or "none"
    reason = " ".join(str(error).split())[:200] or type(error).__name__
    return ConfigError(f"--model-option for model {name!r} (given: {given}) does not build a model: {reason}")


def load_weights(model: nn.Module, path: str | Path, content: bytes | None = None) -> dict[str, Any]:
    """Load a state dict file (raw, or ``{"state_dict": ..., "meta": ...}``) into ``model``.

    Every tensor must fit, except the classifier head: one of another shape is skipped and a
    file without one (a backbone) is fine; the model then keeps its fresh head. Returns what was
    done: ``head`` ("loaded" or why it is fresh), ``sha256`` of the file and the file's ``meta``.
    ``content``: the file's bytes held in memory (a backbone whose cache file could not be
    written); ``path`` then only names it in messages.
    """
    path = Path(path)
    if content is None and not path.is_file():
        raise ConfigError(f"--weights {str(path)!r} is not a file")
    try:
        saved = torch.load(io.BytesIO(content) if content is not None else path, map_location="cpu", weights_only=True)
    except Exception as error:  # any unreadable file is bad user input here
        raise ConfigError(f"--weights {str(path)!r} is not a readable state dict: {error}") from error
    if not isinstance(saved, dict):
        raise ConfigError(f"--weights {str(path)!r} holds a {type(saved).__name__}, not a state dict")
    meta = saved.get("meta", {}) if "state_dict" in saved else {}
    state = dict(saved.get("state_dict", saved))
    if isinstance(meta, dict) and "sha256" in meta and not verified(state, meta):
        raise ConfigError(f"--weights {str(path)!r} is corrupted: its content hash does not match")
    own = model.state_dict()
    head = head_parameter_names(model)
    skipped = [n for n in head if n in state and n in own and state[n].shape != own[n].shape]
    for name in skipped:
        state.pop(name)
    missing = [n for n in own if n not in state and n not in head]
    unexpected = [n for n in state if n not in own]
    wrong = [n for n in state if n in own and state[n].shape != own[n].shape]
    if missing or unexpected or wrong:
        raise ConfigError(
            f"--weights {str(path)!r} does not fit this model (same --model and --model-option?): "
            f"missing {missing[:3]}, unexpected {unexpected[:3]}, shape mismatch {wrong[:3]}"
        )
    model.load_state_dict(state, strict=False)
    if skipped:
        head_note = f"skipped {skipped} (shape differs from this model's): freshly initialised"
    else:
        in_file = all(n in state for n in head if n in own)
        head_note = "loaded" if in_file else "not in the file: freshly initialised"
    digest = hashlib.sha256(content if content is not None else path.read_bytes()).hexdigest()
    return {"head": head_note, "sha256": digest, "meta": meta}


def layer_order(model: nn.Module) -> list[str]:
    """Names of the parametrised layers from input to output.

    Zoo models declare ``layer_names``; for other models the top-level children that hold
    parameters are used, with Sequential/ModuleList containers (ViT blocks, ResNet stages)
    expanded one level.
    """
    declared = getattr(model, "layer_names", None)
    if declared:
        return list(declared)
    names = []
    for name, child in model.named_children():
        if not any(True for _ in child.parameters()):
            continue
        if isinstance(child, (nn.Sequential, nn.ModuleList)):
            names += [
                f"{name}.{sub}"
                for sub, grandchild in child.named_children()
                if any(True for _ in grandchild.parameters())
            ]
        else:
            names.append(name)
    return names


def body_stages(model: nn.Module, varying: set[str] | list[str]) -> int | None:
    """How many stages form a body shared by models that differ only in the tensors ``varying``:
    the index of the first layer holding one of them (all later layers are the head). None when
    the model cannot be split (no ``stages``, a name outside the declared layers, or nothing
    would be shared)."""
    if not isinstance(model, LayeredModel) or type(model).stages is LayeredModel.stages:
        return None
    order = list(model.layer_names)
    if len(model.stages()) != len(order):
        return None
    first = len(order)
    for name in varying:
        layer = next((i for i, prefix in enumerate(order) if name.startswith(prefix + ".")), None)
        if layer is None:
            return None
        first = min(first, layer)
    return first if first > 0 else None


def head_module_names(model: nn.Module, head_layers: int = 1) -> list[str]:
    """The modules forming the head: the last ``head_layers`` layers of ``layer_order``."""
    order = layer_order(model)
    if not 1 <= head_layers < len(order):
        raise ConfigError(
            f"--head-layers {head_layers} must be in [1, {len(order) - 1}] for this model (layers: {', '.join(order)})"
        )
    return order[-head_layers:]


def final_linear_layer(model: nn.Module, algo: str) -> tuple[str, nn.Linear]:
    """The model's final layer (its name and module), which ``algo`` needs to be an ``nn.Linear``
    (it reads or replaces the classifier's input or weights); ConfigError naming both otherwise."""
    name = head_module_names(model, 1)[0]
    head = model.get_submodule(name)
    if type(head) is not nn.Linear:
        raise ConfigError(f"{algo} needs a linear final layer, {name!r} is a {type(head).__name__}")
    return name, head


def head_parameter_names(model: nn.Module, head_layers: int = 1) -> set[str]:
    """Parameter (and buffer) names under the head modules."""
    prefixes = tuple(f"{name}." for name in head_module_names(model, head_layers))
    names = [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers()]
    return {name for name in names if name.startswith(prefixes)}
