"""The worker-side cache of one table's hot rows: set-associative slots with per-row clocks.

Layout (as FBGEMM's embedding cache): ``capacity`` rows in sets of ``ways`` slots; a key hashes
to one set and may sit in any of its ways. Per slot: the key, the row, ``c_s`` (server clock at
the last sync), ``u`` (updates not yet pushed), the pending gradient sum, the step of last use
and the uses since insertion. All of it is tensors on the cache's device, and every operation
takes a whole tensor of keys. Any int64 is a key (a dynamic table's raw ids, negative ones
too): a slot is empty by its ``held`` mark, never by the key it stores, so no key value is
reserved.

One training step, for the unique keys of a batch::

    plan = cache.lookup(keys)              # hits, slots for misses, victims to write back
    # send plan.writeback (push) and sync(keys, plan.clocks) to the PS, wait for the reply
    rows = cache.fill(plan, reply.index, reply.rows, reply.clocks, reply.state)  # (n, D): every key's row
    ...forward, backward...
    push = cache.update(plan, grads)       # local update; rows with u > s are due to push
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import torch

from het import memory, native
from het.cache.lookahead import NEVER, Lookahead
from het.cache.policy import EMPTY, POLICIES, PROTECTED
from het.config import CacheConfig, TableConfig
from het.adagrad import adagrad_factor
from het.staleness import must_push

_HASH = -7046029254386353131  # 0x9E3779B97F4A7C15 as int64: Fibonacci hashing
_SOON = (1 << 62) + NEVER  # a row needed in the lookahead window scores _SOON - (steps away):
                            # above every policy score (< 2^62), below PROTECTED


@dataclass
class Rows:
    """Rows bound for the PS: keys, summed gradients and update counts, and under a local rule
    that follows Adagrad the sums of the steps' squared gradients (het.ps.store.optim.Pushed).
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


@dataclass
class Plan:
    """What a lookup decided for the unique keys of one step.

    ``slot[i]`` is the slot of ``keys[i]`` or -1 when the key bypasses the cache; ``clocks[i]``
    is what to sync (``c_s`` of a hit, -1 for a miss); ``writeback`` holds the evicted rows
    that carried unpushed updates. Shape: keys, slot, hit, clocks (n,).
    """

    keys: torch.Tensor
    slot: torch.Tensor
    hit: torch.Tensor
    clocks: torch.Tensor
    writeback: Rows


