"""Replacement policies: they rank the ways of a set for eviction and store no rows.

A policy maps each slot's bookkeeping (last use step, uses since insertion) to a score; the
lowest score in a set is evicted first. Empty slots score lowest, and slots used in the
current step score highest and are never evicted (victims are never keys of the current batch).
"""

from __future__ import annotations

import torch

EMPTY = -1  # what an empty slot stores; a slot is empty by the cache's held mark (any int64 is a key)
PROTECTED = torch.iinfo(torch.int64).max


class LRU:
    """Evict the row whose last use is oldest."""

    name = "lru"

    @staticmethod
    def score(last_use: torch.Tensor, uses: torch.Tensor) -> torch.Tensor:
        return last_use.clone()


class LFU:
    """Evict the row used in the fewest steps since it was inserted; ties go to the least
    recently used. Scores pack ``(uses, last_use)`` into one int64: uses below 2^29, last_use
    below 2^32, so every score is below 2^62 (the cache ranks its lookahead window above)."""

    name = "lfu"

    @staticmethod
    def score(last_use: torch.Tensor, uses: torch.Tensor) -> torch.Tensor:
        return (uses.clamp(max=(1 << 29) - 1) << 32) | last_use


POLICIES = {"lru": LRU, "lfu": LFU}
