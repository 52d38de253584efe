"""The parameter server: protocol, shards, transports, client, partitioning, optimizers."""

from het.ps.client import Handle, PSClient, SyncResult
from het.ps.protocol import PSError, ProtocolError, VersionError
from het.ps.server import ServerProcess, ServerThread
from het.ps.shard import Shard

__all__ = ["Handle", "PSClient", "PSError", "ProtocolError", "ServerProcess", "ServerThread", "Shard",
           "SyncResult", "VersionError"]
