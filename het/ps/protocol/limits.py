"""The bounds a request and a row keep, on both sides of the PS: keys in their table's range,
counts and clocks below their maxima, values finite. Each check has one wording, whichever side
runs it."""

from __future__ import annotations

import torch

from het import native
from het.config import TableConfig

MAX_STEP = 1 << 62   # a push's step number (Adam's bias correction)
MAX_COUNT = 1 << 31  # one key's updates in one push
MAX_CLOCK = 1 << 62  # a row's clock: pushes that would take it further are refused


def out_of_range(table: TableConfig, keys: torch.Tensor, allowed: int | None = None) -> str:
    """Why ``keys`` (int64) are not keys of ``table`` ('' when they are): a fixed table's keys
    lie in ``[0, rows)``, a dynamic table takes any int64. ``allowed``: one more key taken
    whatever the range (a pooled lookup's padding).

    Example:
        >>> t = TableConfig("user", rows=50, dim=4)
        >>> out_of_range(t, torch.tensor([3, 91]))
        "key 91 out of range for table 'user' with 50 rows"
        >>> out_of_range(t, torch.tensor([-1, 3]), allowed=-1), out_of_range(TableConfig("ids", rows=None, dim=4), torch.tensor([-7]))
        ('', '')
    """
    if table.rows is None or not keys.numel():
        return ""
    return bounds_out_of_range(table, *(int(k) for k in torch.aminmax(keys)), allowed)


def bounds_out_of_range(table: TableConfig, lo: int, hi: int, allowed: int | None = None) -> str:
    """:func:`out_of_range` of keys whose least is ``lo`` and greatest ``hi``."""
    if table.rows is None:
        return ""
    if lo < 0 and lo != allowed:
        return f"key {lo} out of range for table {table.name!r} with {table.rows} rows"
    if hi >= table.rows and hi != allowed:
        return f"key {hi} out of range for table {table.name!r} with {table.rows} rows"
    return ""


def check_finite(values: torch.Tensor, what: str, table: str) -> None:
    """ValueError unless every one of ``values`` (a table's gradients, say) is finite.

    Example:
        >>> check_finite(torch.tensor([1.0, float("nan")]), "grads", "user")
        Traceback (most recent call last):
        ...
        ValueError: grads for table 'user' hold NaN or inf: refused, nothing changed
    """
    if not all_finite(values):
        raise ValueError(non_finite(what, table))


def non_finite(what: str, table: str) -> str:
    """What a refusal of non-finite ``what`` (a table's gradients, say) says."""
    return f"{what} for table {table!r} hold NaN or inf: refused, nothing changed"


def refused_push(stats, table: str, grads_refused: bool, grads, e: ValueError) -> ValueError:
    """The error of a push its table refused with ``e``, nothing changed: its gradients named
    where they are not finite and the table refuses such (``grads_refused``), as a pass over
    them would; else the table's reason, counted in ``stats["refused_pushes"]``."""
    if grads_refused and not all_finite(torch.from_numpy(grads)):
        return ValueError(non_finite("grads", table))
    stats["refused_pushes"] += 1
    return ValueError(f"push to table {table!r} refused, nothing changed: {e}")


def check_squares(sq: torch.Tensor, table: str) -> None:
    """ValueError unless a push's sums of squared gradients are finite and >= 0."""
    if not all_finite(sq) or (sq.numel() and float(sq.min()) < 0):
        raise ValueError(f"sq (sums of squared gradients) for table {table!r} must be finite and >= 0: refused, "
                         f"nothing changed")


def all_finite(t: torch.Tensor) -> bool:
    """Whether every value is finite. A contiguous float32 tensor on the CPU: one native pass
    over the exponent bits (het.native). Else NaN and inf reach the sum, so a finite sum
    clears the tensor in one cheap pass (a full pass only when the sum overflowed)."""
    if native.ops is not None and t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous():
        return native.ops.all_finite(t)
    return bool(torch.isfinite(t.sum())) or bool(torch.isfinite(t).all())
