"""Dynamic tables (any int64 key) from the worker's side: the client's routing by mix(key) % S,
its cutting to max_keys, lazy rows built for negative keys, and het.Embedding against the same
training on a fixed table."""

import numpy as np
import pytest
import torch

from het import CacheConfig, Embedding, OptimizerConfig, TableConfig
from het.cache.policy import EMPTY
from het.config import ShardConfig
from het.ps.client.client import PSClient
from het.ps.local import local_client
from het.ps.protocol import partition
from het.ps.protocol.initial import initial_rows
from het.ps.protocol.transport import LocalTransport
from het.ps.server.shard import Shard
from het.ps.server.store import saves

LO, HI = -2**63, 2**63 - 1
RAW = torch.tensor([EMPTY, LO, HI, 0, -2, 1 << 40, 7, -(1 << 50), 12345678901234])
DIM = 3


def table(rows=None, **kw):
    return TableConfig("ids", rows=rows, dim=DIM, optimizer=OptimizerConfig("sgd", lr=0.5), **kw)


def shards(tables, num_shards, max_keys=ShardConfig.max_keys):
    transport = LocalTransport()
    made = [Shard(ShardConfig(tuple(tables), i, num_shards, max_keys=max_keys), state_dir=saves.local(i))
            for i in range(num_shards)]
    names = [transport.bind(f"local-{i}", s) for i, s in enumerate(made)]
    return made, (lambda **kw: PSClient([transport.connect(n) for n in names], **kw))


@pytest.mark.parametrize("lazy", [True, False])
@pytest.mark.parametrize("num_shards", [1, 3])
def test_pull_gives_initial_rows_in_key_order_for_any_int64_key(lazy, num_shards):
    client = local_client([table()], num_shards, lazy_init=lazy)
    keys = RAW[torch.randperm(len(RAW), generator=torch.Generator().manual_seed(0))]
    rows, clocks = client.wait(client.pull("ids", keys))
    assert torch.equal(rows, torch.from_numpy(initial_rows(table(), keys.numpy())))
    assert clocks.tolist() == [0] * len(keys)


def test_pushes_land_on_the_hashed_shard_and_come_back_in_key_order():
    made, connect = shards([table()], 3)
    client = connect()
    counts = torch.ones(len(RAW), dtype=torch.int64)
    grads = torch.arange(len(RAW) * DIM, dtype=torch.float32).reshape(-1, DIM)
    assert client.wait(client.push("ids", RAW, grads, counts)) == len(RAW)
    home = partition.shard_of(RAW, 3, hashed=True)
    assert [s.stats_dict()["tables"]["ids"]["rows"] for s in made] == torch.bincount(home, minlength=3).tolist()
    rows, clocks = client.wait(client.pull("ids", RAW.flip(0)))
    expect = torch.from_numpy(initial_rows(table(), RAW.numpy())) - 0.5 * grads
    assert torch.allclose(rows, expect.flip(0)) and clocks.tolist() == [1] * len(RAW)
    reply = client.wait(client.sync("ids", RAW, torch.tensor([1, 0] * 4 + [1]), bound=0))
    assert reply.index.tolist() == [1, 3, 5, 7] and torch.allclose(reply.rows, expect[1::2])


def test_fixed_tables_keep_their_range_check_and_dynamic_ones_their_dtype_check():
    client = local_client([table(rows=10), TableConfig("raw", rows=None, dim=2)], 2)
    with pytest.raises(ValueError, match="key -1 out of range for table 'ids' with 10 rows"):
        client.pull("ids", torch.tensor([3, -1]))
    with pytest.raises(TypeError, match=r"keys must be int64 \(or int32\), as nn.Embedding takes them, got torch.float32"):
        client.pull("raw", torch.tensor([1.0]))
    client.wait(client.pull("raw", torch.tensor([-1, LO], dtype=torch.int64)))


