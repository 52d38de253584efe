"""The parameter server: protocol, shards, transports, client, partitioning, optimizers."""

from het.ps.client import PSClient
from het.ps.wire.replies import Handle, SyncResult
from het.ps.wire.protocol import AuthError, PSError, ProtocolError, VersionError
from het.ps.server import ServerProcess, ServerThread
from het.ps.shard import Shard

__all__ = ["AuthError", "Handle", "PSClient", "PSError", "ProtocolError", "ServerProcess", "ServerThread", "Shard",
           "SyncResult", "VersionError"]
