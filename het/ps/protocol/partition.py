"""How keys are spread over PS shards.

Fixed tables: ``shard = key % S``, ``local row = key // S``. Dynamic tables (any int64 key,
:mod:`het.ps.server.store.dynamic`): ``shard = mix(key) % S`` with a 64-bit mixing hash, since raw ids often
share their low bits (a hash of a user id times 1024, say) and ``key % S`` would put them all on
one shard; a dynamic shard finds a key's row through its own index.

Modulo partitioning keeps every shard's slice of a table dense (shard ``i`` holds keys
``i, i + S, i + 2S, ...``), so a shard indexes rows directly with no hash map, and consecutive
hot ids (label-encoded Criteo fields put each field's ids side by side) land on different
shards. The rule works on whole tensors of keys.
"""

from __future__ import annotations

import torch

from het import native

_M1, _M2 = -4658895280553007687, -7723592293110705685  # splitmix64's multipliers as int64


def mix(keys: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 keys (wrapping products, logical shifts): every bit of
    the key moves every bit of the result. Runs on the keys' device.

    Example:
        >>> mix(torch.tensor([0, 1, -1])).tolist()
        [0, 6238072747940578789, -5417735806833148549]
    """
    x = keys.to(torch.int64)
    for shift, mul in ((30, _M1), (27, _M2), (31, None)):
        x = x ^ ((x >> shift) & ((1 << (64 - shift)) - 1))
        if mul is not None:
            x = x * mul
    return x


def shard_of(keys: torch.Tensor, num_shards: int, hashed: bool = False) -> torch.Tensor:
    """The shard that holds each key (``hashed``: a dynamic table's rule, ``mix(key) % S``).

    Example:
        >>> shard_of(torch.tensor([0, 1, 5, 6]), 3).tolist()
        [0, 1, 2, 0]
        >>> shard_of(torch.tensor([1024, 2048, 3072, 4096, 5120, 6144]), 3, hashed=True).tolist()  # multiples of 1024, spread
        [2, 0, 2, 2, 0, 1]
    """
    return torch.remainder(mix(keys) if hashed else keys, num_shards)


def local_rows(keys: torch.Tensor, num_shards: int) -> torch.Tensor:
    """The row index of each key inside its shard: on one shard, ``keys`` itself (not a copy).

    Example:
        >>> local_rows(torch.tensor([0, 5, 6]), 3).tolist(), local_rows(torch.tensor([4]), 1).tolist()
        ([0, 1, 2], [4])
    """
    if num_shards == 1:
        return keys
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


def split(keys: torch.Tensor, num_shards: int, hashed: bool = False) -> list[torch.Tensor]:
    """Positions of ``keys`` that go to each shard, in their original order (``hashed``: by the
    dynamic tables' rule): on the CPU in one native counting pass, else by torch's stable sort
    (the reference, which the tests hold it to).

    Returns one int64 tensor of positions per shard (possibly empty).

    Example:
        >>> [p.tolist() for p in split(torch.tensor([4, 3, 7, 0]), 2)]
        [[0, 3], [1, 2]]
    """
    if num_shards == 1:
        return [torch.arange(keys.numel(), device=keys.device)]
    if native.ops is not None and keys.device.type == "cpu" and keys.dim() == 1:  # one counting pass
        values = mix(keys) if hashed else keys.to(torch.int64)
        order, counts = native.ops.shard_order(values.contiguous(), num_shards)
        return list(torch.split(order, counts.tolist()))
    shards = shard_of(keys, num_shards, hashed)
    order = torch.sort(shards, stable=True).indices
    counts = torch.bincount(shards, minlength=num_shards).tolist()
    return list(torch.split(order, counts))
