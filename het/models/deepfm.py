"""DeepFM for CTR (Guo et al. 2017), as HET trains it on Criteo."""

from __future__ import annotations

import torch
from torch import nn

from het.models.fields import FieldRows, interaction_width
from het.models.wdl import mlp


def fm_interaction(rows: torch.Tensor) -> torch.Tensor:
    """The factorisation machine's second-order term: ``sum_{i<j} <v_i, v_j>`` over the fields,
    computed as ``0.5 * ((sum_i v_i)^2 - sum_i v_i^2)`` summed over the embedding width.

    Shape:
        rows ``(B, F, D)`` -> ``(B,)``.

    Example:
        >>> fm_interaction(torch.tensor([[[1., 2.], [3., 4.], [0., 1.]]]))  # 11 + 2 + 4
        tensor([17.])
    """
    square_of_sum = rows.sum(dim=1) ** 2                           # (B, D)
    sum_of_squares = (rows ** 2).sum(dim=1)                        # (B, D)
    return 0.5 * (square_of_sum - sum_of_squares).sum(dim=1)


class DeepFM(nn.Module):
    """DeepFM: a first-order term, the FM second-order term over the field embeddings, and a deep
    MLP over the flattened embeddings and the dense features, added into one logit (plus a linear
    term over the dense features).

    The first-order term is a scalar weight per key. The embedding's rows are ``dim`` wide, so
    those weights come from a second module ``first_order`` (a table of width 1, e.g.
    ``nn.Embedding(rows, 1)`` or ``het.Embedding(rows, 1)``, as HET's DeepFM uses). When
    ``first_order`` is ``None`` the first-order term is instead a linear layer over the
    flattened embeddings, which needs no second table.

    Args:
        embedding: any module mapping keys ``(B, F)`` to rows ``(B, F, dim)``: ``nn.Embedding``
            or ``het.Embedding``.
        num_fields, dim: categorical fields and embedding width; or each field's width, for
            tables of several widths (:mod:`het.models.fields`: the FM term pairs them at the
            widest, the narrower projected).
        num_dense: dense features.
        hidden: the deep MLP's layer sizes; a plain linear layer maps the last to the logit.
        first_order: ``None``, or a module mapping keys ``(B, F)`` to weights ``(B, F, 1)``.

    Shape:
        dense ``(B, num_dense)``, sparse ``(B, num_fields)`` int64 -> logits ``(B,)``.

    Example (key k's row is [2k, 2k + 1], the deep part is switched off, the dense term is d):
        >>> emb, first = nn.Embedding(10, 2), nn.Embedding(10, 1)
        >>> def switch_deep_off(model):
        ...     with torch.no_grad():
        ...         _ = model.head.weight.zero_(), model.head.bias.zero_()
        ...         _ = model.dense_linear.weight.fill_(1), model.dense_linear.bias.zero_()
        >>> with torch.no_grad():  # key k's first-order weight is k
        ...     _ = emb.weight.copy_(torch.arange(20.).view(10, 2)), first.weight.copy_(torch.arange(10.)[:, None])
        >>> dense, sparse = torch.tensor([[0.5]]), torch.tensor([[1, 3]])
        >>> model = DeepFM(emb, num_fields=2, dim=2, num_dense=1, hidden=(4,), first_order=first)
        >>> switch_deep_off(model)
        >>> model(dense, sparse).tolist()  # first 1 + 3, FM <[2, 3], [6, 7]> = 33, dense 0.5
        [37.5]
        >>> model = DeepFM(emb, num_fields=2, dim=2, num_dense=1, hidden=(4,))  # first order: a linear layer
        >>> switch_deep_off(model)
        >>> with torch.no_grad():
        ...     _ = model.first_linear.weight.fill_(1)
        >>> model(dense, sparse).tolist()  # first 2 + 3 + 6 + 7, FM 33, dense 0.5
        [51.5]
    """

    def __init__(self, embedding: nn.Module, num_fields: int, dim: int | tuple[int, ...], num_dense: int = 13,
                 hidden: tuple[int, ...] = (256, 256, 256), first_order: nn.Module | None = None):
        super().__init__()
        self.embedding = embedding
        self.first_order = first_order
        self.fields = FieldRows(num_fields, dim, common=interaction_width(dim))
        # without a width-1 table, a linear layer over the embeddings plays the first-order term
        self.first_linear = nn.Linear(self.fields.width, 1, bias=False) if first_order is None else None
        self.dense_linear = nn.Linear(num_dense, 1)                # carries the model's bias
        self.deep = mlp([self.fields.width + num_dense, *hidden])
        self.head = nn.Linear(hidden[-1], 1)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        out = self.embedding(sparse)                                # (B, F, D), or a group a width
        flat = self.fields.flat(out)                                # (B, F * D)
        if self.first_order is None:
            first = self.first_linear(flat).squeeze(1)              # (B,)
        else:
            weights = self.first_order(sparse)                      # (B, F, 1)
            if weights.shape != (*sparse.shape, 1):
                raise ValueError(f"first_order must map keys {tuple(sparse.shape)} to weights "
                                 f"{(*sparse.shape, 1)}, got {tuple(weights.shape)}")
            first = weights.sum(dim=(1, 2))                         # (B,)
        second = fm_interaction(self.fields.paired(out))            # (B,)
        deep = self.head(self.deep(torch.cat([flat, dense], dim=1))).squeeze(1)
        return first + second + deep + self.dense_linear(dense).squeeze(1)
