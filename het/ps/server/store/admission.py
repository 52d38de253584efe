"""Admission to a dynamic table: how many worker-steps pushed each key not yet stored.

A count-min sketch (Cormode and Muthukrishnan) with conservative update: ``depth`` rows of
saturating uint8 counters, a key counted in one counter per row chosen by a mixing hash, its
count the least of them. Memory is fixed whatever the number of keys (``depth * width`` bytes,
4 MiB by default) and reported. Between two halvings (below) a count is never below the truth;
collisions can only raise it, so a key may be admitted early, never late. With about ``m`` keys in the sketch at once, a key
seen once reads as seen twice with probability near ``(1 - exp(-m / width)) ** depth``: 2% at
m = width / 2. Conservative update (raise only the counters that hold the minimum) keeps it
lower. Counts saturate at 255, the largest ``admit_after``.

The sketch ages, as TinyLFU's does: every ``width / 2`` sightings recorded, every counter is
halved. Without it a long run's distinct keys (10^8 of them, most seen once) would fill every
counter and admit keys on their first sighting; with it the counters hold about the last
``width / 2`` sightings, so the early-admission rate stays near the 2% above however long the
run, and a key must gather its ``admit_after`` sightings within about that window (a key seen
that often was never in doubt).

This is DeepRec's counter filter with bounded memory: an exact counter per key would grow
with the number of distinct keys, most of which appear once.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from het.ps.protocol.partition import mix

DEPTH = 4
COUNTERS = 1 << 22  # bytes of one table's sketch on one shard
_SALTS = (0x5851F42D4C957F2D, 0x14057B7EF767814F, 0x2545F4914F6CDD1D, 0x61C8864680B583EB)


class SightingSketch:
    """Saturating counts of int64 keys in bounded memory.

    Example:
        >>> sketch = SightingSketch(counters=1024)
        >>> sketch.add(torch.tensor([5, 9]), torch.tensor([1, 2])).tolist()
        [1, 2]
        >>> sketch.add(torch.tensor([5]), torch.tensor([1])).tolist(), sketch.nbytes
        ([2], 1024)
    """

    def __init__(self, counters: int = COUNTERS, depth: int = DEPTH):
        if not 1 <= depth <= len(_SALTS) or counters < depth:
            raise ValueError(f"a sketch takes 1-{len(_SALTS)} rows and at least one counter per row, "
                             f"got depth {depth} and {counters} counters")
        self.width = counters // depth
        self.counts = torch.zeros(depth, self.width, dtype=torch.uint8)
        self.period = max(1, self.width // 2)  # sightings between two halvings
        self.since = 0  # sightings recorded since the last halving
        self.agings = 0

    @property
    def nbytes(self) -> int:
        return self.counts.numel()

    def _positions(self, keys: torch.Tensor) -> torch.Tensor:
        """(depth, n) flat positions of ``keys``' counters in ``counts``."""
        rows = [torch.remainder(mix(keys ^ salt), self.width) + d * self.width
                for d, salt in enumerate(_SALTS[:len(self.counts)])]
        return torch.stack(rows)

    def add(self, keys: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Count ``counts`` more sightings of ``keys`` (unique); their counts after it.
        Shape: (n,), (n,) -> (n,) int64."""
        after, record = self.count(keys, counts)
        record()
        return after

    def count(self, keys: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, Callable[[], None]]:
        """The counts of ``keys`` (unique) after ``counts`` more sightings, and the call that
        records those sightings: a push refused after admission was decided records none.
        Shape: (n,), (n,) -> (n,) int64."""
        if not len(keys):
            return torch.zeros(0, dtype=torch.int64), lambda: None
        pos = self._positions(keys)
        flat = self.counts.view(-1)
        seen = flat[pos].long()  # (depth, n)
        after = (seen.min(0).values + counts).clamp_(max=255)  # (n,)
        raised = torch.maximum(seen, after.expand_as(seen))  # conservative update: none goes past `after`

        def record() -> None:
            flat.scatter_reduce_(0, pos.flatten(), raised.flatten().to(torch.uint8), "amax")
            self.since += int(counts.sum())
            while self.since >= self.period:
                self.counts.bitwise_right_shift_(1)
                self.since -= self.period
                self.agings += 1

        return after, record

    def state_dict(self) -> dict:
        return {"counts": self.counts, "since": torch.tensor(self.since)}

    def load_state_dict(self, state: dict) -> None:
        counts = state["counts"]
        if counts.shape != self.counts.shape or counts.dtype != torch.uint8:
            raise ValueError(f"admission sketch: expected uint8 {tuple(self.counts.shape)}, got "
                             f"{counts.dtype} {tuple(counts.shape)}")
        self.counts = counts.clone()
        self.since = int(state.get("since", 0))


def admit(sketch: SightingSketch, admit_after: int, counters, at, grads, counts, sq=None):
    """A push to a dynamic table (its entries located ``at``: ``(key, slot)``, slot -1 for a
    key not stored) less the entries of keys that are neither stored nor admitted now, and the
    call that records the push's sightings in ``sketch`` and counts the dropped updates in
    ``counters["refused_updates"]`` (made once the push is applied; None when every key is
    stored). Shape: at (n, 2), grads (n, D), counts (n,), sq (n, *) -> the kept entries of each."""
    if bool((at[:, 1] >= 0).all()):
        return at, grads, counts, sq, None
    unique, inverse = torch.unique(at[:, 0], return_inverse=True)
    new = (first_of(at[:, 1], inverse, len(unique)) < 0).nonzero().flatten()
    sightings = torch.zeros(len(unique), dtype=torch.int64).index_add_(0, inverse, counts)
    after, record = sketch.count(unique[new], sightings[new])
    refused = new[after < admit_after]
    if not len(refused):
        return at, grads, counts, sq, record
    drop = torch.zeros(len(unique), dtype=torch.bool)
    drop[refused] = True
    keep = ~drop[inverse]

    def record_and_count() -> None:
        record()
        counters["refused_updates"] += int(len(at) - keep.sum())

    return at[keep], grads[keep], counts[keep], None if sq is None else sq[keep], record_and_count


def first_of(values: torch.Tensor, inverse: torch.Tensor, n: int) -> torch.Tensor:
    """``values`` per unique entry, from entries that agree on it (slots of one key)."""
    return torch.empty(n, dtype=values.dtype).scatter_(0, inverse, values)
