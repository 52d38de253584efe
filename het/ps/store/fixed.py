"""A fixed table's slice on a shard: its rows, clocks, touched marks and optimizer state."""

from __future__ import annotations

import math
import weakref

import numpy as np
import torch

from het import memory, native
from het.config import TableConfig
from het.ps import limits, partition
from het.ps.initial import initial_rows
from het.ps.store import optim


def _busy() -> bool:  # the mark of a buffer taken and not lent yet
    return True


class ReplyBuffers:
    """Buffers for replies' rows, reused once nothing holds them (one thread).

    A reply's rows leave as a zero-copy ZeroMQ frame, which keeps its array until libzmq has
    sent it. So a buffer is lent as one array and taken again only once that array is gone, as a
    weak reference says: anything made from it (a frame, a view, a tensor) keeps it. A new 2 MiB
    buffer for each reply cost more than the gather into it (docs/scripts/shard_replies.py).
    Replies above ``max_bytes`` (bulk reads) get buffers of their own, not kept.

        >>> pool = ReplyBuffers(dim=4)
        >>> a = pool.lend(pool.take(3).numpy())
        >>> b = pool.lend(pool.take(2).numpy())  # a is held: another buffer
        >>> del a
        >>> c = pool.take(3)  # a's buffer again
        >>> len(pool.buffers), c.shape
        (2, torch.Size([3, 4]))
    """

    def __init__(self, dim: int, keep: int = 8, max_bytes: int = 16 << 20):
        self.dim, self.keep = dim, keep
        self.max_rows = max(1, max_bytes // (4 * dim))  # a bigger reply (a bulk read) gets its own, not kept
        self.buffers: list[list] = []  # [buffer (rows, dim), None | _busy | weak reference to the array lent]
        self._taken: list | None = None

    def take(self, rows: int) -> torch.Tensor:
        """The first ``rows`` rows of a free buffer, to fill and then :meth:`lend`.
        Shape: -> (rows, dim)."""
        if self._taken is not None:  # taken and never lent (its reply failed): free again
            self._taken[1] = None
            self._taken = None
        if rows > self.max_rows or rows == 0:
            return torch.empty(rows, self.dim)
        free = [e for e in self.buffers if e[1] is None or e[1]() is None]
        fits = [e for e in free if e[0].shape[0] >= rows]
        if fits:
            entry = min(fits, key=lambda e: e[0].shape[0])
        else:  # sizes in powers of two: replies of varying size reuse a few buffers
            entry = [torch.empty(min(1 << (rows - 1).bit_length(), self.max_rows), self.dim), None]
            if free:  # a free buffer too small for this reply makes way: the pool holds what is in use
                self.buffers[next(i for i, e in enumerate(self.buffers) if e is free[0])] = entry
            elif len(self.buffers) < self.keep:
                self.buffers.append(entry)
        entry[1] = _busy
        self._taken = entry
        return entry[0][:rows]

    def lend(self, array: np.ndarray) -> np.ndarray:
        """``array``, made from the buffer taken last: the buffer is busy while it lives."""
        if self._taken is not None:
            self._taken[1] = weakref.ref(array)
            self._taken = None
        return array


class TableRows:
    """A fixed table's slice on this shard: dense local rows, clocks, optimizer state.

    Key ``k`` lives at local row ``k // S`` (:mod:`het.ps.partition`). :class:`het.ps.store.dynamic.DynamicRows`
    has the same methods for a table of any int64 key.
    """

    def __init__(self, cfg: TableConfig, index: int, num_shards: int, chunk: int = 1 << 16):
        self.cfg = cfg
        self.index, self.num_shards = index, num_shards
        n = partition.rows_on_shard(cfg.rows, index, num_shards)
        self.weight = memory.empty(n, cfg.dim)  # big, read at random rows: on huge pages
        for lo in range(0, n, chunk):  # chunks bound the int64 scratch space of the init
            local = np.arange(lo, min(n, lo + chunk), dtype=np.int64)
            keys = local * num_shards + index
            self.weight[lo:lo + len(local)] = torch.from_numpy(initial_rows(cfg, keys))
        self.clocks = torch.zeros(n, dtype=torch.int64)
        # rows changed by a push (any push, even one of zero counts): the others still hold
        # initial_rows, which a client can build itself instead of receiving them
        self.touched = torch.zeros(n, dtype=torch.bool)
        self.optimizer = optim.make(cfg.optimizer, n, cfg.dim)
        self.native = native.ops is not None and cfg.optimizer.name in ("sgd", "adagrad", "adam")
        self._replies = ReplyBuffers(cfg.dim)

    def check_keys(self, keys: torch.Tensor) -> str:
        """Why ``keys`` do not belong to this slice ('' when they do)."""
        if not len(keys):
            return ""
        lo, hi = int(keys.min()), int(keys.max())
        if lo < 0 or hi >= self.cfg.rows:
            return f"key {lo if lo < 0 else hi} out of range for table {self.cfg.name!r} with {self.cfg.rows} rows"
        S = self.num_shards
        if S > 1 and bool((partition.shard_of(keys, S) != self.index).any()):
            return f"keys of another shard sent to shard {self.index} of {S} (the rule is key % {S})"
        return ""

    def locate(self, keys: torch.Tensor) -> torch.Tensor:
        """Where ``keys`` (checked) live: their local rows."""
        return partition.local_rows(keys, self.num_shards)

    def clocks_of(self, local: torch.Tensor) -> torch.Tensor:
        return self.clocks.index_select(0, local)

    def push(self, local: torch.Tensor, grads: torch.Tensor, counts: torch.Tensor, step: int,
             sq: torch.Tensor | None = None) -> None:
        """Apply the optimizer to ``grads`` (which it may overwrite) and add ``counts`` to the
        clocks; duplicate rows are summed first. ``sq``: the sum of the squared gradients of the
        steps each row's gradient sums (:class:`het.ps.store.optim.Pushed`). All or nothing: a push
        that would make a value non-finite or a clock pass MAX_CLOCK raises ValueError and
        changes nothing. Shape: (n,), (n, D), (n,), sq (n, 1) or (n, D)."""
        if self.native and self.cfg.optimizer.name == "sgd" and grads.dtype == torch.float32:
            # SGD applies the gradients one after another, duplicates too: no unique needed
            order = torch.arange(len(local))
            return self._push_native(local, local, order, grads, counts, step)
        rows, inverse = torch.unique(local, return_inverse=True)
        several = sq is not None and self.optimizer.followed and bool((counts > 1).any())
        if self.native and grads.dtype == torch.float32 and (not several or self.cfg.optimizer.name == "adagrad"):
            return self._push_native(local, rows, inverse, grads, counts, step, sq if several else None)
        before = self._snapshot(rows)
        self.clocks.index_add_(0, local, counts)
        self.touched.index_fill_(0, local, True)
        if self.optimizer.accepts_duplicates:
            self.optimizer.apply(self.weight, local, grads, step)
        elif len(rows) != len(local):  # duplicates are summed first: the update is non-linear
            pushed = optim.Pushed(*(sum_rows(v, inverse, len(rows)) for v in (counts, sq))) if several else None
            grads = sum_rows(grads, inverse, len(rows))
            self.optimizer.apply(self.weight, rows, grads, step, pushed=pushed)
        else:
            self.optimizer.apply(self.weight, local, grads, step, pushed=optim.Pushed(counts, sq) if several else None)
        problem = self._check_rows(rows)
        if problem:  # refused whole: the rows, clocks and state are as they were
            self._restore(rows, before)
            raise ValueError(problem)

    def _push_native(self, local, rows, inverse, grads, counts, step, sq=None) -> None:
        """:meth:`push` in one native call (het.native): the new values computed aside and
        checked before any is written, so nothing needs restoring; the same bits (a push of
        several steps of Adagrad: the same values to rounding, its square roots being IEEE's).
        SGD without duplicates summed (``rows`` is ``local``) is applied in place in one pass,
        each row's old value kept aside and put back if the push fails."""
        opt = self.optimizer
        at, steps = inverse, counts
        if not opt.accepts_duplicates and len(rows) != len(local):
            grads = sum_rows(grads, inverse, len(rows))
            at = torch.arange(len(rows))
            if sq is not None:  # the steps and their squares summed as the gradients are
                steps, sq = sum_rows(counts, inverse, len(rows)), sum_rows(sq, inverse, len(rows))
        none = torch.empty(0, dtype=torch.int64)
        cfg, step = opt.cfg, max(int(step), 1)
        b1, b2 = cfg.betas
        step_size = cfg.lr * math.sqrt(1 - b2 ** step) / (1 - b1 ** step) if cfg.name == "adam" else 0.0
        kind = cfg.name if sq is None else "adagrad_steps"
        failed = native.ops.table_push(kind, self.weight, [opt.state[n] for n in opt.state_names], self.clocks,
                                       self.touched, rows, at.contiguous(), inverse.contiguous(), grads.contiguous(),
                                       counts.contiguous(), cfg.lr, cfg.eps or 0.0, b1, b2, step_size,
                                       limits.MAX_CLOCK, none if sq is None else steps.contiguous(),
                                       torch.empty(0, 1) if sq is None else sq.float().contiguous())
        if failed == 1:
            raise ValueError("the update would make rows non-finite (overflow)")
        if failed == 100:
            raise ValueError(f"a clock would pass {limits.MAX_CLOCK}")
        if failed:
            raise ValueError(f"the update would make optimizer state {opt.state_names[failed - 2]!r} non-finite (overflow)")

    def _snapshot(self, rows: torch.Tensor) -> dict:
        """What a push to ``rows`` (unique) may change: their rows, clocks, marks and state."""
        return {"weight": self.weight.index_select(0, rows), "clocks": self.clocks.index_select(0, rows),
                "touched": self.touched.index_select(0, rows),
                **{f"state.{n}": v.index_select(0, rows) for n, v in self.optimizer.state.items()}}

    def _restore(self, rows: torch.Tensor, saved: dict) -> None:
        self.weight.index_copy_(0, rows, saved["weight"])
        self.clocks.index_copy_(0, rows, saved["clocks"])
        self.touched.index_copy_(0, rows, saved["touched"])
        for n, v in self.optimizer.state.items():
            v.index_copy_(0, rows, saved[f"state.{n}"])

    def _check_rows(self, rows: torch.Tensor) -> str:
        state = self.optimizer.state
        return rows_problem(self.weight.index_select(0, rows), {n: v.index_select(0, rows) for n, v in state.items()},
                            self.clocks.index_select(0, rows))

    def rows_to_send(self, local: torch.Tensor, lazy: bool) -> tuple[list, int]:
        """The reply arrays for the rows ``local``: ``[rows]``, or with ``lazy``
        ``[rows of the touched ones, built (n,) uint8]`` where ``built`` marks the untouched
        rows left out (the client builds them with :func:`initial_rows`); and how many rows
        were sent."""
        if not lazy:
            return [self._gather(local)], len(local)
        if native.ops is not None:  # marks and rows in one native call, the rows prefetched ahead
            # a pooled buffer for as many rows as asked (a bulk read: only the rows sent, allocated)
            out = self._replies.take(len(local)) if len(local) <= self._replies.max_rows else torch.empty(0)
            rows, built = native.ops.gather_touched(self.weight, self.touched, local.contiguous(), out)
            return [self._replies.lend(rows.numpy()), built.numpy()], len(rows)
        touched = self.touched.index_select(0, local)
        sent = local[touched]
        return [self._gather(sent), (~touched).to(torch.uint8).numpy()], len(sent)

    def _gather(self, local: torch.Tensor) -> np.ndarray:
        """The rows ``local``, copied. Shape: (n,) -> (n, D)."""
        if native.ops is None:  # numpy's take copies whole rows: faster than index_select here
            return self.weight.numpy().take(local.numpy(), axis=0)
        out = self._replies.take(len(local))
        native.ops.gather_rows(self.weight, local.contiguous(), out)  # the rows prefetched ahead
        return self._replies.lend(out.numpy())

    def local_state(self, local: torch.Tensor, full: bool) -> np.ndarray:
        """The optimizer state a worker's cache follows the rows ``local`` with
        (:meth:`het.ps.store.optim.SparseOptimizer.local_state`). Shape: (m,) -> (m, 1) or (m, D)."""
        state = {n: v.index_select(0, local) for n, v in self.optimizer.state.items()}
        return self.optimizer.local_state(state, full).contiguous().numpy()

    def state_dict(self) -> dict:
        return {"config": self.cfg.to_dict(), "weight": self.weight, "clocks": self.clocks, "touched": self.touched,
                "optimizer": self.optimizer.state_dict()}

    def check_state(self, saved: dict, path: str) -> None:
        """Refuse a save that does not fit this slice (before anything changes)."""
        name = self.cfg.name
        if "keys" in saved:
            raise ValueError(f"{path}: table {name!r} was saved as a dynamic table, this shard's is fixed "
                             f"({self.cfg.rows} rows)")
        touched = saved.get("touched", self.touched)
        if (saved["weight"].shape != self.weight.shape or saved["clocks"].shape != self.clocks.shape
                or touched.shape != self.touched.shape):
            raise ValueError(f"{path}: table {name!r} has shape {tuple(saved['weight'].shape)} (clocks "
                             f"{tuple(saved['clocks'].shape)}, touched {tuple(touched.shape)}), expected "
                             f"{tuple(self.weight.shape)} ({tuple(self.clocks.shape)} each)")
        check_optimizer_state(self.optimizer, saved["optimizer"], len(self.weight), path, name)

    def load_state_dict(self, saved: dict) -> None:
        self.weight.copy_(saved["weight"])
        self.clocks.copy_(saved["clocks"])
        # a save from before rows were marked touched: count every row as changed
        self.touched.copy_(saved["touched"] if "touched" in saved else torch.ones_like(self.touched))
        self.optimizer.load_state_dict(saved["optimizer"])

    def stats(self) -> dict:
        """Rows held and their bytes (rows, optimizer state, clocks and marks)."""
        state = sum(v.numel() * v.element_size() for v in self.optimizer.state.values())
        return {"rows": len(self.weight), "bytes": self.weight.numel() * 4 + state + self.clocks.numel() * 9}


def sum_rows(values: torch.Tensor, inverse: torch.Tensor, n: int) -> torch.Tensor:
    """``values`` of duplicate rows summed: row ``inverse[i]`` of the result adds ``values[i]``.
    Shape: (m, ...) -> (n, ...)."""
    return torch.zeros(n, *values.shape[1:], dtype=values.dtype).index_add_(0, inverse, values)


def rows_problem(weight: torch.Tensor, state: dict, clocks: torch.Tensor) -> str:
    """Why updated rows are not fit to keep ('' when they are): a value that is not finite (an
    overflow: huge gradients summed), or a clock past MAX_CLOCK."""
    for name, values in (("rows", weight), *((f"optimizer state {n!r}", v) for n, v in state.items())):
        if not limits.all_finite(values):
            return f"the update would make {name} non-finite (overflow)"
    if len(clocks) and int(clocks.max()) > limits.MAX_CLOCK:
        return f"a clock would pass {limits.MAX_CLOCK}"
    return ""


def check_optimizer_state(optimizer, saved: dict, rows: int, path: str, table: str) -> None:
    """Refuse saved optimizer state that is not ``optimizer``'s for ``rows`` rows."""
    expected = {n: (rows, *v.shape[1:]) for n, v in optimizer.state.items()}
    got = {n: tuple(v.shape) for n, v in saved.items()}
    if got != expected:
        raise ValueError(f"{path}: table {table!r} holds optimizer state {sorted(got)}, this shard's "
                         f"{optimizer.cfg.name} needs {sorted(expected)} of its shapes")
