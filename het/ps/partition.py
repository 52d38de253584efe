"""How keys are spread over PS shards: ``shard = key % S``, ``local row = key // S``.

Modulo partitioning keeps every shard's slice of a table dense (shard ``i`` holds keys
``i, i + S, i + 2S, ...``), so a shard indexes rows directly with no hash map, and consecutive
hot ids (label-encoded Criteo fields put each field's ids side by side) land on different
shards. The rule works on whole tensors of keys.
"""

from __future__ import annotations

import torch


def shard_of(keys: torch.Tensor, num_shards: int) -> torch.Tensor:
    """The shard that holds each key.

    Example:
        >>> shard_of(torch.tensor([0, 1, 5, 6]), 3).tolist()
        [0, 1, 2, 0]
    """
    return torch.remainder(keys, num_shards)


def local_rows(keys: torch.Tensor, num_shards: int) -> torch.Tensor:
    """The row index of each key inside its shard."""
    return torch.div(keys, num_shards, rounding_mode="floor")


def global_keys(local: torch.Tensor, index: int, num_shards: int) -> torch.Tensor:
    """Inverse of :func:`local_rows` for shard ``index``."""
    return local * num_shards + index


def rows_on_shard(rows: int, index: int, num_shards: int) -> int:
    """How many of a table's ``rows`` keys shard ``index`` holds.

    Example:
        >>> [rows_on_shard(10, i, 3) for i in range(3)]
        [4, 3, 3]
    """
    return max(0, (rows - index + num_shards - 1) // num_shards)


def split(keys: torch.Tensor, num_shards: int) -> list[torch.Tensor]:
    """Positions of ``keys`` that go to each shard, in their original order.

    Returns one int64 tensor of positions per shard (possibly empty).

    Example:
        >>> [p.tolist() for p in split(torch.tensor([4, 3, 7, 0]), 2)]
        [[0, 3], [1, 2]]
    """
    if num_shards == 1:
        return [torch.arange(keys.numel(), device=keys.device)]
    shards = shard_of(keys, num_shards)
    order = torch.sort(shards, stable=True).indices
    counts = torch.bincount(shards, minlength=num_shards).tolist()
    return list(torch.split(order, counts))
