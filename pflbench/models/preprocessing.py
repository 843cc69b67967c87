"""A saved model's input contract: how raw dataset inputs become model inputs, and what its
outputs mean (``InputTransform``).

The engine normalises every batch on the device (``data.dataset.FederatedData.gather``):

* images (uint8 [N, C, H, W]): ``x = (inputs.float() / 255 − mean) / std``, mean/std per channel
  (of x/255 over the pooled dataset, ``TensorDataset.channel_stats``);
* float features [N, D]: ``x = (inputs − mean) / std``, per feature;
* integer token ids [N, L]: mean 0 and std 1, so ``x`` is the ids as floats (the model casts
  them back).

``InputTransform`` records exactly the tensors the run used and applies the same operations in
the same order, so the model sees bit-identical inputs. ``to_json`` is what ``models/meta.json``
holds under ``inputs`` (readable without pflbench: ``mean``/``std`` are flat lists to reshape to
``stats_shape``); ``classes`` maps a class index to its name when the dataset has names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

IMAGE, FEATURES, TOKENS = "image", "features", "tokens"
KINDS = (IMAGE, FEATURES, TOKENS)
PIXEL_SCALE = 255  # uint8 images are divided by it (before mean/std), as the engine does


@dataclass(frozen=True)
class InputTransform:
    """Raw inputs ``[N, *input_shape]`` → the model's inputs (see the module docstring)."""

    kind: str  # image | features | tokens
    input_shape: tuple[int, ...]  # one sample, without the batch dimension
    input_dtype: str  # the dataset's dtype: uint8 (images, tokens), float32, int64
    mean: torch.Tensor  # broadcast to [N, *input_shape]: [1, C, 1, 1] for images
    std: torch.Tensor
    classes: tuple[str, ...] | None = None  # class index → name, when the dataset knows names

    def __call__(self, inputs: Any) -> torch.Tensor:
        inputs = torch.as_tensor(inputs)
        if tuple(inputs.shape[1:]) != self.input_shape or inputs.dim() != len(self.input_shape) + 1:
            raise ValueError(
                f"expected raw inputs of shape [N, {', '.join(map(str, self.input_shape))}] "
                f"({self.input_dtype}), got {list(inputs.shape)}"
            )
        mean, std = self.mean.to(inputs.device), self.std.to(inputs.device)
        if self.kind == IMAGE:
            if inputs.is_floating_point():
                raise ValueError(
                    f"expected raw images as integers 0-{PIXEL_SCALE} ({self.input_dtype}), got {inputs.dtype}: "
                    "pass the dataset's pixel values, not already scaled ones"
                )
            return (inputs.float().div_(PIXEL_SCALE) - mean) / std
        if self.kind == FEATURES:
            if not inputs.is_floating_point():
                inputs = inputs.float()
            return (inputs.to(getattr(torch, self.input_dtype)) - mean) / std
        if inputs.is_floating_point():
            raise ValueError(f"expected integer token ids ({self.input_dtype}), got {inputs.dtype}")
        return (inputs - mean) / std  # any integer dtype: the same float32 ids

    @property
    def num_classes(self) -> int | None:
        return None if self.classes is None else len(self.classes)

    def to_json(self) -> dict[str, Any]:
        """The JSON record (``models/meta.json`` → ``inputs``)."""
        formula = {
            IMAGE: f"(inputs.float() / {PIXEL_SCALE} - mean) / std",
            FEATURES: "(inputs - mean) / std",
            TOKENS: "(inputs - mean) / std  (mean 0, std 1: the ids as floats)",
        }[self.kind]
        return {
            "kind": self.kind,
            "input_shape": list(self.input_shape),
            "input_dtype": self.input_dtype,
            "scale": f"1/{PIXEL_SCALE}" if self.kind == IMAGE else None,
            "formula": formula,
            "stats_shape": list(self.mean.shape),
            "mean": self.mean.flatten().tolist(),  # float32 values, exact as JSON doubles
            "std": self.std.flatten().tolist(),
            "classes": None if self.classes is None else list(self.classes),
        }

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> InputTransform:
        shape = [int(n) for n in record["stats_shape"]]
        if record.get("kind") not in KINDS:
            raise ValueError(f"unknown input kind {record.get('kind')!r}; expected one of {', '.join(KINDS)}")
        classes = record.get("classes")
        return cls(
            kind=record["kind"],
            input_shape=tuple(int(n) for n in record["input_shape"]),
            input_dtype=str(record["input_dtype"]),
            mean=torch.tensor(record["mean"], dtype=torch.float32).reshape(shape),
            std=torch.tensor(record["std"], dtype=torch.float32).reshape(shape),
            classes=None if classes is None else tuple(str(c) for c in classes),
        )


def class_names(info: dict[str, Any], num_classes: int) -> tuple[str, ...] | None:
    """Class index → name from a dataset's ``info``: its ``classes``, or a character
    vocabulary (next-character prediction); None when it has neither of ``num_classes`` entries."""
    for key in ("classes", "vocab"):
        names = info.get(key)
        if isinstance(names, (str, Sequence)) and len(names) == num_classes:
            return tuple(str(n) for n in names)
    return None


def input_transform(data: Any, dataset: Any) -> InputTransform:
    """The transform a run applied: ``data`` a ``FederatedData`` (its ``mean``/``std`` on the
    device, exactly what ``gather`` uses), ``dataset`` its ``TensorDataset``."""
    inputs = dataset.inputs
    if data.is_image:
        kind = IMAGE
    elif inputs.is_floating_point():
        kind = FEATURES
    else:
        kind = TOKENS
    return InputTransform(
        kind=kind,
        input_shape=tuple(int(n) for n in dataset.input_shape),
        input_dtype=str(inputs.dtype).removeprefix("torch."),
        mean=data.mean.detach().to("cpu", torch.float32).clone(),
        std=data.std.detach().to("cpu", torch.float32).clone(),
        classes=class_names(dataset.info, dataset.num_classes),
    )
