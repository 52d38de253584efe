"""Wide&Deep for CTR, as HET trains it on Criteo."""

from __future__ import annotations

import torch
from torch import nn


def mlp(sizes: list[int]) -> nn.Sequential:
    """Linear layers of ``sizes`` with ReLU between them (and after the last).

    Example:
        >>> mlp([13, 256, 256])(torch.zeros(2, 13)).shape
        torch.Size([2, 256])
    """
    layers = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers)


class WideDeep(nn.Module):
    """Wide&Deep (HET's WDL): the deep part is an MLP over the dense features, the wide part the
    flattened embeddings of the categorical fields; a linear head over both gives the logit.

    Args:
        embedding: any module mapping keys ``(B, F)`` to rows ``(B, F, dim)``: ``nn.Embedding``
            or ``het.Embedding``.
        num_fields, dim: categorical fields and embedding width.
        num_dense: dense features.
        hidden: the deep MLP's layer sizes.

    Shape:
        dense ``(B, num_dense)``, sparse ``(B, num_fields)`` int64 -> logits ``(B,)``.

    Example:
        >>> model = WideDeep(nn.Embedding(100, 4), num_fields=3, dim=4, num_dense=2, hidden=(8, 8))
        >>> model(torch.zeros(5, 2), torch.zeros(5, 3, dtype=torch.int64)).shape
        torch.Size([5])
    """

    def __init__(self, embedding: nn.Module, num_fields: int, dim: int, num_dense: int = 13,
                 hidden: tuple[int, ...] = (256, 256, 256)):
        super().__init__()
        self.embedding = embedding
        self.deep = mlp([num_dense, *hidden])
        self.head = nn.Linear(num_fields * dim + hidden[-1], 1)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        wide = self.embedding(sparse).flatten(1)                    # (B, F * D)
        deep = self.deep(dense)                                     # (B, H)
        return self.head(torch.cat([wide, deep], dim=1)).squeeze(1)
