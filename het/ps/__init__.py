"""The parameter server, in two rooms and the actors between them.

- ``store/``: each table's rows, clocks and optimizer state behind one interface
  (:class:`~het.ps.store.rowstore.RowStore`), with the optimizers, the disk tier, the
  write-ahead log and the saves beneath it;
- ``wire/``: what travels (the protocol, its signing and transport), what a client checks and
  routes before a request leaves, what a shard accepts, and how replies merge;
- what both share: how keys spread over shards (partition), the limits a request keeps, the
  initial value of a row no push touched (initial);
- the shard (wire requests in, stores answering), the server that puts it behind a transport,
  and the client, ps-lite style.
"""

from __future__ import annotations

import importlib

# each public name and its module, imported on first use (PEP 562): the launcher, which starts
# shards as processes (het.ps.server_process), loads neither the client nor the store nor torch
_PUBLIC = {"PSClient": "het.ps.client", "ServerProcess": "het.ps.server_process", "ServerThread": "het.ps.server",
           "Shard": "het.ps.shard", "AuthError": "het.ps.wire.protocol", "ProtocolError": "het.ps.wire.protocol",
           "PSError": "het.ps.wire.protocol", "VersionError": "het.ps.wire.protocol", "Handle": "het.ps.wire.replies",
           "SyncResult": "het.ps.wire.replies"}


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'het.ps' has no attribute {name!r}")


__all__ = sorted(_PUBLIC)
