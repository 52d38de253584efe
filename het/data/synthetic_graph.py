"""A synthetic graph: Chung-Lu power-law degrees, class-correlated features, a 60/20/20 split."""

from __future__ import annotations

import numpy as np
import torch

from het.data.graph_core import Graph, _require, _sorted_unique, csr_from_edges, random_split


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
