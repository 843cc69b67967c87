"""Evaluation of personal models that differ only in a head: the shared body runs once.

When every client's evaluation model holds the same tensors (the same objects) except in the
last layers — FedPer, FedRep, LG-style private heads — the body's output is computed once for
every test sample (in large batches, all clients together) and each client's head is applied to
its own samples: one pass over the test data plus K small head passes, instead of loading and
running K whole models. Models must declare their stages (zoo models, ``LayeredModel.stages``);
for others, or when the varying tensors are not a head, evaluation stays per client.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ..models import body_stages
from .types import Tensors, load_into


@dataclass
class HeadSplit:
    """The tensors all clients share, each client's own (head) tensors, and the body's length."""

    common: Tensors
    heads: list[Tensors]
    body: int


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
    if body is None:
        return None
    common = {n: t for n, t in states[0].items() if n not in set(varying)}
    return HeadSplit(common, [{n: state[n] for n in varying} for state in states], body)


@torch.no_grad()
def evaluate_heads(model: nn.Module, tensors: Tensors, data, split: HeadSplit,
                   batch: int = 256) -> np.ndarray:
    """Correct test predictions of each client (in client order) under ``split``; ``tensors``
    are ``model``'s live tensors (loaded in place)."""
    model.eval()
    load_into(tensors, split.common)
    everyone = torch.cat(data.test_indices)
    features, targets = [], []
    for start in range(0, len(everyone), batch):
        inputs, labels = data.gather(everyone[start:start + batch])
        features.append(model.run_stages(inputs, 0, split.body))
        targets.append(labels)
    body_output, labels = torch.cat(features), torch.cat(targets)
    correct = np.zeros(len(split.heads), dtype=np.int64)
    offset = 0
    for k, head in enumerate(split.heads):
        count = data.num_test[k]
        load_into(tensors, head)
        logits = model.run_stages(body_output[offset:offset + count], split.body)
        correct[k] = int((logits.argmax(dim=1) == labels[offset:offset + count]).sum())
        offset += count
    return correct
