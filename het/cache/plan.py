"""What one step of a worker cache passes around: a lookup's plan, and the rows bound for the PS."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Rows:
    """Rows bound for the PS: keys, summed gradients and update counts, and under a local rule
    that follows Adagrad the sums of the steps' squared gradients (het.ps.store.optim.Pushed).
    Shape: keys (n,), grads (n, D), counts (n,), sq (n, 1) or (n, D)."""

    keys: torch.Tensor
    grads: torch.Tensor
    counts: torch.Tensor
    sq: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.keys.numel()

    @staticmethod
    def cat(parts: list["Rows"]) -> "Rows":
        """The parts one after the other; one part is itself (no copy)."""
        if len(parts) == 1:
            return parts[0]
        sq = None if any(p.sq is None for p in parts) else torch.cat([p.sq for p in parts])
        return Rows(torch.cat([p.keys for p in parts]), torch.cat([p.grads for p in parts]),
                    torch.cat([p.counts for p in parts]), sq)


@dataclass
class Plan:
    """What a lookup decided for the unique keys of one step.

    ``slot[i]`` is the slot of ``keys[i]`` or -1 when the key bypasses the cache; ``clocks[i]``
    is what to sync (``c_s`` of a hit, -1 for a miss); ``writeback`` holds the evicted rows
    that carried unpushed updates. Shape: keys, slot, hit, clocks (n,).
    """

    keys: torch.Tensor
    slot: torch.Tensor
    hit: torch.Tensor
    clocks: torch.Tensor
    writeback: Rows
