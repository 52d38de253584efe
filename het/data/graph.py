"""Graphs for the GNN workloads: one in-memory type, readers, a converter and a generator.

:class:`Graph` holds an undirected graph as a symmetric CSR (no self loops, no duplicate edges,
neighbours sorted), node features, labels and the train/val/test split. Where it comes from:

- :func:`load_planetoid`: the Planetoid files of Kipf & Welling's GCN code (Cora, CiteSeer,
  PubMed), split and ordered exactly as that code and PyG do.
- :func:`load_npz` / :func:`save_npz`: the on-disk format below, which Reddit, Amazon or
  ogbn-mag are converted into once.
- :func:`read_edge_list` / :func:`convert_edge_list`: an edge-list text file (two node ids per
  line) into a :class:`Graph` or the on-disk format.
- :func:`synthetic_power_law`: a Chung-Lu power-law graph with class-correlated features.
- :func:`load`: a spec string (``cora``, ``planetoid:DIR``, ``npz:PATH``, ``synthetic-graph``).

The on-disk format (version 1) is one ``.npz`` file written with ``np.savez``; node ids are
``0 .. num_nodes - 1``. Give the graph either as CSR or as an edge list:

===============  ==============  =============================================================
key              dtype, shape    meaning
===============  ==============  =============================================================
format_version   int, ()         1 (optional when writing by hand)
indptr, indices  int64, (N+1,)   the symmetric CSR, as :class:`Graph` stores it; or instead:
                 and (E,)
edge_index       int, (2, M)     edges in any direction, duplicates and self loops allowed:
                                 they are symmetrised, deduplicated and dropped on load
num_nodes        int, ()         optional with ``edge_index`` (else inferred from ids, labels,
                                 features)
features         float, (N, F)   optional node features (stored as float32)
labels           int, (N,)       optional class per node, -1 for unlabelled nodes
num_classes      int, ()         optional, else ``labels.max() + 1``
train_mask,      bool, (N,)      optional split (all three or none); without them a seeded
val_mask,                        60/20/20 random split of the labelled nodes is made
test_mask
===============  ==============  =============================================================

So converting e.g. ogbn-mag's paper citation graph is, with its arrays in hand::

    np.savez("mag.npz", edge_index=edge_index, features=x, labels=y,
             train_mask=train, val_mask=val, test_mask=test)

and ``load("npz:mag.npz")`` reads it (the spec a ``--data`` flag hands to :func:`load`).
:func:`convert_edge_list` writes the same format from an edge-list text file.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

FORMAT_VERSION = 1
SYNTHETIC_DEFAULTS = dict(num_nodes=20_000, mean_degree=10.0, num_classes=8, feature_dim=32)
SPEC_FORMS = "'cora', 'planetoid:DIR', 'npz:PATH', 'synthetic-graph' or 'synthetic-graph:NODES'"


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _as_tensor(name: str, value, dtype: torch.dtype) -> torch.Tensor:
    """``value`` (tensor or array) as a CPU tensor of ``dtype``; integers are never cast from floats."""
    t = value if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))
    if dtype == torch.bool:
        _require(t.dtype == torch.bool, f"{name} must be bool, got {t.dtype}")
    elif dtype == torch.int64:
        _require(not t.is_floating_point() and t.dtype != torch.bool,
                 f"{name} must hold integers, got {t.dtype}")
    return t.to(dtype).contiguous()


@dataclass
class Graph:
    """An undirected graph as a symmetric CSR, with node features, labels and a split.

    Args:
        indptr: row pointers; node ``v``'s neighbours are ``indices[indptr[v]:indptr[v + 1]]``.
        indices: neighbour ids, sorted within each row. Every edge appears in both directions,
            there are no self loops and no duplicates.
        features: node features, or None for graphs that only have node-id embeddings.
        labels: class of each node in ``0 .. num_classes - 1``, or -1 for an unlabelled node.
        train_mask, val_mask, test_mask: disjoint node sets holding labelled nodes only.
        num_classes: number of classes.

    Arrays are converted to tensors; everything is checked here, so a :class:`Graph` is
    always valid (the symmetry check sorts the E edges once).

    Shape:
        - indptr: (N + 1,), int64
        - indices: (E,), int64, E = 2 * num_edges
        - features: (N, F), float32
        - labels, train_mask, val_mask, test_mask: (N,)

    Example:
        >>> g = Graph(torch.tensor([0, 1, 3, 4]), torch.tensor([1, 0, 2, 1]), None,
        ...           torch.tensor([0, 1, 0]), torch.tensor([True, False, False]),
        ...           torch.tensor([False, True, False]), torch.tensor([False, False, True]), 2)
        >>> g.num_nodes, g.num_edges, g.degrees().tolist()
        (3, 2, [1, 2, 1])
        >>> Graph(torch.tensor([0, 1, 1]), torch.tensor([1]), None, torch.zeros(2, dtype=torch.long),
        ...       *torch.zeros(3, 2, dtype=torch.bool), 1)
        Traceback (most recent call last):
        ...
        ValueError: the CSR must be symmetric (every edge in both directions): edge 0 -> 1 has no reverse
    """

    indptr: torch.Tensor
    indices: torch.Tensor
    features: torch.Tensor | None
    labels: torch.Tensor
    train_mask: torch.Tensor
    val_mask: torch.Tensor
    test_mask: torch.Tensor
    num_classes: int

    def __post_init__(self) -> None:
        self.indptr = _as_tensor("indptr", self.indptr, torch.int64)
        self.indices = _as_tensor("indices", self.indices, torch.int64)
        _require(self.indptr.dim() == 1 and len(self.indptr) >= 1,
                 f"indptr must be 1-D with num_nodes + 1 entries, got shape {tuple(self.indptr.shape)}")
        _require(self.indices.dim() == 1, f"indices must be 1-D, got shape {tuple(self.indices.shape)}")
        n = self.num_nodes
        self.labels = _as_tensor("labels", self.labels, torch.int64)
        for name in ("labels", "train_mask", "val_mask", "test_mask"):
            if name != "labels":
                setattr(self, name, _as_tensor(name, getattr(self, name), torch.bool))
            shape = tuple(getattr(self, name).shape)
            _require(shape == (n,), f"{name} must have shape ({n},) for {n} nodes, got {shape}")
        if self.features is not None:
            f = self.features
            self.features = (f if isinstance(f, torch.Tensor) else torch.as_tensor(np.asarray(f)))
            self.features = self.features.to(torch.float32).contiguous()
            _require(self.features.dim() == 2 and len(self.features) == n,
                     f"features must have shape ({n}, F), got {tuple(self.features.shape)}")
        _require(isinstance(self.num_classes, (int, np.integer)) and self.num_classes >= 0,
                 f"num_classes must be an int >= 0, got {self.num_classes!r}")
        self.num_classes = int(self.num_classes)
        _check_csr(self.indptr.numpy(), self.indices.numpy())
        self._check_labels_and_split()

    def _check_labels_and_split(self) -> None:
        labels = self.labels
        bad = (labels < -1) | (labels >= self.num_classes)
        if bad.any():
            raise ValueError(f"labels must lie in -1 .. {self.num_classes - 1} (-1 = unlabelled), "
                             f"got {int(labels[bad][0])}")
        train, val, test = self.train_mask, self.val_mask, self.test_mask
        overlap = (train & val) | (train & test) | (val & test)
        if overlap.any():
            raise ValueError(f"train_mask, val_mask and test_mask must be disjoint: node "
                             f"{int(overlap.nonzero()[0, 0])} is in two")
        for name, mask in (("train_mask", train), ("val_mask", val), ("test_mask", test)):
            unlabelled = (mask & (labels < 0)).nonzero().flatten()
            if len(unlabelled):
                raise ValueError(f"{name} holds unlabelled node {int(unlabelled[0])} (label -1)")

    @property
    def num_nodes(self) -> int:
        return len(self.indptr) - 1

    @property
    def num_edges(self) -> int:
        """Undirected edges: half the CSR's entries."""
        return len(self.indices) // 2

    @property
    def num_features(self) -> int:
        return 0 if self.features is None else self.features.shape[1]

    def degrees(self) -> torch.Tensor:
        """Number of neighbours of every node, (N,) int64."""
        return self.indptr[1:] - self.indptr[:-1]

    def neighbors(self, node: int) -> torch.Tensor:
        """Sorted neighbour ids of one node."""
        _require(0 <= node < self.num_nodes,
                 f"node {node} out of range for a graph with {self.num_nodes} nodes")
        return self.indices[self.indptr[node]:self.indptr[node + 1]]

    def edges(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(src, dst) of all E directed CSR entries, each undirected edge in both directions."""
        src = torch.repeat_interleave(torch.arange(self.num_nodes), self.degrees())
        return src, self.indices


def _check_csr(indptr: np.ndarray, indices: np.ndarray) -> None:
    n = len(indptr) - 1
    _require(indptr[0] == 0 and indptr[-1] == len(indices),
             f"indptr must start at 0 and end at len(indices) = {len(indices)}, "
             f"got {indptr[0]} .. {indptr[-1]}")
    deg = np.diff(indptr)
    _require(bool((deg >= 0).all()), "indptr must be non-decreasing")
    if len(indices) == 0:
        return
    _require(indices.min() >= 0 and indices.max() < n,
             f"indices must lie in 0 .. {n - 1}, got {indices.min()} .. {indices.max()}")
    src = np.repeat(np.arange(n, dtype=np.int64), deg)
    loops = src == indices
    if loops.any():
        raise ValueError(f"self loops are not allowed: node {src[loops][0]} has one")
    # Row-major keys are strictly increasing iff rows are sorted and free of duplicates.
    keys = src * n + indices
    step = np.diff(keys) <= 0
    if step.any():
        raise ValueError(f"indices must be sorted and free of duplicates within each row: "
                         f"node {src[1:][step][0]}'s are not")
    reverse = np.sort(indices * n + src)
    missing = reverse != keys
    if missing.any():
        k = keys[np.argmax(missing)]
        raise ValueError("the CSR must be symmetric (every edge in both directions): "
                         f"edge {k // n} -> {k % n} has no reverse")


def _sorted_unique(a: np.ndarray) -> np.ndarray:
    """np.unique by sorting: several times faster than numpy 2's hash-based unique on int64 keys."""
    a = np.sort(a)
    return a[np.concatenate([[True], a[1:] != a[:-1]])] if len(a) else a


def csr_from_edges(src, dst, num_nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The symmetric CSR of an edge list: both directions, self loops and duplicates dropped.

    Example:
        >>> indptr, indices = csr_from_edges([0, 1, 1, 2], [1, 0, 1, 0], 3)
        >>> indptr.tolist(), indices.tolist()
        ([0, 2, 3, 4], [1, 2, 0, 0])
    """
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    _require(src.shape == dst.shape and src.ndim == 1, f"src and dst must be 1-D of equal length, "
             f"got shapes {src.shape} and {dst.shape}")
    if len(src):
        lo, hi = min(src.min(), dst.min()), max(src.max(), dst.max())
        _require(lo >= 0 and hi < num_nodes, f"node ids must lie in 0 .. {num_nodes - 1}, got {lo} .. {hi}")
    keep = src != dst
    src, dst = src[keep], dst[keep]
    keys = _sorted_unique(np.concatenate([src * num_nodes + dst, dst * num_nodes + src]))
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys // num_nodes, minlength=num_nodes), out=indptr[1:])
    return torch.from_numpy(indptr), torch.from_numpy(keys % num_nodes)


def random_split(labels, fractions=(0.6, 0.2, 0.2), seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Train/val/test masks: a seeded random split of the labelled nodes (label >= 0).

    Example:
        >>> [int(m.sum()) for m in random_split(torch.tensor([0, 1, -1, 1, 0, 1]), (0.6, 0.2, 0.2))]
        [3, 1, 1]
    """
    labels = torch.as_tensor(np.asarray(labels))
    _require(len(fractions) == 3 and all(f >= 0 for f in fractions) and sum(fractions) <= 1 + 1e-9,
             f"split must be three fractions >= 0 summing to at most 1, got {tuple(fractions)}")
    labelled = (labels >= 0).nonzero().flatten().numpy()
    order = labelled[np.random.default_rng(seed).permutation(len(labelled))]
    n_train = int(round(fractions[0] * len(order)))
    n_val = min(int(round(fractions[1] * len(order))), len(order) - n_train)
    n_test = min(int(round(fractions[2] * len(order))), len(order) - n_train - n_val)
    bounds = np.cumsum([0, n_train, n_val, n_test])
    masks = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        m = torch.zeros(len(labels), dtype=torch.bool)
        m[torch.from_numpy(order[a:b])] = True
        masks.append(m)
    return tuple(masks)


def normalize_features(graph: Graph) -> Graph:
    """A copy of ``graph`` whose feature rows sum to 1 (all-zero rows stay zero), as GCN does."""
    _require(graph.features is not None, "normalize_features: the graph has no features")
    sums = graph.features.sum(dim=1, keepdim=True)
    return dataclasses.replace(graph, features=graph.features / torch.where(sums == 0, 1.0, sums))


# --- Planetoid -------------------------------------------------------------------------------

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


# --- the on-disk format ----------------------------------------------------------------------

def save_npz(graph: Graph, path) -> None:
    """Write ``graph`` in the on-disk format (version 1, CSR form) described in this module."""
    arrays = dict(format_version=np.int64(FORMAT_VERSION), indptr=graph.indptr.numpy(),
                  indices=graph.indices.numpy(), labels=graph.labels.numpy(),
                  num_classes=np.int64(graph.num_classes), train_mask=graph.train_mask.numpy(),
                  val_mask=graph.val_mask.numpy(), test_mask=graph.test_mask.numpy())
    if graph.features is not None:
        arrays["features"] = graph.features.numpy()
    with open(path, "wb") as f:  # a file object: np.savez would append .npz to a bare name
        np.savez(f, **arrays)


def load_npz(path, split_seed: int = 0) -> Graph:
    """Read a graph in the on-disk format described in this module (CSR or edge-list form)."""
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    version = int(arrays.pop("format_version", FORMAT_VERSION))
    _require(version == FORMAT_VERSION, f"{path}: format_version {version} is not supported "
             f"(this reader knows {FORMAT_VERSION})")
    features, labels = arrays.get("features"), arrays.get("labels")
    if "indptr" in arrays and "indices" in arrays:
        indptr, indices = arrays["indptr"], arrays["indices"]
        n = len(indptr) - 1
    elif "edge_index" in arrays:
        edges = arrays["edge_index"]
        _require(edges.ndim == 2 and edges.shape[0] == 2,
                 f"{path}: edge_index must have shape (2, M), got {edges.shape}")
        sizes = [int(edges.max()) + 1 if edges.size else 0]
        sizes += [len(a) for a in (features, labels) if a is not None]
        n = int(arrays["num_nodes"]) if "num_nodes" in arrays else max(sizes)
        indptr, indices = csr_from_edges(edges[0], edges[1], n)
    else:
        raise ValueError(f"{path}: expected 'indptr' and 'indices', or 'edge_index'; found {sorted(arrays)}")
    labels = np.full(n, -1, dtype=np.int64) if labels is None else labels
    return _assemble(indptr, indices, features, labels, arrays, split_seed, str(path))


def _assemble(indptr, indices, features, labels, arrays: dict, split_seed: int, source: str,
              split=(0.6, 0.2, 0.2)) -> Graph:
    labels = np.asarray(labels)
    num_classes = int(arrays.get("num_classes", labels.max(initial=-1) + 1))
    names = ("train_mask", "val_mask", "test_mask")
    present = [k for k in names if k in arrays]
    _require(len(present) in (0, 3), f"{source}: give all of {names} or none, got {present}")
    masks = [arrays[k] for k in names] if present else random_split(labels, split, split_seed)
    return Graph(indptr, indices, features, labels, *masks, num_classes=num_classes)


def _read_edge_pairs(path: Path) -> np.ndarray:
    """(M, 2) int64 from a text file of two ids per line; '#' starts a comment."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # numpy warns on a file with no rows
            pairs = np.loadtxt(path, dtype=np.int64, comments="#", ndmin=2)
        if pairs.size == 0:
            return np.zeros((0, 2), dtype=np.int64)
        if pairs.shape[1] == 2 and pairs.min() >= 0:
            return pairs
    except ValueError:
        pass
    _find_bad_line(path)
    raise ValueError(f"{path}: could not read the edge list")  # _find_bad_line found nothing


def _find_bad_line(path: Path) -> None:
    """Raise naming the first line that is not two non-negative integers (the slow path)."""
    with open(path) as f:
        for number, line in enumerate(f, start=1):
            fields = line.split("#", 1)[0].split()
            if not fields:
                continue
            ok = len(fields) == 2 and all(x.isdigit() for x in fields)
            _require(ok, f"{path}, line {number}: expected two non-negative integer node ids, "
                     f"got {line.rstrip()!r}")


def _read_labels(labels, n_hint: int) -> np.ndarray:
    """Labels from an array, a .npy file, or text: one label per line, or 'node label' pairs."""
    if not isinstance(labels, (str, os.PathLike)):
        return np.asarray(labels, dtype=np.int64)
    if str(labels).endswith(".npy"):
        return np.load(labels, allow_pickle=False).astype(np.int64)
    table = np.loadtxt(labels, dtype=np.int64, comments="#", ndmin=2)
    if table.shape[1] == 1:
        return table[:, 0]
    _require(table.shape[1] == 2, f"{labels}: expected 'label' or 'node label' per line, "
             f"got {table.shape[1]} columns")
    out = np.full(max(n_hint, int(table[:, 0].max(initial=-1)) + 1), -1, dtype=np.int64)
    out[table[:, 0]] = table[:, 1]
    return out


def read_edge_list(path, num_nodes: int | None = None, labels=None, features=None,
                   split=(0.6, 0.2, 0.2), seed: int = 0) -> Graph:
    """Build a :class:`Graph` from an edge-list text file.

    Each line holds two whitespace-separated node ids; ``#`` starts a comment, blank lines are
    skipped. Edges are symmetrised, duplicates and self loops dropped. A bad line raises a
    ValueError naming its line number.

    Args:
        path: the edge-list text file.
        num_nodes: number of nodes; default: one more than the largest id seen (in the edges,
            labels or features).
        labels: an (N,) int array, a ``.npy`` file, or a text file with one label per line (line
            ``i`` is node ``i``) or ``node label`` pairs; -1 = unlabelled. Default: unlabelled.
        features: an (N, F) array or a ``.npy`` file. Default: none.
        split: train/val/test fractions of the labelled nodes, split at random by ``seed``.
    """
    path = Path(path)
    pairs = _read_edge_pairs(path)
    feats = np.load(features, allow_pickle=False) if isinstance(features, (str, os.PathLike)) else features
    n_seen = max(int(pairs.max(initial=-1)) + 1, 0 if feats is None else len(feats))
    labs = None if labels is None else _read_labels(labels, n_seen)
    n = max(n_seen, 0 if labs is None else len(labs))
    if num_nodes is not None:
        _require(num_nodes >= n, f"num_nodes={num_nodes} but the inputs mention {n} nodes")
        n = num_nodes
    if labs is None:
        labs = np.full(n, -1, dtype=np.int64)
    elif len(labs) < n:  # nodes past the label file are unlabelled
        labs = np.concatenate([labs, np.full(n - len(labs), -1, dtype=np.int64)])
    indptr, indices = csr_from_edges(pairs[:, 0], pairs[:, 1], n)
    return _assemble(indptr, indices, feats, labs, {}, seed, str(path), split)


def convert_edge_list(edges_txt, out_npz, labels=None, features=None, num_nodes: int | None = None,
                      split=(0.6, 0.2, 0.2), seed: int = 0) -> Graph:
    """:func:`read_edge_list`, then :func:`save_npz` to ``out_npz``; returns the graph."""
    graph = read_edge_list(edges_txt, num_nodes, labels, features, split, seed)
    save_npz(graph, out_npz)
    return graph


# --- the synthetic generator and specs -------------------------------------------------------

def _check_synthetic(num_nodes, mean_degree, num_classes, feature_dim, exponent, homophily,
                     feature_noise) -> None:
    _require(isinstance(num_nodes, (int, np.integer)) and num_nodes >= 2,
             f"num_nodes must be an int >= 2, got {num_nodes!r}")
    _require(0 < mean_degree <= num_nodes - 1,
             f"mean_degree must lie in (0, num_nodes - 1 = {num_nodes - 1}], got {mean_degree}")
    _require(isinstance(num_classes, (int, np.integer)) and 1 <= num_classes <= num_nodes,
             f"num_classes must be an int in 1 .. num_nodes, got {num_classes!r}")
    _require(isinstance(feature_dim, (int, np.integer)) and feature_dim >= 0,
             f"feature_dim must be an int >= 0, got {feature_dim!r}")
    _require(exponent > 2, f"exponent must be > 2 (a finite mean degree), got {exponent}")
    _require(0 <= homophily <= 1, f"homophily must lie in [0, 1], got {homophily}")
    _require(feature_noise >= 0, f"feature_noise must be >= 0, got {feature_noise}")


def _chung_lu_edges(weights: np.ndarray, labels: np.ndarray, num_classes: int, count: int,
                    homophily: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``count`` edges: endpoint u drawn by weight; v by weight within u's class with
    probability ``homophily``, else by weight among the other classes."""
    order = np.argsort(labels, kind="stable")  # nodes grouped by class: one weight interval each
    cum = np.cumsum(weights[order])
    total = cum[-1]
    class_end = cum[np.cumsum(np.bincount(labels, minlength=num_classes)) - 1]  # (C,)
    class_weight = np.diff(np.concatenate([[0.0], class_end]))
    class_start = class_end - class_weight

    def pick(r):
        return order[np.minimum(np.searchsorted(cum, r, side="right"), len(order) - 1)]

    u = pick(rng.random(count) * total)
    cu = labels[u]
    within = (rng.random(count) < homophily) | (num_classes == 1)
    r = rng.random(count)
    r_within = class_start[cu] + r * class_weight[cu]
    r_across = r * (total - class_weight[cu])
    r_across = np.where(r_across >= class_start[cu], r_across + class_weight[cu], r_across)
    return u, pick(np.where(within, r_within, r_across))


def synthetic_power_law(num_nodes: int, mean_degree: float, num_classes: int, feature_dim: int,
                        exponent: float = 2.5, homophily: float = 0.8, seed: int = 0,
                        feature_noise: float = 2.0) -> Graph:
    """A Chung-Lu power-law graph with class-correlated features and a 60/20/20 split.

    Node ``i`` gets an expected-degree weight ``w_i ~ rank ** (-1 / (exponent - 1))`` (ranks
    shuffled over the ids, so hubs are not the low ids), scaled to mean ``mean_degree`` and
    capped at ``sqrt(N * mean_degree)`` (Chung-Lu's condition). Edges are drawn with endpoints
    proportional to ``w``; the second endpoint is drawn within the first one's class with
    probability ``homophily``, else from the other classes, so about that fraction of edges
    join nodes of one class. Draws repeat until ``round(N * mean_degree / 2)`` distinct edges
    (no self loops) exist, so the mean degree is what was asked. Features are the class
    centroid (standard normal) plus ``feature_noise`` times standard normal noise. Everything is
    a function of ``seed``.

    Example:
        >>> g = synthetic_power_law(1000, 8.0, 4, 16, seed=1)
        >>> g.num_nodes, g.num_edges, g.features.shape
        (1000, 4000, torch.Size([1000, 16]))
    """
    _check_synthetic(num_nodes, mean_degree, num_classes, feature_dim, exponent, homophily, feature_noise)
    rng = np.random.default_rng(seed)
    n = int(num_nodes)
    labels = rng.integers(0, num_classes, n)
    weights = rng.permutation(np.arange(1, n + 1, dtype=np.float64) ** (-1.0 / (exponent - 1.0)))
    weights = np.minimum(weights * (mean_degree / weights.mean()), np.sqrt(n * mean_degree))
    target = min(int(round(n * mean_degree / 2)), n * (n - 1) // 2)
    keys = np.zeros(0, dtype=np.int64)  # undirected edge min * n + max
    for _ in range(100):  # each round draws the shortfall; near-complete graphs may stop short
        if len(keys) >= target:
            break
        u, v = _chung_lu_edges(weights, labels, num_classes, int((target - len(keys)) * 1.1) + 16,
                               homophily, rng)
        keep = u != v
        u, v = u[keep], v[keep]
        keys = _sorted_unique(np.concatenate([keys, np.minimum(u, v) * n + np.maximum(u, v)]))
    if len(keys) > target:
        keys = keys[np.sort(rng.choice(len(keys), target, replace=False))]
    indptr, indices = csr_from_edges(keys // n, keys % n, n)

    features = None
    if feature_dim:
        centroids = rng.standard_normal((num_classes, feature_dim), dtype=np.float32)
        noise = rng.standard_normal((n, feature_dim), dtype=np.float32)
        features = torch.from_numpy(centroids[labels] + np.float32(feature_noise) * noise)
    masks = random_split(labels, (0.6, 0.2, 0.2), seed)
    return Graph(indptr, indices, features, torch.from_numpy(labels), *masks, num_classes=num_classes)


def default_shared_dir() -> Path:
    """The project's shared folder: $HET_SHARED, else ``shared/`` beside the repository root."""
    if os.environ.get("HET_SHARED"):
        return Path(os.environ["HET_SHARED"])
    return Path(__file__).resolve().parents[2].parent / "shared"


def load(spec: str, shared_dir: str | os.PathLike | None = None) -> Graph:
    """The graph named by ``spec``: 'cora', 'planetoid:DIR', 'npz:PATH' or 'synthetic-graph'.

    'cora' reads ``<shared_dir>/data/cora``; ``shared_dir`` defaults to :func:`default_shared_dir`.
    'synthetic-graph' is :func:`synthetic_power_law` with 20,000 nodes, mean degree 10,
    8 classes and 32 features; 'synthetic-graph:N' the same with N nodes.
    """
    kind, _, arg = spec.partition(":")
    if spec == "cora":
        return load_planetoid(Path(shared_dir or default_shared_dir()) / "data" / "cora", "cora")
    if kind == "planetoid" and arg:
        return load_planetoid(arg)
    if kind == "npz" and arg:
        return load_npz(arg)
    if spec == "synthetic-graph":
        return synthetic_power_law(**SYNTHETIC_DEFAULTS)
    if kind == "synthetic-graph" and arg.isdigit() and int(arg) > 0:
        return synthetic_power_law(**{**SYNTHETIC_DEFAULTS, "num_nodes": int(arg)})
    raise ValueError(f"unknown graph {spec!r}: expected {SPEC_FORMS}")
