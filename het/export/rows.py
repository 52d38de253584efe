"""How an export stores a table's rows: float32, float16, or int8 with a row-wise scale and bias.

- ``fp32``: the rows as trained.
- ``fp16``: half rows (2 bytes a value), rounded to nearest.
- ``int8``: FBGEMM's row-wise quantisation: each row's values as bytes ``q`` in 0..255 with the
  row's ``scale`` and ``bias`` in float16 beside them (``D + 4`` bytes a row, against ``4 D``),
  read back as ``q * scale + bias``. ``bias`` is the row's minimum and ``scale`` its range over
  255, both rounded to float16 first, then ``q`` is rounded to nearest against the rounded pair,
  so a value comes back within about ``scale / 2`` of where it was.

Rows are encoded a piece at a time; :func:`decode` turns gathered rows back into float32.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from het.choices import EXPORT_DTYPES

if TYPE_CHECKING:  # decode works on tensors through their methods: the command line loads no torch
    import torch

DTYPES = EXPORT_DTYPES  # of het.choices.Precision
STORED = {"fp32": np.float32, "fp16": np.float16, "int8": np.uint8}  # rows.npy's dtype


def encode(rows: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray | None]:
    """``rows`` as stored: ``(values, qparams)``, qparams (n, 2) float16 ``[scale, bias]`` for int8
    (None otherwise). Shape: (n, D) float32 -> (n, D), (n, 2).

    Example:
        >>> rows = np.array([[0.0, 1.0, 0.5], [2.0, 2.0, 2.0]], np.float32)
        >>> q, qp = encode(rows, "int8")
        >>> q.tolist(), qp.tolist()
        ([[0, 255, 128], [0, 0, 0]], [[0.0039215087890625, 0.0], [0.0, 2.0]])
        >>> import torch
        >>> decode(torch.from_numpy(q), torch.from_numpy(qp)).tolist()[1]
        [2.0, 2.0, 2.0]
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    if dtype == "fp32":
        return rows, None
    if dtype == "fp16":
        return rows.astype(np.float16), None
    lo, hi = rows.min(1, initial=np.inf), rows.max(1, initial=-np.inf)
    if len(rows) and not (np.isfinite(lo).all() and np.isfinite(hi).all()):
        raise ValueError("rows hold NaN or inf: they cannot be quantised")
    qparams = np.stack([(hi - lo) / 255.0, lo], 1).astype(np.float16)  # rounded first
    scale, bias = qparams[:, :1].astype(np.float32), qparams[:, 1:].astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(scale > 0, np.rint((rows - bias) / scale), 0.0)
    return np.clip(q, 0, 255).astype(np.uint8), qparams


def decode(values: torch.Tensor, qparams: torch.Tensor | None) -> torch.Tensor:
    """Gathered stored rows -> float32 rows. Shape: (n, D), (n, 2) -> (n, D)."""
    if qparams is None:
        return values.float()
    qp = qparams.float()
    return qp[:, 1:].addcmul(values.float(), qp[:, :1])


def row_bytes(dim: int, dtype: str) -> int:
    """Bytes one row takes in an export.

    Example:
        >>> [row_bytes(64, d) for d in DTYPES]
        [256, 128, 68]
    """
    return dim * np.dtype(STORED[dtype]).itemsize + (4 if dtype == "int8" else 0)
