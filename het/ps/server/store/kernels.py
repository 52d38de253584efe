"""A fixed table's two hot passes on a shard, a push and a reply's rows, natively (het.native)
or by the PyTorch reference. :class:`het.ps.server.store.fixed.FixedRows` chooses once, when it is
made; property tests hold the two equal bit for bit (tests/unit/test_native.py).

- A push, all or nothing. The reference applies the optimizer's tensor ops and puts every row
  back if a value came out non-finite; the native pass computes the new rows and state aside
  and checks them before writing any (SGD: in place in one pass, with an undo log).
- A reply's rows: gathered whole, the rows ahead prefetched, into reply buffers reused once
  ZeroMQ has let go of them; a lazy reply's marks in the same pass.
"""

from __future__ import annotations

import copy
import math
import weakref

import numpy as np
import torch

from het import native
from het.ps.protocol import halves, limits
from het.ps.protocol.initial import initial_rows
from het.ps.server.store import optim
from het.ps.server.store.adam_push import adam_steps_push
from het.ps.server.store.optim import rows_problem, sum_rows

NATIVE_OPTIMIZERS = ("sgd", "adagrad", "adam")  # those native.ops.table_push applies


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


class TorchPush:
    """The reference push: torch's ops on the table's tensors; the rows a push reaches are
    saved first and put back if it fails."""

    def __call__(self, t, local: torch.Tensor, grads: torch.Tensor, counts: torch.Tensor, step: int,
                 sq: torch.Tensor | None) -> None:
        rows, inverse = torch.unique(local, return_inverse=True)
        several = t.optimizer.takes_steps(counts, sq)
        before = _snapshot(t, rows)
        try:
            t.clocks.index_add_(0, local, counts)
            t.touched.index_fill_(0, local, True)
            if t.optimizer.accepts_duplicates:
                t.optimizer.update(t.weight, local, grads, step)
            elif len(rows) != len(local):  # duplicates are summed first: the update is non-linear
                pushed = optim.Pushed(sum_rows(counts, inverse, len(rows)),
                                      None if sq is None else sum_rows(sq, inverse, len(rows))) if several else None
                t.optimizer.update(t.weight, rows, sum_rows(grads, inverse, len(rows)), step, pushed=pushed)
            else:
                t.optimizer.update(t.weight, local, grads, step, pushed=optim.Pushed(counts, sq) if several else None)
        except BaseException:  # one that fails part way (an lr past float32's range, say) changes nothing
            _restore(t, rows, before)
            raise
        state = {n: v.index_select(0, rows) for n, v in t.optimizer.state.items()}
        problem = rows_problem(t.weight.index_select(0, rows), state, t.clocks.index_select(0, rows))
        if problem:  # refused whole: the rows, clocks and state are as they were
            _restore(t, rows, before)
            raise ValueError(problem)


def _snapshot(t, rows: torch.Tensor) -> dict:
    """What a push to ``rows`` (unique) may change: their rows, clocks, marks and state."""
    return {"weight": t.weight.index_select(0, rows), "clocks": t.clocks.index_select(0, rows),
            "touched": t.touched.index_select(0, rows),
            **{f"state.{n}": v.index_select(0, rows) for n, v in t.optimizer.state.items()}}


def _restore(t, rows: torch.Tensor, saved: dict) -> None:
    t.weight.index_copy_(0, rows, saved["weight"])
    t.clocks.index_copy_(0, rows, saved["clocks"])
    t.touched.index_copy_(0, rows, saved["touched"])
    for n, v in t.optimizer.state.items():
        v.index_copy_(0, rows, saved[f"state.{n}"])


class NativePush:
    """The push in one native call (het.native), with the reference's bits (a push of several
    steps of Adagrad: its values to rounding, its square roots being IEEE's). SGD applies the
    gradients one after another, duplicates too, in place in one pass; Adagrad and Adam move the
    states, then the rows, in place in two, and Adagrad's pushes of several steps both in one;
    each row's old values are kept aside and put back if the push fails."""

    def __call__(self, t, local: torch.Tensor, grads: torch.Tensor, counts: torch.Tensor, step: int,
                 sq: torch.Tensor | None) -> None:
        opt = t.optimizer
        if opt.takes_squares and opt.takes_steps(counts, sq):  # Adam's rows of several steps taken apart aside
            return adam_steps_push(t, local, grads, counts, step, sq, self)
        kind, args = native_push_args(opt, local, grads, counts, step, sq)
        failed = native.ops.table_push(kind, t.weight, [opt.state[n] for n in type(opt).state_names], t.clocks,
                                       t.touched, *args)
        raise_push_failure(failed, opt)


