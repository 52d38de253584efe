"""What ``het data prepare table`` fits on the training rows during its pass, and the one rewrite
of the arrays that applies it after the pass: dense transforms (:mod:`het.data.transforms`),
quantile buckets (:mod:`het.data.buckets`) and sparse vocabularies (:mod:`het.data.vocab`).

During the pass the dense columns are written raw (NaN where missing) and the sparse ones hashed;
the test rows are written too but never looked at. After it, each split's arrays are rewritten
in blocks: the kept dense columns transformed, the sparse keys mapped through the vocabulary, and
the bucketed columns' keys appended as sparse fields after the others.
"""

from __future__ import annotations

import os

import numpy as np

from het.data.buckets import QuantileSample, bucket_keys
from het.data.multi import PAD
from het.data.prepared import SPLITS
from het.data.transforms import DenseStats, apply_all
from het.data.vocab import KeyCounter, apply_vocab, oov_keys

_BLOCK = 1 << 16  # rows rewritten at a time


class Fitter:
    """Statistics of the training rows a table's spec needs (``spec``: a
    :class:`het.data.table.TableSpec`), gathered block by block."""

    def __init__(self, spec):
        self.spec = spec
        self.dense = DenseStats(len(spec.dense))
        self.sample = QuantileSample(len(spec.dense)) if spec.bucket else None
        self.counter = KeyCounter() if spec.min_freq > 1 else None

    def add(self, dense: np.ndarray, sparse: np.ndarray, rows: np.ndarray) -> None:
        """Training rows: raw dense values (NaN where missing), hashed keys, row numbers."""
        if self.spec.fitted:
            self.dense.add(dense)
        if self.sample is not None:
            self.sample.add(dense, rows)
        if self.counter is not None:
            self.counter.add(sparse[sparse != PAD])

    def fit(self) -> dict:
        """What the arrays' rewrite applies, as ``meta.json`` keeps it: ``dense_transforms`` (the
        kept dense columns'), ``buckets`` and ``vocabulary`` (its keys beside, as ``keys``)."""
        spec = self.spec
        kept = [j for j, c in enumerate(spec.dense) if c not in spec.bucket]
        out = {"dense_transforms": None, "buckets": None, "vocabulary": None}
        if spec.fitted and kept:
            kind = "none" if spec.dense_transform == "bucket" else spec.dense_transform
            fitted = self.dense.fit(list(spec.dense), kind)
            out["dense_transforms"] = [fitted[j] for j in kept]
        if self.sample is not None:
            out["buckets"] = self.sample.fit(list(spec.dense), spec.buckets)
            out["buckets"] = [t for t in out["buckets"] if t["column"] in spec.bucket]
        if self.counter is not None:
            keys = self.counter.at_least(spec.min_freq)
            out["vocabulary"] = {"file": "vocab.npy", "min_freq": spec.min_freq, "ids": int(len(keys)),
                                 "oov": dict(zip(spec.sparse, oov_keys(list(spec.sparse)).tolist())), "keys": keys}
        return out


def rewrite(directory: str, spec, fitted: dict) -> None:
    """Each split's arrays made what the model reads: see the module docstring. Arrays whose
    shape stays are rewritten in place; the others are written anew beside and put in place."""
    transforms, buckets, vocab = fitted["dense_transforms"], fitted["buckets"] or [], fitted["vocabulary"]
    kept = [j for j, c in enumerate(spec.dense) if c not in spec.bucket]
    at = {c: j for j, c in enumerate(spec.dense)}
    oov = np.repeat(np.array(list(vocab["oov"].values()), np.int64), spec.bag_sizes) if vocab else None
    if vocab:
        np.save(os.path.join(directory, vocab["file"]), vocab["keys"])
    for split in SPLITS:
        path = {name: os.path.join(directory, f"{split}_{name}.npy") for name in ("dense", "sparse")}
        dense, sparse = np.load(path["dense"], mmap_mode="r+"), np.load(path["sparse"], mmap_mode="r+")
        n = len(dense)
        new_dense = _anew(path["dense"], (n, len(kept)), np.float32) if buckets else dense
        new_sparse = _anew(path["sparse"], (n, sparse.shape[1] + len(buckets)), np.int64) if buckets else sparse
        for lo in range(0, n, _BLOCK):
            d, s = np.asarray(dense[lo:lo + _BLOCK]), np.asarray(sparse[lo:lo + _BLOCK])
            if transforms:
                new_dense[lo:lo + len(d)] = apply_all(d[:, kept], transforms)
            elif buckets:
                new_dense[lo:lo + len(d)] = d[:, kept]
            new_sparse[lo:lo + len(d), :s.shape[1]] = apply_vocab(s, vocab["keys"], oov) if vocab else s
            for b, t in enumerate(buckets):
                x = d[:, at[t["column"]]]
                new_sparse[lo:lo + len(d), s.shape[1] + b] = bucket_keys(x, np.isnan(x), t)
        new_dense.flush()
        new_sparse.flush()
        del dense, sparse, new_dense, new_sparse  # the maps closed before their files move
        if buckets:
            for name in path:
                os.replace(path[name] + ".new", path[name])

def _anew(path: str, shape: tuple, dtype) -> np.ndarray:
    """A fresh array file beside ``path`` (in the preparation's own temporary directory)."""
    return np.lib.format.open_memmap(path + ".new", mode="w+", dtype=dtype, shape=shape)
