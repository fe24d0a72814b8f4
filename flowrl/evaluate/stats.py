"""The statistics of an honest eval: a rate's interval, a paired test and a paired difference's interval.

Pure Python plus numpy, so any tool can recompute an eval's figures without the training extras.

- `wilson_interval`: the Wilson score interval of a success rate (sound at 0/n and n/n, unlike the normal
  approximation, which collapses to a zero-width interval there).
- `mcnemar_exact`: McNemar's exact test on paired outcomes: under "both arms are equally good" each discordant
  task (right in one arm only) is a fair coin, so the two-sided p is a binomial tail doubled.
- `paired_bootstrap_diff`: the difference of the two success rates on the same tasks, with a percentile
  bootstrap interval from resampling tasks (not outcomes) with replacement, so the pairing is kept.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

Z95 = 1.959964  # the two-sided 95% quantile of the standard normal
N_BOOT = 10_000
SEED = 0


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of `successes` out of `n`; (0.0, 1.0) when n is 0 (nothing is known)."""
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"wilson_interval: need 0 <= successes <= n, got {successes} of {n}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return lo, hi


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar p: 2 * P(X <= min) for X ~ Binomial(only_a + only_b, 1/2), capped at 1.0.

    1.0 when there is no discordant pair (nothing tells the arms apart). Computed with integers, exact
    up to the final division."""
    if only_a < 0 or only_b < 0:
        raise ValueError(f"mcnemar_exact: counts must be >= 0, got {only_a} and {only_b}")
    n = only_a + only_b
    if n == 0:
        return 1.0
    k = min(only_a, only_b)
    tail = sum(math.comb(n, i) for i in range(k + 1))
    return min(1.0, 2 * tail / 2**n)


def paired_bootstrap_diff(
    a: Sequence[bool], b: Sequence[bool], *, n_boot: int = N_BOOT, seed: int = SEED
) -> tuple[float, float, float]:
    """(mean(b) - mean(a), lo, hi): the difference over the same tasks and its 95% percentile bootstrap interval.

    Each resample draws len(a) tasks with replacement and takes the mean of (b - a) over them. The per-task
    difference is -1, 0 or +1, so a resample is fully described by how many of each it drew: that is a
    multinomial draw, which gives the same distribution as drawing task indices at O(n_boot) memory. The
    stream comes from `numpy.random.default_rng(seed)`, so a seed gives the same interval every time."""
    if len(a) != len(b):
        raise ValueError(f"paired_bootstrap_diff: the arms cover {len(a)} and {len(b)} tasks; pair them task by task")
    n = len(a)
    if n == 0:
        raise ValueError("paired_bootstrap_diff: no tasks")
    if n_boot < 1:
        raise ValueError(f"paired_bootstrap_diff: n_boot must be >= 1, got {n_boot}")
    d = np.asarray(b, dtype=np.int64) - np.asarray(a, dtype=np.int64)
    diff = float(d.sum()) / n
    counts = np.array([(d == -1).sum(), (d == 0).sum(), (d == 1).sum()], dtype=np.float64)
    draws = np.random.default_rng(seed).multinomial(n, counts / n, size=n_boot)
    means = (draws[:, 2] - draws[:, 0]) / n
    lo, hi = np.percentile(means, [2.5, 97.5])
    return diff, float(lo), float(hi)


def mcnemar_sample_size(base_rate: float, effect: float = 0.10, alpha: float = 0.05, power: float = 0.80) -> int:
    """Held-out tasks a paired comparison needs to detect a rise of `effect` from `base_rate` with McNemar's test
    at `alpha` with `power` (Connor 1987), the arms' outcomes taken as independent given the task, so the
    discordant share is p0(1 - p1) + p1(1 - p0). At least the tasks an exact test needs for any p below `alpha`:
    log2(2 / alpha) discordant tasks all one way."""
    from statistics import NormalDist

    p0 = min(max(base_rate, 0.0), 1.0 - effect)
    p1 = p0 + effect
    psi = p0 * (1 - p1) + p1 * (1 - p0)  # share of tasks right in one arm only
    z_a, z_b = NormalDist().inv_cdf(1 - alpha / 2), NormalDist().inv_cdf(power)
    n = (z_a * math.sqrt(psi) + z_b * math.sqrt(max(psi - effect**2, 0.0))) ** 2 / effect**2
    return max(math.ceil(n), math.ceil(math.log2(2 / alpha)))
