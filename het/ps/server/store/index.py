"""A dynamic table's index: int64 key -> storage slot, and each slot's key, on whole tensors of keys.

:func:`make` gives the native index (``het/native/key_index.h``: a hash table of 4-byte slots
and 1-byte controls over a slot -> key array, 16 + 5 / load bytes a key, load 0.65 to 0.875) where
the native core is built, and :class:`KeyIndex`, its reference, elsewhere. Both answer the same
calls with the same slots; :meth:`items` is sorted by key in both.

The reference: two sorted runs, as a log-structured merge with two levels: a large ``main`` run and a small
``recent`` run that takes the inserts. A lookup is a binary search in each (``torch.searchsorted``,
one call per run for the whole batch); an insert sorts the small run again; when it has grown
past a fraction of the large one the two are merged (one linear pass), so an insert costs
amortised ``O(log n)`` and there is no per-key Python anywhere. A removed key keeps its place in
its run with slot -1 (a tombstone) until the next merge drops it.

Memory: 16 bytes per key (key and slot, int64), plus the tombstones not yet merged away, and 8
bytes a slot for the slot -> key array.
"""

from __future__ import annotations

import torch

from het import native
from het.ps.server.store.chunks import Chunks

MIN_RECENT = 1 << 14  # the recent run merges into main past max(MIN_RECENT, len(main) >> RECENT_SHIFT)
RECENT_SHIFT = 4


