"""DLRM for CTR (Naumov et al. 2019): a bottom MLP, pairwise dot interactions, a top MLP."""

from __future__ import annotations

import torch
from torch import nn

from het.models.fields import FieldRows, interaction_width
from het.models.wdl import mlp


def dot_interaction(vectors: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    """The dot products ``<v_i, v_j>`` of the pairs ``pairs`` of the vectors of each example.

    Args:
        vectors: ``(B, N, D)``.
        pairs: ``(2, P)`` int64 indices ``(i, j)``, e.g. ``torch.triu_indices(N, N, offset=1)``
            for every pair ``i < j``.

    Shape:
        -> ``(B, P)``.

    Example:
        >>> v = torch.tensor([[[1., 0.], [2., 3.], [4., 5.]]])
        >>> dot_interaction(v, torch.triu_indices(3, 3, offset=1))  # (0,1) (0,2) (1,2)
        tensor([[ 2.,  4., 23.]])
    """
    gram = torch.bmm(vectors, vectors.transpose(1, 2))             # (B, N, N)
    return gram[:, pairs[0], pairs[1]]                              # (B, P)


class DLRM(nn.Module):
    """DLRM: a bottom MLP maps the dense features to a ``dim``-wide vector; the dot products of
    every pair of the ``F + 1`` vectors (it and the field embeddings), next to the bottom output,
    feed a top MLP whose last layer, a plain linear one, gives the logit.

    Args:
        embedding: any module mapping keys ``(B, F)`` to rows ``(B, F, dim)``: ``nn.Embedding``
            or ``het.Embedding``.
        num_fields, dim: categorical fields and embedding width; or each field's width, for
            tables of several widths (the dot products pair them at the widest, the bottom MLP's
            output width, the narrower projected).
        num_dense: dense features.
        bottom: the bottom MLP's hidden sizes; a last layer of width ``dim`` (the widest) is appended.
        top: the top MLP's hidden sizes, before the linear layer to the logit.

    Shape:
        dense ``(B, num_dense)``, sparse ``(B, num_fields)`` int64 -> logits ``(B,)``.

    Example (no hidden layers: the bottom MLP is one linear layer and ReLU, the top the head):
        >>> emb = nn.Embedding(10, 2)
        >>> model = DLRM(emb, num_fields=2, dim=2, num_dense=1, bottom=(), top=())
        >>> with torch.no_grad():  # key k's row is [2k, 2k + 1]; bottom: x = relu([d, 2d]); the head sums
        ...     _ = emb.weight.copy_(torch.arange(20.).view(10, 2)), model.bottom[0].bias.zero_()
        ...     _ = model.bottom[0].weight.copy_(torch.tensor([[1.], [2.]]))
        ...     _ = model.head.weight.fill_(1), model.head.bias.zero_()
        >>> model(torch.tensor([[1.]]), torch.tensor([[1, 3]])).tolist()  # x = [1, 2], then its dot products
        [64.0]
        >>> 1 + 2 + (1 * 2 + 2 * 3) + (1 * 6 + 2 * 7) + (2 * 6 + 3 * 7)  # <x, row 1> <x, row 3> <row 1, row 3>
        64
    """

    def __init__(self, embedding: nn.Module, num_fields: int, dim: int | tuple[int, ...], num_dense: int = 13,
                 bottom: tuple[int, ...] = (256, 128), top: tuple[int, ...] = (256, 128)):
        super().__init__()
        vectors, width = num_fields + 1, interaction_width(dim)
        self.embedding = embedding
        self.fields = FieldRows(num_fields, dim, common=width)
        self.bottom = mlp([num_dense, *bottom, width])
        self.register_buffer("pairs", torch.triu_indices(vectors, vectors, offset=1), persistent=False)
        sizes = [width + vectors * (vectors - 1) // 2, *top]        # bottom output, then the pairs
        self.top = mlp(sizes)
        self.head = nn.Linear(sizes[-1], 1)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        x = self.bottom(dense)                                      # (B, D)
        vectors = torch.cat([x[:, None], self.fields.paired(self.embedding(sparse))], dim=1)  # (B, F + 1, D)
        pairs = dot_interaction(vectors, self.pairs)                # (B, (F + 1) F / 2)
        return self.head(self.top(torch.cat([x, pairs], dim=1))).squeeze(1)
