"""Raw ids to 64-bit keys: each (field, id) hashed to one int64, with no vocabulary.

A hashed key needs no pass over the data set and no table of ids: any id, seen before or
not, has its key. The keys feed a dynamic table (``TableConfig(rows=None)``), which stores only
the rows training touched. Two ids collide with probability about ``n^2 / 2^65`` (n distinct
ids: about 0.03 colliding pairs among 10^9 ids).
"""

from __future__ import annotations

import zlib

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser, elementwise on uint64 (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def field_salt(field: int | str) -> np.uint64:
    """A field's 64-bit salt: of its position (an int) or of its name (a str)."""
    if isinstance(field, str):
        return np.uint64(zlib.crc32(field.encode()) | (1 << 40))
    if isinstance(field, (int, np.integer)) and not isinstance(field, bool) and field >= 0:
        return np.uint64(int(field))
    raise ValueError(f"field: expected an int >= 0 or a column name, got {field!r}")


def hash_ids(field: int | str, ids: np.ndarray) -> np.ndarray:
    """The int64 keys of integer ``ids`` of ``field``: ``splitmix64(splitmix64(salt) ^ id)``.
    Any int64 or uint64 ids; the result spans the whole int64 range (negative keys too).

    Example:
        >>> a = hash_ids(0, np.array([1, 2, 1]))
        >>> a.dtype, bool(a[0] == a[2]), bool(a[0] == hash_ids(1, np.array([1]))[0])
        (dtype('int64'), True, False)
    """
    ids = np.asarray(ids)
    if ids.dtype.kind not in "iu":
        raise ValueError(f"ids must be integers, got {ids.dtype}")
    salt = splitmix64(np.array([field_salt(field)], dtype=np.uint64))[0]
    with np.errstate(over="ignore"):
        return splitmix64(ids.astype(np.uint64) ^ salt).view(np.int64)
