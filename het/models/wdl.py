"""Wide&Deep for CTR, as HET trains it on Criteo."""

from __future__ import annotations

import torch
from torch import nn

from het.models.fields import FieldRows


def mlp(sizes: list[int]) -> nn.Sequential:
    """Linear layers of ``sizes`` with ReLU between them (and after the last).

    Example:
        >>> net = mlp([2, 3, 1])
        >>> _ = [nn.init.ones_(p) for p in net.parameters()]  # every weight and bias 1
        >>> net(torch.tensor([[1., 2.], [-4., 1.]])).tolist()  # 3 * relu(1 + 2 + 1) + 1; 3 * relu(-2) + 1
        [[13.0], [1.0]]
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
        num_fields, dim: categorical fields and embedding width; or each field's width, for
            tables of several widths (the wide part holds them side by side).
        num_dense: dense features.
        hidden: the deep MLP's layer sizes.

    Shape:
        dense ``(B, num_dense)``, sparse ``(B, num_fields)`` int64 -> logits ``(B,)``.

    Example:
        >>> emb = nn.Embedding(10, 2)
        >>> model = WideDeep(emb, num_fields=2, dim=2, num_dense=1, hidden=(3,))
        >>> with torch.no_grad():  # key k's row is [2k, 2k + 1]; every other weight 1, biases 0
        ...     _ = emb.weight.copy_(torch.arange(20.).view(10, 2)), model.deep[0].weight.fill_(1)
        ...     _ = model.deep[0].bias.zero_(), model.head.weight.fill_(1), model.head.bias.zero_()
        >>> dense, sparse = torch.tensor([[2.], [-2.]]), torch.tensor([[1, 3], [0, 0]])
        >>> model(dense, sparse).tolist()  # wide 2+3+6+7, deep 3 * relu(2); wide 0+1+0+1, deep 0
        [24.0, 2.0]
    """

    def __init__(self, embedding: nn.Module, num_fields: int, dim: int | tuple[int, ...], num_dense: int = 13,
                 hidden: tuple[int, ...] = (256, 256, 256)):
        super().__init__()
        self.embedding = embedding
        self.fields = FieldRows(num_fields, dim)
        self.deep = mlp([num_dense, *hidden])
        self.head = nn.Linear(self.fields.width + hidden[-1], 1)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        wide = self.fields.flat(self.embedding(sparse))             # (B, F * D)
        deep = self.deep(dense)                                     # (B, H)
        return self.head(torch.cat([wide, deep], dim=1)).squeeze(1)
