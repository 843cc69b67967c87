"""Statistics over seeds as pure functions: spread, confidence intervals, paired tests, ranks.

Everything here works on plain sequences of floats and needs no SciPy: Student's t
distribution is evaluated with the closed form for integer degrees of freedom (seed counts make
the degrees of freedom an integer), and the Wilcoxon signed-rank test uses its exact null
distribution (all 2^n sign assignments, counted by dynamic programming over rank sums).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from pflbench.util.seed_stats import mean, sample_std  # the one definition, shared with sweeps.tune

TESTS = ("ttest", "wilcoxon", "none")
INTERVALS = ("std", "ci95")


def t_two_sided_p(t: float, df: int) -> float:
    """P(|T| ≥ |t|) for Student's t with integer ``df`` ≥ 1 (Abramowitz & Stegun 26.7.3–4).

    With θ = atan(|t|/√df): for odd df, P(|T| < t) = (2/π)(θ + sinθ·Σ_k c_k cos^(2k+1)θ),
    c_0 = 1, c_k = c_(k−1)·2k/(2k+1), k < (df−1)/2; for even df, P(|T| < t) =
    sinθ·Σ_k d_k cos^(2k)θ, d_0 = 1, d_k = d_(k−1)·(2k−1)/(2k), k < df/2.
    """
    if df < 1:
        raise ValueError("degrees of freedom must be ≥ 1")
    if math.isnan(t):
        return math.nan
    if math.isinf(t):
        return 0.0
    theta = math.atan(abs(t) / math.sqrt(df))
    sin, cos = math.sin(theta), math.cos(theta)
    if df % 2:
        series, term = 0.0, cos
        for k in range((df - 1) // 2):
            series += term
            term *= cos * cos * (2 * k + 2) / (2 * k + 3)
        inside = 2 / math.pi * (theta + sin * series) if df > 1 else 2 * theta / math.pi
    else:
        series, term = 0.0, 1.0
        for k in range(df // 2):
            series += term
            term *= cos * cos * (2 * k + 1) / (2 * k + 2)
        inside = sin * series
    return min(1.0, max(0.0, 1.0 - inside))


def t_quantile(probability: float, df: int) -> float:
    """The upper quantile t with P(T ≤ t) = ``probability`` (> 0.5), by bisection."""
    target = 2 * (1 - probability)  # two-sided tail mass beyond t
    low, high = 0.0, 1.0
    while t_two_sided_p(high, df) > target:
        high *= 2
    for _ in range(200):
        middle = (low + high) / 2
        low, high = (middle, high) if t_two_sided_p(middle, df) > target else (low, middle)
    return (low + high) / 2


def spread(values: Sequence[float], interval: str = "std") -> float | None:
    """The ± part of a cell: the sample std, or the half-width of the t-based 95% confidence
    interval of the mean, t_(0.975, n−1)·s/√n. None for n < 2."""
    std = sample_std(values)
    if std is None:
        return None
    if interval == "std":
        return std
    if interval == "ci95":
        return t_quantile(0.975, len(values) - 1) * std / math.sqrt(len(values))
    raise ValueError(f"interval must be one of {INTERVALS}")


def paired_t_test(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """(t, two-sided p) of the paired t-test on d = a − b: t = d̄ / (s_d/√n), df = n − 1.

    Constant differences: t = 0, p = 1 when they are all zero, else t = ±inf, p = 0."""
    differences = [x - y for x, y in zip(a, b, strict=True)]
    n = len(differences)
    if n < 2:
        raise ValueError("a paired test needs at least 2 pairs")
    centre = mean(differences)
    std = sample_std(differences) or 0.0
    if std <= 1e-12 * max(1.0, abs(centre)):
        if abs(centre) <= 1e-12:
            return 0.0, 1.0
        return math.copysign(math.inf, centre), 0.0
    t = centre / (std / math.sqrt(n))
    return t, t_two_sided_p(t, n - 1)


def average_ranks(values: Sequence[float], higher_is_better: bool = True) -> list[float]:
    """Rank 1 = best; tied values share the mean of the ranks they span (1, 2.5, 2.5, 4)."""
    order = sorted(range(len(values)), key=lambda i: -values[i] if higher_is_better else values[i])
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for position in range(start, end + 1):
            ranks[order[position]] = (start + end) / 2 + 1
        start = end + 1
    return ranks


def wilcoxon_signed_rank(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """(W+, exact two-sided p) of the Wilcoxon signed-rank test on d = a − b.

    Zero differences are dropped (Wilcoxon's convention); tied |d| get average ranks. W+ is the
    rank sum of the positive differences; p = min(1, 2·min(P(W ≤ W+), P(W ≥ W+))) under the null
    where each rank's sign is + or − with probability 1/2. All differences zero: p = 1."""
    differences = [x - y for x, y in zip(a, b, strict=True)]
    if len(differences) < 2:
        raise ValueError("a paired test needs at least 2 pairs")
    nonzero = [d for d in differences if d != 0]
    if not nonzero:
        return 0.0, 1.0
    ranks = average_ranks([abs(d) for d in nonzero], higher_is_better=False)
    doubled = [round(2 * r) for r in ranks]  # average ranks are multiples of 1/2
    w_plus = sum(r for r, d in zip(doubled, nonzero) if d > 0)
    counts = {0: 1}  # rank sum (doubled) → number of sign assignments reaching it
    for rank in doubled:
        grown: dict[int, int] = dict(counts)
        for total, count in counts.items():
            grown[total + rank] = grown.get(total + rank, 0) + count
        counts = grown
    assignments = 2 ** len(nonzero)
    lower = sum(c for s, c in counts.items() if s <= w_plus) / assignments
    upper = sum(c for s, c in counts.items() if s >= w_plus) / assignments
    return w_plus / 2, min(1.0, 2 * min(lower, upper))


def paired_p_value(best: Mapping[int, float], other: Mapping[int, float], test: str) -> tuple[float | None, int]:
    """(two-sided p, pairs) of ``test`` over the seeds both mappings (seed → value) have;
    p is None when fewer than 2 seeds pair up or ``test`` is ``none``."""
    seeds = sorted(set(best) & set(other))
    if test == "none" or len(seeds) < 2:
        return None, len(seeds)
    a, b = [best[s] for s in seeds], [other[s] for s in seeds]
    if test not in ("ttest", "wilcoxon"):
        raise ValueError(f"test must be one of {TESTS}")
    if not all(math.isfinite(x - y) for x, y in zip(a, b)):
        return None, len(seeds)
    p = (paired_t_test if test == "ttest" else wilcoxon_signed_rank)(a, b)[1]
    return (p if math.isfinite(p) else None), len(seeds)