class EmbeddingCache:
    """A bounded cache of one table's rows, kept consistent with HET's clock rules.

    Args:
        table: the table cached (its ``dim`` and ``rows``).
        cfg: capacity, policy, staleness bound, ways.
        device: where slots and rows live (CPU or CUDA).

    Example:
        >>> from het.config import CacheConfig, TableConfig
        >>> cache = EmbeddingCache(TableConfig("t", rows=100, dim=2), CacheConfig(capacity=8, ways=4))
        >>> plan = cache.lookup(torch.tensor([3, 9]))
        >>> plan.hit.tolist(), plan.clocks.tolist()
        ([False, False], [-1, -1])
        >>> rows = cache.fill(plan, torch.arange(2), torch.ones(2, 2), torch.tensor([4, 6]))  # the PS's reply
        >>> plan = cache.lookup(torch.tensor([9, 5]))  # 9 is cached now, with the clock the PS sent
        >>> plan.hit.tolist(), plan.clocks.tolist()
        ([True, False], [6, -1])
    """

    def __init__(self, table: TableConfig, cfg: CacheConfig, device: torch.device | str = "cpu"):
        self.table, self.cfg = table, cfg
        self.device = torch.device(device)
        self.bound = cfg.staleness
        self.local_lr = cfg.local_lr if cfg.local_lr is not None else table.optimizer.lr
        self.policy = POLICIES[cfg.policy]
        self.ways = min(cfg.ways, cfg.capacity) if cfg.capacity else cfg.ways
        self.num_sets = math.ceil(cfg.capacity / self.ways) if cfg.capacity else 0
        n, d, dev = self.num_sets * self.ways, table.dim, self.device
        self.keys = torch.full((n,), EMPTY, dtype=torch.int64, device=dev)  # meaningful where held
        self.held = torch.zeros(n, dtype=torch.bool, device=dev)  # slots holding a key: EMPTY is a key too
        self.rows = memory.zeros(n, d, device=dev)  # big, read at random rows: on huge pages
        self.pending = memory.zeros(n, d, device=dev)
        self.clock = torch.full((n,), -1, dtype=torch.int64, device=dev)   # c_s
        self.updates = torch.zeros(n, dtype=torch.int64, device=dev)       # u
        self.last_use = torch.full((n,), -(1 << 40), dtype=torch.int64, device=dev)  # never used
        self.uses = torch.zeros(n, dtype=torch.int64, device=dev)
        self.score = torch.full((n,), -1, dtype=torch.int64, device=dev)  # eviction order; empty -1
        # ceil(capacity / ways) sets can hold more than capacity slots: switch the surplus off,
        # the last ways of the sets in turn, so the cache holds exactly `capacity` rows.
        j = torch.arange(n - cfg.capacity if cfg.capacity else 0, device=dev)
        self.disabled = torch.zeros(n, dtype=torch.bool, device=dev)
        if self.num_sets:
            self.disabled[(j % self.num_sets) * self.ways + self.ways - 1 - j // self.num_sets] = True
        self.score[self.disabled] = PROTECTED
        self.step = 0
        self.protect = 1  # slots used in the last `protect` lookups are never victims
        # announced coming steps; the native index on CPU
        self.window = Lookahead(cfg.lookahead, native=native.ops is not None and self.device.type == "cpu") \
            if cfg.lookahead else None
        self.soon = torch.full((n,), NEVER, dtype=torch.int64, device=dev)  # next announced use
        # the local update (CacheConfig.local_update): "sgd", or follow the table's Adagrad from
        # `acc`, the summary of its accumulator the shard sent with the row ("row": (n, 1),
        # "full": (n, D)) and what the pushes since added to it
        opt = table.optimizer
        self.rule = local_rule(opt.name, cfg.local_update if cfg.local_lr is None else "sgd")
        width = {"sgd": 0, "row": 1, "full": d}[self.rule]
        self.acc = memory.zeros(n, width, device=dev)
        self.sq = memory.zeros(n, width, device=dev)  # the pending steps' squared gradients, summed
        self.lr, self.eps = opt.lr, opt.eps or 0.0
        # a copy whose own updates are the server's (SGD at the table's lr; Adagrad followed
        # from its whole state: row-wise Adagrad's float a row, or "full") counts them as seen
        # once pushed: c_s += u (see _take). Per-coordinate Adagrad followed from a float a row
        # ("row", the default) only approximates the server: its pushed copies are refreshed.
        self.own_seen = ((opt.name == "sgd" and self.local_lr == opt.lr)
                         or (self.rule == "row" and opt.name == "rowwise_adagrad") or self.rule == "full")
        # else a pushed row's copy asks again as a miss when the shard may drop the push (see _take)
        self.clear_clock = not self.own_seen and table.rows is None and table.admit_after > 1
        self.counters = Counter()
        self._way = torch.arange(self.ways, device=dev)
        self.native = native.usable(self.rows)  # the C++ step (het.native) on CPU, this code elsewhere

    def to(self, device) -> "EmbeddingCache":
        """Move every slot tensor to ``device`` (in place); returns self."""
        self.device = torch.device(device)
        for name in ("keys", "held", "rows", "pending", "clock", "updates", "last_use", "uses", "score", "disabled", "_way",
                     "soon", "acc", "sq"):
            setattr(self, name, getattr(self, name).to(self.device))
        self.native = native.usable(self.rows)
        return self

    @property
    def slots(self) -> int:
        """Rows the cache can hold."""
        return self.cfg.capacity if self.num_sets else 0

    @property
    def cached_keys(self) -> torch.Tensor:
        """The keys the cache holds now, in slot order. Shape: (m,)."""
        return self.keys[self.held]

    def announce(self, keys: torch.Tensor, unique_sorted: bool = False) -> None:
        """The keys of a coming step, after those already announced (the data loader knows
        them): eviction follows Belady's rule within the announced window (het.cache.lookahead).
        Ignored without a lookahead window. ``unique_sorted``: ``keys`` are ``torch.unique``'s
        already. Shape: any."""
        if self.window is None:
            return
        number = self.window.announce(keys, unique_sorted)
        if self.num_sets and self.native and self.soon.device.type == "cpu":
            native.ops.cache_soon(self.window.queue[-1][1], self.keys, self.held, self.soon, self.ways, number)
        elif self.num_sets:
            slot = self._find(self.window.queue[-1][1].to(self.device))
            slot = slot[slot >= 0]
            self.soon.index_copy_(0, slot, self.soon.index_select(0, slot).clamp(max=number))

    def _find(self, keys: torch.Tensor, sets: torch.Tensor | None = None) -> torch.Tensor:
        """The slot holding each key, -1 where none does (``sets``: the keys' sets, if known).
        Only held slots match: an empty one holds no key, whatever its stored value.
        Shape: (n,) -> (n,)."""
        sets = self.set_of(keys) if sets is None else sets
        match = (self._by_set(self.keys, sets) == keys[:, None]) & self._by_set(self.held, sets)  # (n, W)
        return torch.where(match.any(1), sets * self.ways + match.to(torch.uint8).argmax(1), -1)

    def set_of(self, keys: torch.Tensor) -> torch.Tensor:
        """The set of each key, by Fibonacci hashing: the key times 2^64 / golden ratio (mod
        2^64), whose high 32 bits, read as a fraction of 1, scale to ``[0, num_sets)``. High
        bits depend on every bit of the key, so raw ids that share their low bits (multiples
        of 1024, say) still spread; any int64 (negative, int64's extremes) lands in range.
        Shape: (n,) -> (n,).

        Example:
            >>> from het.config import CacheConfig, TableConfig
            >>> cache = EmbeddingCache(TableConfig("t", rows=None, dim=1), CacheConfig(capacity=12, ways=4))
            >>> cache.set_of(torch.tensor([-1, 0, -2**63, 2**63 - 1, 1 << 40, 2 << 40])).tolist()  # 3 sets
            [1, 0, 1, 2, 0, 1]
        """
        high = ((keys * _HASH) >> 32) & 0xFFFFFFFF  # (n,) in [0, 2^32): the product wraps mod 2^64
        return (high * self.num_sets) >> 32          # num_sets < 2^31: no overflow

    # -- the step ---------------------------------------------------------------------------
    def lookup(self, keys: torch.Tensor) -> Plan:
        """Find ``keys`` (unique, int64, on the cache's device); give each miss a slot or let it
        bypass; evict victims. Shape: (n,)."""
        self.step += 1
        n = keys.numel()
        self.counters["lookups"] += n
        if self.window is not None:
            self.window.advance(keys)
        if self.num_sets == 0:
            self.counters["misses"] += n
            self.counters["bypasses"] += n
            slot = torch.full_like(keys, -1)
            return Plan(keys, slot, torch.zeros_like(keys, dtype=torch.bool), slot.clone(), self._no_rows())
        # the next announced step each key is needed in
        nxt = self.window.next_use(keys) if self.window is not None else None
        if self.native and keys.device.type == "cpu":
            return self._lookup_native(keys, nxt)
        sets = self.set_of(keys)                                              # (n,)
        slot = self._find(keys, sets)
        hit = slot >= 0
        hit_slots = slot[hit]
        self._touch(hit_slots, self.uses.index_select(0, hit_slots) + 1)
        n_hit = int(hit_slots.numel())
        self.counters["hits"] += n_hit
        self.counters["misses"] += n - n_hit
        writeback = self._no_rows()
        if n_hit < n:
            writeback = self._place(keys, sets, slot, ~hit, nxt)
        if nxt is not None:
            held = slot >= 0
            self.soon.index_copy_(0, slot[held], nxt[held])
        clocks = torch.where(hit, self.clock.index_select(0, slot.clamp(min=0)), -1)
        return Plan(keys, slot, hit, clocks, writeback)

    def _lookup_native(self, keys: torch.Tensor, nxt: torch.Tensor | None) -> Plan:
        """:meth:`lookup`'s find, touch, placement and eviction in one native call (het.native);
        the same plan, bit for bit."""
        # with a window the native call orders the misses, weighs the window and marks the
        # slots' next use, as the reference's argsort, steps_away and soon.index_copy_
        ahead = nxt is not None and bool(self.window.queue)
        slot, hit, clocks, wb_keys, wb_grads, wb_counts, counts, wb_sq = native.ops.cache_lookup(
            keys.contiguous(), torch.empty(0, dtype=torch.int64) if nxt is None else nxt.contiguous(), self.keys,
            self.held, self.rows, self.pending, self.clock, self.updates, self.last_use, self.uses, self.score,
            self.ways, self.step, self.protect, self.policy.name == "lfu", self.soon,
            self.window.now if self.window is not None else 0, ahead, self.sq)
        n_hit, placed, evictions = counts.tolist()
        n = keys.numel()
        self.counters["hits"] += n_hit
        self.counters["misses"] += n - n_hit
        if n_hit < n:
            self.counters["bypasses"] += n - n_hit - placed
            self.counters["evictions"] += evictions
            self.counters["writebacks"] += len(wb_keys)
            self.counters["pushed_rows"] += len(wb_keys)
        return Plan(keys, slot, hit, clocks, Rows(wb_keys, wb_grads, wb_counts, None if self.rule == "sgd" else wb_sq))

    def _by_set(self, values: torch.Tensor, sets: torch.Tensor) -> torch.Tensor:
        """The ways of ``sets``, one set a row. Shape: (T,) -> (T, W)."""
        return values.view(self.num_sets, self.ways).index_select(0, sets)

    def _place(self, keys, key_sets, slot, miss, nxt=None) -> Rows:
        """Give each miss the lowest-scored unprotected way of its set; the rest bypass.

        Misses are placed in rounds, one miss per set a round (most sets get at most one),
        so each round is an argmin over the ways instead of a sort; with a lookahead window the
        misses needed soonest go first.
        """
        pos = miss.nonzero().flatten()
        victims, placed = [], 0
        away = cand_away = None
        if nxt is not None and self.window.queue:  # Belady's rule within the window
            away, cand_away = self.window.steps_away(self.soon), self.window.steps_away(nxt)
            pos = pos[torch.argsort(cand_away.index_select(0, pos), stable=True)]  # soonest first
        for _ in range(self.ways):
            if pos.numel() == 0:
                break
            sets = key_sets.index_select(0, pos)
            order = torch.arange(pos.numel(), device=self.device)
            first = torch.full((self.num_sets,), pos.numel(), dtype=torch.int64, device=self.device)
            first.scatter_reduce_(0, sets, order, reduce="amin")
            lead = first.index_select(0, sets) == order                   # one miss per set
            now, pos, sets = pos[lead], pos[~lead], sets[lead]
            score = self._scores(sets, away)                              # (k, W)
            best = score.argmin(1)
            victim = score.gather(1, best[:, None]).squeeze(1)
            ok = victim != PROTECTED
            if away is not None:  # a victim needed sooner than the miss stays; the miss bypasses
                ok &= (victim <= _SOON - NEVER) | (cand_away.index_select(0, now) < _SOON - victim)
            now, chosen = now[ok], (sets * self.ways + best)[ok]
            victims.append((chosen, self.keys.index_select(0, chosen), self.held.index_select(0, chosen)))
            self.keys.index_copy_(0, chosen, keys.index_select(0, now))
            self.held.index_fill_(0, chosen, True)
            self.clock.index_fill_(0, chosen, -1)
            self._touch(chosen, torch.ones_like(chosen))
            slot[now] = chosen
            placed += now.numel()
        self.counters["bypasses"] += int(miss.sum()) - placed
        return self._evict(*(victims[0] if len(victims) == 1 else map(torch.cat, zip(*victims))))

    def _touch(self, slots: torch.Tensor, uses: torch.Tensor) -> None:
        """Record a use of ``slots`` in this step, now holding ``uses`` uses since insertion."""
        self.last_use.index_fill_(0, slots, self.step)
        self.uses.index_copy_(0, slots, uses)
        self.score.index_copy_(0, slots, self.policy.score(torch.full_like(uses, self.step), uses))

    def _scores(self, sets: torch.Tensor, away: torch.Tensor | None = None) -> torch.Tensor:
        """Eviction scores of the ways of ``sets``; slots used in this step are PROTECTED; with
        ``away`` (steps until each slot's next use), rows in the window rank above the rest,
        the one needed last lowest."""
        in_use = self._by_set(self.last_use, sets) > self.step - self.protect
        score = self._by_set(self.score, sets)
        if away is not None:
            a = self._by_set(away, sets)
            score = torch.where(a < NEVER, _SOON - a, score)
        return torch.where(in_use, PROTECTED, score)

    def _evict(self, slots: torch.Tensor, old_keys: torch.Tensor, held: torch.Tensor) -> Rows:
        """The rows that ``slots`` held (where ``held``) before they took new keys: those with
        unpushed updates are returned to push, and their slots' updates are cleared for the new
        keys."""
        self.counters["evictions"] += int(held.sum())
        dirty = held & (self.updates.index_select(0, slots) > 0)
        dirty_slots = slots[dirty]
        writeback = self._take(dirty_slots)
        writeback.keys = old_keys[dirty]
        self.counters["writebacks"] += len(writeback)
        return writeback

    @property
    def state_request(self) -> str | None:
        """The optimizer state a sync must ask the PS for, beside the rows: the local rule's
        (none without slots: no copy to follow it)."""
        return None if self.rule == "sgd" or not self.num_sets else self.rule

    def _server_step(self, acc: torch.Tensor, pending: torch.Tensor, sq: torch.Tensor,
                     counts: torch.Tensor) -> torch.Tensor:
        """What the table's Adagrad will move rows by when it applies a push of ``pending``, the
        sum of ``counts`` steps whose squared gradients sum to ``sq``, from ``acc``, its
        accumulator before (het.adagrad.adagrad_factor; per row: (k, 1), per coordinate:
        (k, D)). Shape: -> (k, D)."""
        return pending * adagrad_factor(acc, sq, counts[:, None], self.eps) * self.lr

    def _squares(self, grads: torch.Tensor) -> torch.Tensor:
        """What one step of ``grads`` adds to the accumulator: per row or per coordinate."""
        sq = grads * grads
        return sq.mean(1, keepdim=True) if self.acc.shape[1] == 1 else sq

    def fill(self, plan: Plan, index: torch.Tensor, rows: torch.Tensor, clocks: torch.Tensor,
             state: torch.Tensor | None = None) -> torch.Tensor:
        """Take the rows the PS sent for ``plan.keys[index]`` (misses and stale hits); return
        every key's row. A refreshed row is the server's value plus the local updates not yet
        pushed. ``state``: the rows' optimizer state (``state_request``), which a local rule
        other than SGD needs. Shape: index (m,), rows (m, D), clocks (m,), state (m, W) -> (n, D)."""
        if self.state_request is not None and (state is None or state.shape != (len(index), self.acc.shape[1])):
            raise ValueError(f"the {self.rule!r} local update needs the rows' optimizer state: expected shape "
                             f"({len(index)}, {self.acc.shape[1]}), got {None if state is None else tuple(state.shape)}")
        if self.native and rows.dtype == torch.float32 and native.usable(rows, index, plan.slot):
            acc, sq = (self.acc, self.sq) if state is not None else (self.acc[:, :0], self.sq[:, :0])  # none: no rule
            sent_state = acc if state is None else state.float().contiguous()
            out, stats = native.ops.cache_fill(plan.slot, plan.hit, index.long().contiguous(), rows.contiguous(),
                                               clocks.long().contiguous(), self.rows, self.pending, self.clock,
                                               self.local_lr, acc, sent_state, sq, self.updates, self.lr, self.eps)
            stale, drift_sq, norm_sq = stats.tolist()
            self.counters["stale_refreshes"] += int(stale)
            if stale:
                self.counters["drift_sq"] += drift_sq
                self.counters["drift_norm_sq"] += norm_sq
            return out
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
            self.acc.index_copy_(0, cs, state if all_cached else state[cached])
        if stale_hits:  # re-apply the local updates not yet pushed (misses have none)
            if self.rule == "sgd":
                fresh = fresh - self.local_lr * self.pending.index_select(0, cs)
            else:  # the step the server will take with the pending push
                fresh = fresh - self._server_step(self.acc.index_select(0, cs), self.pending.index_select(0, cs),
                                                  self.sq.index_select(0, cs), self.updates.index_select(0, cs))
            self._count_drift(self.rows.index_select(0, cs[stale]), fresh[stale])
        self.rows.index_copy_(0, cs, fresh)
        self.clock.index_copy_(0, cs, clocks if all_cached else clocks[cached])
        self.counters["stale_refreshes"] += stale_hits
        if self.num_sets:
            out = self.rows.index_select(0, slot.clamp(min=0))
        else:
            out = torch.empty(slot.numel(), self.table.dim, device=self.device)
        if not all_cached:
            bypass = ~cached
            out.index_copy_(0, index[bypass], rows[bypass])
        return out

    def _count_drift(self, old: torch.Tensor, new: torch.Tensor) -> None:
        """How far refreshed copies had drifted from what the server's rows say they are: the
        squared distance from each copy to its refreshed value, and the refreshed values'
        squared norms (``stats``'s ``drift``). Shape: (k, D), (k, D)."""
        self.counters["drift_sq"] += float(((old - new) ** 2).sum())
        self.counters["drift_norm_sq"] += float((new * new).sum())

    def update(self, plan: Plan, grads: torch.Tensor) -> Rows:
        """Apply one step's gradients (one per key of ``plan``): cached rows change at once
        (read-your-writes) and accumulate; returns the rows due to be pushed (``u > s``) and
        the gradients of bypassed keys. Shape: grads (n, D)."""
        if self.native and grads.dtype == torch.float32 and native.usable(grads, plan.slot):
            keys, g, counts, due, sq = native.ops.cache_update(
                plan.keys, plan.slot, grads.contiguous(), self.keys, self.held, self.rows, self.pending, self.clock,
                self.updates, self.local_lr, float(self.bound), self.own_seen, self.clear_clock, self.acc, self.sq,
                self.lr, self.eps)
            self.counters["pushed_rows"] += int(due)
            return Rows(keys, g, counts, None if self.rule == "sgd" else sq)
        slot = plan.slot
        # a key may have bypassed the cache, or lost its slot to a later lookup
        if self.num_sets:
            at = slot.clamp(min=0)
            live = (self.keys.index_select(0, at) == plan.keys) & self.held.index_select(0, at) & (slot >= 0)
        else:
            live = torch.zeros_like(slot, dtype=torch.bool)
        all_live = bool(live.all())
        s, g = (slot, grads) if all_live else (slot[live], grads[live])
        if self.rule == "sgd":
            self.rows.index_add_(0, s, g * -self.local_lr)
            self.pending.index_add_(0, s, g)
        else:  # the copy is the synced row moved by the server's step for the pending sum
            acc, before, sq, u = (t.index_select(0, s) for t in (self.acc, self.pending, self.sq, self.updates))
            after, sq_after = before + g, sq + self._squares(g)
            self.rows.index_add_(0, s, self._server_step(acc, before, sq, u) - self._server_step(acc, after, sq_after, u + 1))
            self.pending.index_copy_(0, s, after)
            self.sq.index_copy_(0, s, sq_after)
        self.updates.index_add_(0, s, torch.ones_like(s))
        due = s[must_push(self.updates.index_select(0, s), self.bound)]
        out = [self._take(due, stay=True)]
        if not all_live:
            gone = ~live
            out.append(Rows(plan.keys[gone], grads[gone], torch.ones_like(plan.keys[gone]),
                            None if self.rule == "sgd" else self._squares(grads[gone])))
        return out[0] if len(out) == 1 else Rows.cat(out)

    def flush(self) -> Rows:
        """Every unpushed update in the cache, to push now (a clean shutdown or checkpoint)."""
        return self._take((self.updates > 0).nonzero().flatten(), stay=True)

    def take_idle(self, share: float) -> Rows:
        """``ceil(share * k)`` of the ``k`` rows with unpushed updates that no announced step
        uses (the lookahead window's), nor the last ``protect`` lookups, to push now; they stay
        cached, clean, as a flush leaves them. Near the end of training, when the window holds
        every step left, these rows change no more: pushed while the last steps compute,
        they are off the final flush, at the same bytes. None without a window."""
        if self.window is None or not 0 < share <= 1:
            return self._no_rows()
        # `soon`, each slot's next announced use as the last lookup or announcement of its key
        # left it: none ahead when it is past (<= now) or NEVER
        unused = (self.soon <= self.window.now) | (self.soon == NEVER)
        idle = ((self.updates > 0) & (self.last_use <= self.step - self.protect) & unused).nonzero().flatten()
        return self._take(idle[:math.ceil(share * len(idle))], stay=True)

    def _take(self, slots: torch.Tensor, stay: bool = False) -> Rows:
        """Rows of ``slots`` with their pending updates, which are reset. When the rows ``stay``
        cached and their local updates are the server's (SGD at the table's lr, or Adagrad
        followed from its whole state), the copies count the pushed updates as seen (``c_s +=
        u``): the server's clock will include them, and the copy already does, so they do not
        make it stale; only other workers' updates do (and if a dynamic table drops the push,
        the copy is then ahead of the shard and refreshed: het.staleness.must_refresh)."""
        out = Rows(self.keys.index_select(0, slots), self.pending.index_select(0, slots),
                   self.updates.index_select(0, slots), None if self.rule == "sgd" else self.sq.index_select(0, slots))
        if self.rule != "sgd":
            if stay:  # the accumulator as the server's will be once the push lands
                self.acc.index_add_(0, slots, out.sq)
            self.sq.index_fill_(0, slots, 0)
        if stay and self.own_seen:
            self.clock.index_add_(0, slots, out.counts)
        elif stay and self.clear_clock:
            # the shard may drop this push (a key not admitted yet) and leave its clock where the
            # copy's is: the copy asks again as a miss, so it reads the shard's row (the initial
            # one if the push was dropped) plus its later updates. Costs nothing when admitted:
            # the push alone puts the copy more than s behind.
            self.clock.index_fill_(0, slots, -1)
        self.pending.index_fill_(0, slots, 0)
        self.updates.index_fill_(0, slots, 0)
        self.counters["pushed_rows"] += len(out)
        return out

    def _no_rows(self) -> Rows:
        return Rows(torch.empty(0, dtype=torch.int64, device=self.device),
                    torch.empty(0, self.table.dim, device=self.device),
                    torch.empty(0, dtype=torch.int64, device=self.device),
                    None if self.rule == "sgd" else torch.empty(0, self.acc.shape[1], device=self.device))

    # -- reporting --------------------------------------------------------------------------
    def stats(self) -> dict:
        c = dict(self.counters)
        lookups = c.get("lookups", 0)
        c["hit_rate"] = c.get("hits", 0) / lookups if lookups else 0.0
        c["miss_rate"] = c.get("misses", 0) / lookups if lookups else 0.0
        c["capacity"] = self.slots
        # refreshed copies' distance from the server's view, relative to the rows' norm
        c["drift"] = math.sqrt(c["drift_sq"] / c["drift_norm_sq"]) if c.get("drift_norm_sq") else 0.0
        return c


def local_rule(optimizer: str, asked: str) -> str:
    """The local update a cache of an ``optimizer`` table uses when ``asked`` for one
    (CacheConfig.local_update): Adagrad's can be followed; other optimizers' copies take SGD
    steps, and row-wise Adagrad's whole state is its row summary.

    Example:
        >>> local_rule("adagrad", "full"), local_rule("rowwise_adagrad", "full"), local_rule("adam", "row")
        ('full', 'row', 'sgd')
    """
    if optimizer == "rowwise_adagrad" and asked != "sgd":
        return "row"
    return asked if optimizer == "adagrad" else "sgd"
