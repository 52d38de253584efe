"""What a client sends, checked and routed before it leaves: keys, gradients, counts and
clocks in range and shape, each key bound for the shard that holds it, and no request to a
shard longer than the shards' ``max_keys``. The worker's one check of each input
(het.Embedding checks its keys and gradients here too); what a shard checks on arrival:
:mod:`het.ps.protocol.checks`.

A fixed table's keys lie in ``[0, rows)`` and go to shard ``key % S``; a dynamic table
(``rows=None``) takes any int64 key and routes it by ``mix(key) % S`` (:mod:`het.ps.protocol.partition`).
"""

from __future__ import annotations

import numpy as np
import torch

from het import native
from het.config import TableConfig
from het.ps.protocol import partition
from het.ps.protocol.integers import narrow
from het.ps.protocol.limits import bounds_out_of_range, check_finite, check_squares, out_of_range
from het.ps.protocol.messages import PUSH_DTYPES


def table_of(tables: dict[str, TableConfig], table: str) -> TableConfig:
    """The table named ``table``, or KeyError naming those there are."""
    if table not in tables:
        raise KeyError(f"unknown table {table!r}: the PS holds {sorted(tables)}")
    return tables[table]


def check_keys(table: TableConfig, keys, allowed: int | None = None) -> torch.Tensor:
    """``keys`` of ``table`` as int64 (same shape, same device), or the error naming what is
    wrong: not an integer tensor, or (fixed tables only) a key outside ``[0, rows)``.
    ``allowed``: one more key taken whatever the range (a pooled lookup's padding).

    Example:
        >>> check_keys(TableConfig("ids", rows=None, dim=2), torch.tensor([[-1, 2**63 - 1]])).tolist()  # any int64
        [[-1, 9223372036854775807]]
        >>> check_keys(TableConfig("t", rows=10, dim=2), torch.tensor([3, 10]))
        Traceback (most recent call last):
        ...
        ValueError: key 10 out of range for table 't' with 10 rows
    """
    keys = _int64(keys)
    problem = out_of_range(table, keys, allowed)
    if problem:
        raise ValueError(problem)
    return keys


def keys_to_send(table: TableConfig, keys) -> tuple[torch.Tensor, torch.Tensor]:
    """A request's keys checked (:func:`check_keys`) and flat, and as they travel, from one pass
    over them: int32 when every one fits (a fixed table's below 2^31 rows, say), else int64 as
    they are; the shard widens them back. Ascending keys then travel narrower still where they
    can, as the steps between them (:func:`het.ps.protocol.integers.delta_keys`).
    Shape: any -> (n,), (n,).

    Example:
        >>> ids = TableConfig("ids", rows=None, dim=2)
        >>> keys, wire = keys_to_send(ids, torch.tensor([[0, -5], [2**31 - 1, 7]]))
        >>> keys.shape, wire.dtype, keys_to_send(ids, torch.tensor([2**31]))[1].dtype
        (torch.Size([4]), torch.int32, torch.int64)
    """
    keys = _int64(keys).reshape(-1)
    if not keys.numel():
        return keys, keys.to(torch.int32)
    if native.ops is not None and keys.device.type == "cpu" and keys.is_contiguous():  # one pass
        wire, lo, hi = native.ops.narrow_ints(keys, 2)
    else:
        lo, hi = (int(k) for k in torch.aminmax(keys))
        wire = keys.to(torch.int32) if -(2**31) <= lo and hi < 2**31 else keys
    problem = bounds_out_of_range(table, lo, hi)
    if problem:
        raise ValueError(problem)
    return keys, wire


KEY_DTYPES = (torch.int64, torch.int32)  # what nn.Embedding takes: a uint8 or bool tensor indexes as a mask


def _int64(keys) -> torch.Tensor:
    if not isinstance(keys, torch.Tensor):
        raise TypeError(f"keys must be a torch.Tensor of int64, got {type(keys).__name__}")
    if keys.dtype not in KEY_DTYPES:
        raise TypeError(f"keys must be int64 (or int32), as nn.Embedding takes them, got {keys.dtype}")
    return keys.long()