class KeyIndex:
    """int64 keys -> int64 slots (>= 0).

    Example:
        >>> index = KeyIndex()
        >>> index.insert(torch.tensor([7, -3, 2**62]), torch.tensor([0, 1, 2]))
        >>> index.lookup(torch.tensor([-3, 5, 2**62])).tolist()
        [1, -1, 2]
        >>> index.remove(torch.tensor([-3]))
        >>> index.lookup(torch.tensor([-3, 7])).tolist(), len(index), index.keys_of(torch.tensor([2])).tolist()
        ([-1, 0], 2, [4611686018427387904])
    """

    def __init__(self):
        empty = torch.empty(0, dtype=torch.int64)
        self.main_keys, self.main_slots = empty, empty
        self.recent_keys, self.recent_slots = empty, empty
        self.slot_keys = Chunks(1, torch.int64)
        self.slots_used = 0  # 1 + the largest slot given a key
        self.live = 0
        self.merges = 0  # of the recent run into main: when large scratch arrays were freed

    def __len__(self) -> int:
        return self.live

    @property
    def nbytes(self) -> int:
        runs = len(self.main_keys) + len(self.main_slots) + len(self.recent_keys) + len(self.recent_slots)
        return 8 * runs + self.slot_keys.nbytes(self.slots_used)

    @property
    def load(self) -> float:
        """Live keys over the entries the runs hold (tombstones are the rest)."""
        return self.live / max(1, len(self.main_keys) + len(self.recent_keys))

    def keys_of(self, slots: torch.Tensor) -> torch.Tensor:
        """The key of each slot (each one held). Shape: (n,) -> (n,)."""
        return self.slot_keys.gather(slots)[:, 0]

    def lookup(self, keys: torch.Tensor) -> torch.Tensor:
        """The slot of each key, -1 where the index holds none. Shape: (n,) -> (n,)."""
        slots = _find(self.main_keys, self.main_slots, keys)
        if len(self.recent_keys):
            missing = (slots < 0).nonzero().flatten()
            if len(missing):
                slots[missing] = _find(self.recent_keys, self.recent_slots, keys[missing])
        return slots

    def insert(self, keys: torch.Tensor, slots: torch.Tensor) -> None:
        """Add ``keys`` (unique, none of them held) at ``slots``."""
        if not len(keys):
            return
        self.slots_used = max(self.slots_used, int(slots.max()) + 1)
        self.slot_keys.grow_to(self.slots_used)
        self.slot_keys.scatter(slots, keys[:, None])
        held = self.recent_slots >= 0  # the recent run's tombstones go now: a key is in a run once
        k, order = torch.sort(torch.cat([self.recent_keys[held], keys]))
        self.recent_keys, self.recent_slots = k, torch.cat([self.recent_slots[held], slots])[order]
        self.live += len(keys)
        if len(self.recent_keys) > max(MIN_RECENT, len(self.main_keys) >> RECENT_SHIFT):
            self._merge()
            self.merges += 1

    def remove(self, keys: torch.Tensor) -> None:
        """Forget ``keys`` (unique, all held)."""
        for run_keys, run_slots in ((self.main_keys, self.main_slots), (self.recent_keys, self.recent_slots)):
            if not len(run_keys):
                continue
            pos = torch.searchsorted(run_keys, keys).clamp_(max=len(run_keys) - 1)
            hit = (run_keys[pos] == keys) & (run_slots[pos] >= 0)
            run_slots[pos[hit]] = -1
        self.live -= len(keys)

    def items(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every live (key, slot), sorted by key."""
        self._merge()
        return self.main_keys, self.main_slots

    def _merge(self) -> None:
        """Merge the two sorted runs without sorting them again: each recent key goes where a
        binary search in main puts it, main's keys fill the rest. Scratch: the new run beside
        the old one and a mask (about 2 x 16 bytes a key at the peak), not a sort of both."""
        n, m = len(self.main_keys), len(self.recent_keys)
        at = torch.searchsorted(self.main_keys, self.recent_keys) + torch.arange(m)  # distinct keys: no ties
        from_main = torch.ones(n + m, dtype=torch.bool)
        from_main[at] = False
        keys, slots = torch.empty(n + m, dtype=torch.int64), torch.empty(n + m, dtype=torch.int64)
        keys.masked_scatter_(from_main, self.main_keys)
        slots.masked_scatter_(from_main, self.main_slots)
        keys[at], slots[at] = self.recent_keys, self.recent_slots
        del from_main, at
        self.main_keys = self.main_slots = None  # freed before the tombstones' pass below
        if bool((slots < 0).any()):
            live = slots >= 0
            keys, slots = keys[live], slots[live]
        self.main_keys, self.main_slots = keys, slots
        self.recent_keys = self.recent_slots = torch.empty(0, dtype=torch.int64)


class NativeKeyIndex:
    """:class:`KeyIndex`'s calls on the native index (``het/native/key_index.h``)."""

    def __init__(self):
        self._index = native.ops.KeyIndex()

    def __len__(self) -> int:
        return len(self._index)

    @property
    def nbytes(self) -> int:
        return self._index.nbytes()

    @property
    def load(self) -> float:
        """Live keys over buckets (deleted ones, until the next rebuild, are load too)."""
        return len(self._index) / self._index.buckets()

    @property
    def merges(self) -> int:
        return self._index.rebuilds()  # when a table of every key was freed

    def lookup(self, keys: torch.Tensor) -> torch.Tensor:
        return self._index.lookup(keys.contiguous())

    def insert(self, keys: torch.Tensor, slots: torch.Tensor) -> None:
        self._index.insert(keys.contiguous(), slots.contiguous())

    def remove(self, keys: torch.Tensor) -> None:
        self._index.remove(keys.contiguous())

    def keys_of(self, slots: torch.Tensor) -> torch.Tensor:
        return self._index.keys_of(slots.contiguous())

    def items(self) -> tuple[torch.Tensor, torch.Tensor]:
        keys, slots = self._index.items()
        keys, order = torch.sort(keys)
        return keys, slots[order]


def make() -> KeyIndex | NativeKeyIndex:
    """The native index where the native core is built, else the reference."""
    return NativeKeyIndex() if native.usable() else KeyIndex()


def _find(run_keys: torch.Tensor, run_slots: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Slots of ``keys`` in one sorted run (-1: not there, or a tombstone)."""
    if not len(run_keys):
        return torch.full_like(keys, -1)
    pos = torch.searchsorted(run_keys, keys).clamp_(max=len(run_keys) - 1)
    return torch.where(run_keys[pos] == keys, run_slots[pos], -1)
