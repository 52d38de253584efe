"""One table's slice on a shard: its rows, clocks, touched marks and optimizer state, and the
initial value of any row (a pure function of the table's seed and the key)."""

from __future__ import annotations

import zlib

import numpy as np
import torch

from het.config import TableConfig
from het.ps import checks, optim, partition


def initial_rows(table: TableConfig, keys: np.ndarray) -> np.ndarray:
    """Initial rows for ``keys``: uniform in ``[-init_scale, init_scale]``, a pure function
    of ``(table.seed, table.name, key, column)`` (counter-based, splitmix64), so a row's start
    value does not depend on the number of shards.

    Shape: keys (n,) -> (n, table.dim) float32.

    Example:
        >>> t = TableConfig("t", rows=10, dim=4)
        >>> a = initial_rows(t, np.array([3, 7]))
        >>> bool((a == initial_rows(t, np.array([7, 3]))[::-1]).all()), a.shape
        (True, (2, 4))
    """
    salt = np.uint64((zlib.crc32(table.name.encode()) << 32) ^ (table.seed & 0xFFFFFFFF))
    cols = np.arange(table.dim, dtype=np.uint64)
    x = keys.astype(np.uint64)[:, None] * np.uint64(table.dim) + cols[None, :]  # (n, D), hashed in place
    shifted = np.empty_like(x)
    with np.errstate(over="ignore"):
        x ^= salt
        x += np.uint64(0x9E3779B97F4A7C15)
        for shift, mul in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB), (31, None)):
            np.right_shift(x, np.uint64(shift), out=shifted)
            x ^= shifted
            if mul is not None:
                x *= np.uint64(mul)
    x >>= np.uint64(40)
    unit = x.astype(np.float64)  # 24 random bits
    unit *= 2.0 / (1 << 24)      # exact: [0, 2)
    unit -= 1
    unit *= table.init_scale
    return unit.astype(np.float32)


class TableRows:
    """One table's slice on this shard: dense local rows, clocks, optimizer state."""

    def __init__(self, cfg: TableConfig, index: int, num_shards: int, chunk: int = 1 << 16):
        self.cfg = cfg
        n = partition.rows_on_shard(cfg.rows, index, num_shards)
        self.weight = torch.empty(n, cfg.dim)
        for lo in range(0, n, chunk):  # chunks bound the int64 scratch space of the init
            local = np.arange(lo, min(n, lo + chunk), dtype=np.int64)
            keys = local * num_shards + index
            self.weight[lo:lo + len(local)] = torch.from_numpy(initial_rows(cfg, keys))
        self.clocks = torch.zeros(n, dtype=torch.int64)
        # rows changed by a push (any push, even one of zero counts): the others still hold
        # initial_rows, which a client can build itself instead of receiving them
        self.touched = torch.zeros(n, dtype=torch.bool)
        self.optimizer = optim.make(cfg.optimizer, n, cfg.dim)

    def snapshot(self, rows: torch.Tensor) -> dict:
        """What a push to ``rows`` (unique) may change: their rows, clocks, marks and state."""
        return {"weight": self.weight.index_select(0, rows), "clocks": self.clocks.index_select(0, rows),
                "touched": self.touched.index_select(0, rows),
                **{f"state.{n}": v.index_select(0, rows) for n, v in self.optimizer.state.items()}}

    def restore(self, rows: torch.Tensor, saved: dict) -> None:
        self.weight.index_copy_(0, rows, saved["weight"])
        self.clocks.index_copy_(0, rows, saved["clocks"])
        self.touched.index_copy_(0, rows, saved["touched"])
        for n, v in self.optimizer.state.items():
            v.index_copy_(0, rows, saved[f"state.{n}"])

    def check_rows(self, rows: torch.Tensor) -> str:
        """Why ``rows`` are not fit to keep after an update ('' when they are): a value that is
        not finite (an overflow: huge gradients summed), or a clock past MAX_CLOCK."""
        for name, values in (("rows", self.weight), *((f"optimizer state {n!r}", v)
                                                      for n, v in self.optimizer.state.items())):
            if not checks.all_finite(values.index_select(0, rows)):
                return f"the update would make {name} non-finite (overflow)"
        if len(rows) and int(self.clocks.index_select(0, rows).max()) > checks.MAX_CLOCK:
            return f"a clock would pass {checks.MAX_CLOCK}"
        return ""

    def rows_to_send(self, local: torch.Tensor, lazy: bool) -> tuple[list, int]:
        """The reply arrays for the rows ``local``: ``[rows]``, or with ``lazy``
        ``[rows of the touched ones, built (n,) uint8]`` where ``built`` marks the untouched
        rows left out (the client builds them with :func:`initial_rows`); and how many rows
        were sent."""
        if not lazy:
            return [self.weight.index_select(0, local).numpy()], len(local)
        touched = self.touched.index_select(0, local)
        sent = local[touched]
        return [self.weight.index_select(0, sent).numpy(), (~touched).to(torch.uint8).numpy()], len(sent)
