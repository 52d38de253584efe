"""Deep & Cross Network for CTR (Wang et al. 2017), as HET trains it on Criteo."""

from __future__ import annotations

import torch
from torch import nn

from het.models.fields import FieldRows
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
        >>> with torch.no_grad():
        ...     _ = layer.weight.copy_(torch.tensor([1., 0., -1.])), layer.bias.fill_(0.5)
        >>> x0 = torch.tensor([[1., 2., 3.]])
        >>> layer(x0, x0).tolist()  # x0 . w = -2: x0 * -2 + 0.5 + x0
        [[-0.5, -1.5, -2.5]]
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
        num_fields, dim: categorical fields and embedding width; or each field's width, for
            tables of several widths (``x0`` holds them side by side).
        num_dense: dense features.
        num_cross: cross layers.
        hidden: the deep MLP's layer sizes.

    Shape:
        dense ``(B, num_dense)``, sparse ``(B, num_fields)`` int64 -> logits ``(B,)``.

    Example:
        >>> emb = nn.Embedding(10, 2)
        >>> model = DCN(emb, num_fields=2, dim=2, num_dense=1, num_cross=1, hidden=(4,))
        >>> with torch.no_grad():  # key k's row is [2k, 2k + 1]; the head reads the cross output only
        ...     _ = emb.weight.copy_(torch.arange(20.).view(10, 2)), model.cross[0].weight.fill_(0.5)
        ...     _ = model.head.weight.zero_(), model.head.weight[0, :5].fill_(1), model.head.bias.zero_()
        >>> x0 = [2, 3, 6, 7, 1]  # rows 1 and 3, then the dense feature; x0 . w = 9.5
        >>> model(torch.tensor([[1.]]), torch.tensor([[1, 3]])).tolist(), sum(x0) * 9.5 + sum(x0)
        ([199.5], 199.5)
    """

    def __init__(self, embedding: nn.Module, num_fields: int, dim: int | tuple[int, ...], num_dense: int = 13,
                 num_cross: int = 3, hidden: tuple[int, ...] = (256, 256, 256)):
        super().__init__()
        self.fields = FieldRows(num_fields, dim)
        width = self.fields.width + num_dense
        self.embedding = embedding
        self.cross = nn.ModuleList(CrossLayer(width) for _ in range(num_cross))
        self.deep = mlp([width, *hidden])
        self.head = nn.Linear(width + hidden[-1], 1)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        x0 = torch.cat([self.fields.flat(self.embedding(sparse)), dense], dim=1)  # (B, F * D + num_dense)
        x = x0
        for layer in self.cross:
            x = layer(x0, x)                                        # (B, F * D + num_dense)
        deep = self.deep(x0)                                        # (B, H)
        return self.head(torch.cat([x, deep], dim=1)).squeeze(1)
