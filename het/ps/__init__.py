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

from het.ps.client import PSClient
from het.ps.server import ServerProcess, ServerThread
from het.ps.shard import Shard
from het.ps.wire.protocol import AuthError, ProtocolError, PSError, VersionError
from het.ps.wire.replies import Handle, SyncResult

__all__ = ["AuthError", "Handle", "PSClient", "PSError", "ProtocolError", "ServerProcess", "ServerThread", "Shard",
           "SyncResult", "VersionError"]
