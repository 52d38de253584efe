"""The parameter server, by side, ps-lite style:

- ``protocol/``: what both sides share (the messages, their signing and transport, the rules a
  request keeps, how keys spread over shards, the initial rows, where a save sits on disk);
- ``client/``: the worker's side, which imports nothing of the server;
- ``server/``: the shard's side (the stores beneath the shard, the server, its process);
- ``local``: shards in this process behind a client (tests, het.Embedding alone), and
  ``reshard``, the offline tool: the ends, above both sides.
"""

from __future__ import annotations

import importlib

# each public name and its module, imported on first use (PEP 562): the launcher, which starts
# shards as processes (het.ps.server.process), loads neither the client nor the store nor torch
_PUBLIC = {"PSClient": "het.ps.client.client", "ServerProcess": "het.ps.server.process", "ServerThread": "het.ps.server.server",
           "Shard": "het.ps.server.shard", "AuthError": "het.ps.protocol.messages", "ProtocolError": "het.ps.protocol.messages",
           "PSError": "het.ps.protocol.messages", "VersionError": "het.ps.protocol.messages", "Handle": "het.ps.client.replies",
           "SyncResult": "het.ps.client.replies"}


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'het.ps' has no attribute {name!r}")


__all__ = sorted(_PUBLIC)
