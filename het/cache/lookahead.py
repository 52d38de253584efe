"""The keys of coming steps, as the data loader announces them: the window a cache consults
when it evicts (Belady's rule within the window, as BAGPIPE does with its data loader).

A worker's data loader knows its next batches. Announcing their keys lets the cache keep the
rows needed soon, evict first the row needed last, and let a miss that is needed later than
every row it could displace bypass the cache. Outside the window the replacement policy
decides as before. Announcements are hints: a wrong one costs hits, never correctness.

Steps are numbered in announcement order (1, 2, ...). The window keeps every queued (key,
step) pair sorted, merging each announced step in and filtering each looked-up step out, so a
key's next use is one binary search; the cache stores, per slot, the number of the next
announced step that uses its row.
"""

from __future__ import annotations

import collections

import torch

NEVER = 1 << 40  # the "next use" of a key not announced


class Lookahead:
    """Announced steps not yet looked up, nearest first.

    Args:
        depth: how many steps ahead the data loader announces (the trainer's setting); the
            queue holds at most ``4 * depth`` steps, dropping the oldest beyond that.

    Example:
        >>> w = Lookahead(depth=4)
        >>> [w.announce(torch.tensor(k)) for k in ([1, 2], [2, 3], [4])]
        [1, 2, 3]
        >>> w.advance(torch.tensor([1, 2]))  # the first announced step is being looked up now
        True
        >>> w.next_use(torch.tensor([1, 2, 3, 4])).tolist()  # 1 is not announced again
        [1099511627776, 2, 2, 3]
    """

    def __init__(self, depth: int):
        if not isinstance(depth, int) or depth < 1:
            raise ValueError(f"lookahead depth must be an int >= 1, got {depth!r}")
        self.depth = depth
        self.queue: collections.deque[tuple[int, torch.Tensor]] = collections.deque()
        self.announced = 0  # number of the last announced step
        self.now = 0        # number of the step looked up last (0: none yet)
        # every queued (key, step number), sorted by key, then number: the first entry of a
        # key is its next use
        self._keys = self._numbers = None

    def announce(self, keys: torch.Tensor) -> int:
        """Add the keys of the next step after those already announced; its number."""
        self.announced += 1
        step = torch.unique(keys.reshape(-1).to(torch.int64))
        self.queue.append((self.announced, step))
        if self._keys is None:
            self._keys, self._numbers = step, torch.full_like(step, self.announced)
        else:  # merge: the new step's entries go after the same keys' earlier ones
            step = step.to(self._keys.device)
            n, m = step.numel(), self._keys.numel()
            at_new = torch.searchsorted(self._keys, step, right=True) + torch.arange(n, device=step.device)
            at_old = torch.searchsorted(step, self._keys) + torch.arange(m, device=step.device)
            keys_ = torch.empty(n + m, dtype=torch.int64, device=step.device)
            numbers = torch.empty_like(keys_)
            keys_.index_copy_(0, at_new, step).index_copy_(0, at_old, self._keys)
            numbers.index_fill_(0, at_new, self.announced).index_copy_(0, at_old, self._numbers)
            self._keys, self._numbers = keys_, numbers
        while len(self.queue) > 4 * self.depth:  # announcements nobody looks up: keep the newest
            self._drop(self.queue.popleft()[0])
        return self.announced

    def advance(self, keys: torch.Tensor) -> bool:
        """A lookup of ``keys`` (unique, sorted) is starting: if they are the first announced
        step, that step leaves the queue and becomes ``now``. Whether they were."""
        if not self.queue or not torch.equal(self.queue[0][1], keys.to(self.queue[0][1].device)):
            return False
        self.now = self.queue.popleft()[0]
        self._drop(self.now)
        return True

    def _drop(self, number: int) -> None:
        keep = (self._numbers != number).nonzero().flatten()
        self._keys, self._numbers = self._keys.index_select(0, keep), self._numbers.index_select(0, keep)

    def next_use(self, keys: torch.Tensor) -> torch.Tensor:
        """The number of the first queued step holding each key, ``NEVER`` if none.
        Shape: any -> same, int64."""
        if self._keys is None or self._keys.numel() == 0:
            return torch.full_like(keys, NEVER)
        fk = self._keys.to(keys.device)
        pos = torch.searchsorted(fk, keys).clamp(max=fk.numel() - 1)
        return torch.where(fk[pos] == keys, self._numbers.to(keys.device)[pos], NEVER)

    def steps_away(self, numbers: torch.Tensor) -> torch.Tensor:
        """Step numbers (from ``next_use``) -> steps after ``now``; ``NEVER`` for numbers not
        announced or already past (an announcement that was never looked up)."""
        return torch.where((numbers > self.now) & (numbers < NEVER), numbers - self.now, NEVER)

    def clear(self) -> None:
        self.queue.clear()
        self._keys = self._numbers = None
