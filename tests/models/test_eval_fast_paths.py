"""The zoo's evaluation fast paths (no gradient recorded: ReLU in place, 2×2 max-pool as the
maximum of four strided grids) give the training path's outputs bit for bit."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pflbench.models.zoo import _max_pool, build_model


@pytest.mark.parametrize("name", ["mlp", "cnn", "lenet", "cnn_bn"])
@pytest.mark.parametrize("shape", [(1, 8, 8), (1, 28, 28), (3, 32, 32), (1, 14, 14)])
def test_no_grad_outputs_equal_the_grad_path(name: str, shape: tuple[int, int, int]) -> None:
    torch.manual_seed(0)
    model = build_model(name, shape, 10)
    for module in model.modules():  # trained-looking BatchNorm statistics
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.running_mean.uniform_(-1, 1)
            module.running_var.uniform_(0.5, 2)
    model.eval()
    inputs = torch.randn(37, *shape)
    with torch.enable_grad():
        expected = model(inputs).detach()
    with torch.no_grad():
        fast = model(inputs)
    assert torch.equal(fast, expected)


def test_max_pool_by_hand_ties_nan_and_odd_sizes() -> None:
    pool = nn.MaxPool2d(2, 2, ceil_mode=True)
    x = torch.tensor(
        [[[[1.0, 5.0, 0.0, 0.0], [2.0, 3.0, 0.0, float("nan")], [-1.0, -2.0, 7.0, 7.0], [-3.0, -4.0, 7.0, 6.0]]]]
    )
    with torch.no_grad():
        fast = _max_pool(pool, x)
        assert fast[0, 0, 0, 0] == 5 and fast[0, 0, 1, 0] == -1 and fast[0, 0, 1, 1] == 7
        assert torch.isnan(fast[0, 0, 0, 1])
        assert torch.equal(fast.nan_to_num(), pool(x).nan_to_num())
        odd = torch.randn(2, 3, 7, 7)  # odd sizes: torch's pool itself (ceil_mode pads)
        assert torch.equal(_max_pool(pool, odd), pool(odd)) and _max_pool(pool, odd).shape == (2, 3, 4, 4)
