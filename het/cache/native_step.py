"""A worker cache's step in het's native core (het.native): each of announce, lookup, fill and
update one C++ pass over the keys, on CPU tensors. The same results as
:class:`het.cache.torch_step.TorchStep`, bit for bit (under a local rule that follows Adagrad,
to float rounding: the native pass sums a row's squares in lanes)."""

from __future__ import annotations

import torch

from het import native
from het.cache.plan import Plan, Rows


class NativeStep:
    """The cache's announce, lookup, fill and update on ``cache``'s tensors, natively."""

    def __init__(self, cache):
        self.cache = cache

    def announce(self, keys: torch.Tensor, number: int) -> None:
        c = self.cache
        native.ops.cache_soon(keys, c.keys, c.held, c.soon, c.ways, number)

    def lookup(self, keys: torch.Tensor, nxt: torch.Tensor | None) -> Plan:
        """Find, touch, placement and eviction in one call; with a window the call orders the
        misses, weighs the window and marks the slots' next use."""
        c = self.cache
        ahead = nxt is not None and bool(c.window.queue)
        slot, hit, clocks, wb_keys, wb_grads, wb_counts, counts, wb_sq = native.ops.cache_lookup(
            keys.contiguous(), torch.empty(0, dtype=torch.int64) if nxt is None else nxt.contiguous(), c.keys,
            c.held, c.rows, c.pending, c.clock, c.updates, c.last_use, c.uses, c.score,
            c.ways, c.step, c.protect, c.policy.name == "lfu", c.soon,
            c.window.now if c.window is not None else 0, ahead, c.sq)
        n_hit, placed, evictions = counts.tolist()
        n = keys.numel()
        c.counters["hits"] += n_hit
        c.counters["misses"] += n - n_hit
        if n_hit < n:
            c.counters["bypasses"] += n - n_hit - placed
            c.counters["evictions"] += evictions
            c.counters["writebacks"] += len(wb_keys)
            c.counters["pushed_rows"] += len(wb_keys)
        return Plan(keys, slot, hit, clocks, Rows(wb_keys, wb_grads, wb_counts, wb_sq if c.sq.shape[1] else None))

    def fill(self, plan: Plan, index: torch.Tensor, rows: torch.Tensor, clocks: torch.Tensor,
             state: torch.Tensor | None) -> torch.Tensor:
        c = self.cache
        acc, sq = (c.acc, c.sq) if state is not None else (c.acc[:, :0], c.sq[:, :0])  # none: no rule to follow
        sent_state = acc if state is None else state.float().contiguous()
        out, stats = native.ops.cache_fill(plan.slot, plan.hit, index.long().contiguous(), rows.contiguous(),
                                           clocks.long().contiguous(), c.rows, c.pending, c.clock,
                                           c.local_lr, acc, sent_state, sq, c.updates, c.lr, c.eps)
        stale, drift_sq, norm_sq = stats.tolist()
        c.counters["stale_refreshes"] += int(stale)
        if stale:
            c.counters["drift_sq"] += drift_sq
            c.counters["drift_norm_sq"] += norm_sq
        return out

    def update(self, plan: Plan, grads: torch.Tensor) -> Rows:
        c = self.cache
        keys, g, counts, due, sq = native.ops.cache_update(
            plan.keys, plan.slot, grads.contiguous(), c.keys, c.held, c.rows, c.pending, c.clock,
            c.updates, c.local_lr, float(c.bound), c.own_seen, c.clear_clock, c.acc, c.sq, c.lr, c.eps)
        c.counters["pushed_rows"] += int(due)
        return Rows(keys, g, counts, sq if c.sq.shape[1] else None)