class BroughtPush:
    """The native push of a float32 table whose rows decay (:mod:`het.decay`): its rows brought to
    the push's step first, then pushed natively with the optimizer's own state. A push refused
    leaves its rows brought to the step: the same values, the decay being deterministic."""

    def __init__(self, push: NativePush):
        self.push = push

    def __call__(self, t, local: torch.Tensor, grads: torch.Tensor, counts: torch.Tensor, step: int,
                 sq: torch.Tensor | None) -> None:
        t.optimizer.bring(t.weight, torch.unique(local), step)
        self.push(t, local, grads, counts, step, sq)


class NativeHalfPush:
    """:class:`HalfPush` of a float32 push in one native call (``native.ops.table_push_half``):
    each row widened as it is read, rounded as it is written, the same bits."""

    def __call__(self, t, local: torch.Tensor, grads: torch.Tensor, counts: torch.Tensor, step: int,
                 sq: torch.Tensor | None) -> None:
        opt = t.optimizer
        if opt.takes_squares and opt.takes_steps(counts, sq):  # Adam's steps of a push taken apart: torch's
            return HalfPush(TorchPush())(t, local, grads, counts, step, sq)
        kind, args = native_push_args(opt, local, grads, counts, step, sq)
        each_row_once(opt, args)
        failed = native.ops.table_push_half(kind, t.weight, [opt.state[n] for n in type(opt).state_names], t.clocks,
                                            t.touched, t.cfg.row_rounding == "stochastic", t.num_shards, t.index,
                                            *args)
        if failed == 102:
            halves.refuse(t.weight.dtype, native.ops.refused_value())
        raise_push_failure(failed, opt)


def each_row_once(opt, args: list) -> None:
    """A half table's native push writes each row once: under SGD, whose arguments name a row
    per gradient (:func:`native_push_args`), its gradients are added in order to the row's one
    copy instead of pushed in place."""
    if opt.accepts_duplicates:
        rows, inverse = native.unique_inverse(args[0])
        args[:3] = [rows.contiguous(), inverse.contiguous(), inverse.contiguous()]


_IOTA = [torch.arange(0)]  # 0, 1, 2, ...: the native kernels read it, nothing writes it


def positions(n: int) -> torch.Tensor:
    """``torch.arange(n)``, as a view of one kept range (grown to the next power of two): a
    push's identity mapping without a new tensor each time."""
    if _IOTA[0].shape[0] < n:
        _IOTA[0] = torch.arange(1 << max(n - 1, 0).bit_length())
    return _IOTA[0][:n]


def native_push_args(opt, local: torch.Tensor, grads: torch.Tensor, counts: torch.Tensor, step: int,
                     sq: torch.Tensor | None) -> tuple[str, list]:
    """The native push's kind and its arguments after the storage (``rows`` ... ``sq``): the
    unique rows of ``local`` and where each gradient and count goes, duplicates summed where the
    optimizer takes one gradient a row."""
    if opt.accepts_duplicates:  # SGD: no unique needed
        order = positions(local.shape[0])
        rows, at, inverse, steps = local, order, order, counts
        sq = None
    else:
        rows, inverse = native.unique_inverse(local)
        at, steps = inverse, counts
        sq = sq if sq is not None and opt.followed and bool((counts > 1).any()) else None
        if len(rows) != len(local):  # one gradient a row: duplicates summed first
            grads, at = sum_rows(grads, inverse, len(rows)), torch.arange(len(rows))
            if sq is not None:  # the steps and their squares summed as the gradients are
                steps, sq = sum_rows(counts, inverse, len(rows)), sum_rows(sq, inverse, len(rows))
    cfg, step = opt.cfg, max(int(step), 1)
    b1, b2 = cfg.betas
    step_size = cfg.lr_at(step) * math.sqrt(1 - b2 ** step) / (1 - b1 ** step) if cfg.name == "adam" else 0.0
    return (cfg.name if sq is None else "adagrad_steps",
            [rows.contiguous(), at.contiguous(), inverse.contiguous(), grads.contiguous(), counts.contiguous(),
             cfg.lr_at(step),
             cfg.eps or 0.0, b1, b2, step_size, limits.MAX_CLOCK,
             torch.empty(0, dtype=torch.int64) if sq is None else steps.contiguous(),
             torch.empty(0, 1) if sq is None else sq.float().contiguous()])


