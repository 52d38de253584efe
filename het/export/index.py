"""A dynamic table's keys in an export: where each stored key's row is, from two arrays that
map from disk as they are.

- ``hashes`` (n,) uint64: ``splitmix64(key)`` of every stored key, ascending. splitmix64 is a
  bijection of 64-bit words, so a hash names its key and no two keys share one. An export's rows
  are stored in this order: the row of the key whose hash is ``hashes[p]`` is row ``p``.
- ``directory`` (2^bits + 1,) uint32 or int64: where each bucket of hashes starts, a bucket
  being the hashes' top ``bits`` bits. Hashes spread evenly, so a bucket holds a few (about
  :data:`BUCKET` on average) and a lookup reads one directory entry and searches a few
  neighbouring hashes, whatever the table's size: a cold lookup in a memory-mapped export
  touches two pages, where a binary search over every hash touches about ``log2(n)``.

It costs about ``8 + 4 / BUCKET`` bytes a key (9 with buckets of 4), against 16 for an open-
addressing table of keys and row numbers at half load. docs/RESULTS.md measures it beside a
binary search over the sorted keys and a Python dict.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from het import native
from het.data.hashing import splitmix64

BUCKET = 4  # hashes per bucket on average


def key_hashes(keys: np.ndarray) -> np.ndarray:
    """``splitmix64`` of int64 keys. Shape: (n,) -> (n,) uint64.

    Example:
        >>> key_hashes(np.array([0, 1, -1])).dtype
        dtype('uint64')
    """
    return splitmix64(np.ascontiguousarray(keys, dtype=np.int64).view(np.uint64))


def build(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The index of distinct ``keys``: ``(hashes, directory, order)``, ``order`` saying which key
    goes to each row (row ``p`` holds ``keys[order[p]]``). Memory: about 24 bytes a key.

    Example:
        >>> hashes, directory, order = build(np.array([10, -3, 7]))
        >>> HashIndex(hashes, directory).lookup(np.array([7, 8, 10, -3])).tolist() == [
        ...     int(np.flatnonzero(order == 2)[0]), -1, int(np.flatnonzero(order == 0)[0]),
        ...     int(np.flatnonzero(order == 1)[0])]
        True
    """
    hashes = key_hashes(keys)
    order = np.argsort(hashes, kind="stable")
    hashes = hashes[order]
    if len(hashes) > 1 and bool((hashes[1:] == hashes[:-1]).any()):
        raise ValueError("keys must be distinct: a dynamic table stores each key once")
    bits = max(0, int(np.floor(np.log2(max(1, len(hashes)) / BUCKET))))
    starts = np.searchsorted(hashes, _bucket_starts(bits), side="left")
    dtype = np.uint32 if len(hashes) < 2 ** 32 else np.int64
    directory = np.append(starts, len(hashes)).astype(dtype)
    return hashes, directory, order


def _bucket_starts(bits: int) -> np.ndarray:
    """The smallest hash of each of the 2^bits buckets. Shape: (2^bits,) uint64."""
    return np.arange(2 ** bits, dtype=np.uint64) << np.uint64(64 - bits) if bits else np.zeros(1, np.uint64)


class HashIndex:
    """Lookups in an index :func:`build` made (arrays in memory or memory-mapped).

    Args:
        hashes: (n,) uint64, ascending.
        directory: (2^bits + 1,) bucket starts, then ``n``.

    Example:
        >>> hashes, directory, order = build(np.arange(100, 200))
        >>> index = HashIndex(hashes, directory)
        >>> pos = index.lookup(np.array([150, 99, 100]))
        >>> int(order[pos[0]]), int(pos[1]), int(order[pos[2]])
        (50, -1, 0)
    """

    def __init__(self, hashes: np.ndarray, directory: np.ndarray, use_native: bool = True):
        if hashes.dtype != np.uint64 or hashes.ndim != 1:
            raise ValueError(f"hashes must be a 1-D uint64 array, got {hashes.dtype} {hashes.shape}")
        buckets = len(directory) - 1
        if buckets < 1 or buckets & (buckets - 1) or int(directory[-1]) != len(hashes):
            raise ValueError(f"directory must hold 2^bits + 1 entries ending at {len(hashes)} (the hashes), "
                             f"got {len(directory)} ending at {int(directory[-1]) if len(directory) else None}")
        self.hashes, self.directory = hashes, directory
        self.bits = buckets.bit_length() - 1
        widest = int(np.diff(directory.astype(np.int64)).max(initial=0))
        self.steps = max(1, widest).bit_length()  # binary search steps in the widest bucket
        self._native = None
        if use_native and native.ops is not None:  # the same lookups in one C++ pass (het/native/index.cpp)
            with warnings.catch_warnings():  # a read-only map: only read
                warnings.simplefilter("ignore", UserWarning)
                wide = directory.view(np.int32) if directory.dtype == np.uint32 else directory.astype(np.int64)
                self._native = (torch.from_numpy(hashes.view(np.int64)), torch.from_numpy(wide))

    def __len__(self) -> int:
        return len(self.hashes)

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """The row of each key, -1 for a key not stored. Shape: (m,) -> (m,) int64."""
        if self._native is not None:
            keys = torch.from_numpy(np.ascontiguousarray(keys, dtype=np.int64))
            return native.ops.index_lookup(*self._native, self.bits, keys).numpy()
        return self.lookup_reference(keys)

    def lookup_reference(self, keys: np.ndarray) -> np.ndarray:
        """:meth:`lookup` in NumPy: every key at once, a binary search of its bucket."""
        h = key_hashes(keys)
        n = len(self.hashes)
        if n == 0:
            return np.full(len(h), -1, np.int64)
        bucket = (h >> np.uint64(64 - self.bits)).astype(np.int64) if self.bits else np.zeros(len(h), np.int64)
        lo = self.directory[bucket].astype(np.int64)
        hi = self.directory[bucket + 1].astype(np.int64)
        for _ in range(self.steps):  # lower bound of h in [lo, hi), every key at once
            mid = (lo + hi) >> 1
            less = self.hashes[np.minimum(mid, n - 1)] < h
            active = lo < hi
            lo = np.where(active & less, mid + 1, lo)
            hi = np.where(active & ~less, mid, hi)
        found = self.hashes[np.minimum(lo, n - 1)] == h
        found &= lo < n
        return np.where(found, lo, -1)
