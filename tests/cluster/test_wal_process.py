"""`het serve --wal`, as an operator meets it: a shard process killed with -9 and started
again on its state directory answers with every push it acknowledged."""

from __future__ import annotations

import signal

import pytest
import torch

from het.config import OptimizerConfig, ShardConfig, TableConfig
from het.ps.client import PSClient
from het.ps.server import ServerProcess

pytestmark = pytest.mark.cluster


def test_a_killed_shard_restarted_on_its_state_directory_lost_nothing_acknowledged(tmp_path):
    cfg = ShardConfig((TableConfig("t", rows=500, dim=4, optimizer=OptimizerConfig("adam", lr=0.01)),))
    keys = torch.arange(0, 500, 7)
    with ServerProcess(cfg, state_dir=str(tmp_path), wal=True) as first:
        client = PSClient.connect([first.address])
        for step in range(1, 30):
            grads = torch.randn(len(keys), 4, generator=torch.Generator().manual_seed(step))
            client.wait(client.push("t", keys, grads, torch.ones(len(keys), dtype=torch.int64), step=step))
        expected = client.wait(client.pull("t", torch.arange(500)))
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait()
        client.close()
    with ServerProcess(cfg, state_dir=str(tmp_path), wal=True) as second:
        client = PSClient.connect([second.address])
        rows, clocks = client.wait(client.pull("t", torch.arange(500)))
        stats = client.stats()[0]
        client.close()
    assert torch.equal(rows, expected[0]) and torch.equal(clocks, expected[1])
    assert stats["wal_replayed"] == 29
