"""GraphSAGE neighbour sampling: seeds -> one bipartite block per layer, vectorised.

For a 2-layer model with fanouts (10, 5), each seed takes up to 10 sampled neighbours, and each
of those nodes (the seeds included) up to 5 of its own. The nodes of the widest layer are the
ones whose features and node-id embeddings must be looked up: ``blocks.input_nodes``. The
sequence of those sets over successive mini-batches (:meth:`NeighborSampler.access_trace`) is
the embedding access trace that the worker cache sees.

Sampling ``k`` of a node's ``d`` neighbours without replacement uses Robert Floyd's algorithm,
run on all frontier nodes at once: ``k`` vectorised steps, O(k^2) work per node whatever ``d``
is, so hubs with 10^4 neighbours cost no more than nodes with 20.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from het.data.graph import Graph


@dataclass(frozen=True)
class Block:
    """One layer's bipartite graph: messages flow from ``src_nodes`` to the first ``dst_count`` of them.

    Args:
        src_nodes: global ids of the layer's input nodes; the destination nodes come first
            (``src_nodes[:dst_count]``), as in DGL, so a layer can read its own previous state.
        dst_count: number of destination nodes.
        edge_src: local position in ``src_nodes`` of each sampled edge's neighbour.
        edge_dst: local position in the destination prefix of each sampled edge's centre node.

    Shape:
        - src_nodes: (num_src,), int64
        - edge_src, edge_dst: (num_sampled_edges,), int64

    Example (a mean aggregator)::

        summed = torch.zeros(block.dst_count, D).index_add_(0, block.edge_dst, h[block.edge_src])
        mean = summed / block.in_degrees().clamp(min=1).unsqueeze(1)
    """

    src_nodes: torch.Tensor
    dst_count: int
    edge_src: torch.Tensor
    edge_dst: torch.Tensor

    @property
    def dst_nodes(self) -> torch.Tensor:
        return self.src_nodes[:self.dst_count]

    @property
    def num_src(self) -> int:
        return len(self.src_nodes)

    def in_degrees(self) -> torch.Tensor:
        """Sampled neighbours of each destination node, (dst_count,) int64."""
        return torch.bincount(self.edge_dst, minlength=self.dst_count)

    def to(self, device) -> "Block":
        """The same block with its tensors on ``device``."""
        return Block(self.src_nodes.to(device), self.dst_count, self.edge_src.to(device), self.edge_dst.to(device))


class Blocks(list):
    """The blocks of one mini-batch, input layer first: ``blocks[0]`` has the most nodes."""

    @property
    def input_nodes(self) -> torch.Tensor:
        """Global ids whose features / embeddings the first layer reads."""
        return self[0].src_nodes

    @property
    def output_nodes(self) -> torch.Tensor:
        """The seeds, in the order given."""
        return self[-1].dst_nodes


def _floyd_sample(deg: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k distinct offsets in ``0 .. deg - 1`` for every row, uniformly (all deg > k), (n, k)."""
    n = len(deg)
    chosen = np.empty((n, k), dtype=np.int64)
    for i in range(k):  # Floyd: for j = d - k .. d - 1, take t ~ U{0..j}, or j if t was taken
        j = deg - k + i
        t = np.minimum((rng.random(n) * (j + 1)).astype(np.int64), j)
        taken = (chosen[:, :i] == t[:, None]).any(axis=1)
        chosen[:, i] = np.where(taken, j, t)
    return chosen


def _sample_layer(indptr: np.ndarray, indices: np.ndarray, dst: np.ndarray, fanout: int,
                  rng: np.random.Generator) -> Block:
    """Sample up to ``fanout`` neighbours of each (distinct) node of ``dst``; relabel locally."""
    start = indptr[dst]
    deg = indptr[dst + 1] - start
    k = np.minimum(deg, fanout) if fanout >= 0 else deg  # -1: every neighbour
    row = np.repeat(np.arange(len(dst), dtype=np.int64), k)  # (m,) destination of each edge
    offset = np.arange(len(row), dtype=np.int64) - np.repeat(np.cumsum(k) - k, k)  # 0 .. k-1 per row
    big = np.flatnonzero(deg > k)  # rows that keep a random subset, not all neighbours
    if len(big):
        picked = _floyd_sample(deg[big], fanout, rng)  # (len(big), fanout)
        slots = (np.cumsum(k) - k)[big][:, None] + np.arange(fanout)  # their edges' positions
        offset[slots.ravel()] = picked.ravel()
    neighbours = indices[start[row] + offset]  # (m,) global ids

    # src = dst first, then the new neighbours (in sorted order): relabel through np.unique.
    uniq, inverse = np.unique(np.concatenate([dst, neighbours]), return_inverse=True)
    local = np.full(len(uniq), -1, dtype=np.int64)
    local[inverse[:len(dst)]] = np.arange(len(dst))
    new = local < 0
    local[new] = len(dst) + np.arange(int(new.sum()))
    src_nodes = np.empty(len(uniq), dtype=np.int64)
    src_nodes[local] = uniq
    return Block(torch.from_numpy(src_nodes), len(dst), torch.from_numpy(local[inverse[len(dst):]]),
                 torch.from_numpy(row))


