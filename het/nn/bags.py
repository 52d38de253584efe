"""FieldBags: multi-hot fields pooled into one row per field, for the CTR models."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class FieldBags(nn.Module):
    """Pools each field's bag of keys into one row: keys ``(B, L)`` -> rows ``(B, F, D)``, what
    the CTR models ask of their embedding. Every sample holds ``bag_sizes[f]`` keys of field
    ``f``, the fields' bags side by side (``L = sum(bag_sizes)``), as multi-hot data sets
    (MLPerf's Criteo 1TB) give them.

    Args:
        embedding: a pooling embedding called as ``embedding(keys (N,), offsets (B * F,))``
            -> ``(B * F, D)``: ``nn.EmbeddingBag(mode="sum")`` or ``het.Embedding(mode="sum")``.
        bag_sizes: keys per field, each >= 1.

    Shape:
        keys ``(B, L)`` int64 -> ``(B, F, D)``.

    Example:
        >>> bag = nn.EmbeddingBag(10, 2, mode="sum")
        >>> with torch.no_grad():  # key k's row is [k, k]
        ...     _ = bag.weight.copy_(torch.arange(10.)[:, None].expand(10, 2))
        >>> pooled = FieldBags(bag, bag_sizes=(2, 1))
        >>> pooled(torch.tensor([[1, 2, 5], [0, 0, 9]])).tolist()  # field 0 sums keys 1 and 2
        [[[3.0, 3.0], [5.0, 5.0]], [[0.0, 0.0], [9.0, 9.0]]]
    """

    def __init__(self, embedding: nn.Module, bag_sizes: Sequence[int]):
        super().__init__()
        sizes = [int(n) for n in bag_sizes]  # checked as ints: a model may be built on meta tensors
        if not sizes or min(sizes) < 1:
            raise ValueError(f"bag_sizes: expected one int >= 1 per field, got {tuple(bag_sizes)}")
        self.embedding = embedding
        self.num_fields, self.num_keys = len(sizes), sum(sizes)
        starts = [sum(sizes[:f]) for f in range(len(sizes))]  # each field's first column
        self.register_buffer("starts", torch.tensor(starts, dtype=torch.int64), persistent=False)  # (F,)

    def forward(self, keys: torch.Tensor) -> torch.Tensor:
        if keys.dim() != 2 or keys.shape[1] != self.num_keys:
            raise ValueError(f"expected keys of shape (B, {self.num_keys}) (the fields' bags side by side), "
                             f"got {tuple(keys.shape)}")
        batch = keys.shape[0]
        rows = torch.arange(batch, device=keys.device)[:, None] * self.num_keys  # (B, 1)
        offsets = (rows + self.starts.to(keys.device)).reshape(-1)                # (B * F,)
        return self.embedding(keys.reshape(-1), offsets).view(batch, self.num_fields, -1)

    def extra_repr(self) -> str:
        return f"fields={self.num_fields}, keys={self.num_keys}"
