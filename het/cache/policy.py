"""Replacement policies: they rank the ways of a set for eviction and store no rows.

A policy maps each slot's bookkeeping (last use step, uses since insertion) to a score; the
lowest score in a set is evicted first. Empty slots score lowest, and slots used in the
current step score highest and are never evicted (victims are never keys of the current batch).
"""

from __future__ import annotations

import torch

EMPTY = -1
PROTECTED = torch.iinfo(torch.int64).max


class LRU:
    """Evict the row whose last use is oldest."""

    name = "lru"

    @staticmethod
    def score(last_use: torch.Tensor, uses: torch.Tensor) -> torch.Tensor:
        return last_use.clone()


class LFU:
    """Evict the row used in the fewest steps since it was inserted; ties go to the least
    recently used. Scores pack ``(uses, last_use)`` into one int64, both below 2^31."""

    name = "lfu"

    @staticmethod
    def score(last_use: torch.Tensor, uses: torch.Tensor) -> torch.Tensor:
        return (uses.clamp(max=(1 << 31) - 1) << 32) | last_use


POLICIES = {"lru": LRU, "lfu": LFU}
