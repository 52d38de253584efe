"""Any label-encoded CTR data set with raw 64-bit keys instead: each (field, id) hashed.

:class:`HashedIds` wraps a data set whose keys are ``offsets[f] + id`` (synthetic Criteo,
prepared Criteo) and hands out ``hash_ids(f, id)`` instead: keys over the whole int64 range, as
production ids are, for a dynamic table (``num_rows`` is ``None``). The field-local id is
hashed, not the global key, so the same id of the same field has the same key whatever the other
fields' sizes. The hash is a bijection, so the planted model of synthetic data still reads the
original keys back (:meth:`HashedIds.unhash`).
"""

from __future__ import annotations

import numpy as np
import torch

from het.data.batch import Batch
from het.data.hashing import hash_fields, unhash_fields


class HashedIds:
    """A CTR data set's batches with every key hashed per field.

    Args:
        data: a data set with ``batch(split, index, size)``, ``offsets`` (F,), ``num_rows``,
            ``num_fields`` and ``num_dense``; and, if multi-hot, ``key_fields`` (L,) and
            ``bag_sizes`` (F,). Its ``planted_logits`` and ``rows``, if any, carry over.

    Attributes:
        num_rows: ``None``: any int64 key may come (a dynamic table).
        num_ids: the ids in the data (the wrapped data set's ``num_rows``): what sizes a cache.

    Example:
        >>> from het.data.synthetic import SyntheticCriteo, SyntheticCriteoConfig
        >>> plain = SyntheticCriteo(SyntheticCriteoConfig(cap=1000))
        >>> data = HashedIds(plain)
        >>> data.num_rows, data.num_ids, data.num_fields
        (None, 16727, 26)
        >>> b, raw = data.batch("train", 0, 4), plain.batch("train", 0, 4)
        >>> b.sparse.dtype, torch.equal(b.labels, raw.labels), bool((b.sparse < 0).any() or (b.sparse >= 2 ** 40).any())
        (torch.int64, True, True)
        >>> torch.equal(torch.from_numpy(data.unhash(b.sparse.numpy())), raw.sparse)
        True
    """

    def __init__(self, data):
        self.data = data
        self.num_fields, self.num_dense = data.num_fields, data.num_dense
        self.bag_sizes = tuple(getattr(data, "bag_sizes", (1,) * data.num_fields))
        self.key_fields = np.asarray(getattr(data, "key_fields", np.arange(data.num_fields)))  # (L,)
        self._offsets = np.asarray(data.offsets, dtype=np.int64)[self.key_fields]  # (L,)
        self.num_rows = None
        self.num_ids = int(data.num_rows)
        if hasattr(data, "rows"):  # held-out sizes of a prepared data set
            self.rows = data.rows
        if hasattr(data, "planted_logits"):
            self.planted_logits = self._planted_logits

    def batch(self, split: str, index: int, size: int) -> Batch:
        """The wrapped data set's batch, its keys hashed. Shape: sparse (size, L) int64."""
        b = self.data.batch(split, index, size)
        return Batch(b.dense, torch.from_numpy(self.hash(b.sparse.numpy())), b.labels)

    def hash(self, sparse: np.ndarray) -> np.ndarray:
        """Global keys -> hashed keys: ``hash_ids(f, key - offsets[f])``. Shape: (B, L) -> (B, L)."""
        return hash_fields(self.key_fields, np.asarray(sparse, dtype=np.int64) - self._offsets)

    def unhash(self, keys: np.ndarray) -> np.ndarray:
        """Hashed keys -> the global keys they came from. Shape: (B, L) -> (B, L) int64."""
        return unhash_fields(self.key_fields, np.asarray(keys, dtype=np.int64)) + self._offsets

    def _planted_logits(self, sparse, dense) -> np.ndarray:
        """The wrapped data set's planted logits of hashed keys. Shape: (B, L), (B, 13) -> (B,)."""
        return self.data.planted_logits(self.unhash(np.asarray(sparse)), dense)
