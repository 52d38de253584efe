"""Shared fixtures: PS clients over both transports, so contract tests run against each."""

from __future__ import annotations

import shutil

import pytest
import zmq

from het.config import ShardConfig
from het.ps.client.client import PSClient
from het.ps.protocol.transport import LocalTransport
from het.ps.server.server import ServerThread
from het.ps.server.shard import Shard
from het.ps.server.store import saves


class LocalCluster:
    """In-process shards; ``client()`` connects another client to the same shards."""

    def __init__(self, tables, num_shards: int = 1):
        self.transport = LocalTransport()
        self.shards = [Shard(ShardConfig(tuple(tables), i, num_shards), state_dir=saves.temporary())
                       for i in range(num_shards)]
        self.names = [self.transport.bind(f"local-{i}", s) for i, s in enumerate(self.shards)]
        self.clients = []

    def client(self, **kwargs) -> PSClient:
        c = PSClient([self.transport.connect(n) for n in self.names], **kwargs)
        self.clients.append(c)
        return c

    def close(self):
        for c in self.clients:
            c.close()
        for s in self.shards:
            shutil.rmtree(s.state_dir, ignore_errors=True)


class ZmqCluster:
    """Shards served over ZeroMQ on 127.0.0.1 from threads of the test process."""

    def __init__(self, tables, num_shards: int = 1):
        self.servers = [ServerThread(ShardConfig(tuple(tables), i, num_shards)) for i in range(num_shards)]
        self.shards = [s.shard for s in self.servers]
        self.clients = []

    def client(self, **kwargs) -> PSClient:
        c = PSClient.connect([s.address for s in self.servers], timeout_s=30, **kwargs)
        self.clients.append(c)
        return c

    def close(self):
        for c in self.clients:
            c.close()
        for s in self.servers:
            s.stop()


@pytest.fixture(params=["local", "zmq"])
def cluster_factory(request):
    """Build a cluster of the parametrised transport: ``cluster_factory(tables, num_shards)``."""
    made = []

    def make(tables, num_shards=1):
        c = (LocalCluster if request.param == "local" else ZmqCluster)(tables, num_shards)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def raw_request(address: str, frames, timeout_ms: int = 10_000) -> list:
    """Send raw frames to a shard from a bare DEALER socket; its reply's frames (bytes)."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    try:
        sock.send_multipart(frames)
        assert sock.poll(timeout_ms), "the shard stopped answering"
        return sock.recv_multipart()
    finally:
        sock.close()


def built(table):
    """``table`` (a shard's fixed table) with every row built, as a save holds them: a test that
    reads or writes its whole ``weight`` or state sees every row's value (a shard builds rows on
    first touch)."""
    table.build_all()
    return table
