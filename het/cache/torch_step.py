"""A worker cache's step by torch's tensor ops: the reference, and the path on CUDA.

:class:`TorchStep` and :class:`het.cache.native_step.NativeStep` make the same calls on an
:class:`~het.cache.cache.EmbeddingCache`'s slot tensors, which the cache chooses between once,
when it is made or moved; property tests hold the two equal bit for bit
(tests/unit/test_native.py). No Python loop runs per key: misses are placed in rounds of one
miss per set.
"""

from __future__ import annotations

import torch

from het.adagrad import adagrad_factor
from het.cache.lookahead import NEVER
from het.cache.plan import Plan, Rows
from het.cache.policy import PROTECTED
from het.staleness import must_push

_SOON = (1 << 62) + NEVER  # a row needed in the lookahead window scores _SOON - (steps away):
                            # above every policy score (< 2^62), below PROTECTED


class TorchStep:
    """The cache's announce, lookup, fill and update on ``cache``'s tensors, by torch's ops."""

    def __init__(self, cache):
        self.cache = cache

    def announce(self, keys: torch.Tensor, number: int) -> None:
        """The slots holding ``keys`` (the step announced as ``number``) are used then at the
        latest."""
        c = self.cache
        slot = self.find(keys.to(c.device))
        slot = slot[slot >= 0]
        c.soon.index_copy_(0, slot, c.soon.index_select(0, slot).clamp(max=number))

    def find(self, keys: torch.Tensor, sets: torch.Tensor | None = None) -> torch.Tensor:
        """The slot holding each key, -1 where none does (``sets``: the keys' sets, if known).
        Only held slots match: an empty one holds no key, whatever its stored value.
        Shape: (n,) -> (n,)."""
        c = self.cache
        sets = c.set_of(keys) if sets is None else sets
        match = (c._by_set(c.keys, sets) == keys[:, None]) & c._by_set(c.held, sets)  # (n, W)
        return torch.where(match.any(1), sets * c.ways + match.to(torch.uint8).argmax(1), -1)

    # -- lookup -----------------------------------------------------------------------------
    def lookup(self, keys: torch.Tensor, nxt: torch.Tensor | None) -> Plan:
        """Find ``keys``; hits are touched, misses placed or bypassed, victims evicted; with
        ``nxt`` (each key's next announced use) the slots' next uses are marked."""
        c = self.cache
        n = keys.numel()
        sets = c.set_of(keys)                                              # (n,)
        slot = self.find(keys, sets)
        hit = slot >= 0
        hit_slots = slot[hit]
        self._touch(hit_slots, c.uses.index_select(0, hit_slots) + 1)
        n_hit = int(hit_slots.numel())
        c.counters["hits"] += n_hit
        c.counters["misses"] += n - n_hit
        writeback = c._no_rows()
        if n_hit < n:
            writeback = self._place(keys, sets, slot, ~hit, nxt)
        if nxt is not None:
            held = slot >= 0
            c.soon.index_copy_(0, slot[held], nxt[held])
        clocks = torch.where(hit, c.clock.index_select(0, slot.clamp(min=0)), -1)
        return Plan(keys, slot, hit, clocks, writeback)

    def _place(self, keys, key_sets, slot, miss, nxt=None) -> Rows:
        """Give each miss the lowest-scored unprotected way of its set; the rest bypass.

        Misses are placed in rounds, one miss per set a round (most sets get at most one),
        so each round is an argmin over the ways instead of a sort; with a lookahead window the
        misses needed soonest go first.
        """
        c = self.cache
        pos = miss.nonzero().flatten()
        victims, placed = [], 0
        away = cand_away = None
        if nxt is not None and c.window.queue:  # Belady's rule within the window
            away, cand_away = c.window.steps_away(c.soon), c.window.steps_away(nxt)
            pos = pos[torch.argsort(cand_away.index_select(0, pos), stable=True)]  # soonest first
        for _ in range(c.ways):
            if pos.numel() == 0:
                break
            sets = key_sets.index_select(0, pos)
            order = torch.arange(pos.numel(), device=c.device)
            first = torch.full((c.num_sets,), pos.numel(), dtype=torch.int64, device=c.device)
            first.scatter_reduce_(0, sets, order, reduce="amin")
            lead = first.index_select(0, sets) == order                   # one miss per set
            now, pos, sets = pos[lead], pos[~lead], sets[lead]
            score = self._scores(sets, away)                              # (k, W)
            best = score.argmin(1)
            victim = score.gather(1, best[:, None]).squeeze(1)
            ok = victim != PROTECTED
            if away is not None:  # a victim needed sooner than the miss stays; the miss bypasses
                ok &= (victim <= _SOON - NEVER) | (cand_away.index_select(0, now) < _SOON - victim)
            now, chosen = now[ok], (sets * c.ways + best)[ok]
            victims.append((chosen, c.keys.index_select(0, chosen), c.held.index_select(0, chosen)))
            c.keys.index_copy_(0, chosen, keys.index_select(0, now))
            c.held.index_fill_(0, chosen, True)
            c.clock.index_fill_(0, chosen, -1)
            self._touch(chosen, torch.ones_like(chosen))
            slot[now] = chosen
            placed += now.numel()
        c.counters["bypasses"] += int(miss.sum()) - placed
        return self._evict(*(victims[0] if len(victims) == 1 else map(torch.cat, zip(*victims))))

    def _touch(self, slots: torch.Tensor, uses: torch.Tensor) -> None:
        """Record a use of ``slots`` in this step, now holding ``uses`` uses since insertion."""
        c = self.cache
        c.last_use.index_fill_(0, slots, c.step)
        c.uses.index_copy_(0, slots, uses)
        c.score.index_copy_(0, slots, c.policy.score(torch.full_like(uses, c.step), uses))

    def _scores(self, sets: torch.Tensor, away: torch.Tensor | None = None) -> torch.Tensor:
        """Eviction scores of the ways of ``sets``; slots used in this step are PROTECTED; with
        ``away`` (steps until each slot's next use), rows in the window rank above the rest,
        the one needed last lowest."""
        c = self.cache
        in_use = c._by_set(c.last_use, sets) > c.step - c.protect
        score = c._by_set(c.score, sets)
        if away is not None:
            a = c._by_set(away, sets)
            score = torch.where(a < NEVER, _SOON - a, score)
        return torch.where(in_use, PROTECTED, score)

    def _evict(self, slots: torch.Tensor, old_keys: torch.Tensor, held: torch.Tensor) -> Rows:
        """The rows that ``slots`` held (where ``held``) before they took new keys: those with
        unpushed updates are returned to push, and their slots' updates are cleared for the new
        keys."""
        c = self.cache
        c.counters["evictions"] += int(held.sum())
        dirty = held & (c.updates.index_select(0, slots) > 0)
        writeback = c._take(slots[dirty])
        writeback.keys = old_keys[dirty]
        c.counters["writebacks"] += len(writeback)
        return writeback

    # -- fill and update --------------------------------------------------------------------
    def fill(self, plan: Plan, index: torch.Tensor, rows: torch.Tensor, clocks: torch.Tensor,
             state: torch.Tensor | None) -> torch.Tensor:
        """Take the rows the PS sent for ``plan.keys[index]``; every key's row. A refreshed row
        is the server's value minus the step its pending updates will take there."""
        c = self.cache
        slot = plan.slot
        sent_slot = slot.index_select(0, index)
        cached = sent_slot >= 0
        all_cached = bool(cached.all())
        cs = sent_slot if all_cached else sent_slot[cached]
        fresh = rows if all_cached else rows[cached]
        stale = plan.hit.index_select(0, index)
        stale = stale if all_cached else stale[cached]
        stale_hits = int(stale.sum())
        if state is not None:
            c.acc.index_copy_(0, cs, state if all_cached else state[cached])
        if stale_hits:  # re-apply the local updates not yet pushed (misses have none)
            if c.rule == "sgd":
                fresh = fresh - c.local_lr * c.pending.index_select(0, cs)
            else:  # the step the server will take with the pending push
                fresh = fresh - self._server_step(c.acc.index_select(0, cs), c.pending.index_select(0, cs),
                                                  c.sq.index_select(0, cs), c.updates.index_select(0, cs))
            self._count_drift(c.rows.index_select(0, cs[stale]), fresh[stale])
        c.rows.index_copy_(0, cs, fresh)
        c.clock.index_copy_(0, cs, clocks if all_cached else clocks[cached])
        c.counters["stale_refreshes"] += stale_hits
        if c.num_sets:
            out = c.rows.index_select(0, slot.clamp(min=0))
        else:
            out = torch.empty(slot.numel(), c.table.dim, device=c.device)
        if not all_cached:
            bypass = ~cached
            out.index_copy_(0, index[bypass], rows[bypass])
        return out

    def _count_drift(self, old: torch.Tensor, new: torch.Tensor) -> None:
        """How far refreshed copies had drifted from what the server's rows say they are: the
        squared distance from each copy to its refreshed value, and the refreshed values'
        squared norms (``stats``'s ``drift``). Shape: (k, D), (k, D)."""
        self.cache.counters["drift_sq"] += float(((old - new) ** 2).sum())
        self.cache.counters["drift_norm_sq"] += float((new * new).sum())

    def update(self, plan: Plan, grads: torch.Tensor) -> Rows:
        """Apply one step's gradients to the cached rows and accumulate them; the rows due to be
        pushed and the gradients of bypassed keys."""
        c = self.cache
        slot = plan.slot
        # a key may have bypassed the cache, or lost its slot to a later lookup
        if c.num_sets:
            at = slot.clamp(min=0)
            live = (c.keys.index_select(0, at) == plan.keys) & c.held.index_select(0, at) & (slot >= 0)
        else:
            live = torch.zeros_like(slot, dtype=torch.bool)
        all_live = bool(live.all())
        s, g = (slot, grads) if all_live else (slot[live], grads[live])
        if c.rule == "sgd":
            c.rows.index_add_(0, s, g * -c.local_lr)
            c.pending.index_add_(0, s, g)
            if c.sq.shape[1]:  # Adam's squares, pushed with the rows
                c.sq.index_add_(0, s, self._squares(g))
        else:  # the copy is the synced row moved by the server's step for the pending sum
            acc, before, sq, u = (t.index_select(0, s) for t in (c.acc, c.pending, c.sq, c.updates))
            after, sq_after = before + g, sq + self._squares(g)
            c.rows.index_add_(0, s, self._server_step(acc, before, sq, u) - self._server_step(acc, after, sq_after, u + 1))
            c.pending.index_copy_(0, s, after)
            c.sq.index_copy_(0, s, sq_after)
        c.updates.index_add_(0, s, torch.ones_like(s))
        due = s[must_push(c.updates.index_select(0, s), c.bound)]
        out = [c._take(due, stay=True)]
        if not all_live:
            gone = ~live
            out.append(Rows(plan.keys[gone], grads[gone], torch.ones_like(plan.keys[gone]),
                            self._squares(grads[gone]) if c.sq.shape[1] else None))
        return out[0] if len(out) == 1 else Rows.cat(out)

    def _server_step(self, acc: torch.Tensor, pending: torch.Tensor, sq: torch.Tensor,
                     counts: torch.Tensor) -> torch.Tensor:
        """What the table's Adagrad will move rows by when it applies a push of ``pending``, the
        sum of ``counts`` steps whose squared gradients sum to ``sq``, from ``acc``, its
        accumulator before (het.adagrad.adagrad_factor; per row: (k, 1), per coordinate:
        (k, D)). Shape: -> (k, D)."""
        c = self.cache
        return pending * adagrad_factor(acc, sq, counts[:, None], c.eps) * c.lr

    def _squares(self, grads: torch.Tensor) -> torch.Tensor:
        """What one step of ``grads`` adds to the accumulator: per row or per coordinate."""
        sq = grads * grads
        return sq.mean(1, keepdim=True) if self.cache.sq.shape[1] == 1 else sq
