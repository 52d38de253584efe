"""Dense columns made ids: quantile buckets fitted on the training split.

A bucketed column's boundaries are the quantiles ``1/N .. (N-1)/N`` of its training values
(ties merged: a column that is mostly zeros gets fewer buckets), taken from a uniform sample of
at most :data:`SAMPLE_ROWS` training rows, the same rows on every run. A value ``x`` falls in
bucket ``i``, the number of boundaries at or below it (``x`` as float32, as a prepared array
holds it); bucket ``i``'s key is the text ``str(i)`` hashed with the column's name, as a sparse
value is hashed, and a missing value is the column's missing key (the empty string). Values
beyond the training range fall in the first or the last bucket. One function,
:func:`bucket_keys`, makes the keys in the prepared arrays, ``het predict``, ``het.load_model``
and ``het serve-model``.

A bucket is a row of its own: the model learns any shape of the column's effect instead of the
one line a dense input gives (Wide & Deep's bucketised age), at the cost of the order between
neighbouring buckets, which it must learn from the data.
"""

from __future__ import annotations

import numpy as np

from het.data.hashing import hash_strings, splitmix64

SAMPLE_ROWS = 1 << 17  # rows kept for the quantiles: exact up to here, about 0.3% of a rank beyond


class QuantileSample:
    """A uniform sample of at most ``k`` rows of raw dense values (NaN where missing): the rows
    whose re-mixed row numbers are smallest, so the sample does not depend on how the rows were
    cut into blocks.

    Example:
        >>> s = QuantileSample(1, k=3)
        >>> s.add(np.array([[1.0], [2.0]]), np.array([0, 1])); s.add(np.array([[3.0], [4.0]]), np.array([2, 3]))
        >>> len(s.values), sorted(s.values[:, 0].tolist())[:1] in ([1.0], [2.0])
        (3, True)
    """

    def __init__(self, width: int, k: int = SAMPLE_ROWS):
        self.k = k
        self.values = np.zeros((0, width), np.float32)
        self.priority = np.zeros(0, np.uint64)

    def add(self, values: np.ndarray, rows: np.ndarray) -> None:
        """Rows of raw values and their row numbers in the file. Shape: (n, D), (n,)."""
        priority = np.concatenate([self.priority, splitmix64(np.asarray(rows, np.int64).view(np.uint64))])
        values = np.concatenate([self.values, np.asarray(values, np.float32)])
        if len(priority) > self.k:
            keep = np.argpartition(priority, self.k - 1)[:self.k]
            priority, values = priority[keep], values[keep]
        self.priority, self.values = priority, values

    def fit(self, names: list[str], buckets: int) -> list[dict]:
        """Each column's boundaries (see the module docstring); ``names`` label the sample's columns."""
        if not isinstance(buckets, int) or isinstance(buckets, bool) or not 2 <= buckets <= 1000:
            raise ValueError(f"buckets must be an int in [2, 1000], got {buckets!r}")
        out = []
        for j, name in enumerate(names):
            x = self.values[:, j].astype(np.float64)
            x = x[~np.isnan(x)]
            edges = np.unique(np.quantile(x, np.arange(1, buckets) / buckets, method="inverted_cdf")) \
                if len(x) else np.zeros(0)
            out.append({"column": name, "kind": "bucket", "buckets": len(edges) + 1, "count": int(len(x)),
                        "boundaries": [float(b) for b in edges]})
        return out


def bucket_keys(x: np.ndarray, missing: np.ndarray, t: dict) -> np.ndarray:
    """A column's raw values -> its bucket keys under the fitted bucketing ``t``.

    Shape:
        (n,) float, (n,) bool -> (n,) int64.

    Example:
        >>> t = {"column": "age", "boundaries": [30.0, 50.0]}
        >>> k = bucket_keys(np.array([18.0, 30.0, 99.0, 0.0, 40.0]), np.array([0, 0, 0, 1, 0], bool), t)
        >>> [int(np.flatnonzero(keys_of(t) == v)[0]) for v in k]  # buckets 0..2, then missing
        [0, 1, 2, 3, 1]
    """
    v = np.asarray(x, np.float32).astype(np.float64)
    index = np.searchsorted(np.asarray(t["boundaries"], np.float64), v, side="right")
    return keys_of(t)[np.where(missing, len(t["boundaries"]) + 1, index)]


def keys_of(t: dict) -> np.ndarray:
    """Every key of a bucketed column: bucket 0, 1, ..., then missing. Shape: (buckets + 1,) int64."""
    texts = [str(i).encode() for i in range(len(t["boundaries"]) + 1)] + [b""]
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in texts])])
    return hash_strings(t["column"], np.frombuffer(b"".join(texts), np.uint8), offsets)
