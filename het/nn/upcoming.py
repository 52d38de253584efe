"""The steps to come: made, announced and prefetched ahead by one owner.

A worker knows its next batches. :class:`Upcoming` holds everything made for a step before
the step runs: its batch (made by the data loader, ``ahead`` steps early), each table's
announced keys with their ``torch.unique`` (the caches evict by them, and the step's lookup
reuses them) and each table's sync sent early (the PS answers while the step before
computes). The training loop asks it for each step's batch; het.Embedding's ``forward`` asks
it for a lookup made ahead before it makes one.

Announcements and early syncs are hints: a step whose keys differ from those announced or
prefetched costs hits, never correctness (an early sync nobody uses is completed and dropped).
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable

import torch

from het import native
from het.cache.cache import EmbeddingCache


class Upcoming:
    """The coming steps of one het.Embedding: their batches, their announced keys, their
    early syncs, oldest first.

    Args:
        embedding: the :class:`~het.nn.Embedding` whose caches hear the announcements and
            whose syncs go early (its ``_start`` sends one).

    A training loop attaches its data loader with :meth:`follow`; het.Embedding's own
    ``announce`` and ``prefetch`` work without one.

    Example:
        >>> from het.config import CacheConfig
        >>> from het.nn import Embedding
        >>> emb = Embedding(100, 4, cache=CacheConfig(capacity=16, staleness=10, lookahead=2))
        >>> made = []
        >>> emb.upcoming.follow(lambda step: made.append(step) or torch.tensor([step, step + 1]),
        ...                     keys=lambda batch: batch, ahead=2, early=True)
        >>> emb.upcoming.batch(0).tolist(), made  # steps 1 and 2 made and announced ahead
        ([0, 1], [0, 1, 2])
        >>> emb.upcoming.send_early(torch.tensor([0, 1]), torch.tensor([1, 2]))
        >>> emb.prefetching()
        True
    """

    def __init__(self, embedding):
        self.embedding = embedding
        self.make: Callable | None = None  # step -> batch: the data loader
        self.keys: Callable = lambda batch: batch  # batch -> the keys het.Embedding looks up
        self.ahead = 0       # steps made and announced before they run
        self.early = False   # whether each step's sync is sent while the step before computes
        self._split: Callable | None = None  # a whole batch's keys -> each table's (route)
        self._batches: collections.deque = collections.deque()  # (step, batch), made ahead
        names = list(embedding.tables)
        # per table: announced lookups (flat keys, unique keys, inverse); syncs sent early
        self._announced = {n: collections.deque() for n in names}
        self._sent = {n: collections.deque() for n in names}

    def route(self, split: Callable) -> None:
        """Split a whole batch's keys among the tables in het.Embedding's ``announce`` and
        ``prefetch`` without ``table=``: ``split(keys)`` -> ``{table: keys}``
        (:class:`het.nn.fields.FieldTables` routes its source so)."""
        self._split = split

    def routed(self, keys, table: str | None) -> list:
        """``[(table, keys)]`` of a lookup: the table named, or the batch split among the tables."""
        if table is None and self._split is not None and len(self.embedding.tables) > 1:
            return list(self._split(keys).items())
        return [(self.embedding._table_name(table), keys)]

    def follow(self, make: Callable, keys: Callable, ahead: int = 0, early: bool = False) -> None:
        """Make batches with ``make(step)``, ``ahead`` steps early, announcing ``keys(batch)``
        to the caches; with ``early``, :meth:`send_early` sends the coming steps' syncs."""
        self.make, self.keys, self.ahead, self.early = make, keys, ahead, early
        self._batches.clear()

    # -- the training loop's side -----------------------------------------------------------
    def batch(self, step: int, end: float = math.inf):
        """The batch of ``step``. With ``ahead``, the batches up to ``step + ahead`` (none at
        or past ``end``, the step training stops before) are made now and their keys
        announced, in step order; steps are asked for in order (a step out of order starts
        afresh: the first step, a resume)."""
        if not self.ahead:
            return self.make(step)
        queue = self._batches
        while queue and queue[0][0] < step:
            queue.popleft()
        if not queue or queue[0][0] != step:
            queue.clear()
        made = queue[-1][0] + 1 if queue else step
        for s in range(made, min(step + self.ahead, end - 1) + 1):
            batch = self.make(s)
            if batch is not None:  # None: the data ended before this step
                self.embedding.announce(self.keys(batch))
            queue.append((s, batch))
        return queue[0][1]

    def send_early(self, batch, next_batch=None) -> None:
        """Send this step's sync, unless it is in flight already (the step before sent it, and
        no checkpoint or evaluation in between used it up), and the next step's, so the PS
        answers while this step computes. The next step's carries this step's pushes."""
        if not self.early:
            return
        if not self.in_flight():
            self.embedding.prefetch(self.keys(batch))
        if next_batch is not None:
            self.embedding.prefetch(self.keys(next_batch))

    # -- het.Embedding's side ---------------------------------------------------------------
    def announce(self, name: str, flat: torch.Tensor) -> None:
        """Tell table ``name``'s cache the keys of a coming lookup (a hint for eviction), and
        keep their unique for the lookup. Without a lookahead window, nothing."""
        cache = self.embedding.caches[name]
        if cache.window is None:
            return
        unique, inverse = unique_inverse(cache, flat)
        cache.announce(unique, unique_sorted=True)
        known = self._announced[name]
        known.append((flat.clone(), unique, inverse))  # a copy: the caller may reuse its tensor
        while len(known) > cache.window.most_queued:  # announcements never looked up
            known.popleft()

    def unique(self, name: str, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``torch.unique(flat, return_inverse=True)``, taken from the announcement when these
        are the keys announced next (the same keys: the same result)."""
        known = self._announced[name]
        if known and known[0][0].shape == flat.shape and torch.equal(known[0][0], flat):
            _, unique, inverse = known.popleft()
            return unique, inverse
        return unique_inverse(self.embedding.caches[name], flat)

    def send(self, name: str, flat: torch.Tensor) -> None:
        """Look the keys of a coming lookup up now and send its sync."""
        self.embedding.caches[name].protect = 2  # the prefetched step's slots and the current step's
        self._sent[name].append(self.embedding._start(name, flat))

    def take(self, name: str, flat: torch.Tensor):
        """The lookup sent early for these keys, or None. Early lookups of other keys before it
        are completed (no reply is left behind) and dropped."""
        queue = self._sent[name]
        while queue:
            pending = queue.popleft()
            if torch.equal(pending.flat, flat):
                return pending
            self.embedding._finish(pending)
        return None

    def in_flight(self) -> bool:
        """Whether a lookup sent early waits for its ``forward``."""
        return any(self._sent.values())

    def complete(self) -> None:
        """Complete every lookup sent early and drop it: a flush, after which nobody uses them."""
        for pending in [p for queue in self._sent.values() for p in queue]:
            with torch.no_grad():
                self.embedding._finish(pending)
        for queue in self._sent.values():
            queue.clear()


def unique_inverse(cache: EmbeddingCache, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.unique(flat, return_inverse=True)``, by the native core where the cache runs it:
    a radix sort (the default job's 13,312 keys a step: 0.73 -> 0.17 ms, docs/scripts/native_ops.py)."""
    if cache.native and flat.dtype == torch.int64:
        return native.unique_inverse(flat)
    return torch.unique(flat, return_inverse=True)
