"""The pretrained-backbone cache key counts the CPU thread count (issue 25): 1 and 2 threads
pretrain different weights, so one must not be reused for the other."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from pflbench.config.run_config import RunConfig
from pflbench.data.dataset import load_dataset
from pflbench.models.pretrain import backbone_key, backbone_path


def test_the_backbone_cache_key_counts_cpu_threads_only_on_the_cpu() -> None:
    dataset = load_dataset("digits")
    public = np.arange(50)
    one = RunConfig(dataset="digits", model="vit_tiny_patch16_224", threads=1)
    two = dataclasses.replace(one, threads=2)
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    key_one, key_two = backbone_key(one, dataset, public, cpu), backbone_key(two, dataset, public, cpu)
    assert key_one["threads"] == 1 and key_two["threads"] == 2
    assert backbone_path(one, key_one) != backbone_path(two, key_two)
    assert backbone_key(one, dataset, public, gpu) == backbone_key(two, dataset, public, gpu)
