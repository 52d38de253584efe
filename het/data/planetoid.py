"""The Planetoid files of Kipf & Welling's GCN code (Cora, CiteSeer, PubMed) -> :class:`Graph`."""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path

import numpy as np
import torch

from het.data.graph_core import Graph, _require, csr_from_edges

_PICKLE_ALLOWED = {
    ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"), ("collections", "defaultdict"), ("collections", "OrderedDict"),
    ("copy_reg", "_reconstructor"), ("copyreg", "_reconstructor"),
    ("__builtin__", "list"), ("builtins", "list"), ("__builtin__", "dict"), ("builtins", "dict"),
    ("__builtin__", "object"), ("builtins", "object"), ("__builtin__", "int"), ("builtins", "int"),
}
_SPARSE_CLASSES = {"csr_matrix", "csc_matrix", "coo_matrix", "lil_matrix", "dok_matrix"}


class _PlanetoidUnpickler(pickle.Unpickler):
    """Unpickles only arrays, scipy sparse matrices, dicts and lists: a file cannot run code."""

    def find_class(self, module, name):
        sparse = module.startswith("scipy.sparse") and name in _SPARSE_CLASSES
        if not sparse and (module, name) not in _PICKLE_ALLOWED:
            raise pickle.UnpicklingError(f"Planetoid files hold arrays and dicts only, found {module}.{name}")
        return super().find_class(module, name)


def _unpickle(path: Path):
    if not path.is_file():
        raise FileNotFoundError(f"Planetoid file {path} not found")
    with open(path, "rb") as f, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the scipy.sparse.csr module path
        return _PlanetoidUnpickler(f, encoding="latin1").load()


def _dense(m) -> np.ndarray:
    return np.asarray(m.toarray() if hasattr(m, "toarray") else m)


def _planetoid_name(directory: Path) -> str:
    names = sorted(p.name[len("ind."):-len(".x")] for p in directory.glob("ind.*.x"))
    _require(len(names) == 1, f"expected one Planetoid data set (files ind.NAME.x, ...) in {directory}, "
             f"found {names or 'none'}; pass name=")
    return names[0]


def load_planetoid(directory, name: str | None = None) -> Graph:
    """Read a Planetoid data set (Cora, CiteSeer, PubMed) with the standard split.

    As Kipf & Welling's GCN code and PyG do: nodes ``0 .. len(allx) - 1`` take ``allx``/``ally``,
    the test nodes (ids in ``test.index``) take ``tx``/``ty`` in that file's order. CiteSeer's
    test ids leave gaps (isolated nodes outside the test set): those nodes get zero features
    and label -1. Train is ``range(len(y))`` (20 per class), val the next 500 nodes, test the
    ``test.index`` nodes (val stops at ``len(allx)``, which only matters for toy files).
    Features stay raw (binary); see :func:`normalize_features`.

    Args:
        directory: the folder holding ``ind.NAME.{x,y,tx,ty,allx,ally,graph,test.index}``.
        name: NAME; found from the files when the folder holds one data set.
    """
    directory = Path(directory)
    name = name or _planetoid_name(directory)
    parts = {k: _unpickle(directory / f"ind.{name}.{k}")
             for k in ("x", "y", "tx", "ty", "allx", "ally", "graph")}
    index_path = directory / f"ind.{name}.test.index"
    if not index_path.is_file():
        raise FileNotFoundError(f"Planetoid file {index_path} not found")
    test = np.loadtxt(index_path, dtype=np.int64, ndmin=1)
    allx, ally, tx, ty = (_dense(parts[k]) for k in ("allx", "ally", "tx", "ty"))
    n_base, n_train = len(allx), len(parts["y"])
    _require(len(tx) == len(ty) == len(test), f"{name}: tx, ty and test.index disagree: "
             f"{len(tx)}, {len(ty)} and {len(test)} rows")
    _require(test.min() >= n_base and len(np.unique(test)) == len(test),
             f"{name}: test.index must hold distinct ids >= len(allx) = {n_base}")
    adjacency = parts["graph"]
    n = max(n_base, int(test.max()) + 1, len(adjacency))

    features = np.zeros((n, allx.shape[1]), dtype=np.float32)
    features[:n_base], features[test] = allx, tx
    onehot = np.zeros((n, ally.shape[1]), dtype=np.int64)
    onehot[:n_base], onehot[test] = ally, ty
    labels = np.where(onehot.any(1), onehot.argmax(1), -1)

    src = np.repeat(np.fromiter(adjacency.keys(), np.int64, len(adjacency)),
                    [len(v) for v in adjacency.values()])
    dst = np.fromiter((u for v in adjacency.values() for u in v), np.int64, len(src))
    indptr, indices = csr_from_edges(src, dst, n)

    masks = [np.zeros(n, dtype=bool) for _ in range(3)]
    masks[0][:n_train] = True
    masks[1][n_train:min(n_train + 500, n_base)] = True
    masks[2][test] = True
    masks = [torch.from_numpy(m & (labels >= 0)) for m in masks]
    return Graph(indptr, indices, torch.from_numpy(features), torch.from_numpy(labels), *masks,
                 num_classes=ally.shape[1])
