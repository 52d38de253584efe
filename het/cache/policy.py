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


def rank_in_group(groups: torch.Tensor) -> torch.Tensor:
    """For each element, how many earlier elements share its group.

    Example:
        >>> rank_in_group(torch.tensor([2, 0, 2, 2, 0])).tolist()
        [0, 0, 1, 2, 1]
    """
    if groups.numel() == 0:
        return groups.clone()
    order = torch.sort(groups, stable=True).indices
    sorted_groups = groups[order]
    starts = torch.ones_like(sorted_groups, dtype=torch.bool)
    starts[1:] = sorted_groups[1:] != sorted_groups[:-1]
    pos = torch.arange(groups.numel(), device=groups.device)
    first = torch.cummax(torch.where(starts, pos, torch.zeros_like(pos)), 0).values
    rank = torch.empty_like(pos)
    rank[order] = pos - first
    return rank
