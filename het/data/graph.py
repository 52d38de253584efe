"""Graphs for the GNN workloads: one in-memory type, readers, a converter and a generator.

:class:`Graph` holds an undirected graph as a symmetric CSR (no self loops, no duplicate edges,
neighbours sorted), node features, labels and the train/val/test split. Where it comes from:

- :func:`load_planetoid`: the Planetoid files of Kipf & Welling's GCN code (Cora, CiteSeer,
  PubMed), split and ordered exactly as that code and PyG do.
- :func:`load_npz` / :func:`save_npz`: the on-disk ``.npz`` format, which Reddit, Amazon or
  ogbn-mag are converted into once.
- :func:`read_edge_list` / :func:`convert_edge_list`: an edge-list text file (two node ids per
  line) into a :class:`Graph` or the on-disk format.
- :func:`synthetic_power_law`: a Chung-Lu power-law graph with class-correlated features.
- :func:`load`: a spec string (``cora``, ``planetoid:DIR``, ``npz:PATH``, ``synthetic-graph``).

Each lives in its own module: :mod:`het.data.graph_core` (:class:`Graph`, :func:`csr_from_edges`,
:func:`random_split`, :func:`normalize_features`), :mod:`het.data.planetoid`,
:mod:`het.data.graph_npz` (which describes the on-disk format), :mod:`het.data.edge_list` and
:mod:`het.data.synthetic_graph`. This module holds :func:`load` and re-exports their public names.
"""

from __future__ import annotations

import os
from pathlib import Path

from het.data.edge_list import convert_edge_list, read_edge_list
from het.data.graph_core import Graph, csr_from_edges, normalize_features, random_split
from het.data.graph_npz import FORMAT_VERSION, load_npz, save_npz
from het.data.planetoid import load_planetoid
from het.data.synthetic_graph import synthetic_power_law

__all__ = ["FORMAT_VERSION", "SPEC_FORMS", "SYNTHETIC_DEFAULTS", "Graph", "convert_edge_list",
           "csr_from_edges", "default_shared_dir", "load", "load_npz", "load_planetoid",
           "normalize_features", "random_split", "read_edge_list", "save_npz", "synthetic_power_law"]

SYNTHETIC_DEFAULTS = dict(num_nodes=20_000, mean_degree=10.0, num_classes=8, feature_dim=32)
SPEC_FORMS = "'cora', 'planetoid:DIR', 'npz:PATH', 'synthetic-graph' or 'synthetic-graph:NODES'"


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
