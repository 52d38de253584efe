"""The contract every table store keeps (het.ps.server.store.rowstore.RowStore), run over each: a fixed
table, a dynamic one in memory, and a dynamic one tiered between a DRAM pool and disk. The
shard calls them through this interface alone, so each must answer it the same way."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

from het.config import OptimizerConfig, ShardConfig, TableConfig
from het.ps.protocol.initial import initial_rows
from het.ps.server.shard import Shard
from het.ps.server.store.dynamic import DynamicRows
from het.ps.server.store.fixed import FixedRows
from het.ps.server.store.rowstore import RowStore, open_stores

DIM = 4
OPT = OptimizerConfig("adagrad", lr=0.1)


def make(kind: str, tmp_path) -> RowStore:
    if kind == "fixed":
        return FixedRows(TableConfig("t", rows=100, dim=DIM, optimizer=OPT), 0, 1)
    cfg = TableConfig("t", rows=None, dim=DIM, optimizer=OPT)
    if kind == "dynamic":
        return DynamicRows(cfg, 0, 1)
    store = DynamicRows(cfg, 0, 1, disk_dir=str(tmp_path / "tier"))
    store.size_pool(2)  # most rows live on disk
    return store


KINDS = ["fixed", "dynamic", "tiered"]


def protocol_members() -> set[str]:
    return {n for n, v in vars(RowStore).items() if inspect.isfunction(v) and not n.startswith("_")}


@pytest.mark.parametrize("kind", KINDS)
def test_every_store_answers_every_call_of_the_interface(kind, tmp_path):
    store = make(kind, tmp_path)
    assert {n for n in protocol_members() if callable(getattr(store, n, None))} == protocol_members()
    assert store.cfg.dim == DIM and store.optimizer.followed


@pytest.mark.parametrize("kind", KINDS)
def test_a_push_moves_rows_and_clocks_and_the_rest_stay_initial(kind, tmp_path):
    store = make(kind, tmp_path)
    keys = torch.tensor([3, 7, 3, 11])
    store.push(store.locate(keys), torch.ones(4, DIM), torch.tensor([1, 2, 1, 1]), step=1)
    asked = torch.tensor([3, 7, 11, 50])
    at = store.locate(asked)
    assert store.clocks_of(at).tolist() == [2, 2, 1, 0]
    (rows,), sent = store.rows_to_send(at, lazy=False)
    assert sent == 4 and np.array_equal(rows[3], initial_rows(store.cfg, np.array([50]))[0])
    assert not np.allclose(rows[:3], initial_rows(store.cfg, asked[:3].numpy()))
    (touched, built), sent = store.rows_to_send(at, lazy=True)
    assert sent == 3 and built.tolist() == [0, 0, 0, 1] and np.array_equal(touched, rows[:3])
    assert store.local_state(at, full=False).shape == (4, 1)
    assert store.stats()["rows"] >= 3


@pytest.mark.parametrize("kind", KINDS)
def test_a_push_that_would_overflow_is_refused_whole(kind, tmp_path):
    store = make(kind, tmp_path)
    at = store.locate(torch.tensor([1, 2]))
    before = store.rows_to_send(at, lazy=False)[0][0].copy()
    with pytest.raises(ValueError, match="non-finite"):
        store.push(at, torch.full((2, DIM), 3e38), torch.ones(2, dtype=torch.int64), 1)  # its square overflows
    assert np.array_equal(store.rows_to_send(store.locate(torch.tensor([1, 2])), lazy=False)[0][0], before)
    assert store.clocks_of(store.locate(torch.tensor([1, 2]))).tolist() == [0, 0]


@pytest.mark.parametrize("kind", KINDS)
def test_a_save_loads_into_a_fresh_store_as_it_was(kind, tmp_path):
    store, fresh = make(kind, tmp_path), make(kind, tmp_path / "other")
    keys = torch.arange(0, 40, 3)
    store.push(store.locate(keys), torch.randn(len(keys), DIM), torch.ones(len(keys), dtype=torch.int64), 1)
    saved = store.state_dict(str(tmp_path / "rows"))
    fresh.check_state(saved, "save")
    fresh.load_state_dict(saved, str(tmp_path / "rows"))
    at, again = store.locate(keys), fresh.locate(keys)
    assert np.array_equal(store.rows_to_send(at, False)[0][0], fresh.rows_to_send(again, False)[0][0])
    assert torch.equal(store.clocks_of(at), fresh.clocks_of(again))


@pytest.mark.parametrize("kind", KINDS)
def test_only_a_store_with_rows_on_disk_pages_them_in_and_has_a_pool(kind, tmp_path):
    store = make(kind, tmp_path)
    keys = torch.arange(20)
    store.push(store.locate(keys), torch.ones(20, DIM), torch.ones(20, dtype=torch.int64), 1)
    pageable = store.pageable(store.locate(keys))
    held, row_bytes = store.dram_bytes()
    assert held > 0
    if kind == "tiered":
        assert pageable is not None and row_bytes > 0 and store.page_in(pageable) > 0
    else:
        assert pageable is None and row_bytes == 0


def test_open_stores_gives_each_table_its_kind_and_a_shard_fits_the_pools_to_its_budget(tmp_path):
    tables = (TableConfig("fixed", rows=50, dim=DIM), TableConfig("ids", rows=None, dim=DIM))
    stores = open_stores(ShardConfig(tables), None)
    assert isinstance(stores["fixed"], FixedRows) and isinstance(stores["ids"], DynamicRows)
    assert [s.dram_bytes()[1] for s in stores.values()] == [0, 0]
    with pytest.raises(ValueError, match="a memory budget needs a state directory"):
        open_stores(ShardConfig(tables, memory=1 << 20), None)
    shard = Shard(ShardConfig(tables, memory=1 << 20), state_dir=str(tmp_path))
    held = sum(t.dram_bytes()[0] for t in shard.tables.values())
    pool_rows = shard.tables["ids"].store.capacity
    assert pool_rows > 0 and held + pool_rows * shard.tables["ids"].dram_bytes()[1] <= 1 << 20