def check_push(table: TableConfig, keys: torch.Tensor, grads, counts, grad_dtype: str = "fp32"):
    """A push's gradients (float32, or bfloat16 bits as int16) and counts, checked against
    ``keys`` and the table's width; the counts as they travel, in the narrowest integers that
    hold them (:func:`het.ps.protocol.integers.narrow`: one byte while a row sums under 256 steps).
    Shape: keys (n,), grads (n, D), counts (n,)."""
    if grad_dtype not in PUSH_DTYPES:
        raise ValueError(f"grad_dtype must be one of {PUSH_DTYPES}, got {grad_dtype!r}")
    n, d = keys.shape[0], table.dim
    if not isinstance(grads, torch.Tensor) or grads.shape != (n, d):
        raise ValueError(f"grads must be a tensor of shape ({n}, {d}), got "
                         f"{tuple(grads.shape) if isinstance(grads, torch.Tensor) else type(grads).__name__}")
    check_finite(grads, "grads", table.name)
    counts = integers(counts, "counts", keys.device)
    if counts.shape != (n,):
        raise ValueError(f"counts must have shape ({n},), got {tuple(counts.shape)}")
    if grad_dtype == "bf16":  # rounded to nearest even; int16 bits on the wire
        return grads.to(torch.bfloat16).view(torch.int16), narrow(counts)
    return grads.float(), narrow(counts)


def check_sq(table: TableConfig, keys: torch.Tensor, sq, counts: torch.Tensor) -> torch.Tensor | None:
    """A push's sums of squared gradients (None, or float32 (n, 1) or (n, D), finite, >= 0),
    and None where no row sums several steps (``counts``): Adagrad takes a row of one step by
    its gradient's square, so such a push carries none."""
    if sq is None:
        return None
    n, d = len(keys), table.dim
    if not isinstance(sq, torch.Tensor) or tuple(sq.shape) not in ((n, 1), (n, d)):
        raise ValueError(f"sq must be a tensor of shape ({n}, 1) or ({n}, {d}), got "
                         f"{tuple(sq.shape) if isinstance(sq, torch.Tensor) else type(sq).__name__}")
    sq = sq.float()
    check_squares(sq, table.name)
    return sq if bool((counts > 1).any()) else None


def squares_to_send(sq: torch.Tensor | None, counts: torch.Tensor) -> torch.Tensor | None:
    """A push's squares as they travel: those of its rows of several steps (``counts > 1``), in
    order. Adagrad takes a row of one step by its gradient's square, which the shard has
    (:func:`het.ps.protocol.checks.squares`). Shape: sq (n, w), counts (n,) -> (k, w).

    Example:
        >>> squares_to_send(torch.tensor([[4.], [9.], [1.]]), torch.tensor([1, 3, 1])).tolist()
        [[9.0]]
    """
    return None if sq is None else sq[counts > 1]


def push_arrays(wire, grads, counts, sq, at) -> list:
    """The arrays of a push's rows ``at`` (positions or a slice): keys as they travel (``wire``,
    :func:`keys_to_send`), gradients, counts and, with ``sq``, the squares of the rows of several
    steps among them."""
    counts_at = rows_at(counts, at)
    return [rows_at(wire, at), rows_at(grads, at), counts_at,
            *([] if sq is None else [squares_to_send(rows_at(sq, at), counts_at)])]


def rows_at(t: torch.Tensor, at) -> torch.Tensor:
    """The rows of ``t`` at ``at``: positions (a copy, by ``index_select``: a quarter of the
    time of indexing, for rows of floats on a CPU), or a slice (a view; every row: ``t`` itself).

    Example:
        >>> rows_at(torch.tensor([[1, 2], [3, 4], [5, 6]]), torch.tensor([2, 0])).tolist()
        [[5, 6], [1, 2]]
    """
    if isinstance(at, slice):
        return t if at == _EVERY else t[at]
    return t.index_select(0, at)


_EVERY = slice(None)


