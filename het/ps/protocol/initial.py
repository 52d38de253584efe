"""The value of a row no push has touched: a pure function of the table's seed and the key.

A shard and a client make the same rows, bit for bit, from ``(seed, table, key, column)``: a
shard starts its rows so, and a client builds the rows a lazy reply leaves out (with their
clock, 0, and optimizer state, the initial one) instead of receiving them. So this module sits
in the protocol, beneath both sides of the PS.

The hash runs in one native pass where het's native core is built (:mod:`het.native`), else in
numpy (:func:`hash_rows`, the reference): the same bits.
"""

from __future__ import annotations

import functools
import zlib

import numpy as np
import torch

from het import native
from het.choices import RowDtype
from het.config import TableConfig
from het.ps.protocol import partition
from het.ps.protocol.halves import DTYPES

FOLLOWED = ("adagrad", "rowwise_adagrad", "ftrl")  # the optimizers whose state a worker's cache follows


def initial_counters(table: TableConfig, keys: np.ndarray) -> tuple[np.ndarray, np.uint64]:
    """:func:`initial_rows`'s counters of ``keys`` (each key, or for a key whose ``key * dim``
    wraps, its mix) and the table's salt. Shape: keys (n,) -> (n,) uint64."""
    salt = initial_salt(table)
    keys = np.asarray(keys, dtype=np.int64)
    wide = (keys < 0) | (keys >= (1 << 64) // table.dim) if table.dim > 1 else keys < 0  # key * dim wraps
    counters = keys.astype(np.uint64)
    if wide.any():
        counters[wide] = partition.mix(torch.from_numpy(keys[wide])).numpy().astype(np.uint64)
    return counters, salt


def initial_salt(table: TableConfig) -> np.uint64:
    """:func:`initial_rows`'s salt of ``table``: its name's CRC-32 and its seed."""
    return np.uint64((zlib.crc32(table.name.encode()) << 32) ^ (table.seed & 0xFFFFFFFF))


def initial_rows(table: TableConfig, keys: np.ndarray) -> np.ndarray:
    """Initial rows for ``keys``: uniform in ``[-init_scale, init_scale]``, a pure function
    of ``(table.seed, table.name, key, column)`` (counter-based, splitmix64), so a row's start
    value does not depend on the number of shards.

    The counter is ``key * dim + column`` (mod 2^64). For a key outside ``[0, 2^64 / dim)`` (a
    dynamic table's negative or huge ids) that product wraps, and keys ``2^64 / dim`` apart
    would share their rows (with dim 4: key 0 and key -2^63); such a key is mixed first
    (:func:`het.ps.protocol.partition.mix`), so its row relates to no other key's by a simple rule.
    Keys in that range (every fixed table's) are unaffected. A table whose rows are stored in
    half precision (``row_dtype``) gets each value rounded to the nearest one that holds.

    Shape: keys (n,) -> (n, table.dim) float32.

    Example:
        >>> t = TableConfig("t", rows=10, dim=4)
        >>> a = initial_rows(t, np.array([3, 7]))
        >>> bool((a == initial_rows(t, np.array([7, 3]))[::-1]).all()), a.shape
        (True, (2, 4))
        >>> bool((initial_rows(t, np.array([0])) != initial_rows(t, np.array([-2**63]))).all())
        True
    """
    counters, salt = initial_counters(table, keys)
    rows = _hash(counters, table.dim, salt, float(table.init_scale))
    if table.row_dtype != RowDtype.FP32:  # rows stored in half: each value the nearest one it holds
        rows = torch.from_numpy(rows).to(DTYPES[table.row_dtype]).float().numpy()
    return rows


def hash_rows(counters: np.ndarray, dim: int, salt: np.uint64, scale: float) -> np.ndarray:
    """The rows of ``counters`` (:func:`initial_counters`): column ``c`` of row ``i`` is
    splitmix64 of ``(counters[i] * dim + c) ^ salt``, its top 24 bits scaled to ``[-scale,
    scale)`` in float64, then rounded to float32. The reference the native pass is held to.
    Shape: (n,) -> (n, dim)."""
    cols = np.arange(dim, dtype=np.uint64)
    x = counters[:, None] * np.uint64(dim) + cols[None, :]  # (n, D), hashed in place
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
    unit *= scale
    return unit.astype(np.float32)


def _hash_native(counters: np.ndarray, dim: int, salt: np.uint64, scale: float) -> np.ndarray:
    """:func:`hash_rows` in one native pass (het.native)."""
    return native.ops.initial_rows(torch.from_numpy(counters.view(np.int64)), dim, int(salt.view(np.int64)),
                                   scale).numpy()


_hash = _hash_native if native.ops is not None else hash_rows


def initial_state(table: TableConfig, n: int, full: bool) -> torch.Tensor:
    """What a worker's cache follows ``n`` rows no push touched yet with: the optimizer state
    they start from, as a shard's table gives it (:meth:`het.ps.server.store.optim.SparseOptimizer.local_state`:
    Adagrad's accumulator, all ``initial_accumulator``, or its mean over a row when not
    ``full``). A lazy sync leaves it out for the rows it leaves out. Shape: -> (n, 1) or (n, D).

    Example:
        >>> cfg = TableConfig.from_dict({"name": "t", "rows": 4, "dim": 3,
        ...                              "optimizer": {"name": "adagrad", "initial_accumulator": 0.5}})
        >>> initial_state(cfg, 2, full=False).tolist(), tuple(initial_state(cfg, 2, full=True).shape)
        ([[0.5], [0.5]], (2, 3))
    """
    one = _initial_state_row(table, full)
    return one.expand(n, one.shape[1]).contiguous()


@functools.lru_cache(maxsize=64)
def _initial_state_row(table: TableConfig, full: bool) -> torch.Tensor:
    """:func:`initial_state` of one row, made once a table (read only: expanded and copied)."""
    opt = table.optimizer
    if opt.name not in FOLLOWED:
        raise ValueError(f"a worker's cache follows the state of {' or '.join(FOLLOWED)} only, got table "
                         f"{table.name!r}'s {opt.name}")
    width = 1 if opt.name == "rowwise_adagrad" else table.dim  # row-wise Adagrad: one float a row
    acc = torch.full((1, width), float(opt.initial_accumulator))
    return acc if full or width == 1 else acc.mean(1, keepdim=True)
