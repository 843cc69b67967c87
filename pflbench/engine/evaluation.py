"""Evaluation of personal models that differ only in a head: the shared body runs once.

When every client's evaluation model holds the same tensors (the same objects) except in the
last layers — FedPer, FedRep, LG-style private heads — the body's output is computed once for
every test sample (in large batches, all clients together) and each client's head is applied to
its own samples: one pass over the test data plus K small head passes, instead of loading and
running K whole models. Zoo models declare their stages (``LayeredModel.stages``). Other models
(timm) split at the one module holding every varying tensor (e.g. a ViT's ``head``): its input is
captured with a forward pre-hook, and the split is used only if that module is called once and
its output is the model's output, bit for bit, on the first batch. Otherwise, or when the
varying tensors are not a head, evaluation stays per client.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from pflbench.engine.types import Tensors, load_into
from pflbench.models.zoo import body_stages
from pflbench.util.precision import autocast, eval_batch


@dataclass
class HeadSplit:
    """The tensors all clients share, each client's own (head) tensors, and the body's length."""

    common: Tensors
    heads: list[Tensors]
    body: int | None  # stages of a LayeredModel's body; None: split at ``module``
    module: str = ""


def varying_names(states: list[Tensors]) -> list[str] | None:
    """Names whose tensor is not one and the same object in every state (None: the states do
    not even have the same names)."""
    first = states[0]
    if any(state.keys() != first.keys() for state in states[1:]):
        return None
    return [n for n in first if any(state[n] is not first[n] for state in states[1:])]


def head_split(model: nn.Module, states: list[Tensors]) -> HeadSplit | None:
    """A ``HeadSplit`` of the clients' evaluation models, or None when they are not body + head."""
    varying = varying_names(states)
    if not varying:  # None (different names) or [] (one model: evaluated as such elsewhere)
        return None
    body = body_stages(model, varying)
    module = "" if body is not None else head_module(model, varying)
    if body is None and not module:
        return None
    common = {n: t for n, t in states[0].items() if n not in set(varying)}
    return HeadSplit(common, [{n: state[n] for n in varying} for state in states], body, module)


def head_module(model: nn.Module, varying: list[str]) -> str:
    """The deepest proper submodule holding every name of ``varying`` ("" if none)."""
    parts = [name.split(".")[:-1] for name in varying]
    prefix = []
    for level in zip(*parts):
        if any(part != level[0] for part in level):
            break
        prefix.append(level[0])
    while prefix:
        name = ".".join(prefix)
        try:
            model.get_submodule(name)
            return name
        except AttributeError:
            prefix.pop()
    return ""


def _features(model: nn.Module, split: HeadSplit, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The head's input for ``inputs``, and (hook split) the model's output to check it against."""
    if split.body is not None:
        return model.run_stages(inputs, 0, split.body), None
    captured: list[torch.Tensor] = []
    handle = model.get_submodule(split.module).register_forward_pre_hook(
        lambda module, args: captured.append(args[0]) if len(args) == 1 else captured.append(None)
    )
    try:
        output = model(inputs)
    finally:
        handle.remove()
    if len(captured) != 1 or captured[0] is None:
        raise _NoSplit
    return captured[0], output


class _NoSplit(Exception):
    """The model's forward does not end in one call of the head module."""


def _head(model: nn.Module, split: HeadSplit, features: torch.Tensor) -> torch.Tensor:
    if split.body is not None:
        return model.run_stages(features, split.body)
    return model.get_submodule(split.module)(features)


@torch.no_grad()
def evaluate_heads(
    model: nn.Module,
    tensors: Tensors,
    data,
    split: HeadSplit,
    batch: int = 256,
    clients: list[int] | None = None,
    on: str = "test",
    precision: str = "fp32",
) -> np.ndarray | None:
    """Correct predictions of each client of ``clients`` (default: all; ``split.heads[i]`` is
    ``clients[i]``'s head) on its ``on`` split (``test`` or ``val``) under ``split``;
    ``tensors`` are ``model``'s live tensors (loaded in place). None if a hook split turns out
    not to hold. ``batch`` is the CPU's; an accelerator takes a large one (``util.precision``);
    ``precision`` bf16 runs body and heads under autocast."""
    model.eval()
    batch = eval_batch(data.device, batch)
    with autocast(data.device, precision):
        return _evaluate_heads(model, tensors, data, split, batch, clients, on)


def _evaluate_heads(
    model: nn.Module, tensors: Tensors, data, split: HeadSplit, batch: int, clients: list[int] | None, on: str
) -> np.ndarray | None:
    clients = list(range(len(split.heads))) if clients is None else clients
    indices, counts = data.eval_indices(on), data.eval_counts(on)
    load_into(tensors, {**split.common, **split.heads[0]})
    everyone = torch.cat([indices[k] for k in clients])
    features, targets = [], []
    for start in range(0, len(everyone), batch):
        inputs, labels = data.gather(everyone[start : start + batch])
        try:
            head_input, output = _features(model, split, inputs)
        except _NoSplit:
            return None
        if start == 0 and output is not None and not torch.equal(_head(model, split, head_input), output):
            return None  # something follows the head module: not a split
        features.append(head_input)
        targets.append(labels)
    body_output, labels = torch.cat(features), torch.cat(targets)
    correct = []  # on the device until the end: one host sync, not one per client
    offset = 0
    for i, head in enumerate(split.heads):
        count = counts[clients[i]]
        load_into(tensors, head)
        logits = _head(model, split, body_output[offset : offset + count])
        correct.append((logits.argmax(dim=1) == labels[offset : offset + count]).sum(dtype=torch.long))
        offset += count
    return torch.stack(correct).cpu().numpy()