def raise_push_failure(failed: int, opt) -> None:
    """The error a native push's result names (0: none)."""
    if failed == 1:
        raise ValueError("the update would make rows non-finite (overflow)")
    if failed == 100:
        raise ValueError(f"a clock would pass {limits.MAX_CLOCK}")
    if failed:
        raise ValueError(f"the update would make optimizer state {type(opt).state_names[failed - 2]!r} non-finite "
                         f"(overflow)")


_NO_KEYS = torch.empty(0, dtype=torch.int64)


def push_chunks(table, at: torch.Tensor, grads: torch.Tensor, counts: torch.Tensor, step: int,
                sq: torch.Tensor | None) -> None:
    """A dynamic table's push (:meth:`het.ps.server.store.dynamic.DynamicRows.push`, all in memory) in
    one native pass over its chunks (``native.ops.chunk_push``), rows stored in half rounded as a
    fixed table's, by their keys: new keys are given slots with their initial rows first (a half
    table's exact in its dtype), and lose them if the push fails."""
    slots = at[:, 1].clone()
    missing = (slots < 0).nonzero().flatten()
    new_keys = new_slots = None
    if len(missing):
        new_keys = torch.unique(at[missing, 0])
        new_slots = table._alloc(len(new_keys))
        table.keys.insert(new_keys, new_slots)
        fresh = table.optimizer.initial_state(len(new_keys), table.cfg.dim)
        table.store.scatter(new_slots, torch.from_numpy(initial_rows(table.cfg, new_keys.numpy())),
                           torch.cat([fresh[n] for n in table.state_names], 1) if fresh else None)
        table.meta.scatter(new_slots, torch.zeros(len(new_slots), 2, dtype=table.meta.dtype))
        slots[missing] = table.keys.lookup(at[missing, 0])
    if int(step) > torch.iinfo(torch.int32).max and table.meta.dtype != torch.int64:
        table.meta.widen(torch.int64)
    kind, args = native_push_args(table.optimizer, slots, grads, counts, step, sq)
    store, keys = table.store, _NO_KEYS
    if table.dtype != torch.float32:  # half rows: rounded by their keys
        each_row_once(table.optimizer, args)
        keys = table.keys.keys_of(args[0]).contiguous()
    while True:
        failed = native.ops.chunk_push(kind, store.weight.parts, store.state.parts if store.state is not None else [],
                                       table.meta.parts, store.weight.first.bit_length() - 1, False,
                                       len(table.state_names), int(step), table.cfg.row_rounding == "stochastic",
                                       keys, *args)
        if failed != 101:
            break
        table.meta.widen(torch.int64)  # a clock outgrew 32 bits: nothing was written
    if failed and new_keys is not None:  # the new keys' slots go back
        table.keys.remove(new_keys)
        table.meta.scatter(new_slots, torch.full((len(new_slots), 2), -1, dtype=table.meta.dtype))
        table.free = torch.cat([table.free, new_slots])
    if failed == 102:
        halves.refuse(table.dtype, native.ops.refused_value())
    raise_push_failure(failed, table.optimizer)
    if new_keys is not None:
        table.counters["admitted"] += len(new_keys)


class TorchReplies:
    """A reply's rows by numpy's take (it copies whole rows: faster than index_select here)."""

    def gather(self, weight: torch.Tensor, local: torch.Tensor) -> np.ndarray:
        """The rows ``local``, copied. Shape: (n,) -> (n, D)."""
        return weight.numpy().take(local.numpy(), axis=0)

    def gather_touched(self, weight: torch.Tensor, touched: torch.Tensor, local: torch.Tensor) -> list:
        """A lazy reply's arrays: the rows of ``local`` a push touched, and ``built`` (n,)
        uint8, 1 where a row was left out."""
        marks = touched.index_select(0, local)
        return [self.gather(weight, local[marks]), (~marks).to(torch.uint8).numpy()]


