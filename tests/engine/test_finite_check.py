"""The round loop's finiteness check (``federation._all_finite``): a finite sum proves every
entry finite; a sum that overflows from large finite entries falls back to the exact check."""

from __future__ import annotations

import math

import torch

from pflbench.engine.federation import _all_finite


def test_finite_tensors_pass():
    assert _all_finite({"w": torch.randn(5, 3), "b": torch.zeros(3), "empty": torch.zeros(0)})


def test_large_finite_entries_whose_sum_overflows_pass():
    big = torch.full((4,), 3e38)  # each finite (float32 max ≈ 3.4e38), their sum is inf
    assert math.isinf(float(big.sum()))
    assert _all_finite({"w": big, "b": torch.ones(2)})


def test_nan_and_inf_entries_fail():
    for bad in (float("nan"), float("inf"), -float("inf")):
        w = torch.ones(6)
        w[3] = bad
        assert not _all_finite({"b": torch.ones(2), "w": w})
    both = torch.tensor([float("inf"), -float("inf"), 1.0])  # sum NaN
    assert not _all_finite({"w": both})


def test_integer_tensors_are_not_checked():
    assert _all_finite({"steps": torch.tensor([2**62, 2**62]), "w": torch.ones(2)})
