"""Rows stored in half precision: float32 values rounded to float16 or bfloat16.

A table of ``row_dtype`` fp16 or bf16 holds its rows in half the bytes; its optimizer state
stays float32, and a push computes in float32 as for any table, then rounds the rows it wrote
(:class:`het.ps.store.fixed.FixedRows`, :class:`het.ps.store.dynamic.DynamicRows`). Initial rows
are rounded to nearest (:func:`het.ps.initial.initial_rows`), so a client that builds one gets
the shard's value exactly.

Rounding an update:

- ``nearest``: to the nearest value, ties to even (torch's conversion). An update smaller than
  half the gap between two half values is lost: bf16 keeps 8 significant bits, so a row of 0.05
  ignores updates below about 1e-4.
- ``stochastic``: up or down with the probabilities that make the expected result the float32
  value (``P(up) = (x - down) / (up - down)``), as FBGEMM's half-precision tables do, so small
  updates still move a row on average. The random number of each value is a hash of
  ``(salt, column)`` where the salt is the row's key and its clock after the push: the same push
  rounds the same way when a write-ahead log replays it, on any shard.
"""

from __future__ import annotations

import torch

from het.choices import RowDtype, RowRounding
from het.ps.partition import mix

DTYPES = {RowDtype.FP32: torch.float32, RowDtype.FP16: torch.float16, RowDtype.BF16: torch.bfloat16}
_FIELD = 0x9E3779B97F4A7C15 - (1 << 64)  # golden ratio, as an int64


def torch_dtype(row_dtype) -> torch.dtype:
    """The torch dtype a table's rows are stored in."""
    return DTYPES[RowDtype.parse(row_dtype, "row_dtype")]


def salts(keys: torch.Tensor, clocks: torch.Tensor) -> torch.Tensor:
    """Each row's salt for stochastic rounding: its key and its clock after the push, mixed.
    Shape: (n,), (n,) -> (n,) int64."""
    return mix(keys.to(torch.int64) * _FIELD + clocks.to(torch.int64))


def round_rows(values: torch.Tensor, dtype: torch.dtype, rounding, salt: torch.Tensor | None = None) -> torch.Tensor:
    """``values`` (float32) in ``dtype``; ``stochastic`` needs ``salt`` (:func:`salts`). Raises
    ValueError for a finite value that ``dtype`` cannot hold (float16 past 65504), naming it.
    Shape: (n, D), (n,) -> (n, D).

    Example:
        >>> x = torch.full((1, 4000), 1 + 2 ** -10)  # a quarter of the way from 1 to bf16's next value, 1 + 2^-7
        >>> up = round_rows(x, torch.bfloat16, "stochastic", torch.tensor([7])).float()
        >>> round_rows(x, torch.bfloat16, "nearest").float().unique().tolist(), sorted(up.unique().tolist())
        ([1.0], [1.0, 1.0078125])
        >>> 0.1 < float((up > 1).float().mean()) < 0.15  # P(up) = 1/8
        True
    """
    if dtype == torch.float32:
        return values
    values = values.float()
    near = values.to(dtype)
    if RowRounding.parse(rounding, "row_rounding") == RowRounding.STOCHASTIC and values.numel():
        n, d = values.shape
        cols = torch.arange(d, dtype=torch.int64, device=values.device)
        u = mix(salt.to(values.device)[:, None] * _FIELD + cols)  # (n, D) random bits
        unit = ((u >> 40) & 0xFFFFFF).to(torch.float32) * (1.0 / (1 << 24))  # [0, 1), 24 bits
        at = near.float()
        gap = values - at  # from the nearest value toward the float32 one
        other = torch.nextafter(near, torch.where(gap > 0, torch.inf, -torch.inf).to(dtype))
        step = other.float() - at  # same sign as gap, never 0 where gap is not
        p = torch.where(gap != 0, gap / torch.where(step != 0, step, 1.0), 0.0)
        near = torch.where(unit < p, other, near)
    bad = torch.isinf(near) & torch.isfinite(values)
    if bool(bad.any()):
        v = float(values[bad][0])
        raise ValueError(f"a row value {v:g} does not fit {str(dtype).removeprefix('torch.')} (its largest is "
                         f"{torch.finfo(dtype).max:g}): the push is refused")
    return near
