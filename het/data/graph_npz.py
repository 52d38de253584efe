"""The on-disk graph format, read by :func:`load_npz` and written by :func:`save_npz`.

The format (version 1) is one ``.npz`` file written with ``np.savez``; node ids are
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

and ``load("npz:mag.npz")`` reads it (the spec a ``--data`` flag hands to
:func:`het.data.graph.load`). :func:`het.data.edge_list.convert_edge_list` writes the same format
from an edge-list text file.
"""

from __future__ import annotations

import numpy as np

from het.data.graph_core import Graph, _require, csr_from_edges, random_split

FORMAT_VERSION = 1


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
