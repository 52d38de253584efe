"""Deep & Cross Network for CTR (Wang et al. 2017), as HET trains it on Criteo."""

from __future__ import annotations

import torch
from torch import nn

from het.models.wdl import mlp


class CrossLayer(nn.Module):
    """One cross layer of the original DCN: ``x_{l+1} = x0 * (x_l . w) + b + x_l``, with a
    weight vector ``w`` (one scalar per example crosses ``x0``), so each layer adds ``2 * width``
    parameters.

    Args:
        width: the width of ``x0`` and ``x_l``.

    Shape:
        x0 ``(B, width)``, x ``(B, width)`` -> ``(B, width)``.

    Example:
        >>> layer = CrossLayer(3)
        >>> x0 = torch.randn(2, 3)
        >>> layer(x0, x0).shape
        torch.Size([2, 3])
    """

    def __init__(self, width: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(width).uniform_(-width ** -0.5, width ** -0.5))
        self.bias = nn.Parameter(torch.zeros(width))

    def forward(self, x0: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        scale = x @ self.weight                                     # (B,)
        return x0 * scale[:, None] + self.bias + x


class DCN(nn.Module):
    """DCN: ``x0`` is the flattened field embeddings followed by the dense features; a stack of
    cross layers and a deep MLP both read ``x0``, and a linear head over their two outputs gives
    the logit.

    Args:
        embedding: any module mapping keys ``(B, F)`` to rows ``(B, F, dim)``: ``nn.Embedding``
            or ``het.Embedding``.
        num_fields, dim: categorical fields and embedding width.
        num_dense: dense features.
        num_cross: cross layers.
        hidden: the deep MLP's layer sizes.

    Shape:
        dense ``(B, num_dense)``, sparse ``(B, num_fields)`` int64 -> logits ``(B,)``.

    Example:
        >>> model = DCN(nn.Embedding(100, 4), num_fields=3, dim=4, num_dense=2, num_cross=2,
        ...             hidden=(8, 8))
        >>> model(torch.zeros(5, 2), torch.zeros(5, 3, dtype=torch.int64)).shape
        torch.Size([5])
    """

    def __init__(self, embedding: nn.Module, num_fields: int, dim: int, num_dense: int = 13,
                 num_cross: int = 3, hidden: tuple[int, ...] = (256, 256, 256)):
        super().__init__()
        width = num_fields * dim + num_dense
        self.embedding = embedding
        self.cross = nn.ModuleList(CrossLayer(width) for _ in range(num_cross))
        self.deep = mlp([width, *hidden])
        self.head = nn.Linear(width + hidden[-1], 1)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        x0 = torch.cat([self.embedding(sparse).flatten(1), dense], dim=1)  # (B, F * D + num_dense)
        x = x0
        for layer in self.cross:
            x = layer(x0, x)                                        # (B, F * D + num_dense)
        deep = self.deep(x0)                                        # (B, H)
        return self.head(torch.cat([x, deep], dim=1)).squeeze(1)
