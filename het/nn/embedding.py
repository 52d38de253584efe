"""het.Embedding: an ``nn.Module`` whose rows live on PS shards, behind a per-worker cache.

The forward pass looks the batch's unique keys up in the cache and syncs with the PS in one
message per shard (this table's pushes of the previous step ride along); the backward pass
hands one gradient per unique row to the cache, which applies it locally and queues the rows
due to be pushed. The PS applies the table's optimizer, so het.Embedding needs no torch
optimizer: give the dense layers' parameters to yours as usual.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch import nn

from het.cache.cache import EmbeddingCache, Plan, Rows, summed_stats
from het.choices import Pooling, PushDtype
from het.config import CacheConfig, OptimizerConfig, TableConfig
from het.nn.bags import bag_keys, pool
from het.nn.tables import module_tables, own_shards
from het.nn.upcoming import Upcoming
from het.ps.client.client import PSClient
from het.ps.client.requests import check_keys
from het.ps.protocol.limits import check_finite

# the most keys one push of a flush carries (Embedding._push): 16,384 rows of dim 128 are 8 MiB
FLUSH_KEYS = 1 << 14


@dataclass
class _Pending:
    """A lookup whose sync is in flight: the flat keys, the inverse of their unique, the plan."""

    name: str
    flat: torch.Tensor
    inverse: torch.Tensor
    plan: Plan
    handle: object


@dataclass
class _Outbox:
    """Rows due to be pushed for one table, sent with the table's next sync or flush."""

    parts: list = field(default_factory=list)
    step: int = 0


