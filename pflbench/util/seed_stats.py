"""Mean and spread over seeds: the one definition of the std that every report shares.

``pflbench.report`` (leaderboard, tables) and ``pflbench.sweeps.tune`` (the study record and its
printed line) both show "mean ± std over seeds"; they sit side by side in the import layers
and may not import each other, so the definition lives here, below both. The std is the
sample std (n − 1 in the denominator): the seeds are a sample of the runs one could have made.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def sample_std(values: Sequence[float]) -> float | None:
    """s = sqrt(Σ(x − x̄)² / (n − 1)); None for n < 2."""
    if len(values) < 2:
        return None
    centre = mean(values)
    return math.sqrt(sum((v - centre) * (v - centre) for v in values) / (len(values) - 1))  # inf, not OverflowError
