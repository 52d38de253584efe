"""A fixed table's slice on a shard: its rows, clocks, touched marks and optimizer state."""

from __future__ import annotations

import numpy as np
import torch

from het import memory
from het import native as het_native
from het.config import TableConfig
from het.decay import DECAYED, steps_of
from het.ps.protocol import halves, limits, partition
from het.ps.protocol.initial import initial_rows
from het.ps.server.store import optim
from het.ps.server.store.kernels import (HALF_REPLIES, NATIVE_OPTIMIZERS, BroughtPush, HalfPush, NativeHalfPush, NativePush,
                                  NativeReplies, TorchPush, TorchReplies, WidenedReplies)


class FixedRows:
    """A fixed table's slice on this shard: dense local rows, clocks, optimizer state: a
    :class:`het.ps.server.store.rowstore.RowStore`.

    Key ``k`` lives at local row ``k // S`` (:mod:`het.ps.protocol.partition`); ``at`` is local rows.

    Args:
        cfg: the table.
        index, num_shards: which shard of how many this slice is on.
        native: push and gather with het's native core where it is built (False: the PyTorch
            reference, which the tests hold it to).
    """

    on_remove = None  # told the keys of rows the store forgets (a shard's record of changes)

    def __init__(self, cfg: TableConfig, index: int, num_shards: int, native: bool = True):
        self.cfg = cfg
        self.index, self.num_shards = index, num_shards
        n = partition.rows_on_shard(cfg.rows, index, num_shards)
        self.dtype = halves.torch_dtype(cfg.row_dtype)  # float32, or half: half the bytes
        # Rows are built on first touch (:meth:`build`), and the rest while the shard is idle
        # (:meth:`build_next`): a shard starts at once whatever its table's size.
        self.weight = memory.empty(n, cfg.dim, dtype=self.dtype)  # big, read at random rows: on huge pages
        self.built = torch.zeros(n, dtype=torch.bool)
        self.unbuilt, self._next = n, 0
        self.clocks = torch.zeros(n, dtype=torch.int64)
        # rows changed by a push (any push, even one of zero counts): the others still hold
        # initial_rows, which a client can build itself instead of receiving them
        self.touched = torch.zeros(n, dtype=torch.bool)
        self.optimizer = optim.make(cfg.optimizer, n, cfg.dim, started=False)
        self.step = 0  # the largest step a push named
        self.native = native and het_native.ops is not None
        decays = self.optimizer.decay.active  # half rows that decay: decayed and stepped in float32 (torch's)
        native_rule = cfg.optimizer.name in NATIVE_OPTIMIZERS and not (decays and self.dtype != torch.float32)
        self._push = NativePush() if self.native and native_rule else TorchPush()
        self.refuses_non_finite_grads = isinstance(self._push, NativePush) and self.dtype == torch.float32
        if decays and isinstance(self._push, NativePush):
            self._push = BroughtPush(self._push)
        if self.dtype != torch.float32:  # half rows: widened to float32 to push, rounded back
            native_half = isinstance(self._push, NativePush)
            self._push, self._replies = (NativeHalfPush() if native_half else HalfPush(self._push)), WidenedReplies()
        else:
            self._replies = NativeReplies(cfg.dim) if self.native else TorchReplies()

    def build(self, local: torch.Tensor) -> None:
        """Give the rows ``local`` never built yet their initial value
        (:func:`het.ps.protocol.initial.initial_rows`: the bits a shard that built every row at start
        held) and their optimizer's initial state. Every push and every read of a row that
        may be untouched builds its rows first; a lazy reply reads touched rows only."""
        if not self.unbuilt or not len(local):
            return
        fresh = local[~self.built.index_select(0, local)]
        if not len(fresh):
            return
        fresh = torch.unique(fresh)
        keys = fresh.numpy() * self.num_shards + self.index
        self.weight.index_copy_(0, fresh, torch.from_numpy(initial_rows(self.cfg, keys)).to(self.dtype))
        self.optimizer.start_rows(fresh)
        self.built.index_fill_(0, fresh, True)
        self.unbuilt -= len(fresh)

    def build_next(self, rows: int = 1 << 13) -> None:
        """:meth:`build` the next ``rows`` rows in order, from where the last call stopped: a
        shard builds its table so while no request waits (het.ps.server.server.serve), off the path of
        a job's start and without a push's scattered writes."""
        lo = self._next
        hi = min(len(self.weight), lo + rows)
        self.build(torch.arange(lo, hi))
        self._next = hi if hi < len(self.weight) else 0

    def build_all(self, chunk: int = 1 << 16) -> None:
        """:meth:`build` every row (a save holds them all), ``chunk`` rows at a time: the chunks
        bound the scratch space."""
        while self.unbuilt:
            self.build_next(chunk)

    def check_keys(self, keys: torch.Tensor) -> str:
        S = self.num_shards
        problem = limits.out_of_range(self.cfg, keys)
        if not problem and S > 1 and bool((partition.shard_of(keys, S) != self.index).any()):
            problem = f"keys of another shard sent to shard {self.index} of {S} (the rule is key % {S})"
        return problem

    def locate(self, keys: torch.Tensor) -> torch.Tensor:
        return partition.local_rows(keys, self.num_shards)

    def clocks_of(self, local: torch.Tensor) -> torch.Tensor:
        return self.clocks.index_select(0, local)

    def push(self, local: torch.Tensor, grads: torch.Tensor, counts: torch.Tensor, step: int,
             sq: torch.Tensor | None = None) -> None:
        """Apply the optimizer to ``grads`` (which it may overwrite) and add ``counts`` to the
        clocks; duplicate rows are summed first. ``sq``: the sum of the squared gradients of the
        steps each row's gradient sums (:class:`het.ps.server.store.optim.Pushed`). All or nothing: a
        push that would make a value non-finite or a clock pass MAX_CLOCK raises ValueError and
        changes nothing. Shape: (n,), (n, D), (n,), sq (n, 1) or (n, D)."""
        self.build(local)
        self._push(self, local, grads, counts, step, sq)
        self.step = max(self.step, int(step))

    def rows_to_send(self, local: torch.Tensor, lazy: bool, half: bool = False) -> tuple[list, int]:
        """The reply arrays for the rows ``local``: ``[rows]``, or with ``lazy``
        ``[rows of the touched ones, built (n,) uint8]`` where ``built`` marks the untouched
        rows left out (the client builds them with :func:`het.ps.protocol.initial.initial_rows`); and
        how many rows were sent. ``half``: rows stored in half precision go as their bits."""
        replies = self._replies if not half or self.dtype == torch.float32 else HALF_REPLIES
        if not lazy:
            self.build(local)
            return [replies.gather(self.weight, local)], len(local)
        arrays = replies.gather_touched(self.weight, self.touched, local)
        return arrays, len(arrays[0])

    def pull_reply(self, local: torch.Tensor, lazy: bool) -> tuple[list, int] | None:
        """A lazy pull's reply in one native pass (float32 rows); None otherwise."""
        if not lazy or not isinstance(self._replies, NativeReplies):
            return None
        return self._replies.pull_touched(self.weight, self.touched, self.clocks, local)

    def wire_pull(self, keys: np.ndarray, lazy: bool) -> tuple[list, int] | None:
        """:meth:`pull_reply` of the keys as they travel, located and checked in one native pass."""
        if not lazy or not isinstance(self._replies, NativeReplies) or not len(keys):
            return None
        local = het_native.ops.wire_rows(torch.from_numpy(keys), self.cfg.rows, self.num_shards, self.index)
        return None if local is None else self._replies.pull_touched(self.weight, self.touched, self.clocks, local)

    def wire_push(self, keys: np.ndarray, grads: np.ndarray, counts: np.ndarray, step: int) -> int | None:
        """:meth:`push` of a native push (float32 rows) from the arrays as they travel: keys
        located and counts widened, each checked in one native pass; the gradients are left to
        the push, which refuses a result that is not finite."""
        n = len(keys)
        if (not self.refuses_non_finite_grads or not n or grads.dtype != np.float32 or grads.shape != (n, self.cfg.dim)
                or counts.shape != (n,)):
            return None
        local = het_native.ops.wire_rows(torch.from_numpy(keys), self.cfg.rows, self.num_shards, self.index)
        wide = None if local is None else het_native.ops.wire_counts(torch.from_numpy(counts), limits.MAX_COUNT)
        if wide is None:
            return None
        self.build(local)
        self._push(self, local, torch.from_numpy(grads), wide, step, None)
        self.step = max(self.step, int(step))
        return n

    def decayed_to(self, local: torch.Tensor) -> torch.Tensor:
        self.build(local)
        return steps_of(self.optimizer.state[DECAYED].index_select(0, local))

    def local_state(self, local: torch.Tensor, full: bool) -> np.ndarray:
        self.build(local)
        state = {n: v.index_select(0, local) for n, v in self.optimizer.state.items()}
        return self.optimizer.local_state(state, full).contiguous().numpy()

    # -- a fixed table is all in memory -----------------------------------------------------
    def pageable(self, local: torch.Tensor) -> None:
        return None

    def page_in(self, pageable) -> int:
        return 0

    def dram_bytes(self) -> tuple[int, int]:
        return self.stats()["bytes"], 0

    def size_pool(self, rows: int) -> None:
        pass

    def close(self) -> None:
        pass

    # -- saves ------------------------------------------------------------------------------
    def state_dict(self, rows_dir: str | None = None) -> dict:
        self.build_all()
        return {"config": self.cfg.to_dict(), "weight": self.weight, "clocks": self.clocks, "touched": self.touched,
                "optimizer": self.optimizer.state_dict()}

    def check_state(self, saved: dict, path: str) -> None:
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

    def load_state_dict(self, saved: dict, rows_dir: str | None = None) -> None:
        self.weight.copy_(saved["weight"])  # rows saved in another precision: rounded to nearest
        self.clocks.copy_(saved["clocks"])
        # a save from before rows were marked touched: count every row as changed
        self.touched.copy_(saved["touched"] if "touched" in saved else torch.ones_like(self.touched))
        self.optimizer.load_state_dict(saved["optimizer"])
        decayed = self.optimizer.state.get(DECAYED)  # the last step a push named, as far as the rows tell
        self.step = int(steps_of(decayed).max()) if decayed is not None and len(decayed) else 0
        self.built.fill_(True)
        self.unbuilt = 0

    def stats(self) -> dict:
        """Rows held, rows built, and the bytes of those built (values and optimizer state)
        and of every row's clock and marks."""
        state = sum(v.shape[1] * v.element_size() for v in self.optimizer.state.values())
        built = len(self.weight) - self.unbuilt
        return {"rows": len(self.weight), "rows_built": built,
                "bytes": built * (self.cfg.dim * self.weight.element_size() + state) + self.clocks.numel() * 10}


def check_optimizer_state(optimizer, saved: dict, rows: int, path: str, table: str) -> None:
    """Refuse saved optimizer state that is not ``optimizer``'s for ``rows`` rows."""
    expected = {n: (rows, *v.shape[1:]) for n, v in optimizer.state.items()}
    got = {n: tuple(v.shape) for n, v in saved.items()}
    if got != expected:
        raise ValueError(f"{path}: table {table!r} holds optimizer state {sorted(got)}, this shard's "
                         f"{optimizer.cfg.name} needs {sorted(expected)} of its shapes")