@pytest.mark.parametrize("max_keys", [1, 2, 5])
def test_requests_cut_to_max_keys_give_what_uncut_ones_give(max_keys):
    """Every verb, 3 shards each taking at most ``max_keys`` keys a request, against shards
    with no such limit; push_sync's pushes are applied before any of its syncs is read."""
    keys = torch.unique(torch.cat([RAW, torch.arange(-20, 20)]))
    grads = torch.randn(len(keys), DIM, generator=torch.Generator().manual_seed(1))
    counts = torch.ones(len(keys), dtype=torch.int64)
    results = []
    for limit in (max_keys, ShardConfig.max_keys):
        _, connect = shards([table()], 3, limit)
        client = connect()
        client.wait(client.push("ids", keys[:20], grads[:20], counts[:20]))
        sync = client.wait(client.sync("ids", keys, torch.full_like(keys, -1), bound=0))
        both = client.wait(client.push_sync("ids", keys, grads, counts, keys.flip(0), torch.zeros_like(keys), bound=0))
        pulled = client.wait(client.pull("ids", keys))
        results.append((sync.index, sync.rows, both.index, both.rows, both.clocks, *pulled))
    for a, b in zip(*results):
        assert torch.equal(a, b)
    assert results[0][2].tolist() == list(range(len(keys)))  # every row changed by the push it rode with


KEYS_6000 = torch.arange(-3000, 3000) * 7919


def _whole_then_in_parts(monkeypatch, requests) -> tuple:
    """``requests(client)`` -> (a handle, its result), run with parts of PART_BYTES (one request
    a shard) and of the floor (1,024 keys) on two shards of 6,000 keys: the handle's parts
    counted, the two results equal; the first."""
    import het.ps.client.client as client_module

    results = []
    for part_bytes in (client_module.PART_BYTES, 0):  # 0: parts of the floor, 1,024 keys
        monkeypatch.setattr(client_module, "PART_BYTES", part_bytes)
        _, connect = shards([table()], 2)
        handle, result = requests(connect())
        sizes = [len(p) for _, _, p in handle.parts]
        if part_bytes:
            assert len(handle.parts) == 2, sizes  # one request a shard
        else:
            assert len(handle.parts) >= 6 and max(sizes) == 1024 and sum(sizes) == len(KEYS_6000), sizes
        results.append(result)
    for a, b in zip(*results):
        assert torch.equal(a, b)
    return results[0]


def test_big_pulls_and_pushes_travel_in_parts_in_flight_together_and_give_what_one_message_gives(monkeypatch):
    """A flush's push or a bulk pull of many rows goes in requests of about PART_BYTES of rows
    (at least 1,024 keys), all sent before any is waited for; the rows are those of whole ones."""
    import het.ps.client.client as client_module

    keys = KEYS_6000
    grads = torch.randn(len(keys), DIM, generator=torch.Generator().manual_seed(2))
    counts = torch.ones(len(keys), dtype=torch.int64)

    def push_then_pull(client):
        push = client.push("ids", keys, grads, counts)
        pull = client.pull("ids", keys.flip(0))  # in flight beside the push's parts, after them
        assert client.wait(push) == len(keys)
        return push, client.wait(pull)

    rows, clocks = _whole_then_in_parts(monkeypatch, push_then_pull)
    assert torch.equal(clocks, torch.ones(len(keys), dtype=torch.int64))
    # never more than MAX_PARTS requests to a shard: bigger parts instead
    monkeypatch.setattr(client_module, "MAX_PARTS", 2)
    _, connect = shards([table()], 2)
    client = connect()
    push = client.push("ids", keys, grads, counts)
    assert len(push.parts) == 4 and client.wait(push) == len(keys)


