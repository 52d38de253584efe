"""Power-law (Zipf) key streams, the access pattern of embedding tables."""

from __future__ import annotations

import numpy as np


class Zipf:
    """Keys ``0 .. num_keys - 1`` with ``P(rank r) ~ (r + 1) ** -alpha``. Which key holds which rank
    is a seeded permutation fixed at construction, so hot keys are spread over the id space and
    stay the same keys from one sample to the next.

    Example:
        >>> z = Zipf(1000, 1.05, seed=1)
        >>> keys = z.sample(10_000, np.random.default_rng(0))
        >>> keys.dtype, int(keys.min()) >= 0, int(keys.max()) < 1000
        (dtype('int64'), True, True)
        >>> int(np.bincount(keys).argmax()) == int(z.keys_by_rank[0])
        True
    """

    def __init__(self, num_keys: int, alpha: float, seed: int = 0):
        if num_keys <= 0:
            raise ValueError(f"expected num_keys > 0, got {num_keys}")
        if alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {alpha}")
        self.num_keys, self.alpha = num_keys, alpha
        self.cdf = np.cumsum(np.arange(1, num_keys + 1, dtype=np.float64) ** -alpha)
        self.keys_by_rank = np.random.default_rng(seed).permutation(num_keys).astype(np.int64)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` keys. Shape: -> (n,) int64."""
        if n < 0:
            raise ValueError(f"expected n >= 0, got {n}")
        ranks = np.searchsorted(self.cdf, rng.random(n) * self.cdf[-1], side="right")
        return self.keys_by_rank[np.minimum(ranks, self.num_keys - 1)]


def zipf_keys(num_keys: int, alpha: float, n: int, seed: int = 0) -> np.ndarray:
    """``n`` keys of one seeded :class:`Zipf` stream. Shape: -> (n,) int64."""
    return Zipf(num_keys, alpha, seed).sample(n, np.random.default_rng(seed))
