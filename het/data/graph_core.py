"""The :class:`Graph` type: an undirected graph as a symmetric CSR with features, labels and a split.

Besides the type: :func:`csr_from_edges` (an edge list -> the symmetric CSR :class:`Graph` stores),
:func:`random_split` (a seeded train/val/test split of the labelled nodes) and
:func:`normalize_features`. The readers and the generator that produce a :class:`Graph` live
beside it; :mod:`het.data.graph` gathers them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch


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
