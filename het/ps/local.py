"""A PS in this process: shards behind a client over an in-process transport, for tests, for
``het.Embedding`` used alone, and for tools. It stands above both sides, the one place a client
and shards meet in a process, so that a worker's client imports nothing of the server."""

from __future__ import annotations

from het.config import ShardConfig, TableConfig
from het.ps.client.client import PSClient
from het.ps.protocol.transport import LocalTransport
from het.ps.server.shard import Shard
from het.ps.server.store import saves


def local_client(tables: list[TableConfig], num_shards: int = 1, lazy_init: bool = True, **options) -> PSClient:
    """Start ``num_shards`` in-process shards holding ``tables`` and connect a client to them;
    ``options``: more :class:`het.config.ShardConfig` fields (``memory``...).

    Example:
        >>> import torch
        >>> client = local_client([TableConfig("t", rows=10, dim=2)], num_shards=2)
        >>> rows, clocks = client.wait(client.pull("t", torch.tensor([3])))
        >>> rows.shape, clocks.tolist()
        (torch.Size([1, 2]), [0])
    """
    transport = LocalTransport()
    names = [transport.bind(f"local-{i}", Shard(ShardConfig(tuple(tables), i, num_shards, **options),
                                               state_dir=saves.local(i)))
             for i in range(num_shards)]
    return PSClient([transport.connect(n) for n in names], lazy_init=lazy_init)