class NeighborSampler:
    """GraphSAGE layer-wise neighbour sampling without replacement.

    Args:
        graph: the graph to sample from.
        fanouts: neighbours to take per node, hop by hop from the seeds: ``fanouts[0]`` for the
            seeds (the output layer, ``blocks[-1]``), ``fanouts[1]`` for their neighbours, and
            so on (PyG's ``num_neighbors`` order). A node with fewer neighbours keeps all of
            them; -1 keeps every neighbour.
        seed: seeds the sampler's random stream (advanced by every :meth:`sample`).

    Example:
        >>> from het.data.graph import synthetic_power_law
        >>> sampler = NeighborSampler(synthetic_power_law(500, 6.0, 3, 4), fanouts=(10, 5))
        >>> blocks = sampler.sample(torch.tensor([0, 1, 2]))
        >>> len(blocks), blocks[-1].dst_count, blocks[0].num_src == len(blocks.input_nodes)
        (2, 3, True)
    """

    def __init__(self, graph: Graph, fanouts: Sequence[int] = (10, 5), seed: int = 0):
        fanouts = tuple(int(f) for f in fanouts)
        if not fanouts or any(f == 0 or f < -1 for f in fanouts):
            raise ValueError(f"fanouts must be a non-empty sequence of ints >= 1 (or -1 for all), "
                             f"got {fanouts}")
        self.graph = graph
        self.fanouts = fanouts
        self._indptr = graph.indptr.numpy()
        self._indices = graph.indices.numpy()
        self._rng = np.random.default_rng(seed)

    def sample(self, seeds: torch.Tensor) -> Blocks:
        """Blocks for ``seeds`` (distinct node ids), input layer first.

        Shape:
            - seeds: (B,), integer
        """
        return self._sample(seeds, self._rng)

    def _sample(self, seeds, rng: np.random.Generator) -> Blocks:
        seeds = torch.as_tensor(seeds)
        if seeds.dim() != 1 or seeds.is_floating_point() or seeds.dtype == torch.bool:
            raise ValueError(f"seeds must be a 1-D integer tensor, "
                             f"got {seeds.dtype} of shape {tuple(seeds.shape)}")
        dst = seeds.to(torch.int64).numpy()
        n = self.graph.num_nodes
        if len(dst) and (dst.min() < 0 or dst.max() >= n):
            raise ValueError(f"seeds must lie in 0 .. {n - 1}, got {dst.min()} .. {dst.max()}")
        if len(np.unique(dst)) != len(dst):
            raise ValueError(f"seeds must be distinct, got {len(dst) - len(np.unique(dst))} repeated")
        blocks = []
        for fanout in self.fanouts:  # from the seeds outwards
            block = _sample_layer(self._indptr, self._indices, dst, fanout, rng)
            blocks.append(block)
            dst = block.src_nodes.numpy()
        return Blocks(reversed(blocks))

    def batches(self, nodes: torch.Tensor, batch_size: int, shuffle: bool = True,
                seed: int | tuple[int, ...] = 0) -> Iterator[tuple[torch.Tensor, Blocks]]:
        """One epoch over ``nodes`` (ids or a bool mask): ``(seeds, blocks)`` per mini-batch.

        Shuffling and sampling both follow ``seed``, so an epoch is reproducible.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        nodes = torch.as_tensor(nodes)
        ids = nodes.nonzero().flatten() if nodes.dtype == torch.bool else nodes.to(torch.int64)
        rng = np.random.default_rng(seed)
        if shuffle:
            ids = ids[torch.from_numpy(rng.permutation(len(ids)))]
        for i in range(0, len(ids), batch_size):
            seeds = ids[i:i + batch_size]
            yield seeds, self._sample(seeds, rng)

    def access_trace(self, batch_size: int, num_batches: int, seed: int = 0) -> list[torch.Tensor]:
        """The input-node ids of ``num_batches`` successive training mini-batches.

        Train nodes are shuffled each epoch (epochs repeat until ``num_batches`` are made); each
        entry is the (num_inputs,) int64 set of node-id embeddings that batch reads: the
        access trace for measuring cache miss rates.
        """
        if num_batches < 0:
            raise ValueError(f"num_batches must be >= 0, got {num_batches}")
        if not bool(self.graph.train_mask.any()) and num_batches:
            raise ValueError("access_trace: the graph has no training nodes")
        trace: list[torch.Tensor] = []
        epoch = 0
        while len(trace) < num_batches:
            for _, blocks in self.batches(self.graph.train_mask, batch_size, True, seed=(seed, epoch)):
                trace.append(blocks.input_nodes)
                if len(trace) == num_batches:
                    break
            epoch += 1
        return trace
