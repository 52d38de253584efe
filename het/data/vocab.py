"""Sparse columns' vocabularies, fitted on the training split: an id seen at least ``min_freq``
times in the training rows keeps its own key; every other id (rarer there, seen only in the test
split, or first met in serving) shares its column's out-of-vocabulary key, one row trained on
all the rare ids instead of many rows trained on almost nothing.

The vocabulary is kept as the sorted keys it holds (``vocab.npy`` beside the prepared arrays,
``input/vocab.npy`` in an export) and one function applies it, :func:`apply_vocab`, in the
prepared arrays, ``het predict``, ``het.load_model`` and ``het serve-model`` alike. A column's
out-of-vocabulary key is the hash of a text no file holds (:data:`OOV_TEXT`) with its name, as
any of its values is hashed; a multi-hot bag's empty slots (:data:`het.data.multi.PAD`) stay
empty. With ``min_freq`` 1 there is no vocabulary: every id is hashed to its own key, unseen ones
too (the table makes their rows on first touch).
"""

from __future__ import annotations

import numpy as np
from het.data.hashing import hash_strings
from het.data.multi import PAD

OOV_TEXT = "\x00het: out of vocabulary"  # a NUL first: no CSV, TSV or Parquet text value reads as it


class KeyCounter:
    """Occurrences of every key, as sorted ``(keys, counts)``; merges are batched, so the cost is
    amortised O(distinct keys log) a block of rows instead of O(vocabulary). Memory: 16 bytes a
    distinct key.

    Example:
        >>> c = KeyCounter()
        >>> c.add(np.array([5, -3, 5])); c.add(np.array([7, 5])); c.merge()
        >>> c.keys.tolist(), c.counts.tolist()
        ([-3, 5, 7], [1, 3, 1])
    """

    def __init__(self):
        self.keys, self.counts = np.zeros(0, np.int64), np.zeros(0, np.int64)
        self._pending, self._pending_size = [], 0

    def add(self, keys: np.ndarray) -> None:
        """Count each key of ``keys`` (any shape, int64) once more."""
        uniq, counts = np.unique(np.asarray(keys, np.int64).reshape(-1), return_counts=True)
        self._pending.append((uniq, counts))
        self._pending_size += len(uniq)
        if self._pending_size > max(len(self.keys), 1 << 20):
            self.merge()

    def merge(self) -> None:
        """Fold the pending blocks into ``keys`` and ``counts``."""
        keys = np.concatenate([self.keys, *(k for k, _ in self._pending)])
        counts = np.concatenate([self.counts, *(c for _, c in self._pending)])
        if len(keys):
            order = np.argsort(keys, kind="stable")
            keys, counts = keys[order], counts[order]
            first = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))
            keys, counts = keys[first], np.add.reduceat(counts, first)
        self.keys, self.counts = keys, counts
        self._pending, self._pending_size = [], 0

    def at_least(self, min_freq: int) -> np.ndarray:
        """The keys counted at least ``min_freq`` times, sorted."""
        self.merge()
        return self.keys[self.counts >= min_freq]


def oov_keys(columns: list[str]) -> np.ndarray:
    """Each column's out-of-vocabulary key. Shape: (F,) int64.

    Example:
        >>> a, b = oov_keys(["city", "shop"]); bool(a != b)
        True
    """
    text = np.frombuffer(OOV_TEXT.encode(), np.uint8)
    return np.array([hash_strings(c, text, np.array([0, len(text)]))[0] for c in columns], np.int64)


def apply_vocab(keys: np.ndarray, vocab: np.ndarray, oov: np.ndarray) -> np.ndarray:
    """Keys outside the sorted ``vocab`` -> their slot's out-of-vocabulary key; PAD kept.

    Shape:
        keys (n, L) int64, vocab (V,) sorted int64, oov (L,) int64 (each slot's column's key) -> (n, L).

    Example:
        >>> apply_vocab(np.array([[1, 9], [PAD, 3]]), np.array([1, 3]), np.array([-1, -2])).tolist()
        [[1, -2], [-9223372036854775808, 3]]
    """
    keys = np.asarray(keys, np.int64)
    if len(vocab) == 0:
        known = np.zeros(keys.shape, bool)
    else:
        at = np.minimum(np.searchsorted(vocab, keys), len(vocab) - 1)
        known = vocab[at] == keys
    return np.where(known | (keys == PAD), keys, np.broadcast_to(oov, keys.shape))
