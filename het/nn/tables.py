"""What a :class:`het.nn.embedding.Embedding` is built from when it is not given everything: its
tables from ``num_embeddings`` and ``embedding_dim`` (``torch.nn.Embedding``'s arguments), and,
without a client, shards of its own in this process."""

from __future__ import annotations

from het.config import OptimizerConfig, TableConfig


def module_tables(num, dim, tables, optimizer, lr) -> list[TableConfig]:
    """The module's tables: ``tables`` (one or several), or one table ``embedding`` of ``num``
    rows of ``dim`` with ``optimizer`` (a name or config) at ``lr``.

    Example:
        >>> [(t.name, t.rows, t.dim, t.optimizer.name) for t in module_tables(10, 4, None, "sgd", 0.1)]
        [('embedding', 10, 4, 'sgd')]
    """
    if tables is not None:
        if num is not None or dim is not None:
            raise ValueError("give either num_embeddings and embedding_dim, or tables, not both")
        return [tables] if isinstance(tables, TableConfig) else list(tables)
    if num is None or dim is None:
        raise ValueError("give num_embeddings and embedding_dim, or tables")
    opt = optimizer if isinstance(optimizer, OptimizerConfig) else OptimizerConfig(optimizer, lr=lr)
    return [TableConfig("embedding", rows=num, dim=dim, optimizer=opt)]


def own_shards(tables: list[TableConfig], num_shards: int):
    """A client of ``num_shards`` shards in this process holding ``tables``: the module used alone.
    Imported here, when asked for, so that a worker, which passes its client, loads no shard."""
    from het.ps.local import local_client

    return local_client(tables, num_shards)