def test_a_push_sync_of_many_keys_syncs_them_in_parts_and_gives_what_one_message_gives(monkeypatch):
    """A push_sync whose sync names many keys (an evaluation's, its cache bound 0) sends them in
    requests of about PART_BYTES of rows, after its push: a shard builds one part's reply at a
    time, its scratch bounded by the part; the rows and clocks are those of one message."""
    keys = KEYS_6000
    grads = torch.randn(100, DIM, generator=torch.Generator().manual_seed(4))
    counts = torch.ones(100, dtype=torch.int64)
    clocks = torch.full((len(keys),), -1, dtype=torch.int64)  # all misses: every row comes back

    def push_sync(client):
        both = client.push_sync("ids", keys[:100], grads, counts, keys, clocks, bound=0)
        got = client.wait(both)
        return both, (got.index, got.rows, got.clocks)

    index, _, got_clocks = _whole_then_in_parts(monkeypatch, push_sync)
    assert index.tolist() == list(range(len(keys))) and int(got_clocks[:100].min()) == 1


def test_initial_rows_of_negative_and_huge_keys_are_sane_and_deterministic():
    t = TableConfig("ids", rows=None, dim=16, init_scale=0.1)
    keys = np.array([EMPTY, LO, HI, 0, 1, -2, 2**62, -(2**62), 2**60, -(2**60)], dtype=np.int64)
    rows = initial_rows(t, keys)
    assert rows.dtype == np.float32 and rows.shape == (len(keys), 16)
    assert np.array_equal(rows, initial_rows(t, keys[::-1].copy())[::-1])    # a pure function of the key
    assert np.abs(rows).max() <= 0.1 and len({r.tobytes() for r in rows}) == len(keys)  # no two alike
    many = initial_rows(t, np.random.default_rng(0).integers(LO, HI, 20_000, dtype=np.int64))
    assert abs(many.mean()) < 2e-3 and 0.05 < many.std() < 0.065           # uniform: std 0.1 / sqrt(3)


def _train(emb, keys, steps, seed=0):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        out = emb(keys[torch.randint(0, len(keys), (8, 3), generator=g)])  # (8, 3, D), or (8, D) pooled
        ((out - torch.randn(out.shape, generator=g)) ** 2).sum().backward()
    emb.flush()


@pytest.mark.parametrize("mode", [None, "sum"])
@pytest.mark.parametrize("staleness", [0, 2])
def test_embedding_on_raw_ids_trains_as_on_a_fixed_table(mode, staleness):
    """The same batches on a fixed table (keys 0..n-1) and on a dynamic one (the keys mapped
    onto raw int64 ids, EMPTY and negatives among them; padding_idx mapped too): the same rows
    (init_scale 0: both start at zero), through a small cache that evicts."""
    raw = RAW
    small = torch.arange(len(raw))
    cache = CacheConfig(capacity=4, ways=2, staleness=staleness)
    embs = []
    for t, keys, pad in ((table(rows=len(raw), init_scale=0.0), small, 0), (table(init_scale=0.0), raw, int(raw[0]))):
        emb = Embedding(tables=t, cache=cache, num_shards=3, mode=mode, padding_idx=pad if mode else None)
        _train(emb, keys, 12)
        embs.append(emb.read(keys))
    assert torch.allclose(embs[0], embs[1], atol=1e-6)
    assert embs[1].abs().sum() > 0


def test_embedding_reads_initial_rows_of_raw_ids_and_names_a_dynamic_table():
    t = table()
    emb = Embedding(tables=t, cache=CacheConfig(capacity=4), num_shards=2)
    with torch.no_grad():
        out = emb(RAW.reshape(3, 3))
    assert torch.equal(out.reshape(-1, DIM), torch.from_numpy(initial_rows(t, RAW.numpy())))
    assert "ids: dynamic x 3 sgd" in repr(emb)
    fixed = local_client([table(rows=10)], 1)
    with pytest.raises(ValueError, match=r"table 'ids' \(dynamic x 3\) is not what the PS serves: 10 x 3"):
        Embedding(tables=t, client=fixed)
    with pytest.raises(ValueError, match="key -1 out of range"):
        Embedding(tables=table(rows=10), client=fixed)(torch.tensor([-1]))
