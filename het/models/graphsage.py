"""GraphSAGE with mean aggregation over sampled blocks, with trainable node-id embeddings (as HET
trains it: the embeddings are the sparse, cached parameters) beside the node features."""

from __future__ import annotations

import torch
from torch import nn


AGGREGATORS = ("mean", "gcn")


class SAGELayer(nn.Module):
    """``mean``: ``h_dst' = W_self h_dst + W_neigh mean(h_src over sampled neighbours)``;
    ``gcn``: ``h_dst' = W mean(h_dst and h_src over its sampled neighbours)``, GraphSAGE's GCN
    aggregator (Hamilton et al. 2017): one weight for the node and its neighbours, so a node's
    own input cannot carry its prediction alone (fewer weights to fit on few labels).

    A block is one layer's bipartite graph: its destination nodes are the first ``dst_count`` of
    its source nodes, and edge ``e`` goes from source position ``edge_src[e]`` to destination
    position ``edge_dst[e]``.

    Example:
        >>> from types import SimpleNamespace
        >>> block = SimpleNamespace(dst_count=1, edge_src=torch.tensor([1, 2]), edge_dst=torch.tensor([0, 0]))
        >>> layer = SAGELayer(1, 1)
        >>> with torch.no_grad():
        ...     _ = layer.self_lin.weight.fill_(1), layer.self_lin.bias.zero_(), layer.neigh_lin.weight.fill_(1)
        >>> layer(torch.tensor([[1.0], [2.0], [4.0]]), block)  # 1 + mean(2, 4)
        tensor([[4.]], grad_fn=<AddBackward0>)
    """

    def __init__(self, in_dim: int, out_dim: int, aggregator: str = "mean"):
        super().__init__()
        if aggregator not in AGGREGATORS:
            raise ValueError(f"aggregator must be one of {AGGREGATORS}, got {aggregator!r}")
        self.aggregator = aggregator
        self.self_lin = nn.Linear(in_dim, out_dim)
        self.neigh_lin = nn.Linear(in_dim, out_dim, bias=False) if aggregator == "mean" else None

    def forward(self, h_src: torch.Tensor, block) -> torch.Tensor:
        n_dst = block.dst_count
        total = torch.zeros(n_dst, h_src.shape[1], device=h_src.device, dtype=h_src.dtype)
        total = total.index_add(0, block.edge_dst, h_src[block.edge_src])                   # (n_dst, in)
        degree = torch.bincount(block.edge_dst, minlength=n_dst).to(h_src.dtype)
        if self.aggregator == "gcn":
            return self.self_lin((total + h_src[:n_dst]) / (degree + 1)[:, None])
        return self.self_lin(h_src[:n_dst]) + self.neigh_lin(total / degree.clamp(min=1)[:, None])


class GraphSAGE(nn.Module):
    """Node classification: node-id embeddings (and features) through SAGE layers.

    Args:
        embedding: maps node ids ``(N,)`` to rows ``(N, dim)``: ``nn.Embedding`` or
            ``het.Embedding``.
        dim: the embedding width.
        in_features: width of the node features (0 when the graph has none).
        num_classes: output classes.
        hidden: hidden width; ``layers``: SAGE layers (one block each); ``dropout``: on inputs;
        ``aggregator``: each layer's (:class:`SAGELayer`).
        embedding_dropout: dropout on the node-id rows alone, in ``[0, 1)``, before ``dropout``
            (so an id coordinate survives training with probability ``(1 - embedding_dropout)
            * (1 - dropout)``). A training node's own row can memorise its label, which the
            features alone cannot: on small graphs this is what makes accuracy fall after its
            best validated step.

    Shape:
        input_nodes ``(N,)`` int64, features ``(N, in_features)`` or None, blocks (input first)
        -> logits ``(n_seeds, num_classes)``.
    """

    def __init__(self, embedding: nn.Module, dim: int, in_features: int, num_classes: int,
                 hidden: int = 128, layers: int = 2, dropout: float = 0.5, embedding_dropout: float = 0.0,
                 aggregator: str = "mean"):
        super().__init__()
        if not 0 <= embedding_dropout < 1:  # at 1 training would never see the rows evaluation uses
            raise ValueError(f"embedding_dropout must lie in [0, 1), got {embedding_dropout}")
        self.embedding = embedding
        sizes = [dim + in_features] + [hidden] * (layers - 1) + [num_classes]
        self.layers = nn.ModuleList(SAGELayer(a, b, aggregator) for a, b in zip(sizes[:-1], sizes[1:]))
        self.dropout = nn.Dropout(dropout)
        self.embedding_dropout = nn.Dropout(embedding_dropout)

    def forward(self, input_nodes: torch.Tensor, features: torch.Tensor | None, blocks) -> torch.Tensor:
        if len(blocks) != len(self.layers):
            raise ValueError(f"expected {len(self.layers)} blocks (one per layer), got {len(blocks)}")
        h = self.embedding_dropout(self.embedding(input_nodes))             # (N, dim)
        if features is not None:
            h = torch.cat([h, features], dim=1)                              # (N, dim + F)
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(self.dropout(h), block)
            if i < len(self.layers) - 1:
                h = torch.relu(h)
        return h
