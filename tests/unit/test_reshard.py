"""Resharding a saved PS: every row, clock, touched mark and optimizer state moves to the shard
that key % S' names, so the resharded PS answers and trains exactly as the original."""

import os

import pytest
import torch

from het.config import OptimizerConfig, TableConfig
from het.ps.client.client import PSClient
from het.ps.local import local_client
from het.ps.protocol import partition
from het.ps.reshard import reshard

TABLES = [TableConfig("a", rows=103, dim=4, optimizer=OptimizerConfig("adagrad", lr=0.1)),
          TableConfig("b", rows=7, dim=2, optimizer=OptimizerConfig("adam", lr=0.01))]


def trained(num_shards: int) -> tuple[PSClient, dict]:
    """A PS of ``num_shards`` shards after a few pushes, and each table's pushed keys (the rows
    it marks touched)."""
    client = local_client(TABLES, num_shards)
    g = torch.Generator().manual_seed(num_shards)
    pushed = {}
    for table in TABLES:
        pushed[table.name] = torch.zeros(table.rows, dtype=torch.bool)
        for step in range(1, 4):
            keys = torch.unique(torch.randint(0, table.rows, (table.rows // 2,), generator=g))
            client.wait(client.push(table.name, keys, torch.randn(len(keys), table.dim, generator=g),
                                    torch.randint(1, 3, (len(keys),), generator=g), step=step))
            pushed[table.name][keys] = True
    return client, pushed


def touched(client: PSClient, table: TableConfig) -> torch.Tensor:
    """Every key's touched mark, read off the in-process shards. Shape: (rows,) bool."""
    out = torch.zeros(table.rows, dtype=torch.bool)
    for i, channel in enumerate(client.channels):
        marks = channel.shard.tables[table.name].touched
        out[partition.global_keys(torch.arange(len(marks)), i, len(client.channels))] = marks
    return out


@pytest.mark.parametrize("before, after", [(1, 3), (3, 2), (2, 2), (4, 1)])
def test_a_resharded_ps_answers_and_trains_as_the_original(tmp_path, before, after):
    original, pushed = trained(before)
    original.save(str(tmp_path / "old"))
    paths = reshard(str(tmp_path / "old"), str(tmp_path / "new"), after)
    assert [os.path.basename(p) for p in paths] == [f"shard-{j}.pt" for j in range(after)]
    moved = local_client(TABLES, after)
    moved.load(str(tmp_path / "new"))
    assert not pushed["a"].all() and pushed["a"].any()  # some keys untouched, some touched
    for table in TABLES:
        # touched marks moved with their keys: exactly the pushed keys, an untouched key stays
        # untouched (its row is still built by the client, not sent)
        expected = pushed[table.name].nonzero().flatten().tolist()
        assert touched(original, table).nonzero().flatten().tolist() == expected
        assert touched(moved, table).nonzero().flatten().tolist() == expected
        keys = torch.arange(table.rows)
        rows, clocks = original.wait(original.pull(table.name, keys))
        rows2, clocks2 = moved.wait(moved.pull(table.name, keys))
        assert torch.equal(rows, rows2) and torch.equal(clocks, clocks2)
        # the optimizer state moved with its rows: one more identical push gives identical rows
        grads = torch.ones(table.rows, table.dim)
        for client in (original, moved):
            client.wait(client.push(table.name, keys, grads, torch.ones(table.rows, dtype=torch.int64), step=4))
        assert torch.equal(original.wait(original.pull(table.name, keys))[0], moved.wait(moved.pull(table.name, keys))[0])
        assert bool(touched(moved, table).all())


def test_reshard_refuses_an_incomplete_or_mixed_save_and_a_used_destination(tmp_path):
    trained(3)[0].save(str(tmp_path / "old"))
    with pytest.raises(ValueError, match="not empty"):
        reshard(str(tmp_path / "old"), str(tmp_path / "old"), 2)
    os.remove(tmp_path / "old" / "shard-1.pt")
    with pytest.raises(ValueError, match=r"holds shards \[0, 2\].*expected shards 0..2 of 3"):
        reshard(str(tmp_path / "old"), str(tmp_path / "new"), 2)
    with pytest.raises(ValueError, match="no shard files"):
        reshard(str(tmp_path / "nothing"), str(tmp_path / "new2"), 2)
    with pytest.raises(ValueError, match="num_shards must be an int >= 1"):
        reshard(str(tmp_path / "old"), str(tmp_path / "new3"), 0)


def test_a_damaged_save_is_refused_naming_it_and_nothing_is_written(tmp_path):
    from damage import flip_in_largest_member
    from het.files import DamagedFile

    client, _ = trained(2)
    client.save(str(tmp_path / "src"))
    save = tmp_path / "src" / "shard-1.pt"
    flip_in_largest_member(save, 0x10)
    with pytest.raises(DamagedFile, match=rf"{save}: .*bytes .*damaged"):
        reshard(str(tmp_path / "src"), str(tmp_path / "dst"), 3)
    assert not (tmp_path / "dst").exists() or os.listdir(tmp_path / "dst") == []
