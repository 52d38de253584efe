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

import torch

from het import memory
from het import native as het_native
from het.cache.lookahead import NEVER, Lookahead
from het.cache.native_step import NativeStep
from het.cache.decaying import SlotSteps
from het.cache.plan import Plan, Rows
from het.cache.policy import EMPTY, POLICIES, PROTECTED
from het.cache.torch_step import TorchStep
from het.config import CacheConfig, TableConfig
from het.decay import RowDecay

_HASH = -7046029254386353131  # 0x9E3779B97F4A7C15 as int64: Fibonacci hashing


class EmbeddingCache:
    """A bounded cache of one table's rows, kept consistent with HET's clock rules.

    Args:
        table: the table cached (its ``dim`` and ``rows``).
        cfg: capacity, policy, staleness bound, ways.
        device: where slots and rows live (CPU or CUDA).
        native: on CPU, run the step in het's native core where it is built (False: the
            PyTorch reference, which runs on any device and which the tests hold it to).

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

    def __init__(self, table: TableConfig, cfg: CacheConfig, device: torch.device | str = "cpu", native: bool = True):
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
        on_cpu = native and het_native.ops is not None and self.device.type == "cpu"
        self.window = Lookahead(cfg.lookahead, native=on_cpu) if cfg.lookahead else None
        self.soon = torch.full((n,), NEVER, dtype=torch.int64, device=dev)  # next announced use
        self._follow(table.optimizer, n, d)
        # L2 as a lazy decay (het.decay): the step each slot was last brought to
        decay = RowDecay(table.optimizer)
        self.slot_steps = SlotSteps(self, decay) if decay.active else None
        self.counters = Counter()
        self._native_asked = native
        self._choose_step()

    def _follow(self, opt, n: int, d: int) -> None:
        """The local update's state for ``n`` slots of width ``d``: how copies follow ``opt``."""
        cfg, dev = self.cfg, self.device
        # the local update (CacheConfig.local_update): "sgd", or follow the table's Adagrad from
        # `acc`, the summary of its accumulator the shard sent with the row ("row": (n, 1),
        # "full": (n, D)) and what the pushes since added to it
        self.rule = local_rule(opt.name, cfg.local_update if cfg.local_lr is None else "sgd")
        width = {"sgd": 0, "row": 1, "full": d}[self.rule]
        self.acc = memory.zeros(n, width, device=dev)
        # the pending steps' squared gradients, summed; under Adam, whose copies take SGD steps,
        # the row's mean all the same: its pushes carry them, and the shard takes their steps apart
        self.sq = memory.zeros(n, 1 if opt.name == "adam" else width, device=dev)
        # FTRL without L1 steps as Adagrad with eps = beta + lr * l2: w' = w - lr g / (beta + sqrt(n') + lr l2),
        # its closed form w = -lr z / (beta + sqrt(n) + lr l2) moved by one step of g (exact; with L1 near)
        self.lr, self.eps = opt.lr, (opt.beta + opt.lr * opt.l2) if opt.name == "ftrl" else (opt.eps or 0.0)
        self.base_lrs = (self.local_lr, self.lr)  # a schedule scales both (scale_lr)
        # a copy whose own updates are the server's (SGD at the table's lr; Adagrad followed
        # from its whole state: row-wise Adagrad's float a row, or "full") counts them as seen
        # once pushed: c_s += u (see _take). Per-coordinate Adagrad followed from a float a row
        # ("row", the default) only approximates the server: its pushed copies are refreshed; so
        # are they under a schedule (the shard's step is at the push's step's rate, the copy's at each one's).
        self.own_seen = not opt.schedule.active and ((opt.name == "sgd" and self.local_lr == opt.lr)
                                                     or (self.rule == "row" and opt.name == "rowwise_adagrad")
                                                     or self.rule == "full")
        # else a pushed row's copy asks again as a miss when the shard may drop the push (see _take)
        self.clear_clock = not self.own_seen and self.table.rows is None and self.table.admit_after > 1

    def _choose_step(self) -> None:
        """The step's operations, native (het.native, on CPU) or the reference, chosen once."""
        self.native = self._native_asked and het_native.usable(self.rows)
        self._ops = NativeStep(self) if self.native else TorchStep(self)

    def to(self, device) -> "EmbeddingCache":
        """Move every slot tensor to ``device`` (in place); returns self."""
        self.device = torch.device(device)
        for name in ("keys", "held", "rows", "pending", "clock", "updates", "last_use", "uses", "score", "disabled",
                     "soon", "acc", "sq"):
            setattr(self, name, getattr(self, name).to(self.device))
        if self.slot_steps is not None:
            self.slot_steps.to(self.device)
        self._choose_step()
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
        if self.num_sets:
            self._ops.announce(self.window.queue[-1][1], number)

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
    def lookup(self, keys: torch.Tensor, as_of: int = 0) -> Plan:
        """Find ``keys`` (unique, int64, on the cache's device); give each miss a slot or let it
        bypass; evict victims. ``as_of``: the step whose rows are read (the steps trained), to
        which a table whose rows decay brings its hits (:mod:`het.decay`). Shape: (n,)."""
        self.step += 1
        n = keys.numel()
        self.counters["lookups"] += n
        if self.window is not None:
            self.window.advance(keys)
        if self.num_sets == 0:
            self.counters["misses"] += n
            self.counters["bypasses"] += n
            slot = torch.full_like(keys, -1)
            return Plan(keys, slot, torch.zeros_like(keys, dtype=torch.bool), slot.clone(), self._no_rows(), as_of)
        # the next announced step each key is needed in
        nxt = self.window.next_use(keys) if self.window is not None else None
        victims = self.slot_steps.victims(keys) if self.slot_steps is not None else None
        plan = self._ops.lookup(keys, nxt)
        plan.as_of = as_of
        if self.slot_steps is not None:
            self.slot_steps.looked_up(plan, victims)
        return plan

    def _by_set(self, values: torch.Tensor, sets: torch.Tensor) -> torch.Tensor:
        """The ways of ``sets``, one set a row. Shape: (T,) -> (T, W)."""
        return values.view(self.num_sets, self.ways).index_select(0, sets)

    @property
    def state_request(self) -> str | None:
        """The optimizer state a sync must ask the PS for, beside the rows: the local rule's
        (none without slots: no copy to follow it)."""
        return None if self.rule == "sgd" or not self.num_sets else self.rule

    def fill(self, plan: Plan, index: torch.Tensor, rows: torch.Tensor, clocks: torch.Tensor,
             state: torch.Tensor | None = None, now: int | None = None) -> torch.Tensor:
        """Take the rows the PS sent for ``plan.keys[index]`` (misses and stale hits); return
        every key's row. A refreshed row is the server's value plus the local updates not yet
        pushed. ``state``: the rows' optimizer state (``state_request``), which a local rule
        other than SGD needs. ``now``: the steps trained by the fill (past the lookup's when it was
        prefetched), to which rows that decay are brought. Shape: index (m,), rows (m, D), clocks
        (m,), state (m, W) -> (n, D)."""
        if self.state_request is not None and (state is None or state.shape != (len(index), self.acc.shape[1])):
            raise ValueError(f"the {self.rule!r} local update needs the rows' optimizer state: expected shape "
                             f"({len(index)}, {self.acc.shape[1]}), got {None if state is None else tuple(state.shape)}")
        if self.slot_steps is not None:  # rows that decay: brought to the steps trained by ``now``
            rows = self.slot_steps.filling(plan, rows, plan.as_of if now is None else now)
        return self._ops.fill(plan, index, rows, clocks, state)

    def update(self, plan: Plan, grads: torch.Tensor, step: int = 0) -> Rows:
        """Apply one step's gradients (one per key of ``plan``): cached rows change at once
        (read-your-writes) and accumulate; returns the rows due to be pushed (``u > s``) and
        the gradients of bypassed keys. ``step``: the step's number, to which a table whose
        rows decay brings them first, as the PS will. Shape: grads (n, D)."""
        if self.slot_steps is not None:
            self.slot_steps.updating(plan, step)
        return self._ops.update(plan, grads)

    def unpushed(self, as_of: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The keys, copies and clocks (``c_s``) of the rows this worker updated and has not
        pushed: its own view of them, ahead of the PS's by its updates, as its steps read them
        (brought to step ``as_of`` where the rows decay). Shape: -> (k,), (k, D), (k,)."""
        slots = (self.updates > 0).nonzero().flatten()
        if self.slot_steps is not None:
            self.slot_steps.bring(slots, as_of)
        return tuple(t.index_select(0, slots) for t in (self.keys, self.rows, self.clock))

    def flush(self) -> Rows:
        """Every unpushed update in the cache, to push now (a clean shutdown or checkpoint)."""
        if self.slot_steps is not None:
            self.slot_steps.bring_dirty()
        return self._take((self.updates > 0).nonzero().flatten(), stay=True)

    def scale_lr(self, factor: float) -> None:
        """Local updates at the learning rates this cache was built with, times ``factor``."""
        self.local_lr, self.lr = self.base_lrs[0] * factor, self.base_lrs[1] * factor

    def forget(self) -> None:
        """Make every cached copy ask the PS again at its next lookup (after the PS's rows were
        put back to an earlier save). Only a flushed cache may forget: no update is dropped."""
        if bool((self.updates > 0).any()):
            raise RuntimeError("the cache holds unpushed updates: flush it before it forgets its copies")
        self.clock.fill_(-1)

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
        idle = idle[:math.ceil(share * len(idle))]
        if self.slot_steps is not None:
            self.slot_steps.bring(idle, self.slot_steps.now)
        return self._take(idle, stay=True)

    def _take(self, slots: torch.Tensor, stay: bool = False) -> Rows:
        """Rows of ``slots`` with their pending updates, which are reset. When the rows ``stay``
        cached and their local updates are the server's (SGD at the table's lr, or Adagrad
        followed from its whole state), the copies count the pushed updates as seen (``c_s +=
        u``): the server's clock will include them, and the copy already does, so they do not
        make it stale; only other workers' updates do (and if a dynamic table drops the push,
        the copy is then ahead of the shard and refreshed: het.staleness.must_refresh)."""
        out = Rows(self.keys.index_select(0, slots), self.pending.index_select(0, slots),
                   self.updates.index_select(0, slots), None if not self.sq.shape[1] else self.sq.index_select(0, slots))
        if self.sq.shape[1]:
            if stay and self.rule != "sgd":  # the accumulator as the server's will be once the push lands
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
                    None if not self.sq.shape[1] else torch.empty(0, self.sq.shape[1], device=self.device))

    # -- reporting --------------------------------------------------------------------------
    def stats(self) -> dict:
        return with_rates({**self.counters, "capacity": self.slots})


RATES = ("hit_rate", "miss_rate", "drift")


def with_rates(c: dict) -> dict:
    """Cache counters with their rates: hits and misses a lookup, and the refreshed copies'
    distance from the server's view relative to the rows' norm (``drift``)."""
    lookups = c.get("lookups", 0)
    c["hit_rate"] = c.get("hits", 0) / lookups if lookups else 0.0
    c["miss_rate"] = c.get("misses", 0) / lookups if lookups else 0.0
    c["drift"] = math.sqrt(c["drift_sq"] / c["drift_norm_sq"]) if c.get("drift_norm_sq") else 0.0
    return c


def summed_stats(per_cache: list[dict]) -> dict:
    """Several caches' :meth:`EmbeddingCache.stats` as one: counters summed, rates over the sums."""
    keys = set().union(*per_cache) - set(RATES)
    return with_rates({k: sum(s.get(k, 0) for s in per_cache) for k in keys})


def local_rule(optimizer: str, asked: str) -> str:
    """The local update a cache of an ``optimizer`` table uses when ``asked`` for one
    (CacheConfig.local_update): Adagrad's can be followed; other optimizers' copies take SGD
    steps, and row-wise Adagrad's whole state is its row summary.

    Example:
        >>> local_rule("adagrad", "full"), local_rule("rowwise_adagrad", "full"), local_rule("adam", "row")
        ('full', 'row', 'sgd')
        >>> local_rule("ftrl", "row")
        'row'
    """
    if optimizer == "rowwise_adagrad" and asked != "sgd":
        return "row"
    # FTRL's sum of squares is Adagrad's accumulator, and without L1 its step is Adagrad's at lr
    # alpha with eps beta + alpha l2: its copies follow it by Adagrad's rule
    return asked if optimizer in ("adagrad", "ftrl") else "sgd"
