"""A shard with a disk tier (`het serve --memory`), as an operator meets it: killed with -9 and
started again, it loads exactly its last save; with a write-ahead log, the pushes after it too."""

from __future__ import annotations

import signal

import pytest
import torch

from het.config import OptimizerConfig, ShardConfig, TableConfig
from het.ps.client import PSClient
from het.ps.server import ServerProcess

pytestmark = pytest.mark.cluster

TABLE = TableConfig("emb", rows=None, dim=16, optimizer=OptimizerConfig("adagrad", lr=0.1), seed=5)
CFG = ShardConfig((TABLE,), memory=2_600_000)  # room for a few thousand rows beside the index


def push_steps(client, steps, first=1):
    g = torch.Generator().manual_seed(first)
    for step in range(first, first + steps):
        keys = torch.unique(torch.randint(-2**40, 2**40, (3000,), generator=g) % 40_000)
        grads = torch.randn(len(keys), 16, generator=g)
        client.wait(client.push("emb", keys, grads, torch.ones(len(keys), dtype=torch.int64), step=step))


def pull_all(client):
    keys = torch.arange(40_000)
    return client.wait(client.pull("emb", keys))


def kill(server):
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait()


def test_a_killed_shard_with_a_disk_tier_loads_exactly_its_last_save(tmp_path):
    with ServerProcess(CFG, state_dir=str(tmp_path)) as first:
        client = PSClient.connect([first.address])
        push_steps(client, 10)
        client.save_named("s1")
        saved = pull_all(client)
        stats = client.stats()[0]["tables"]["emb"]
        push_steps(client, 5, first=11)  # after the save: these are lost with the process
        assert not torch.equal(pull_all(client)[0], saved[0])
        kill(first)
        client.close()
    assert stats["rows_on_disk"] > stats["rows_in_memory"] > 0
    with ServerProcess(CFG, state_dir=str(tmp_path)) as second:
        client = PSClient.connect([second.address])
        client.load_named("s1")
        rows, clocks = pull_all(client)
        after = client.stats()[0]["tables"]["emb"]
        client.close()
    assert torch.equal(rows, saved[0]) and torch.equal(clocks, saved[1])
    assert after["rows"] == stats["rows"] and after["rows_on_disk"] > 0


def test_with_a_log_the_killed_shard_also_replays_the_pushes_after_its_save(tmp_path):
    with ServerProcess(CFG, state_dir=str(tmp_path), wal=True) as first:
        client = PSClient.connect([first.address])
        push_steps(client, 10)
        client.save_named("s1")  # the log's base: its disk tier linked, not copied
        push_steps(client, 8, first=11)
        expected = pull_all(client)
        kill(first)
        client.close()
    with ServerProcess(CFG, state_dir=str(tmp_path), wal=True) as second:
        client = PSClient.connect([second.address])
        rows, clocks = pull_all(client)
        stats = client.stats()[0]
        client.close()
    assert torch.equal(rows, expected[0]) and torch.equal(clocks, expected[1])
    assert stats["wal_replayed"] == 8 and stats["tables"]["emb"]["rows_on_disk"] > 0
