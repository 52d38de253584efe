"""A dynamic table's slice on a shard: any int64 key, storage only for the rows pushes changed.

A row no push has changed is its initial value, a pure function of the table's seed and the key
(:func:`het.ps.protocol.initial.initial_rows`), which a client builds itself ("lazy rows"): so the shard
stores nothing for it, and its memory follows the rows training touched, not the id space.

- **Index**: key -> slot and slot -> key (:mod:`het.ps.server.store.index`: native, a hash table of
  16 + 5 / load bytes a key; the reference, sorted runs).
- **Storage**: rows (float32, or half: ``row_dtype``, :mod:`het.ps.protocol.halves`), optimizer state
  and ``(clock, last step)`` per slot, in chunks that grow (:class:`het.ps.server.store.chunks.Chunks`);
  freed slots are reused. Clock and last step are 32-bit until one of them outgrows that, when the whole column pair widens to 64 bits once: 8
  bytes a row, where a step count or a row's updates past 2^31 would need 16.
- **Admission** (``admit_after = N``): a key gets a slot once pushes touched it in N
  worker-steps (the pushes' ``counts`` summed, in :class:`het.ps.server.store.admission.SightingSketch`).
  Until then reads give its initial row, its gradients are dropped and counted
  (``refused_updates``) and its clock stays 0, as DeepRec's counter filter. The worker that
  pushed them reads the initial row again plus its own unpushed updates: under SGD its copy
  counted the dropped updates (``c_s > c_g``) and is refreshed on its next sync
  (:func:`het.staleness.must_refresh`); under Adagrad and Adam its cache asks for a pushed row
  again as a miss (:meth:`het.cache.cache.EmbeddingCache._take`).
- **Expiry** (``expire_after``) and the **budget** (``max_rows``): rows not updated for that
  many steps (the largest step any push named), or the least recently updated past the budget,
  are removed and counted (``expired``, ``evicted``): they read as their initial value again,
  clock 0. A key's sightings stay in the sketch, so a removed key that comes back is admitted
  at once.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import torch

from het import native
from het.config import TableConfig
from het.decay import DECAYED, steps_of
from het.process import release_freed_memory
from het.ps.protocol import halves, partition
from het.ps.protocol.initial import initial_rows
from het.ps.server.store import kernels, optim
from het.ps.server.store import index as key_index
from het.ps.server.store.admission import SightingSketch, admit, first_of
from het.ps.server.store.chunks import Chunks
from het.ps.server.store.optim import rows_problem, sum_rows
from het.ps.server.store.records import MemoryRows
from het.ps.server.store.tiers import TieredRows

CLOCK, LAST = 0, 1  # the columns of a slot's meta
NARROW = torch.iinfo(torch.int32).max  # meta held in int32 up to this
BUDGET_SLACK = 32  # past max_rows, rows are evicted down to max_rows - max_rows // BUDGET_SLACK


class DynamicRows:
    """The same methods as :class:`het.ps.server.store.fixed.FixedRows`, for a table of any int64 key. A key
    is located as the pair ``(key, slot)`` (slot -1: not stored), shape (n, 2).

    Example:
        >>> from het.config import OptimizerConfig
        >>> t = DynamicRows(TableConfig("ids", rows=None, dim=2, optimizer=OptimizerConfig("sgd", lr=1.0)), 0, 1)
        >>> at = t.locate(torch.tensor([-5, 2**62]))
        >>> t.push(at, torch.ones(2, 2), torch.tensor([1, 1]), step=1)
        >>> t.clocks_of(t.locate(torch.tensor([2**62, 7]))).tolist(), t.stats()["rows"]
        ([1, 0], 2)
    """

    on_remove = None  # told the keys of rows the store forgets (a shard's record of changes)

    def __init__(self, cfg: TableConfig, index: int, num_shards: int, disk_dir: str | None = None,
                 policy: str = "lru"):
        self.cfg, self.index, self.num_shards = cfg, index, num_shards
        self.disk_dir, self.policy = disk_dir, policy
        self.optimizer = optim.make(cfg.optimizer, 0, cfg.dim)  # its rules; the state lives in `store`
        self.state_names = self.optimizer.state_names
        # each state's columns in a packed record after the row: (name, first, end)
        widths = self.optimizer.state_widths(cfg.dim)
        ends = np.cumsum([0] + [widths[n] for n in self.state_names]).tolist()
        self.state_spans = [(n, ends[i], ends[i + 1]) for i, n in enumerate(self.state_names)]
        state_width = ends[-1]
        self.state_width = state_width
        # rows and optimizer state: all in memory, or under a budget with a disk tier (het.ps.server.store.tiers)
        self.dtype = halves.torch_dtype(cfg.row_dtype)
        if disk_dir is not None and self.dtype != torch.float32:
            raise ValueError(f"table {cfg.name!r}: row_dtype {cfg.row_dtype} under a memory budget: the disk "
                             f"tier stores float32 records (use row_dtype fp32 there)")
        self.store = (MemoryRows(cfg.dim, state_width, self.dtype) if disk_dir is None
                      else TieredRows(cfg.dim, state_width, disk_dir, policy=policy))
        self.meta = Chunks(2, torch.int32)  # clock, last step that updated it (-1: a free slot)
        self.keys = key_index.make()
        self.free = torch.empty(0, dtype=torch.int64)
        self.used = 0  # slots handed out at least once
        self.sketch = SightingSketch(cfg.admit_counters) if cfg.admit_after > 1 else None
        self.counters = Counter(admitted=0, refused_updates=0, expired=0, evicted=0)
        self.step = 0  # the largest step a push named
        self._expiry_checked = 0
        # pushes in one native pass over the chunks (kernels.native_push_args), where the rows
        # are all in memory and each state is a row's width, as a fixed table's native push
        self.native = (native.ops is not None and isinstance(self.store, MemoryRows)
                       and cfg.optimizer.name in kernels.NATIVE_OPTIMIZERS and not self.optimizer.decay.active
                       and all(widths[n] == cfg.dim for n in self.state_names))
        # a native float32 push refuses non-finite results, sparing the shard's pass (not where admission drops some)
        self.refuses_non_finite_grads = self.native and self.dtype == torch.float32 and self.sketch is None
        # replies' rows gathered into reused buffers, as a fixed table's (a new one faults its pages in)
        self._replies = (kernels.ReplyBuffers(cfg.dim) if isinstance(self.store, MemoryRows)
                         and self.dtype == torch.float32 else None)

    # -- keys -------------------------------------------------------------------------------
    def check_keys(self, keys: torch.Tensor) -> str:
        S = self.num_shards
        if S > 1 and len(keys) and bool((partition.shard_of(keys, S, hashed=True) != self.index).any()):
            return (f"keys of another shard sent to shard {self.index} of {S} (a dynamic table's rule is "
                    f"mix(key) % {S})")
        return ""

    def locate(self, keys: torch.Tensor) -> torch.Tensor:
        return torch.stack([keys, self.keys.lookup(keys)], 1)

    def clocks_of(self, at: torch.Tensor) -> torch.Tensor:
        return self.meta.gather(at[:, 1], missing=True)[:, CLOCK].long()  # not stored: clock 0

    def pull_reply(self, *request) -> None:
        return None  # keys located through the index: the shard's checked path, rows_to_send and clocks_of

    wire_pull = wire_push = pull_reply

    def rows_to_send(self, at: torch.Tensor, lazy: bool, half: bool = False) -> tuple[list, int]:
        """As :meth:`FixedRows.rows_to_send`: a row not stored is "untouched"."""
        stored = at[:, 1] >= 0
        every = bool(stored.all())
        slots = at[:, 1] if every else at[stored, 1]
        if half and self.dtype != torch.float32 and (lazy or every):  # the rows' bits as stored
            bits = halves.as_bits(self.store.weight.gather(slots))
            return ([bits, (~stored).to(torch.uint8).numpy()] if lazy else [bits]), len(slots)
        if self._replies is not None and (lazy or every):
            rows = self._replies.take(len(slots))
            rows = self.store.gather_weight(slots, out=rows)
            sent = self._replies.lend(rows.numpy())
            return ([sent, (~stored).to(torch.uint8).numpy()] if lazy else [sent]), len(slots)
        rows = self.store.gather_weight(slots)
        if lazy:
            return [rows.numpy(), (~stored).to(torch.uint8).numpy()], len(rows)
        if every:  # no initial rows to make
            return [rows.numpy()], len(at)
        out = torch.empty(len(at), self.cfg.dim)
        out[stored] = rows
        missing = (~stored).nonzero().flatten()
        out[missing] = torch.from_numpy(initial_rows(self.cfg, at[missing, 0].numpy()))
        if half and self.dtype != torch.float32:  # every value one the dtype holds: exact in its bits
            return [halves.as_bits(out.to(self.dtype))], len(at)
        return [out.numpy()], len(at)

    def local_state(self, at: torch.Tensor, full: bool) -> np.ndarray:
        """As :meth:`FixedRows.local_state`: a row not stored has its initial state."""
        stored = (at[:, 1] >= 0).nonzero().flatten()
        if len(stored) == len(at):  # every row stored: no initial state to make
            packed = self.store.gather_state(at[:, 1]) if self.state_names else torch.empty(len(at), 0)
        else:
            packed = torch.empty(len(at), self.state_width)
            fresh = self.optimizer.initial_state(len(at), self.cfg.dim)
            if fresh:
                packed[:] = torch.cat([fresh[name] for name in self.state_names], 1)
            if len(stored):
                packed[stored] = self.store.gather(at[stored, 1])[1]
        state = {name: packed[:, lo:hi] for name, lo, hi in self.state_spans}
        return self.optimizer.local_state(state, full).contiguous().numpy()

    def decayed_to(self, at: torch.Tensor) -> torch.Tensor:
        """As :meth:`FixedRows.decayed_to`: a row not stored was never brought past step 0."""
        stored, out = at[:, 1] >= 0, torch.zeros(len(at), dtype=torch.int64)
        column = next(lo for name, lo, _ in self.state_spans if name == DECAYED)
        out[stored] = steps_of(self.store.gather_state(at[stored, 1])[:, column:column + 2])
        return out

    # -- pushes -----------------------------------------------------------------------------
    def push(self, at: torch.Tensor, grads: torch.Tensor, counts: torch.Tensor, step: int,
             sq: torch.Tensor | None = None) -> None:
        """As :meth:`FixedRows.push` (all or nothing), after admission: the gradients of keys not
        admitted are dropped and counted. Then expiry and the budget run. A push refused
        counts no sighting: its keys' admission is as it was."""
        record = None
        if self.sketch is not None:
            admitted = admit(self.sketch, self.cfg.admit_after, self.counters, at, grads, counts, sq)
            at, grads, counts, sq, record = admitted
        merges = self.keys.merges
        if len(at):
            self._apply(at, grads, counts, step, sq)
        if record is not None:
            record()
        if self.keys.merges != merges:  # the merge's scratch (every key, twice) was freed: give it back
            release_freed_memory()
        self.step = max(self.step, int(step))
        self._expire()
        self._enforce_budget()

    def _apply(self, at, grads, counts, step, sq=None) -> None:
        opt = self.optimizer
        if self.native and not (opt.takes_squares and opt.takes_steps(counts, sq)):
            return kernels.push_chunks(self, at, grads, counts, step, sq)
        unique, inverse = torch.unique(at[:, 0], return_inverse=True)
        slots = first_of(at[:, 1], inverse, len(unique))  # located when the push arrived
        new = (slots < 0).nonzero().flatten()
        weight, state, meta, packed = self._rows_for(unique, slots, new)
        meta[:, CLOCK].index_add_(0, inverse, counts)
        several = self.optimizer.takes_steps(counts, sq)
        if self.optimizer.accepts_duplicates:
            self.optimizer.update(weight, inverse, grads, step, state)
        elif len(unique) != len(at):  # duplicates summed first, in the order a fixed table sums them
            pushed = optim.Pushed(sum_rows(counts, inverse, len(unique)), None if sq is None else sum_rows(sq, inverse, len(unique))) if several else None
            grads = sum_rows(grads, inverse, len(unique))
            self.optimizer.update(weight, torch.arange(len(unique)), grads, step, state, pushed)
        else:
            self.optimizer.update(weight, inverse, grads, step, state, optim.Pushed(counts, sq) if several else None)
        problem = rows_problem(weight, state, meta[:, CLOCK])
        if problem:  # nothing was written yet
            raise ValueError(problem)
        # rows stored in half: rounded (and refused if out of its range) before anything is written
        weight = halves.round_rows(weight, self.dtype, self.cfg.row_rounding, halves.salts(unique, meta[:, CLOCK]))
        meta[:, LAST].clamp_(min=int(step))
        if self.meta.dtype != torch.int64 and int(meta.max()) > NARROW:
            self.meta.widen(torch.int64)
        if len(new):
            slots[new] = self._alloc(len(new))
            self.keys.insert(unique[new], slots[new])
            self.counters["admitted"] += len(new)
        self.store.scatter(slots, weight, packed if self.state_names else None)
        self.meta.scatter(slots, meta.to(self.meta.dtype))

    def _rows_for(self, keys, slots, new):
        """Copies of the rows, state (views into one packed tensor) and meta of ``keys``: stored
        ones gathered, new ones made."""
        stored = (slots >= 0).nonzero().flatten()
        n, dim = len(keys), self.cfg.dim
        weight = torch.empty(n, dim)
        packed = torch.empty(n, self.state_width)
        meta = torch.empty(n, 2, dtype=torch.int64)
        if len(stored):
            weight[stored], state = self.store.gather(slots[stored])
            meta[stored] = self.meta.gather(slots[stored]).long()
            if state is not None:
                packed[stored] = state
        if len(new):
            weight[new] = torch.from_numpy(initial_rows(self.cfg, keys[new].numpy()))
            fresh = self.optimizer.initial_state(len(new), dim)
            if fresh:
                packed[new] = torch.cat([fresh[name] for name in self.state_names], 1)
            meta[new] = 0
        # views: the optimizer updates them in place, so `packed` is written back as it is
        state = {name: packed[:, lo:hi] for name, lo, hi in self.state_spans}
        return weight, state, meta, packed

    # -- slots ------------------------------------------------------------------------------
    def _alloc(self, n: int) -> torch.Tensor:
        reused = self.free[len(self.free) - min(n, len(self.free)):]
        self.free = self.free[:len(self.free) - len(reused)]
        fresh = torch.arange(self.used, self.used + n - len(reused))
        self.used += len(fresh)
        self.meta.grow_to(self.used)
        self.store.grow_to(self.used)
        return torch.cat([reused, fresh])

    def _remove(self, slots: torch.Tensor, counter: str) -> None:
        """Forget the rows at ``slots``: they read as their initial value again."""
        keys = self.keys.keys_of(slots)
        self.keys.remove(keys)
        if self.on_remove is not None:
            self.on_remove(keys)
        meta = self.meta.gather(slots)
        meta[:, LAST] = -1
        self.meta.scatter(slots, meta)
        self.store.release(slots)
        self.free = torch.cat([self.free, slots])
        self.counters[counter] += len(slots)

    def _last_steps(self) -> torch.Tensor:
        """Every slot's last update step (-1: free). Shape: (used,)."""
        return self.meta.column(LAST, self.used)

    def _expire(self) -> None:
        after = self.cfg.expire_after
        if after is None or self.step - self._expiry_checked < max(1, after // 8):
            return
        self._expiry_checked = self.step
        last = self._last_steps()
        old = ((last >= 0) & (last < self.step - after)).nonzero().flatten()
        if len(old):
            self._remove(old, "expired")

    def _enforce_budget(self) -> None:
        budget = self.cfg.max_rows
        if budget is None or len(self.keys) <= budget:
            return
        excess = len(self.keys) - budget + budget // BUDGET_SLACK
        last = self._last_steps()
        last[last < 0] = torch.iinfo(last.dtype).max  # free slots are never chosen
        self._remove(torch.topk(last, excess, largest=False).indices, "evicted")

    # -- state ------------------------------------------------------------------------------
    def stats(self) -> dict:
        return {"rows": len(self.keys), **self.counters, "bytes": self.store.nbytes(self.used) + self.index_bytes(),
                "admission_bytes": self.sketch.nbytes if self.sketch is not None else 0,
                **self.store.stats(len(self.keys))}

    def index_bytes(self) -> int:
        """DRAM held besides the rows: index, clocks, free slots and the admission sketch."""
        return (self.meta.nbytes(self.used) + self.keys.nbytes + 8 * len(self.free)
                + (self.sketch.nbytes if self.sketch is not None else 0))

    # -- memory: under a budget, a DRAM pool of rows and a disk tier --------------------------
    def pageable(self, at: torch.Tensor) -> torch.Tensor | None:
        return self.store.pageable(at[at[:, 1] >= 0, 1])

    def page_in(self, slots: torch.Tensor) -> int:
        return self.store.page_in(slots)

    def dram_bytes(self) -> tuple[int, int]:
        return self.index_bytes() + self.store.fixed_bytes(self.used), self.store.position_bytes()

    def size_pool(self, rows: int) -> None:
        self.store.set_capacity(rows)

    # -- saves ------------------------------------------------------------------------------
    def state_dict(self, rows_dir: str | None = None) -> dict:
        """Keys, rows, clocks, optimizer state, admission and counters. With a disk tier and
        ``rows_dir``, the rows stay in the tier's files, linked into ``rows_dir`` (``disk``)."""
        keys, slots = self.keys.items()
        meta = self.meta.gather(slots).long()
        out = {"config": self.cfg.to_dict(), "keys": keys.clone(), "clocks": meta[:, CLOCK].clone(),
               "last_step": meta[:, LAST].clone(),
               "sketch": self.sketch.state_dict() if self.sketch is not None else None,
               "counters": dict(self.counters), "step": self.step}
        disk = None if rows_dir is None else self.store.save(slots, rows_dir)
        if disk is not None:
            return {**out, "disk": disk}
        d = self.cfg.dim
        records = self.store.peek(slots)
        return {**out, "weight": records[:, :d].clone(),
                "optimizer": {n: records[:, d + lo:d + hi].clone() for n, lo, hi in self.state_spans}}

    def check_state(self, saved: dict, path: str) -> None:
        name = self.cfg.name
        if "keys" not in saved:
            raise ValueError(f"{path}: table {name!r} was saved as a fixed table, this shard's is dynamic")
        n, width = len(saved["keys"]), self.cfg.dim + self.state_width
        shapes = {"clocks": (n,), "last_step": (n,)}
        got = {"clocks": saved["clocks"].shape, "last_step": saved["last_step"].shape}
        if "disk" in saved:
            shapes.update(records=(n,), width=width)
            got.update(records=saved["disk"]["records"].shape, width=saved["disk"]["width"])
        else:
            shapes.update({"weight": (n, self.cfg.dim), **{f"optimizer {k}": (n, hi - lo) for k, lo, hi in self.state_spans}})
            got.update({"weight": saved["weight"].shape, **{f"optimizer {k}": v.shape for k, v in saved["optimizer"].items()}})
        if {k: v if isinstance(v, int) else tuple(v) for k, v in got.items()} != shapes:
            raise ValueError(f"{path}: table {name!r} holds {got}, expected {shapes}")
        if self.sketch is not None and saved.get("sketch") is not None:
            if tuple(saved["sketch"]["counts"].shape) != tuple(self.sketch.counts.shape):
                raise ValueError(f"{path}: table {name!r}'s admission sketch has shape "
                                 f"{tuple(saved['sketch']['counts'].shape)}, expected {tuple(self.sketch.counts.shape)}")

    def load_state_dict(self, saved: dict, rows_dir: str | None = None) -> None:
        """Load :meth:`state_dict`'s output; ``rows_dir``: where its disk tier's files are."""
        self.close()
        self.__init__(self.cfg, self.index, self.num_shards, self.disk_dir, self.policy)
        keys = saved["keys"]
        slots = self._alloc(len(keys))
        self.keys.insert(keys, slots)
        meta = torch.stack([saved["clocks"], saved["last_step"]], 1).long()
        if len(meta) and int(meta.max()) > NARROW:
            self.meta.widen(torch.int64)
        self.meta.scatter(slots, meta.to(self.meta.dtype))
        if "disk" in saved:  # a tiered save: its files linked in, or read into memory
            self.store.load(slots, saved["disk"], rows_dir)
        else:
            self.store.scatter(slots, saved["weight"],
                               torch.cat([saved["optimizer"][n] for n in self.state_names], 1) if self.state_names else None)
        if self.sketch is not None and saved.get("sketch") is not None:
            self.sketch.load_state_dict(saved["sketch"])
        self.counters.update(saved.get("counters", {}))
        self.step = self._expiry_checked = int(saved.get("step", 0))

    def close(self) -> None:
        """Close the disk tier and remove its files (a save holds its own links to them)."""
        self.store.discard()
