"""The transport's emulated latency (HET_PS_LATENCY_MS): a lower bound on every round trip,
nothing lost or reordered, the option read and checked. Shards run in threads of this process.
Only lower bounds on time are asserted: an upper bound would fail on a busy machine."""

import os
import threading
import time

import pytest
import torch

from het.config import ShardConfig, TableConfig
from het.ps.client.client import PSClient
from het.ps.protocol.transport import LATENCY_ENV, DelayedChannel, ZmqChannel, ZmqTransport
from het.ps.server.server import ServerThread

TABLE = TableConfig("t", rows=1000, dim=4)


@pytest.fixture
def shards():
    servers = [ServerThread(ShardConfig((TABLE,), i, 2)) for i in range(2)]
    yield [s.address for s in servers]
    for s in servers:
        s.stop()


def test_a_pull_takes_at_least_a_round_trip_of_the_latency(shards):
    client = PSClient.connect(shards, latency_ms=50)
    try:
        keys = torch.arange(0, 1000, 7)
        start = time.monotonic()
        rows, clocks = client.wait(client.pull("t", keys))
        assert time.monotonic() - start >= 2 * 0.050  # one way out, one way back
        plain = PSClient.connect(shards, latency_ms=0)
        try:
            expected_rows, expected_clocks = plain.wait(plain.pull("t", keys))
        finally:
            plain.close()
        assert torch.equal(rows, expected_rows) and torch.equal(clocks, expected_clocks)
    finally:
        client.close()


def test_pipelined_requests_keep_their_order_through_the_delay(shards):
    """A push and the pull sent right after it, without waiting: the pull sees the push."""
    client = PSClient.connect(shards, latency_ms=20)
    try:
        keys = torch.tensor([1, 2, 501, 998])
        before, _ = client.wait(client.pull("t", keys))
        handles = [client.push("t", keys, torch.ones(4, 4), torch.ones(4, dtype=torch.int64), step=i + 1)
                   for i in range(3)]
        pull = client.pull("t", keys)
        rows, clocks = client.wait(pull)
        assert [client.wait(h) for h in handles] == [4, 4, 4]
        assert clocks.tolist() == [3, 3, 3, 3]
        assert not torch.equal(rows, before)  # the shard's SGD moved the rows before the pull read them
    finally:
        client.close()


def test_the_environment_variable_sets_the_latency_and_is_checked(shards, monkeypatch):
    monkeypatch.setenv(LATENCY_ENV, "30")
    channel = ZmqTransport().connect(shards[0])
    assert isinstance(channel, DelayedChannel) and channel.latency_s == pytest.approx(0.030)
    channel.close()
    plain = ZmqTransport(latency_ms=0).connect(shards[0])
    assert isinstance(plain, ZmqChannel)  # an explicit 0 wins over the environment
    plain.close()
    monkeypatch.setenv(LATENCY_ENV, "soon")
    with pytest.raises(ValueError, match="HET_PS_LATENCY_MS must be a number of milliseconds >= 0, got 'soon'"):
        ZmqTransport().connect(shards[0])
    ZmqTransport().bind("127.0.0.1:0").close()  # a shard never reads the client's latency
    with pytest.raises(ValueError, match="latency_ms must be a number of milliseconds >= 0, got -1"):
        ZmqTransport(latency_ms=-1)


def test_close_stops_the_relay_thread(shards):
    before = {t.name for t in threading.enumerate()}
    client = PSClient.connect(shards, latency_ms=5)
    relays = [t for t in threading.enumerate() if t.name.startswith("het-delay") and t.name not in before]
    assert len(relays) == 2  # one per shard
    client.close()
    assert not any(t.is_alive() for t in relays)


def test_the_e2e_latency_scope_restores_the_environment(monkeypatch):
    from het.bench.e2e import ps_latency

    monkeypatch.setenv(LATENCY_ENV, "7")
    with ps_latency(40):
        assert os.environ[LATENCY_ENV] == "40.0"
    assert os.environ[LATENCY_ENV] == "7"
    monkeypatch.delenv(LATENCY_ENV)
    with ps_latency(None):
        assert LATENCY_ENV not in os.environ
    with pytest.raises(ValueError, match="latency_ms must be a number of milliseconds >= 0, got 'x'"):
        with ps_latency("x"):
            pass
    assert LATENCY_ENV not in os.environ
