"""The keys of a table that changed since a reader last took them: what ``het train --publish``
sends to serving (:mod:`het.train.publish`), read a page at a time by the CHANGED request.

A shard keeps no record until a reader first asks (a job that publishes nothing pays nothing):
from then on every push's keys, and every key a dynamic table forgets (expired, evicted: it
reads as its initial row again), are kept. :meth:`Changes.take` hands them out, each changed
key once, a page at a time: the keys the first page takes are fixed, and keys changed while
they are read out wait for the next round. A key is read out with its row as it is when its
page is read, so nothing is lost between rounds; a key changed again is simply sent again.

Memory: the keys pushed between two rounds, 8 bytes each, deduplicated past four times the
distinct keys last seen.
"""

from __future__ import annotations

import numpy as np
import torch

from het.ps.protocol.integers import narrow


class Changes:
    """Changed keys of one table (see the module).

    Example:
        >>> c = Changes()
        >>> c.add(torch.tensor([5, 1, 5])); c.add(torch.tensor([9]))
        >>> c.take(2), c.take(2)
        ((tensor([1, 5]), True), (tensor([9]), False))
        >>> c.take(2)  # nothing changed since
        (tensor([], dtype=torch.int64), False)
    """

    def __init__(self):
        self._parts: list[torch.Tensor] = []
        self._size = 0
        self._compact_at = 1 << 16
        self._round: torch.Tensor | None = None  # the keys being read out, ascending
        self._read = 0

    def add(self, keys: torch.Tensor) -> None:
        """Record ``keys`` (any int64, repeats too) as changed."""
        if not len(keys):
            return
        self._parts.append(keys.to(torch.int64).clone())
        self._size += len(keys)
        if self._size > self._compact_at:
            merged = torch.unique(torch.cat(self._parts))
            self._parts, self._size = [merged], len(merged)
            self._compact_at = max(1 << 16, 4 * len(merged))

    def take(self, limit: int) -> tuple[torch.Tensor, bool]:
        """The next ``limit`` changed keys at most, ascending, and whether more are left in this
        round. A round starts with every key changed since the last one."""
        if self._round is None or self._read >= len(self._round):
            merged = torch.unique(torch.cat(self._parts)) if self._parts else torch.empty(0, dtype=torch.int64)
            self._round, self._read = merged, 0
            self._parts, self._size = [], 0
        page = self._round[self._read:self._read + limit]
        self._read += len(page)
        return page, self._read < len(self._round)


def page(changes: dict, table: str, store, limit: int) -> tuple[dict, list]:
    """A CHANGED reply: the next ``limit`` changed keys of ``table`` (``changes``: the shard's
    records by table, made here at the first request, which returns none), their rows as
    ``store`` (a :class:`het.ps.server.store.rowstore.RowStore`) holds them now, and clocks.
    Shape: -> keys (k,) int64, rows (k, D) float32, clocks (k,)."""
    if table not in changes:
        changes[table] = Changes()
        store.on_remove = changes[table].add  # a forgotten row reads as its initial row again: a change
        empty = [np.zeros(0, np.int64), np.zeros((0, store.cfg.dim), np.float32), np.zeros(0, np.int64)]
        return {"more": False, "started": True}, empty
    keys, more = changes[table].take(limit)
    at = store.locate(keys)
    rows, _ = store.rows_to_send(at, lazy=False)
    return {"more": more}, [keys.numpy(), rows[0], narrow(store.clocks_of(at)).numpy()]
