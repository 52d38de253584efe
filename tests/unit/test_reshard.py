"""Resharding a saved PS: every row, clock, touched mark and optimizer state moves to the shard
that key % S' names, so the resharded PS answers and trains exactly as the original."""

import os

import pytest
import torch

from het.config import OptimizerConfig, TableConfig
from het.ps.client import PSClient
from het.ps.reshard import reshard

TABLES = [TableConfig("a", rows=103, dim=4, optimizer=OptimizerConfig("adagrad", lr=0.1)),
          TableConfig("b", rows=7, dim=2, optimizer=OptimizerConfig("adam", lr=0.01))]


def trained(num_shards: int) -> PSClient:
    client = PSClient.local(TABLES, num_shards)
    g = torch.Generator().manual_seed(num_shards)
    for table in TABLES:
        for step in range(1, 4):
            keys = torch.unique(torch.randint(0, table.rows, (table.rows // 2,), generator=g))
            client.wait(client.push(table.name, keys, torch.randn(len(keys), table.dim, generator=g),
                                    torch.randint(1, 3, (len(keys),), generator=g), step=step))
    return client


@pytest.mark.parametrize("before, after", [(1, 3), (3, 2), (2, 2), (4, 1)])
def test_a_resharded_ps_answers_and_trains_as_the_original(tmp_path, before, after):
    original = trained(before)
    original.save(str(tmp_path / "old"))
    paths = reshard(str(tmp_path / "old"), str(tmp_path / "new"), after)
    assert [os.path.basename(p) for p in paths] == [f"shard-{j}.pt" for j in range(after)]
    moved = PSClient.local(TABLES, after)
    moved.load(str(tmp_path / "new"))
    for table in TABLES:
        keys = torch.arange(table.rows)
        rows, clocks = original.wait(original.pull(table.name, keys))
        rows2, clocks2 = moved.wait(moved.pull(table.name, keys))
        assert torch.equal(rows, rows2) and torch.equal(clocks, clocks2)
        # the optimizer state moved with its rows: one more identical push gives identical rows
        grads = torch.ones(table.rows, table.dim)
        for client in (original, moved):
            client.wait(client.push(table.name, keys, grads, torch.ones(table.rows, dtype=torch.int64), step=4))
        assert torch.equal(original.wait(original.pull(table.name, keys))[0], moved.wait(moved.pull(table.name, keys))[0])
    # touched marks moved too: the rows no push reached are still built by the client
    old_touched = sum(int(t.touched.sum()) for s in original.channels for t in s.shard.tables.values())
    new_touched = sum(int(t.touched.sum()) for s in moved.channels for t in s.shard.tables.values())
    assert old_touched == new_touched


def test_reshard_refuses_an_incomplete_or_mixed_save_and_a_used_destination(tmp_path):
    trained(3).save(str(tmp_path / "old"))
    with pytest.raises(ValueError, match="not empty"):
        reshard(str(tmp_path / "old"), str(tmp_path / "old"), 2)
    os.remove(tmp_path / "old" / "shard-1.pt")
    with pytest.raises(ValueError, match=r"holds shards \[0, 2\].*expected shards 0..2 of 3"):
        reshard(str(tmp_path / "old"), str(tmp_path / "new"), 2)
    with pytest.raises(ValueError, match="no shard files"):
        reshard(str(tmp_path / "nothing"), str(tmp_path / "new2"), 2)
    with pytest.raises(ValueError, match="num_shards must be an int >= 1"):
        reshard(str(tmp_path / "old"), str(tmp_path / "new3"), 0)
