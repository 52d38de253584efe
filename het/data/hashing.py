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
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
# The multipliers are odd, so invertible mod 2**64: splitmix64 is a bijection of uint64.
_M1_INV, _M2_INV = (np.uint64(pow(m, -1, 2 ** 64)) for m in (_M1, _M2))


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser, elementwise on uint64 (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * np.uint64(_M1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(_M2)
        return z ^ (z >> np.uint64(31))


def unsplitmix64(z: np.ndarray) -> np.ndarray:
    """The inverse of :func:`splitmix64`, elementwise on uint64.

    Example:
        >>> x = np.array([0, 1, 2 ** 64 - 1], dtype=np.uint64)
        >>> bool((unsplitmix64(splitmix64(x)) == x).all())
        True
    """
    with np.errstate(over="ignore"):
        z = _unshift(z, 31) * _M2_INV
        z = _unshift(z, 27) * _M1_INV
        return _unshift(z, 30) - _GOLDEN


def _unshift(y: np.ndarray, shift: int) -> np.ndarray:
    """The x with ``x ^ (x >> shift) == y``: each pass fixes ``shift`` more high bits."""
    x = y
    for _ in range(64 // shift):
        x = y ^ (x >> np.uint64(shift))
    return x


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


def hash_fields(fields: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """:func:`hash_ids` of every column of ``ids`` at once, column ``j`` as field ``fields[j]``
    (several columns may share a field: a multi-hot field's bag).

    Shape:
        fields (L,) ints >= 0, ids (B, L) -> (B, L) int64.

    Example:
        >>> ids = np.array([[5, 9, 9], [7, 5, 1]])
        >>> keys = hash_fields(np.array([0, 2, 2]), ids)
        >>> bool((keys[:, 1] == hash_ids(2, ids[:, 1])).all()), bool((keys[:, 0] == hash_ids(0, ids[:, 0])).all())
        (True, True)
    """
    ids = np.asarray(ids)
    if ids.dtype.kind not in "iu":
        raise ValueError(f"ids must be integers, got {ids.dtype}")
    salts = _salts(fields, ids.shape[-1])
    with np.errstate(over="ignore"):
        return splitmix64(ids.astype(np.uint64) ^ salts).view(np.int64)


def unhash_fields(fields: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """The ids whose :func:`hash_fields` are ``keys`` (splitmix64 is a bijection): exact, for
    any int64 keys. Shape: fields (L,), keys (B, L) -> (B, L) int64.

    Example:
        >>> ids = np.array([[5, -3, 2 ** 62]])
        >>> unhash_fields(np.array([0, 1, 1]), hash_fields(np.array([0, 1, 1]), ids)).tolist()
        [[5, -3, 4611686018427387904]]
    """
    keys = np.asarray(keys)
    if keys.dtype != np.int64:
        raise ValueError(f"keys must be int64, got {keys.dtype}")
    return (unsplitmix64(keys.view(np.uint64)) ^ _salts(fields, keys.shape[-1])).view(np.int64)


def _salts(fields: np.ndarray, columns: int) -> np.ndarray:
    """splitmix64 of each column's field salt. Shape: (L,) -> (L,) uint64."""
    fields = np.asarray(fields)
    if fields.shape != (columns,):
        raise ValueError(f"fields: expected one field per column, shape ({columns},), got {fields.shape}")
    return splitmix64(np.array([field_salt(int(f)) for f in fields], dtype=np.uint64))  # L columns, not keys


_STRING_SEED = np.uint64(0x5851F42D4C957F2D)  # keeps a string's id apart from an integer id


def string_ids(words: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """64-bit ids of byte strings given as zero-padded little-endian 8-byte words: the length,
    then each word the string reaches, folded through splitmix64. A string's id does not
    depend on the padding width, so any chunk of values gives it the same id.

    Shape:
        words (n, W) uint64, lengths (n,) -> (n,) uint64.
    """
    h = splitmix64(lengths.astype(np.uint64) ^ _STRING_SEED)
    for j in range(words.shape[1]):  # a loop over word positions (W), never over values
        with np.errstate(over="ignore"):
            h = np.where(lengths > 8 * j, splitmix64(h ^ words[:, j]), h)
    return h


def hash_strings(field: int | str, data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The int64 keys of byte strings of ``field``: ``hash_ids(field, string_ids(...))``.
    String ``i`` is ``data[offsets[i]:offsets[i + 1]]`` (Arrow's layout); the empty string is
    the field's missing value.

    Shape:
        data (bytes,) uint8, offsets (n + 1,) -> (n,) int64.

    Example:
        >>> data = np.frombuffer(b"abcdef01abcdef01x", dtype=np.uint8)
        >>> k = hash_strings("C1", data, np.array([0, 8, 16, 17, 17]))
        >>> bool(k[0] == k[1]), bool(k[0] == k[2]), bool(k[3] == hash_strings("C1", data[:0], [0, 0])[0])
        (True, False, True)
    """
    data, offsets = np.asarray(data, dtype=np.uint8), np.asarray(offsets, dtype=np.int64)
    starts, lengths = offsets[:-1], np.diff(offsets)
    if len(lengths) and lengths.min() < 0:
        raise ValueError(f"offsets must not decrease, got {offsets[:5].tolist()}...")
    width = -(-int(lengths.max(initial=0)) // 8)
    padded = np.concatenate([data, np.zeros(8 * width + 8, np.uint8)])
    view = np.ndarray((len(padded) - 7,), dtype=np.uint64, buffer=padded, strides=(1,))  # word at any byte
    words = view[starts[:, None] + 8 * np.arange(width)]  # (n, width), bytes past a string's end kept
    keep = np.clip(lengths[:, None] - 8 * np.arange(width), 0, 8).astype(np.uint64)  # bytes of each word
    with np.errstate(over="ignore"):
        mask = np.where(keep == 8, ~np.uint64(0), (np.uint64(1) << (np.uint64(8) * keep)) - np.uint64(1))
    return hash_ids(field, string_ids(words & mask, lengths))
