"""Property tests of HET's consistency rules over random key streams, several clients.

Every client is a het.Embedding with its own cache, all connected to the same shards; the
hypothesis-chosen order of their steps is the interleaving. SGD with lr = 1 and small integer
gradients keeps every float sum exact, so "each row equals its initial value minus the sum of
every gradient" is checked with ==, and the server clocks count every (client, step) update.
"""

import math

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import LocalCluster
from het import CacheConfig, Embedding, OptimizerConfig, TableConfig
from het.ps.protocol import partition

DIM = 2

steps_strategy = st.lists(
    st.tuples(st.integers(0, 2),                                          # which client
              st.lists(st.integers(0, 29), min_size=1, max_size=12),      # its batch of keys
              st.integers(-3, 3)),                                        # gradient scale
    min_size=1, max_size=30)


def server_clocks(cluster, keys: torch.Tensor) -> torch.Tensor:
    S = len(cluster.shards)
    out = torch.empty_like(keys)
    for i, shard in enumerate(cluster.shards):
        mine = partition.shard_of(keys, S) == i
        out[mine] = shard.tables["t"].clocks[partition.local_rows(keys[mine], S)]
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=steps_strategy, rows=st.integers(30, 40), capacity=st.integers(0, 12),
       staleness=st.sampled_from([0, 1, 3, math.inf]), policy=st.sampled_from(["lru", "lfu"]),
       ways=st.sampled_from([1, 4, 32]), num_shards=st.integers(1, 3), lookahead=st.booleans())
def test_reads_respect_the_bound_and_no_update_is_lost_or_doubled(steps, rows, capacity, staleness, policy,
                                                                  ways, num_shards, lookahead):
    table = TableConfig("t", rows=rows, dim=DIM, optimizer=OptimizerConfig("sgd", lr=1.0), init_scale=0.0)
    cluster = LocalCluster([table], num_shards)
    cache = CacheConfig(capacity=capacity, policy=policy, staleness=staleness, ways=ways,
                        lookahead=len(steps) if lookahead else 0)
    clients = [Embedding(tables=table, client=cluster.client(), cache=cache) for _ in range(3)]
    for who, keys, _ in steps:  # each client's data loader announces all its steps (Belady's rule)
        clients[who].announce(torch.tensor(keys))
    expected_rows = torch.zeros(rows, DIM)
    expected_clocks = torch.zeros(rows, dtype=torch.int64)
    for who, keys, scale in steps:
        emb, keys = clients[who], torch.tensor(keys)
        out = emb(keys)
        # read rule: every key served from the cache is within the bound of the server's clock
        c = emb.caches["t"]
        if c.slots:
            unique = torch.unique(keys)
            sets = c._by_set(c.keys, c.set_of(unique))
            cached = (sets == unique[:, None]).any(1)
            slot = (c.set_of(unique) * c.ways + (sets == unique[:, None]).to(torch.uint8).argmax(1))[cached]
            gap = server_clocks(cluster, unique[cached]) - c.clock[slot]
            assert bool((c.clock[slot] >= 0).all())
            assert bool((gap <= staleness).all()), (gap, staleness)
            assert bool((gap >= 0).all()), gap  # own pushed updates (c_s += u) are never overcounted
        grads = torch.full((len(keys), DIM), float(scale))
        (out * grads).sum().backward()
        expected_rows.index_add_(0, keys, -grads)
        expected_clocks[torch.unique(keys)] += 1   # one update per step that touched the row
    for emb in clients:
        emb.flush()
    all_keys = torch.arange(rows)
    assert torch.equal(clients[0].read(all_keys), expected_rows)
    assert torch.equal(server_clocks(cluster, all_keys), expected_clocks)
    for emb in clients:  # nothing left behind in any cache
        assert int(emb.caches["t"].updates.sum()) == 0


@settings(max_examples=40, deadline=None)
@given(steps=steps_strategy, capacity=st.integers(1, 12), policy=st.sampled_from(["lru", "lfu"]))
def test_one_client_at_staleness_zero_always_reads_the_server_value(steps, capacity, policy):
    table = TableConfig("t", rows=30, dim=DIM, optimizer=OptimizerConfig("sgd", lr=1.0))
    cluster = LocalCluster([table], 2)
    emb = Embedding(tables=table, client=cluster.client(), cache=CacheConfig(capacity=capacity, policy=policy))
    peek = cluster.client()
    for _, keys, scale in steps:
        keys = torch.tensor(keys)
        out = emb(keys)
        server_rows, _ = peek.wait(peek.pull("t", keys))
        assert torch.equal(out.detach(), server_rows)
        (out * scale).sum().backward()
