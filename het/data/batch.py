"""Batch: the one type that flows from the data to the model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Batch:
    """A batch of CTR samples: dense features, categorical keys and click labels.

    Args:
        dense: the continuous features (13 for Criteo), already transformed, float32.
        sparse: one global key per categorical field (26 for Criteo), int64. Field ``f``'s
            keys lie in its own range of one shared table, so keys of different fields never
            collide (hashed keys: any int64, salted by the field). Multi-hot data holds each
            field's bag of keys instead, the bags side by side, of the same sizes in every
            sample (its ``bag_sizes``): ``(B, sum(bag_sizes))``.
        labels: 1.0 for a click, 0.0 otherwise, float32.

    Shape:
        - dense: (B, num_dense)
        - sparse: (B, num_fields), or (B, sum(bag_sizes)) when multi-hot
        - labels: (B,)

    Example:
        >>> b = Batch(torch.zeros(2, 13), torch.tensor([[0, 5], [1, 7]]), torch.tensor([0.0, 1.0]))
        >>> len(b), b.sparse.shape
        (2, torch.Size([2, 2]))
        >>> len(Batch.cat([b, b.to("cpu")]))
        4
    """

    dense: torch.Tensor
    sparse: torch.Tensor
    labels: torch.Tensor

    def __post_init__(self) -> None:
        _check("dense", self.dense, 2, torch.float32)
        _check("sparse", self.sparse, 2, torch.int64)
        _check("labels", self.labels, 1, torch.float32)
        rows = (self.dense.shape[0], self.sparse.shape[0], self.labels.shape[0])
        if len(set(rows)) != 1:
            raise ValueError(f"dense, sparse and labels must have the same number of rows, got {rows}")

    def __len__(self) -> int:
        return self.labels.shape[0]

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """A new Batch with every tensor on ``device``."""
        return Batch(self.dense.to(device, non_blocking=non_blocking),
                     self.sparse.to(device, non_blocking=non_blocking),
                     self.labels.to(device, non_blocking=non_blocking))

    @classmethod
    def cat(cls, batches: Sequence[Batch]) -> Batch:
        """The rows of ``batches``, one after another, as one Batch.

        Example:
            >>> b = Batch(torch.ones(1, 3), torch.tensor([[4]]), torch.tensor([1.0]))
            >>> Batch.cat([b, b, b]).labels
            tensor([1., 1., 1.])
        """
        if len(batches) == 0:
            raise ValueError("expected at least one Batch to concatenate, got none")
        return cls(torch.cat([b.dense for b in batches]),
                   torch.cat([b.sparse for b in batches]),
                   torch.cat([b.labels for b in batches]))


def _check(name: str, t: torch.Tensor, ndim: int, dtype: torch.dtype) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"Batch.{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.ndim != ndim or t.dtype != dtype:
        raise ValueError(f"Batch.{name} must be a {ndim}-D {dtype} tensor, "
                         f"got {t.ndim}-D {t.dtype} with shape {tuple(t.shape)}")
