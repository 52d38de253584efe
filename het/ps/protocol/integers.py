"""How integer arrays travel: in the narrowest of uint8, int16, int32 and int64 that holds
them (clocks, counts, a sync reply's index), and ascending keys as the steps between them. A
receiver widens them back, and refuses anything else.
"""

from __future__ import annotations

import functools

import numpy as np

_INTS = {"u1": np.dtype("u1"), "i2": np.dtype("<i2"), "i4": np.dtype("<i4"), "i8": np.dtype("<i8")}
WIRE_INTS = tuple(_INTS.values())  # what integers travel as, and are widened from
_DELTA_INTS = WIRE_INTS[:3]  # the steps between ascending keys travel in at most 4 bytes


# Integer arrays travel in the narrowest of these that holds every value (:func:`narrow`)
_NARROW = ((0, (1 << 8) - 1, "u1"), (-(1 << 15), (1 << 15) - 1, "i2"), (-(1 << 31), (1 << 31) - 1, "i4"))


def narrow(values):
    """Integers (a torch tensor or numpy array) as the narrowest of uint8, int16 and int32 that
    holds every one of them, else as int64: how clocks, counts and a sync reply's index
    travel. A hot row's clock passes 32,767 only after that many updates, and a push's count
    is the steps its gradient sums, so most of these take one or two bytes, not eight.

    Example:
        >>> [narrow(np.array(v)).dtype.name for v in ([0, 5], [-1, 5], [-1, 1 << 20], [1 << 40])]
        ['uint8', 'int16', 'int32', 'int64']
    """
    if isinstance(values, np.ndarray):
        lo, hi = (0, 0) if len(values) == 0 else (int(values.min()), int(values.max()))
        return values.astype(_INTS[_narrowest(lo, hi)], copy=False)
    ops = _native().ops
    if values.dtype == _torch_ints()["i8"] and values.device.type == "cpu" and values.dim() == 1 and ops:
        return ops.narrow_ints(values.contiguous(), 0)[0]  # one pass, min, max and copy
    lo, hi = (0, 0) if len(values) == 0 else map(int, values.aminmax())  # one pass, where numpy takes two
    return values.to(_torch_ints()[_narrowest(lo, hi)])


@functools.cache
def _native():
    """The module of het's native core (imported on first use, as torch is): its ``ops``, or None."""
    from het import native

    return native


def _narrowest(lo: int, hi: int) -> str:
    """The code of the narrowest wire integer that holds ``lo .. hi``."""
    for a, b, code in _NARROW:
        if a <= lo and hi <= b:
            return code
    return "i8"


@functools.cache
def _torch_ints() -> dict:
    """The wire integers' codes -> torch dtypes (torch imported on first use: the protocol
    itself needs only numpy). A dict lookup: numpy's ``dtype.name`` costs microseconds a call."""
    import torch

    return {"u1": torch.uint8, "i2": torch.int16, "i4": torch.int32, "i8": torch.int64}


def widen(values: np.ndarray, what: str) -> np.ndarray:
    """A received integer array of any :data:`WIRE_INTS` type as int64; ValueError naming
    ``what`` for any other dtype.

    Example:
        >>> widen(np.array([3], dtype=np.uint8), "counts").dtype
        dtype('int64')
    """
    if values.dtype not in WIRE_INTS:
        raise ValueError(f"{what} must be integers ({', '.join(t.name for t in WIRE_INTS)}), got {values.dtype}")
    return values.astype(np.int64, copy=False)


def delta_keys(keys: np.ndarray):
    """Strictly ascending keys (int32 or int64, as they would travel) as the steps between
    them, narrowed, and the first key: ``(steps (n,), first)`` with ``steps[0] = 0``, or None
    where that would not take fewer bytes (keys out of order, fewer than two, long steps). A
    step's unique keys come sorted, so a sync's keys mostly go as one or two bytes each.

    Example:
        >>> steps, first = delta_keys(np.array([1000, 1003, 1300], np.int32))
        >>> steps.tolist(), steps.dtype, first
        ([0, 3, 297], dtype('int16'), 1000)
        >>> delta_keys(np.array([5, 3], np.int32)) is None
        True
    """
    # compared as they are: no difference wraps; keys in no order mostly fail on their first two
    if len(keys) < 2 or keys[1] <= keys[0] or not bool((keys[1:] > keys[:-1]).all()):
        return None
    steps = np.diff(keys.astype(np.int64, copy=False), prepend=keys[:1])
    if int(steps[1:].min()) < 1:  # a step past 2^63 wrapped: send the keys as they are
        return None
    steps = narrow(steps)
    return None if steps.itemsize >= keys.itemsize else (steps, int(keys[0]))


def undelta_keys(steps: np.ndarray, first, max_keys: int) -> np.ndarray:
    """The int64 keys that :func:`delta_keys` sent as ``steps`` from ``first``; ValueError when
    they are not such steps (integers of at most 4 bytes, 0 first, then each >= 1) or the
    keys would leave int64."""
    if steps.dtype not in _DELTA_INTS or steps.ndim != 1 or not 1 <= len(steps) <= min(max_keys, (1 << 32) - 1):
        raise ValueError(f"delta-coded keys travel as a 1-D array of 1 to {max_keys} integers of at most 4 bytes, "
                         f"got {steps.dtype} of shape {steps.shape}")
    if not isinstance(first, int) or isinstance(first, bool) or not -(1 << 63) <= first < (1 << 63):
        raise ValueError(f"the first of delta-coded keys must be an int64, got {first!r}")
    wide = steps.astype(np.int64)
    if wide[0] != 0 or (len(wide) > 1 and int(wide[1:].min()) < 1):
        raise ValueError("delta-coded keys must step up: 0 first, then steps of at least 1")
    if first + int(wide.sum()) >= (1 << 63):  # under 2^31 a step and 2^32 steps: the sum fits int64
        raise ValueError(f"delta-coded keys from {first} pass the largest int64")
    return np.cumsum(wide, out=wide) + np.int64(first)
