"""The keys of coming steps, as the data loader announces them: the window a cache consults
when it evicts (Belady's rule within the window, as BAGPIPE does with its data loader).

A worker's data loader knows its next batches. Announcing their keys lets the cache keep the
rows needed soon, evict first the row needed last, and let a miss that is needed later than
every row it could displace bypass the cache. Outside the window the replacement policy
decides as before. Announcements are hints: a wrong one costs hits, never correctness.

Steps are numbered in announcement order (1, 2, ...); the cache stores, per slot, the number
of the next announced step that uses its row. Two indexes give a key's next use after the
current step, the same answer:

- native (het.native's ``Window``, on CPU): per key, the numbers of the queued steps that hold
  it, oldest first, kept up to date as steps are announced and leave: a step costs a hash
  operation per key announced, looked up and asked about;
- the reference (PyTorch, on CUDA or without a build): when the window changed since it was
  last asked, it sorts the distinct queued keys and packs each queued (key, step) pair into one
  sorted int64 (``rank of the key << 20 | step - base``), so a key's next use is two binary
  searches (its rank, then ``(rank, now + 1)``). Ranks, not keys, are packed: every int64 is a
  key (a dynamic table's raw ids).
"""

from __future__ import annotations

import collections

import torch

from het import native as het_native

NEVER = 1 << 40  # the "next use" of a key not announced
_BITS = 20       # an index entry packs rank of the key << 20 | (step number - base)
_MASK = (1 << _BITS) - 1
MAX_DEPTH = 1 << 16  # 4 * depth queued steps, plus the rebuild interval, stay below 2^20


class Lookahead:
    """Announced steps not yet looked up, nearest first.

    Args:
        depth: how many steps ahead the data loader announces (the trainer's setting); the
            queue holds at most :attr:`most_queued` steps, dropping the oldest beyond that.
        native: keep the index with het.native's ``Window`` (CPU keys); else the reference.

    Example:
        >>> w = Lookahead(depth=4)
        >>> [w.announce(torch.tensor(k)) for k in ([1, 2], [2, 3], [4])]
        [1, 2, 3]
        >>> w.advance(torch.tensor([1, 2]))  # the first announced step is being looked up now
        True
        >>> w.next_use(torch.tensor([1, 2, 3, 4])).tolist()  # 1 is not announced again
        [1099511627776, 2, 2, 3]
        >>> w.announce(torch.tensor([-1, -2**63, 2**63 - 1]))  # any int64 is a key
        4
        >>> w.advance(torch.tensor([2, 3]))  # the window is re-indexed as steps are looked up
        True
        >>> w.next_use(torch.tensor([-1, 2**63 - 1, 4, 5])).tolist()
        [4, 4, 3, 1099511627776]
    """

    def __init__(self, depth: int, native: bool = False):
        if not isinstance(depth, int) or not 1 <= depth <= MAX_DEPTH:
            raise ValueError(f"lookahead depth must be an int in [1, {MAX_DEPTH}], got {depth!r}")
        self.depth = depth
        self._window = het_native.ops.Window() if native and het_native.ops is not None else None
        self.queue: collections.deque[tuple[int, torch.Tensor]] = collections.deque()
        self.announced = 0  # number of the last announced step
        self.now = 0        # number of the step looked up last (0: none yet)
        # every queued (key, number) at the last rebuild, packed as rank << 20 | (number - base),
        # sorted, where rank is the key's position in _keys (the distinct keys queued, sorted)
        self._index: torch.Tensor | None = None
        self._keys = torch.empty(0, dtype=torch.int64)
        self._base = 0

    def announce(self, keys: torch.Tensor, unique_sorted: bool = False) -> int:
        """Add the keys of the next step after those already announced; its number.
        ``unique_sorted``: ``keys`` are ``torch.unique``'s output already (int64)."""
        step = keys if unique_sorted else torch.unique(keys.reshape(-1).to(torch.int64))
        self.announced += 1
        self.queue.append((self.announced, step))
        if self._window is not None:
            self._window.announce(step.cpu(), self.announced)
        while len(self.queue) > self.most_queued:  # announcements nobody looks up: keep the newest
            self._leave()
        self._index = None
        return self.announced

    @property
    def most_queued(self) -> int:
        """Announced steps kept at most, ``4 * depth``: an announcement that the lookups went
        past (they came in another order, or some were never made) leaves beyond it."""
        return 4 * self.depth

    def _leave(self) -> int:
        """The oldest queued step leaves the window; its number."""
        number, keys = self.queue.popleft()
        if self._window is not None:
            self._window.forget(keys.cpu(), number)
        return number

    def advance(self, keys: torch.Tensor) -> bool:
        """A lookup of ``keys`` (unique, sorted) is starting: if they are the first announced
        step, that step leaves the queue and becomes ``now``. Whether they were."""
        if not self.queue or not torch.equal(self.queue[0][1], keys.to(self.queue[0][1].device)):
            return False
        self.now = self._leave()
        self._index = None
        return True

    def next_use(self, keys: torch.Tensor) -> torch.Tensor:
        """The number of the first queued step (after ``now``) holding each key; ``NEVER`` if
        none. Shape: any -> same, int64."""
        if self._window is not None and keys.device.type == "cpu":
            return self._window.next_use(keys.to(torch.int64).contiguous())
        if self._index is None:
            self._build()
        index, known = self._index.to(keys.device), self._keys.to(keys.device)
        if index.numel() == 0 or keys.numel() == 0:
            return torch.full_like(keys, NEVER)
        rank = torch.searchsorted(known, keys).clamp(max=known.numel() - 1)
        queued = known[rank] == keys
        first = (rank << _BITS) | (self.now + 1 - self._base)  # the first entry at or after (key, now + 1)
        pos = torch.searchsorted(index, first).clamp(max=index.numel() - 1)
        found = index[pos]
        return torch.where(queued & ((found >> _BITS) == rank), (found & _MASK) + self._base, NEVER)

    def _build(self) -> None:
        self._base = self.now
        if not self.queue:
            self._index = self._keys = torch.empty(0, dtype=torch.int64)
            return
        keys = torch.cat([k for _, k in self.queue])
        numbers = torch.cat([torch.full_like(k, number - self._base) for number, k in self.queue])
        self._keys, rank = torch.unique(keys, return_inverse=True)  # sorted distinct keys; each key's rank
        self._index = torch.sort((rank << _BITS) | numbers).values

    def steps_away(self, numbers: torch.Tensor) -> torch.Tensor:
        """Step numbers (from ``next_use``) -> steps after ``now``; ``NEVER`` for numbers not
        announced or already past (an announcement that was never looked up)."""
        return torch.where((numbers > self.now) & (numbers < NEVER), numbers - self.now, NEVER)

    def clear(self) -> None:
        self.queue.clear()
        self._index = None
        if self._window is not None:
            self._window.clear()