def integers(values, what: str, device) -> torch.Tensor:
    """``values`` (a tensor, an array or a list of integers) as a flat int64 tensor on ``device``;
    TypeError for anything but integers (1.5 is not a count, and is not taken as 1).

    Example:
        >>> integers([1, 2], "counts", "cpu").tolist()
        [1, 2]
        >>> integers(torch.tensor([1.5]), "counts", "cpu")
        Traceback (most recent call last):
        ...
        TypeError: counts must be integers, got torch.float32
    """
    values = values if isinstance(values, torch.Tensor) else torch.as_tensor(np.asarray(values))
    if values.dtype.is_floating_point or values.dtype.is_complex or values.dtype == torch.bool:
        raise TypeError(f"{what} must be integers, got {values.dtype}")
    return values.to(device=device, dtype=torch.int64).reshape(-1)


def check_clocks(keys: torch.Tensor, clocks) -> torch.Tensor:
    """A sync's clocks, one per key, in the narrowest integers that hold them (uint8 while every
    one is in [0, 255], int16 with a miss's -1 or below 32,768)."""
    clocks = integers(clocks, "clocks", keys.device)
    if clocks.shape != keys.shape:
        raise ValueError(f"clocks must have shape {tuple(keys.shape)}, got {tuple(clocks.shape)}")
    return narrow(clocks)


def route(table: TableConfig, keys: torch.Tensor, num_shards: int) -> list[torch.Tensor]:
    """Positions of ``keys`` bound for each shard, in their order: ``key % S`` for a fixed
    table, ``mix(key) % S`` for a dynamic one. Shape: (n,) -> S tensors (k_i,).

    Example:
        >>> keys = torch.tensor([1024, 2048, 3072, 4096])
        >>> [p.tolist() for p in route(TableConfig("t", rows=5000, dim=1), keys, 2)]  # all even
        [[0, 1, 2, 3], []]
        >>> [p.tolist() for p in route(TableConfig("ids", rows=None, dim=1), keys, 2)]
        [[1, 2, 3], [0]]
    """
    return partition.split(keys, num_shards, hashed=table.dynamic)


def cut(positions: torch.Tensor, max_keys: int) -> list[torch.Tensor]:
    """``positions`` in pieces of at most ``max_keys`` (none when empty).

    Example:
        >>> [p.tolist() for p in cut(torch.arange(5), 2)]
        [[0, 1], [2, 3], [4]]
    """
    return [positions[lo:lo + max_keys] for lo in range(0, len(positions), max_keys)]


def push_sync_parts(push: torch.Tensor, sync: torch.Tensor, max_keys: int, sync_keys: int | None = None) -> list[tuple]:
    """One shard's push and sync positions in messages of at most ``max_keys`` keys each, and
    at most ``sync_keys`` synced keys each (a sync of many keys, as an evaluation's, travels in
    parts whose replies a shard builds one at a time, with scratch in proportion to each), every
    push before any sync: a shard applies a client's requests in order, so no sync of this
    push_sync reads a row before its push is applied. ``[(push (k,), sync (m,)), ...]``.

    Example:
        >>> [(q.tolist(), p.tolist()) for q, p in push_sync_parts(torch.arange(3), torch.arange(3), 2)]
        [([0, 1], []), ([2], [0, 1]), ([], [2])]
        >>> [(q.tolist(), p.tolist()) for q, p in push_sync_parts(torch.arange(2), torch.arange(1), 2)]
        [([0, 1], [0])]
        >>> [(q.tolist(), p.tolist()) for q, p in push_sync_parts(torch.arange(1), torch.arange(5), 4, sync_keys=2)]
        [([0], [0, 1]), ([], [2, 3]), ([], [4])]
    """
    pushes = cut(push, max_keys) or [push[:0]]
    syncs = cut(sync, min(max_keys, sync_keys or max_keys)) or [sync[:0]]
    return ([(q, sync[:0]) for q in pushes[:-1]] + [(pushes[-1], syncs[0])]
            + [(push[:0], p) for p in syncs[1:]])
