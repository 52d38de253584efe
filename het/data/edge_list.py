"""Edge-list text files (two node ids per line) -> :class:`Graph`, or into the ``.npz`` format."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np

from het.data.graph_core import Graph, _require, csr_from_edges
from het.data.graph_npz import _assemble, save_npz


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
