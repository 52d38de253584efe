"""What one step of a worker cache passes around: a lookup's plan, and the rows bound for the PS."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Rows:
    """Rows bound for the PS: keys, summed gradients and update counts, and under a local rule
    that follows Adagrad the sums of the steps' squared gradients (het.ps.server.store.optim.Pushed).
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

    def pieces(self, most: int) -> list["Rows"]:
        """The rows in pieces of at most about ``most`` keys, ordered by key, a key's entries in
        one piece in their order (so each piece is a push as the whole would have been); the
        rows themselves when they fit.

        Example:
            >>> r = Rows(torch.tensor([5, 1, 5, 2]), torch.arange(4.).reshape(4, 1), torch.ones(4, dtype=torch.int64))
            >>> [p.keys.tolist() for p in r.pieces(2)], r.pieces(2)[1].grads.flatten().tolist()
            ([[1, 2], [5, 5]], [0.0, 2.0])
        """
        if len(self) <= most:
            return [self]
        keys, order = torch.sort(self.keys, stable=True)
        starts = torch.ones(len(keys), dtype=torch.bool, device=keys.device)
        starts[1:] = keys[1:] != keys[:-1]
        first = starts.nonzero().flatten()  # where each key's entries begin
        at = torch.searchsorted(first, torch.arange(most, len(keys), most, device=keys.device))
        cuts = torch.unique(torch.cat([first[at[at < len(first)]], torch.tensor([0, len(keys)], device=keys.device)]))
        cuts = cuts.tolist()  # a cut a piece: the entries' first key at or past each multiple of most
        return [self._take(order[a:b]) for a, b in zip(cuts, cuts[1:])]

    def _take(self, idx: torch.Tensor) -> "Rows":
        return Rows(self.keys[idx], self.grads[idx], self.counts[idx], None if self.sq is None else self.sq[idx])


@dataclass
class Plan:
    """What a lookup decided for the unique keys of one step.

    ``slot[i]`` is the slot of ``keys[i]`` or -1 when the key bypasses the cache; ``clocks[i]``
    is what to sync (``c_s`` of a hit, -1 for a miss); ``writeback`` holds the evicted rows
    that carried unpushed updates; ``as_of``, the step whose rows it reads (het.decay).
    Shape: keys, slot, hit, clocks (n,).
    """

    keys: torch.Tensor
    slot: torch.Tensor
    hit: torch.Tensor
    clocks: torch.Tensor
    writeback: Rows
    as_of: int = 0
