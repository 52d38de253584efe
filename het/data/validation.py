"""A prepared table's training split, cut in two: rows for training, reshuffled every epoch, and
a validation split kept apart by a hash of the row (:func:`het.data.prepared.split_is_test`
with a salt of its own, so the same seed never picks the test split's rows again).

Training reads its split epoch after epoch, each in a fresh order drawn from ``(seed, epoch)``:
batch ``i`` of ``k`` samples holds samples ``i * k .. (i + 1) * k - 1`` of that endless
stream, so a step's batch is a function of the step, as checkpoints and rejoins need. The
validation and test splits are read in order.
"""

from __future__ import annotations

import numpy as np

from het.data.batch import Batch
from het.data.prepared import split_is_test

VALIDATION_SALT = 0x76616C  # "val": the validation split's hash differs from the test split's


class ValidatedTable:
    """``data`` (a :class:`het.data.prepared.PreparedDataset`) with splits ``train``, ``val``
    and ``test``; every other attribute is ``data``'s. The validation rows are a function of
    ``split_seed`` (default: the seed the data was prepared with, as its test rows are), so
    jobs of every ``seed`` (the training order's) validate on the same rows.

    Example:
        >>> import tempfile
        >>> from het.data.prepared import HASHED_FORMAT, HASHED_VERSION, PreparedDataset, SplitWriter
        >>> d = tempfile.mkdtemp()
        >>> w = SplitWriter(d, num_dense=1, num_fields=1)
        >>> w.add(np.arange(110.0)[:, None], np.arange(110)[:, None], np.zeros(110), np.arange(110) >= 100)
        >>> _ = w.close()
        >>> w.write_meta({"format": HASHED_FORMAT, "version": HASHED_VERSION, "num_rows": None, "num_ids": 110,
        ...               "num_dense": 1, "num_fields": 1, "train_rows": 100, "test_rows": 10})
        >>> data = ValidatedTable(PreparedDataset(d), frac=0.2, seed=0)
        >>> data.rows["train"] + data.rows["val"], data.rows["test"]
        (100, 10)
        >>> epoch = data.batch("train", 0, data.rows["train"]).sparse.flatten()
        >>> sorted(epoch.tolist()) == sorted(set(range(100)) - set(data.batch("val", 0, data.rows["val"]).sparse.flatten().tolist()))
        True
    """

    def __init__(self, data, frac: float, seed: int, split_seed: int | None = None):
        self.data, self.seed = data, seed
        n = data.rows["train"]
        split_seed = int(getattr(data, "meta", {}).get("seed", 0) or 0) if split_seed is None else split_seed
        is_val = split_is_test(np.arange(n), split_seed ^ VALIDATION_SALT, frac) if frac > 0 else np.zeros(n, bool)
        self.train_rows, self.val_rows = np.flatnonzero(~is_val), np.flatnonzero(is_val)
        self.rows = {"train": len(self.train_rows), "val": len(self.val_rows), "test": data.rows["test"]}
        self._orders: dict[int, np.ndarray] = {}

    def __getattr__(self, name):
        return getattr(self.data, name)

    def _order(self, epoch: int) -> np.ndarray:
        """The training rows in epoch ``epoch``'s order (the last two epochs' kept)."""
        if epoch not in self._orders:
            rng = np.random.default_rng((self.seed, VALIDATION_SALT, epoch))
            self._orders = {e: o for e, o in self._orders.items() if e == epoch - 1}
            self._orders[epoch] = self.train_rows[rng.permutation(len(self.train_rows))]
        return self._orders[epoch]

    def batch(self, split: str, index: int, size: int) -> Batch:
        """Batch ``index`` of ``size`` samples of ``split`` (see the module docstring).

        Shape: dense (size, D) float32, sparse (size, F) int64, labels (size,) float32."""
        if split == "test":
            return self.data.batch(split, index, size)
        if split not in self.rows:
            raise ValueError(f"split must be one of {tuple(self.rows)}, got {split!r}")
        n = self.rows[split]
        if n == 0:
            raise ValueError(f"split {split!r} has no rows ({self.data.rows['train']} training rows, of which "
                             f"{len(self.val_rows)} validate)")
        position = index * size + np.arange(size)
        if split == "val":
            rows = self.val_rows[position % n]
        else:
            epochs, at = np.divmod(position, n)
            rows = np.empty(size, np.int64)
            for epoch in np.unique(epochs):
                mine = epochs == epoch
                rows[mine] = self._order(int(epoch))[at[mine]]
        return self.data.take("train", rows)