class WidenedReplies:
    """A reply's rows from a table stored in half precision, widened to float32 (a reader that
    takes float32 rows only)."""

    def gather(self, weight: torch.Tensor, local: torch.Tensor) -> np.ndarray:
        return weight.index_select(0, local).float().numpy()

    def gather_touched(self, weight: torch.Tensor, touched: torch.Tensor, local: torch.Tensor) -> list:
        marks = touched.index_select(0, local)
        return [self.gather(weight, local[marks]), (~marks).to(torch.uint8).numpy()]


class HalfReplies(WidenedReplies):
    """A reply's rows from a table stored in half precision as they are stored: their bits."""

    def gather(self, weight: torch.Tensor, local: torch.Tensor) -> np.ndarray:
        return halves.as_bits(weight.index_select(0, local))


HALF_REPLIES = HalfReplies()


class HalfPush:
    """The push of a table stored in half precision (:mod:`het.ps.protocol.halves`): the rows it reaches
    copied to float32 with their clocks, marks and optimizer state, the float32 push (``push``,
    native or torch) applied to the copies, and the rows rounded back. All or nothing as that
    push: a failure, or a row that its dtype cannot hold, writes nothing."""

    def __init__(self, push):
        self.push = push

    def __call__(self, t, local: torch.Tensor, grads: torch.Tensor, counts: torch.Tensor, step: int,
                 sq: torch.Tensor | None) -> None:
        rows, inverse = torch.unique(local, return_inverse=True)
        copies = _Copies(t, rows)
        self.push(copies, inverse, grads, counts, step, sq)
        weight = halves.round_rows(copies.weight, t.weight.dtype, t.cfg.row_rounding,
                                   halves.salts(rows * t.num_shards + t.index, copies.clocks))
        t.weight.index_copy_(0, rows, weight)
        t.clocks.index_copy_(0, rows, copies.clocks)
        t.touched.index_copy_(0, rows, copies.touched)
        for n, v in copies.optimizer.state.items():
            t.optimizer.state[n].index_copy_(0, rows, v)


class _Copies:
    """The rows ``rows`` of a fixed table ``t`` as a table of their own: float32 copies of the
    weight, and copies of their clocks, marks and optimizer state (rows ``0 .. len(rows) - 1``)."""

    def __init__(self, t, rows: torch.Tensor):
        self.cfg = t.cfg
        self.weight = t.weight.index_select(0, rows).float()
        self.clocks = t.clocks.index_select(0, rows)
        self.touched = t.touched.index_select(0, rows)
        self.optimizer = copy.copy(t.optimizer)
        self.optimizer.state = {n: v.index_select(0, rows) for n, v in t.optimizer.state.items()}


class NativeReplies:
    """A reply's rows gathered natively (the rows ahead prefetched) into pooled buffers."""

    def __init__(self, dim: int):
        self.buffers = ReplyBuffers(dim)

    def gather(self, weight: torch.Tensor, local: torch.Tensor) -> np.ndarray:
        out = self.buffers.take(len(local))
        native.ops.gather_rows(weight, local.contiguous(), out)
        return self.buffers.lend(out.numpy())

    def gather_touched(self, weight: torch.Tensor, touched: torch.Tensor, local: torch.Tensor) -> list:
        # a pooled buffer for as many rows as asked (a bulk read: only the rows sent, allocated)
        out = self.buffers.take(len(local)) if len(local) <= self.buffers.max_rows else torch.empty(0)
        rows, built = native.ops.gather_touched(weight, touched, local.contiguous(), out)
        return [self.buffers.lend(rows.numpy()), built.numpy()]

    def pull_touched(self, weight: torch.Tensor, touched: torch.Tensor, clocks: torch.Tensor,
                     local: torch.Tensor) -> tuple[list, int]:
        """A lazy pull's reply arrays (:meth:`het.ps.server.store.fixed.FixedRows.pull_reply`) and the
        rows sent: :meth:`gather_touched`'s, with the clocks and the packed marks of the same pass."""
        out = self.buffers.take(len(local)) if len(local) <= self.buffers.max_rows else torch.empty(0)
        rows, sent_clocks, marks = native.ops.pull_touched(weight, touched, clocks, local.contiguous(), out)
        return [self.buffers.lend(rows.numpy()), sent_clocks.numpy(), marks.numpy()], len(rows)