class Embedding(nn.Module):
    """Embedding tables held by parameter servers, read through a worker cache.

    Args:
        num_embeddings, embedding_dim: one table named ``"embedding"`` of this size, as
            ``nn.Embedding``; or give ``tables`` instead.
        tables: one or more :class:`~het.config.TableConfig` (several named tables).
        optimizer: the sparse optimizer for the single-table form: a name or an
            :class:`~het.config.OptimizerConfig`; ``lr`` goes with a name.
        cache: a :class:`~het.config.CacheConfig` for every table, or a dict by table name.
        client: a connected :class:`~het.ps.client.client.PSClient`; ``None`` starts ``num_shards``
            in-process shards (one process, no sockets).
        mode: ``None`` returns one row per key; ``"sum"`` or ``"mean"`` pools bags of keys
            (``offsets`` as ``nn.EmbeddingBag``, or the last dimension of a 2-D input).
        padding_idx: with pooling, keys equal to it are left out of their bag (in a dynamic
            table too, whose keys are any int64: no range is checked there).
        device: where the cache and the returned rows live.
        grad_scale: multiplies the rows' gradients before they reach the cache (the trainer
            sets ``1 / workers``: see docs/ARCHITECTURE.md, "Gradient scaling").
        push_dtype: how pushed gradients travel: ``"fp32"``, or ``"bf16"`` (half the bytes,
            rounded to nearest: about three significant digits per value).

    Shape:
        - keys: int64 of any shape ``(*)``; output ``(*, D)``.
        - pooled: keys ``(B, L)`` or keys ``(N,)`` with ``offsets (B,)``; output ``(B, D)``.

    Example:
        >>> emb = Embedding(100, 8, optimizer="sgd", lr=0.1, cache=CacheConfig(capacity=16))
        >>> out = emb(torch.tensor([[1, 2], [2, 3]]))
        >>> out.shape
        torch.Size([2, 2, 8])
        >>> out.sum().backward()
        >>> emb.flush()
        >>> emb.stats()["embedding"]["lookups"]
        3
    """

    def __init__(self, num_embeddings: int | None = None, embedding_dim: int | None = None, *,
                 tables: TableConfig | list[TableConfig] | None = None,
                 optimizer: str | OptimizerConfig = "sgd", lr: float = 0.01,
                 cache: CacheConfig | dict[str, CacheConfig] | None = None,
                 client: PSClient | None = None, num_shards: int = 1,
                 mode: str | None = None, padding_idx: int | None = None,
                 device: torch.device | str | None = None, grad_scale: float = 1.0,
                 push_dtype: str = "fp32"):
        super().__init__()
        self.push_dtype = PushDtype.parse(push_dtype, "push_dtype")
        tables = module_tables(num_embeddings, embedding_dim, tables, optimizer, lr)
        mode = None if mode is None else Pooling.parse(mode, "mode (or None)")
        self.client = client if client is not None else own_shards(tables, num_shards)
        for t in tables:
            served = self.client.tables.get(t.name)
            if served is None or (served.rows, served.dim) != (t.rows, t.dim):
                raise ValueError(f"table {t.name!r} ({t.size}) is not what the PS serves: "
                                 f"{served.size if served else 'no such table'}")
        # the shards' own configs: their optimizer, seed and admission rule are what the caches follow
        self.tables = {t.name: self.client.tables[t.name] for t in tables}
        self.mode, self.padding_idx = mode, padding_idx
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        caches = cache if isinstance(cache, dict) else {t.name: cache or CacheConfig() for t in tables}
        unknown = set(caches) - set(self.tables)
        if unknown:
            raise ValueError(f"cache configs for unknown tables {sorted(unknown)}; tables: {sorted(self.tables)}")
        self.caches = {n: EmbeddingCache(t, caches.get(n, CacheConfig()), self.device)
                       for n, t in self.tables.items()}
        self._outbox = {n: _Outbox() for n in self.tables}
        self.upcoming = Upcoming(self)  # coming steps' announced keys and early syncs
        self._early: list = []  # push_idle's pushes in flight, waited for by the next flush
        self.grad_scale = grad_scale
        self.traffic = Counter()  # payload bytes: sparse_pull, sparse_push, sync
        self.wait_s = 0.0         # time blocked on the PS

    # -- forward ----------------------------------------------------------------------------
    def forward(self, keys: torch.Tensor, offsets: torch.Tensor | None = None,
                table: str | None = None) -> torch.Tensor:
        name = self._table_name(table)
        flat, bag, bags = self._flatten(self._check_keys(keys, name), offsets)
        pending = self.upcoming.take(name, flat) or self._start(name, flat)
        # index_select, not [inverse]: the same rows, and its backward an index_add (not
        # index_put's accumulate): 1.5-1.7x faster both ways at 13,312 x 128 (docs/scripts/native_ops.py)
        per_key = self._finish(pending).index_select(0, pending.inverse)          # (N, D)
        if self.mode is None:
            return per_key.reshape(*keys.shape, self.tables[name].dim)
        return pool(per_key, bag, bags, self.mode)                                # (B, D)

    def prefetch(self, keys: torch.Tensor, offsets: torch.Tensor | None = None, table: str | None = None) -> None:
        """Look up the keys of a coming ``forward`` now and send their sync, so the PS answers
        while this step computes; the matching ``forward`` then only waits for the reply.

        A prefetched row may miss this worker's own update of the step in between until its next
        refresh (one update, within any bound ``s >= 1``); at ``s = 0`` do not prefetch.
        """
        for name, part in self.upcoming.routed(keys, table):
            flat, _, _ = self._flatten(self._check_keys(part, name), offsets)
            self.upcoming.send(name, flat)

    def announce(self, keys: torch.Tensor, offsets: torch.Tensor | None = None, table: str | None = None) -> None:
        """Tell the cache the keys of a coming ``forward``, in the order the forwards will come,
        ahead of time (up to the cache's ``lookahead`` steps): eviction then keeps the rows
        needed soon (Belady's rule within the window). A hint: without a lookahead window, or
        when the forwards differ, it costs hits, never correctness."""
        for name, part in self.upcoming.routed(keys, table):
            flat, _, _ = self._flatten(self._check_keys(part, name), offsets)
            self.upcoming.announce(name, flat)

    def prefetching(self) -> bool:
        """Whether a prefetched lookup is waiting for its ``forward``."""
        return self.upcoming.in_flight()

    def _start(self, name: str, flat: torch.Tensor) -> "_Pending":
        """Look the unique keys up and send their sync, with this table's due pushes."""
        cache, out = self.caches[name], self._outbox[name]
        unique, inverse = self.upcoming.unique(name, flat)
        plan = cache.lookup(unique, as_of=out.step)
        if len(plan.writeback):
            out.parts.append(plan.writeback)  # kept until sent: an error below loses no update
        pushes = Rows.cat(out.parts) if out.parts else plan.writeback
        handle = self.client.push_sync(name, pushes.keys, pushes.grads, pushes.counts,
                                       unique, plan.clocks, cache.bound, step=max(out.step, 1),
                                       grad_dtype=self.push_dtype, state=cache.state_request,
                                       sq=pushes.sq, as_of=out.step)
        out.parts.clear()
        self.traffic["sparse_push"] += handle.push_bytes  # keys, gradients, counts (and squares) as sent
        self.traffic["sync"] += handle.sync_bytes  # keys and clocks, no rows
        return _Pending(name, flat, inverse, plan, handle)

    def _finish(self, pending: "_Pending") -> torch.Tensor:
        """Wait for the sync's reply; one row per unique key, hooked to the cache's gradient
        update. Shape: -> (n, D)."""
        reply = self._wait(pending.handle)
        self.traffic["sync"] += reply.sync_bytes    # index, clock (and lazy's built mark) of each row
        self.traffic["sparse_pull"] += reply.row_bytes  # rows that travelled: untouched ones are built here
        rows = self.caches[pending.name].fill(pending.plan, reply.index, reply.rows, reply.clocks, reply.state,
                                              now=self._outbox[pending.name].step)
        if not torch.is_grad_enabled():
            return rows
        anchor = torch.empty(0, device=rows.device, requires_grad=True)
        return _HandGradsToCache.apply(anchor, (self, pending.name, pending.plan, rows))

    def _apply_grads(self, name: str, plan: Plan, grads: torch.Tensor) -> None:
        check_finite(grads, "grads", name)  # before the cache or the PS takes any
        out = self._outbox[name]
        out.step += 1
        grads = grads.detach().to(self.device, torch.float32)
        if self.grad_scale != 1.0:
            grads = grads * self.grad_scale
        due = self.caches[name].update(plan, grads, step=out.step)
        if len(due):
            out.parts.append(due)

    # -- consistency ------------------------------------------------------------------------
    def resume_at(self, step: int) -> None:
        """Number the coming steps from ``step`` on, as a checkpoint taken at ``step`` left them:
        every push carries its step, by which the PS's Adam corrects its bias."""
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"step must be an int >= 0, got {step!r}")
        for out in self._outbox.values():
            out.step = step

    def scale_lr(self, factor: float) -> None:
        """The caches' local updates at their table's learning rate times ``factor`` (a schedule's
        at this step, as the shards scale theirs)."""
        for name, cache in self.caches.items():
            cache.scale_lr(factor)

    def forget(self) -> None:
        """Every cache's copies read again from the PS at their next lookup (the PS's rows were
        put back to a save); call after :meth:`flush`."""
        for cache in self.caches.values():
            cache.forget()

    def pending_updates(self) -> int:
        """Row updates this worker made and has not pushed (in its caches and its outbox): what
        its death would lose."""
        cached = sum(int(cache.updates.sum()) for cache in self.caches.values())
        return cached + sum(int(part.counts.sum()) for out in self._outbox.values() for part in out.parts)

    def push_due(self) -> None:
        """Push the rows due now (``u > s``) and wait until the PS applied them, instead of
        sending them with the next sync: synchronous training puts a barrier after this."""
        self._push({name: Rows.cat(out.parts) for name, out in self._outbox.items() if out.parts})

    def push_idle(self, share: float) -> None:
        """Push ``share`` of each cache's rows with updates that no announced step uses
        (:meth:`EmbeddingCache.take_idle`), now and apart from the steps' syncs; the next
        ``flush`` waits for them. The training loop calls it in the last ``lookahead`` steps,
        when the window holds every step left."""
        for name, cache in self.caches.items():
            rows = cache.take_idle(share)
            if len(rows):
                out = self._outbox[name]
                handle = self.client.push(name, rows.keys, rows.grads, rows.counts, step=max(out.step, 1),
                                          sq=rows.sq, grad_dtype=self.push_dtype)
                self._early.append(handle)
                self.traffic["sparse_push"] += handle.push_bytes

    def flush(self) -> None:
        """Push every pending update of every table and wait until the PS applied them."""
        self.upcoming.complete()  # replies of prefetches nobody used
        self._push({name: Rows.cat([*self._outbox[name].parts, cache.flush()])
                    for name, cache in self.caches.items()})

    def _push(self, rows_by_table: dict) -> None:
        """Push the rows and wait. Many rows (a flush of a whole cache) go as pushes of at most
        :data:`FLUSH_KEYS` keys, two in flight: a shard applies a push whole, with scratch in
        proportion to it, and under a memory budget (het.ps.server.shard) that is counted."""
        handles, self._early = self._early, []  # push_idle's, sent earlier
        for name, rows in rows_by_table.items():
            out = self._outbox[name]
            out.parts.clear()
            for piece in rows.pieces(FLUSH_KEYS) if len(rows) else ():
                if len(handles) >= 2:
                    self._wait(handles.pop(0))
                handles.append(self.client.push(name, piece.keys, piece.grads, piece.counts, step=max(out.step, 1),
                                                sq=piece.sq, grad_dtype=self.push_dtype))
                self.traffic["sparse_push"] += handles[-1].push_bytes
        for h in handles:
            self._wait(h)

    def _wait(self, handle):
        """The handle's result; the time blocked on the PS counts in ``wait_s``, not the merging
        of its replies afterwards (rows placed in key order, untouched rows built): that is
        this worker's own work."""
        merged, start = handle.done, time.perf_counter()
        try:
            return self.client.wait(handle)
        finally:
            self.wait_s += time.perf_counter() - start - (0.0 if merged else handle.merge_s)

    def unpushed(self, table: str | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This worker's copies of the rows of ``table`` it updated and has not pushed, with their
        keys and clocks, on the CPU (:meth:`EmbeddingCache.unpushed`). Shape: -> (k,), (k, D), (k,)."""
        name = self._table_name(table)
        return tuple(t.cpu() for t in self.caches[name].unpushed(as_of=self._outbox[name].step))

    def read(self, keys: torch.Tensor, table: str | None = None) -> torch.Tensor:
        """The PS's current rows for ``keys`` (after a flush), bypassing the cache.
        Shape: (*) -> (*, D)."""
        name = self._table_name(table)
        keys = self._check_keys(keys, name)
        self.flush()
        rows, _ = self._wait(self.client.pull(name, keys.reshape(-1), as_of=self._outbox[name].step))
        return rows.reshape(*keys.shape, -1).to(self.device)

    @contextlib.contextmanager
    def fresh(self):
        """Within it, every lookup reads rows as the PS holds them now (plus this worker's own
        updates not yet pushed): the caches' staleness bound is 0, so a cached row behind the
        server by any update is refreshed. For evaluation: after a flush, every rank then
        scores the same, latest model whatever the training bound.

        Example:
            >>> emb = Embedding(10, 2, lr=0.5, cache=CacheConfig(capacity=4, staleness=100))
            >>> cached = emb(torch.tensor([1])).detach()
            >>> ones = torch.ones(1, dtype=torch.int64)  # another worker's push of gradient 1 to row 1:
            >>> emb.client.wait(emb.client.push("embedding", torch.tensor([1]), torch.ones(1, 2), ones))
            1
            >>> torch.equal(emb(torch.tensor([1])), cached)  # 1 update behind is within the bound
            True
            >>> with emb.fresh():
            ...     torch.allclose(emb(torch.tensor([1])), cached - 0.5)  # the PS's row
            True
            >>> emb.caches["embedding"].bound  # back to the training bound
            100
        """
        bounds = {name: cache.bound for name, cache in self.caches.items()}
        for cache in self.caches.values():
            cache.bound = 0
        try:
            yield self
        finally:
            for name, cache in self.caches.items():
                cache.bound = bounds[name]

    def stats(self) -> dict:
        return {name: cache.stats() for name, cache in self.caches.items()}

    def total_stats(self) -> dict:
        """Every table's cache counters summed, their rates over the sums (one table: its own)."""
        per = list(self.stats().values())
        return per[0] if len(per) == 1 else summed_stats(per)

    def _apply(self, fn, recurse=True):
        """``.to(device)`` / ``.cuda()`` move the caches and the rows returned."""
        device = fn(torch.empty(0, device=self.device)).device
        if device != self.device:
            self.flush()
            self.device = device
            for cache in self.caches.values():
                cache.to(device)
        return super()._apply(fn, recurse)

    def extra_repr(self) -> str:
        tables = ", ".join(f"{t.name}: {t.size} {t.optimizer.name}" for t in self.tables.values())
        caches = ", ".join(f"{n}: {c.slots} rows {c.cfg.policy} s={c.bound}" for n, c in self.caches.items())
        return f"tables=[{tables}], caches=[{caches}], shards={self.client.num_shards}, mode={self.mode}"

    # -- checks -----------------------------------------------------------------------------
    def _table_name(self, table: str | None) -> str:
        if table is None:
            if len(self.tables) != 1:
                raise ValueError(f"this module holds tables {sorted(self.tables)}: name one with table=")
            return next(iter(self.tables))
        if table not in self.tables:
            raise ValueError(f"unknown table {table!r}: this module holds {sorted(self.tables)}")
        return table

    def _check_keys(self, keys, name: str) -> torch.Tensor:
        pad = self.padding_idx if self.mode is not None else None  # a pooled lookup's padding
        return check_keys(self.tables[name], keys, allowed=pad).to(self.device)

    def _flatten(self, keys, offsets):
        """Input -> (flat keys (N,), bag of each key (N,) or None, number of bags)."""
        if self.mode is None:
            if offsets is not None:
                raise ValueError("offsets are for pooled lookups: build the module with mode='sum' or 'mean'")
            return keys.reshape(-1), None, 0
        return bag_keys(keys, offsets, self.padding_idx)


class _HandGradsToCache(torch.autograd.Function):
    """Identity on the rows; its backward gives the rows' gradient to the module's cache."""

    @staticmethod
    def forward(ctx, anchor, box):
        module, name, plan, rows = box
        ctx.box = (module, name, plan)
        return rows

    @staticmethod
    def backward(ctx, grad):
        module, name, plan = ctx.box
        module._apply_grads(name, plan, grad)
        return None, None


