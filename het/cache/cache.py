"""The worker-side cache of one table's hot rows: set-associative slots with per-row clocks.

Layout (as FBGEMM's embedding cache): ``capacity`` rows in sets of ``ways`` slots; a key hashes
to one set and may sit in any of its ways. Per slot: the key, the row, ``c_s`` (server clock at
the last sync), ``u`` (updates not yet pushed), the pending gradient sum, the step of last use
and the uses since insertion. All of it is tensors on the cache's device, and every operation
takes a whole tensor of keys.

One training step, for the unique keys of a batch::

    plan = cache.lookup(keys)              # hits, slots for misses, victims to write back
    # send plan.writeback (push) and sync(keys, plan.clocks) to the PS, wait for the reply
    rows = cache.fill(plan, sync_result)   # (n, D): cached, refreshed or bypassed rows
    ...forward, backward...
    push = cache.update(plan, grads)       # local update; rows with u > s are due to push
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import torch

from het.cache.policy import EMPTY, POLICIES, PROTECTED, rank_in_group
from het.config import CacheConfig, TableConfig
from het.staleness import must_push

_HASH = -7046029254386353131  # 0x9E3779B97F4A7C15 as int64: Fibonacci hashing


@dataclass
class Rows:
    """Rows bound for the PS: keys, summed gradients and update counts.
    Shape: keys (n,), grads (n, D), counts (n,)."""

    keys: torch.Tensor
    grads: torch.Tensor
    counts: torch.Tensor

    def __len__(self) -> int:
        return self.keys.numel()

    @staticmethod
    def cat(parts: list["Rows"]) -> "Rows":
        return Rows(torch.cat([p.keys for p in parts]), torch.cat([p.grads for p in parts]),
                    torch.cat([p.counts for p in parts]))


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
        self.keys = torch.full((n,), EMPTY, dtype=torch.int64, device=dev)
        self.rows = torch.zeros(n, d, device=dev)
        self.pending = torch.zeros(n, d, device=dev)
        self.clock = torch.full((n,), -1, dtype=torch.int64, device=dev)   # c_s
        self.updates = torch.zeros(n, dtype=torch.int64, device=dev)       # u
        self.last_use = torch.zeros(n, dtype=torch.int64, device=dev)
        self.uses = torch.zeros(n, dtype=torch.int64, device=dev)
        self.step = 0
        self.counters = Counter()
        self._way = torch.arange(self.ways, device=dev)

    @property
    def slots(self) -> int:
        return self.keys.numel()

    def set_of(self, keys: torch.Tensor) -> torch.Tensor:
        h = keys * _HASH  # wraps mod 2^64
        return torch.remainder(h ^ (h >> 29), self.num_sets)

    # -- the step ---------------------------------------------------------------------------
    def lookup(self, keys: torch.Tensor) -> Plan:
        """Find ``keys`` (unique, int64, on the cache's device); give each miss a slot or let it
        bypass; evict victims. Shape: (n,)."""
        self.step += 1
        n = keys.numel()
        self.counters["lookups"] += n
        if self.num_sets == 0:
            self.counters["misses"] += n
            self.counters["bypasses"] += n
            slot = torch.full_like(keys, -1)
            return Plan(keys, slot, torch.zeros_like(keys, dtype=torch.bool), slot.clone(), self._no_rows())
        base = self.set_of(keys) * self.ways                                  # (n,)
        ways = base[:, None] + self._way                                      # (n, W)
        match = self.keys[ways] == keys[:, None]
        hit = match.any(1)
        slot = torch.where(hit, base + match.to(torch.uint8).argmax(1), torch.full_like(keys, -1))
        hit_slots = slot[hit]
        self.last_use[hit_slots] = self.step
        self.uses[hit_slots] += 1
        n_hit = int(hit_slots.numel())
        self.counters["hits"] += n_hit
        self.counters["misses"] += n - n_hit
        writeback = self._no_rows()
        if n_hit < n:
            writeback = self._place(keys, base, slot, ~hit)
        clocks = torch.where(hit, self.clock[slot.clamp(min=0)], torch.full_like(keys, -1))
        return Plan(keys, slot, hit, clocks, writeback)

    def _place(self, keys, base, slot, miss) -> Rows:
        """Give misses the lowest-scored unprotected ways of their sets; the rest bypass."""
        miss_pos = miss.nonzero().flatten()
        miss_base = base[miss_pos]
        sets, inverse = torch.unique(miss_base, return_inverse=True)          # (T,), (m,)
        cand = sets[:, None] + self._way                                      # (T, W)
        score = self.policy.score(self.last_use[cand], self.uses[cand])
        score = torch.where(self.keys[cand] == EMPTY, torch.full_like(score, -1), score)
        score = torch.where(self.last_use[cand] == self.step, torch.full_like(score, PROTECTED), score)
        score, order = torch.sort(score, dim=1)
        ranked = torch.gather(cand, 1, order)
        rank = rank_in_group(inverse)
        fits = rank < self.ways
        rank = rank.clamp(max=self.ways - 1)
        chosen = ranked[inverse, rank]
        fits &= score[inverse, rank] != PROTECTED
        pos, chosen = miss_pos[fits], chosen[fits]
        self.counters["bypasses"] += int(miss_pos.numel() - pos.numel())
        # victims: slots that held a key; those with unpushed updates are written back
        held = self.keys[chosen] != EMPTY
        self.counters["evictions"] += int(held.sum())
        dirty = chosen[held & (self.updates[chosen] > 0)]
        writeback = Rows(self.keys[dirty], self.pending[dirty].clone(), self.updates[dirty].clone())
        self.counters["writebacks"] += len(writeback)
        self.keys[chosen] = keys[pos]
        self.clock[chosen] = -1
        self.updates[chosen] = 0
        self.pending[chosen] = 0
        self.last_use[chosen] = self.step
        self.uses[chosen] = 1
        slot[pos] = chosen
        return writeback

    def fill(self, plan: Plan, index: torch.Tensor, rows: torch.Tensor, clocks: torch.Tensor) -> torch.Tensor:
        """Take the rows the PS sent for ``plan.keys[index]`` (misses and stale hits); return
        every key's row. A refreshed row is the server's value plus the local updates not yet
        pushed. Shape: index (m,), rows (m, D), clocks (m,) -> (n, D)."""
        slot = plan.slot
        sent_slot = slot[index]
        cached = sent_slot >= 0
        cs = sent_slot[cached]
        self.rows[cs] = rows[cached] - self.local_lr * self.pending[cs]
        self.clock[cs] = clocks[cached]
        self.counters["stale_refreshes"] += int(plan.hit[index].sum())
        out = self.rows[slot.clamp(min=0)]
        bypass = ~cached
        if bool(bypass.any()):
            out[index[bypass]] = rows[bypass]
        return out

    def update(self, plan: Plan, grads: torch.Tensor) -> Rows:
        """Apply one step's gradients (one per key of ``plan``): cached rows change at once
        (read-your-writes) and accumulate; returns the rows due to be pushed (``u > s``) and
        the gradients of bypassed keys. Shape: grads (n, D)."""
        slot = plan.slot
        live = slot >= 0
        live[live.clone()] = self.keys[slot[live]] == plan.keys[live]  # a later lookup may have evicted it
        s, g = slot[live], grads[live]
        self.rows.index_add_(0, s, g, alpha=-self.local_lr)
        self.pending.index_add_(0, s, g)
        self.updates[s] += 1
        due = s[must_push(self.updates[s], self.bound)]
        out = [self._take(due)]
        if not bool(live.all()):
            gone = ~live
            out.append(Rows(plan.keys[gone], grads[gone], torch.ones_like(plan.keys[gone])))
        return out[0] if len(out) == 1 else Rows.cat(out)

    def flush(self) -> Rows:
        """Every unpushed update in the cache, to push now (a clean shutdown or checkpoint)."""
        return self._take((self.updates > 0).nonzero().flatten())

    def _take(self, slots: torch.Tensor) -> Rows:
        out = Rows(self.keys[slots], self.pending[slots].clone(), self.updates[slots].clone())
        self.pending[slots] = 0
        self.updates[slots] = 0
        self.counters["pushed_rows"] += len(out)
        return out

    def _no_rows(self) -> Rows:
        return Rows(torch.empty(0, dtype=torch.int64, device=self.device),
                    torch.empty(0, self.table.dim, device=self.device),
                    torch.empty(0, dtype=torch.int64, device=self.device))

    # -- reporting --------------------------------------------------------------------------
    def stats(self) -> dict:
        c = dict(self.counters)
        lookups = c.get("lookups", 0)
        c["hit_rate"] = c.get("hits", 0) / lookups if lookups else 0.0
        c["miss_rate"] = c.get("misses", 0) / lookups if lookups else 0.0
        c["capacity"] = self.slots
        return c
