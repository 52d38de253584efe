"""Rows stored in half precision: float32 values rounded to float16 or bfloat16.

A table of ``row_dtype`` fp16 or bf16 holds its rows in half the bytes; its optimizer state
stays float32, and a push computes in float32 as for any table, then rounds the rows it wrote
(:class:`het.ps.server.store.fixed.FixedRows`, :class:`het.ps.server.store.dynamic.DynamicRows`). Initial rows
are rounded to nearest (:func:`het.ps.protocol.initial.initial_rows`), so a client that builds one gets
the shard's value exactly.

Rounding an update:

- ``nearest``: to the nearest value, ties to even (torch's conversion). An update smaller than
  half the gap between two half values is lost: bf16 keeps 8 significant bits, so a row of 0.05
  ignores updates below about 1e-4.
- ``stochastic``: up or down with the probabilities that make the expected result the float32
  value (``P(up) = (x - down) / (up - down)``), as FBGEMM's half-precision tables do, so small
  updates still move a row on average: 16 random bits added below the bits the dtype keeps, then
  cut off (:func:`_stochastic`). The random bits of each value are a hash of ``(salt, column)``
  where the salt is the row's key and its clock after the push: the same push rounds the same
  way when a write-ahead log replays it, on any shard.

The rounding runs in one native pass where het's native core is built, else in torch's ops
(the reference): the same bits.
"""

from __future__ import annotations

import numpy as np
import torch

from het import native
from het.choices import RowDtype, RowRounding
from het.ps.protocol.partition import mix

DTYPES = {RowDtype.FP32: torch.float32, RowDtype.FP16: torch.float16, RowDtype.BF16: torch.bfloat16}
_FIELD = 0x9E3779B97F4A7C15 - (1 << 64)  # golden ratio, as an int64


def torch_dtype(row_dtype) -> torch.dtype:
    """The torch dtype a table's rows are stored in."""
    return DTYPES[RowDtype.parse(row_dtype, "row_dtype")]


def as_bits(rows: torch.Tensor) -> np.ndarray:
    """Half-precision rows as the wire carries them: their bits, int16 (numpy has no bfloat16).
    Shape: (n, D) -> (n, D)."""
    return rows.contiguous().view(torch.int16).numpy()


def from_bits(bits: torch.Tensor, row_dtype) -> torch.Tensor:
    """:func:`as_bits`' rows of a table of ``row_dtype`` as float32 (exact). Shape: (n, D) -> (n, D)."""
    return bits.view(torch_dtype(row_dtype)).float()


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
    stochastic = RowRounding.parse(rounding, "row_rounding") == RowRounding.STOCHASTIC
    if native.ops is not None and values.device.type == "cpu" and values.dim() == 2:  # one pass, the same bits
        out = torch.empty(values.shape, dtype=dtype)
        bad = native.ops.round_rows(values.contiguous(), out, salt.contiguous() if stochastic else torch.empty(0, dtype=torch.int64),
                                    stochastic)
        if bad >= 0:
            refuse(dtype, float(values.flatten()[bad]))
        return out
    if stochastic and values.numel():
        near = _stochastic(values, dtype, salt)
    else:
        near = values.to(dtype)
    bad = torch.isinf(near) & torch.isfinite(values)
    if bool(bad.any()):
        refuse(dtype, float(values[bad][0]))
    return near


def _stochastic(values: torch.Tensor, dtype: torch.dtype, salt: torch.Tensor) -> torch.Tensor:
    """Stochastic rounding by float32's bits: random bits added below the ones ``dtype`` keeps,
    then those cut off, so a value goes up with probability (its distance from the value below) /
    (the step). bfloat16 keeps float32's top 16 bits everywhere; float16 its top 13 of the
    mantissa where its values are normal (2^-14 and up); below, its steps are 2^-24 whatever
    the exponent, and the value is rounded by that step with the same probability.
    Each value's 16 random bits: a quarter of ``mix(salt * FIELD + column // 4)``."""
    n, d = values.shape
    cols = torch.arange(d, dtype=torch.int64, device=values.device)
    u = mix(salt.to(values.device)[:, None] * _FIELD + cols // 4)
    r = (u >> (16 * (cols % 4))) & 0xFFFF  # (n, D) 16 random bits
    bits = values.view(torch.int32).to(torch.int64)
    if dtype == torch.bfloat16:
        return ((bits + r) & ~0xFFFF).to(torch.int32).view(torch.float32).to(dtype)
    out = ((bits + (r & 0x1FFF)) & ~0x1FFF).to(torch.int32).view(torch.float32)
    tiny = values.abs() < 2.0 ** -14  # float16's subnormals: a fixed step of 2^-24
    if bool(tiny.any()):
        scaled = values[tiny].double() * 2.0 ** 24  # exact
        low = scaled.floor()
        unit = r[tiny].double() / 65536.0
        out[tiny] = ((low + (unit < scaled - low).double()) * 2.0 ** -24).float()
    return out.to(dtype)


def refuse(dtype: torch.dtype, value: float | None = None) -> None:
    """Raise the ValueError of a push refused for a row value (``value`` where known) that
    ``dtype`` cannot hold."""
    what = "a row value" if value is None else f"a row value {value:g}"
    raise ValueError(f"{what} does not fit {str(dtype).removeprefix('torch.')} (its largest is "
                     f"{torch.finfo(dtype).max:g}): the push is refused")
