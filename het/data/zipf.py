"""Power-law (Zipf) key streams, the access pattern of embedding tables."""

from __future__ import annotations

import numpy as np


def zipf_keys(num_keys: int, alpha: float, n: int, seed: int = 0) -> np.ndarray:
    """``n`` keys from ``0 .. num_keys - 1`` with ``P(rank r) ~ (r + 1) ** -alpha``; which key has
    which rank is a seeded random permutation, so hot keys are spread over the id space.

    Shape: -> (n,) int64.

    Example:
        >>> keys = zipf_keys(1000, 1.05, 10_000, seed=1)
        >>> keys.dtype, int(keys.min()) >= 0, int(keys.max()) < 1000
        (dtype('int64'), True, True)
    """
    if num_keys <= 0 or n < 0:
        raise ValueError(f"expected num_keys > 0 and n >= 0, got num_keys={num_keys}, n={n}")
    if alpha < 0:
        raise ValueError(f"alpha must be >= 0, got {alpha}")
    rng = np.random.default_rng(seed)
    cdf = np.cumsum(np.arange(1, num_keys + 1, dtype=np.float64) ** -alpha)
    ranks = np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right")
    ranks = np.minimum(ranks, num_keys - 1)
    return rng.permutation(num_keys).astype(np.int64)[ranks]
