"""The cache against exact references, and its bookkeeping rules."""

import math

import numpy as np
import pytest
import torch

from het.cache.cache import EmbeddingCache
from het.config import CacheConfig, TableConfig
from het.data.zipf import zipf_keys
from reference import ExactLFU, ExactLRU, miss_rate

TABLE = TableConfig("t", rows=20_000, dim=4)


def run_cache(cache, trace, batch):
    for i in range(0, len(trace), batch):
        cache.lookup(torch.unique(torch.from_numpy(trace[i:i + batch])))
    return cache.stats()["miss_rate"]


@pytest.mark.parametrize("policy, exact", [("lru", ExactLRU), ("lfu", ExactLFU)])
@pytest.mark.parametrize("frac", [0.05, 0.15, 0.30])
@pytest.mark.parametrize("alpha", [0.9, 1.2])
def test_miss_rate_within_one_point_of_the_exact_policy(policy, exact, frac, alpha):
    keys, batch = 20_000, 512
    trace = zipf_keys(keys, alpha, batch * 150, seed=int(alpha * 10))
    capacity = int(frac * keys)
    expected = miss_rate(exact(capacity), trace, batch)
    got = run_cache(EmbeddingCache(TABLE, CacheConfig(capacity=capacity, policy=policy)), trace, batch)
    assert abs(got - expected) <= 0.01, (got, expected)


def test_exact_lfu_misses_less_than_exact_lru_on_skewed_traces():  # the references themselves
    trace = zipf_keys(5000, 1.05, 512 * 100, seed=0)
    assert miss_rate(ExactLFU(250), trace, 512) < miss_rate(ExactLRU(250), trace, 512)


@pytest.mark.parametrize("capacity", [1, 7, 31, 32, 33, 100, 1000])
def test_capacity_is_exact(capacity):
    cache = EmbeddingCache(TABLE, CacheConfig(capacity=capacity, ways=32))
    cache.lookup(torch.arange(5000))
    assert int((cache.keys >= 0).sum()) == capacity == cache.slots


def test_keys_of_the_current_batch_are_never_evicted_and_the_rest_bypass():
    cache = EmbeddingCache(TABLE, CacheConfig(capacity=8, ways=8))  # one set: fully associative
    first = cache.lookup(torch.arange(8))
    assert (first.slot >= 0).all()
    plan = cache.lookup(torch.arange(4, 16))        # 4 hits + 8 misses, room for 4 of them
    assert plan.hit.tolist() == [True] * 4 + [False] * 8
    assert set(cache.keys[plan.slot[:4]].tolist()) == {4, 5, 6, 7}
    assert int((plan.slot[4:] >= 0).sum()) == 4 and cache.counters["bypasses"] == 4
    assert set(cache.keys[cache.keys >= 0].tolist()) >= {4, 5, 6, 7}


def test_lfu_keeps_the_frequent_key_and_lru_the_recent_one():
    """Key 2 takes the one slot the policy frees: LFU evicts key 1 (one use), LRU key 0 (used
    longest ago); the whole surviving key set is checked, so a cache that never evicts fails."""
    for policy, survivors in [("lfu", {0, 2}), ("lru", {1, 2})]:
        cache = EmbeddingCache(TABLE, CacheConfig(capacity=2, ways=2, policy=policy))
        for keys in ([0], [0], [0], [1], [2]):  # key 0 used thrice, key 1 once but later
            cache.lookup(torch.tensor(keys))
        assert set(cache.keys.tolist()) == survivors, policy
        assert cache.counters["evictions"] == 1 and cache.counters["bypasses"] == 0, policy


def fill_from(cache, plan, value=0.0, clock=0):
    n = plan.keys.numel()
    return cache.fill(plan, torch.arange(n), torch.full((n, cache.table.dim), value),
                      torch.full((n,), clock, dtype=torch.int64))


def test_write_rule_pushes_after_more_than_s_updates_and_counts_steps():
    cache = EmbeddingCache(TABLE, CacheConfig(capacity=4, staleness=2))
    for step in range(3):
        plan = cache.lookup(torch.tensor([5]))
        if step == 0:
            fill_from(cache, plan)
        else:
            cache.fill(plan, torch.empty(0, dtype=torch.int64), torch.empty(0, 4), torch.empty(0, dtype=torch.int64))
        due = cache.update(plan, torch.ones(1, 4))
        assert len(due) == (1 if step == 2 else 0)
    assert due.counts.tolist() == [3] and torch.equal(due.grads, torch.full((1, 4), 3.0))
    assert int(cache.updates.sum()) == 0 and float(cache.pending.abs().sum()) == 0


def test_refresh_reapplies_unpushed_local_updates():
    table = TableConfig("t", rows=10, dim=2)
    cache = EmbeddingCache(table, CacheConfig(capacity=4, staleness=5, local_lr=0.5))
    plan = cache.lookup(torch.tensor([3]))
    assert fill_from(cache, plan, value=1.0).tolist() == [[1.0, 1.0]]
    cache.update(plan, torch.ones(1, 2))                     # local row 0.5, pending 1
    plan = cache.lookup(torch.tensor([3]))
    out = fill_from(cache, plan, value=10.0, clock=7)         # the server moved on: 10
    assert out.tolist() == [[9.5, 9.5]] and cache.counters["stale_refreshes"] == 1
    assert cache.clock[plan.slot].tolist() == [7]


def test_eviction_writes_back_only_rows_with_updates():
    """Three rows are evicted at once: the two updated ones (one with a zero gradient) are
    written back with their updates, the one that was only read is not."""
    cache = EmbeddingCache(TableConfig("t", rows=10, dim=2), CacheConfig(capacity=3, ways=3, staleness=math.inf))
    plan = cache.lookup(torch.tensor([0, 1]))
    fill_from(cache, plan)
    cache.update(plan, torch.tensor([[1.0, 2.0], [0.0, 0.0]]))
    fill_from(cache, cache.lookup(torch.tensor([2])))           # read, never updated
    assert set(cache.keys.tolist()) == {0, 1, 2}
    plan2 = cache.lookup(torch.tensor([3, 4, 5]))              # evicts all three
    assert cache.counters["evictions"] == 3 and set(cache.keys.tolist()) == {3, 4, 5}
    wb = plan2.writeback
    written = {k: (c, g) for k, c, g in zip(wb.keys.tolist(), wb.counts.tolist(), wb.grads.tolist())}
    assert written == {0: (1, [1.0, 2.0]), 1: (1, [0.0, 0.0])}  # 1 step each, zero gradient or not
    assert cache.counters["writebacks"] == 2


def test_flush_takes_every_pending_update_once():
    cache = EmbeddingCache(TableConfig("t", rows=10, dim=2), CacheConfig(capacity=4, staleness=math.inf))
    plan = cache.lookup(torch.tensor([1, 2]))
    fill_from(cache, plan)
    cache.update(plan, torch.ones(2, 2))
    first = cache.flush()
    assert sorted(first.keys.tolist()) == [1, 2] and first.counts.tolist() == [1, 1]
    assert len(cache.flush()) == 0


def test_zero_capacity_bypasses_everything():
    cache = EmbeddingCache(TABLE, CacheConfig(capacity=0))
    plan = cache.lookup(torch.tensor([1, 2, 3]))
    assert (plan.slot == -1).all() and cache.stats()["miss_rate"] == 1.0
    out = fill_from(cache, plan, value=2.0)
    assert out.shape == (3, 4)
    due = cache.update(plan, torch.ones(3, 4))
    assert due.keys.tolist() == [1, 2, 3] and due.counts.tolist() == [1, 1, 1]


from hypothesis import given, settings
from hypothesis import strategies as st

from het.cache.belady import belady_miss_rate


@settings(max_examples=80, deadline=None)
@given(batches=st.lists(st.lists(st.integers(0, 30), min_size=1, max_size=8), min_size=1, max_size=40),
       capacity=st.integers(0, 12))
def test_belady_never_misses_more_than_lru_or_lfu(batches, capacity):
    steps = [torch.unique(torch.tensor(b)) for b in batches]
    trace = np.concatenate([s.numpy() for s in steps])
    floor = belady_miss_rate(steps, capacity)
    for exact in (ExactLRU(capacity), ExactLFU(capacity)):
        lookups = misses = 0
        for s in steps:
            lookups += s.numel()
            misses += exact.step(s.tolist())
        assert floor <= misses / lookups + 1e-12
    assert 0 <= floor <= 1 and len(trace) > 0


def test_belady_on_a_hand_checked_trace():
    # capacity 2: [1 2] miss miss; [3] miss but never needed again: bypassed; [1] hit; [2] hit
    steps = [torch.tensor([1, 2]), torch.tensor([3]), torch.tensor([1]), torch.tensor([2])]
    assert belady_miss_rate(steps, 2) == 3 / 5
    # capacity 1: 1 is needed at step 2, 3 never: 3 bypasses and 1 stays
    assert belady_miss_rate(steps[:3], 1) == 3 / 4
    # capacity 2 with 3 needed later: at step 1 evict 2 (needed last), so step 3 misses
    steps = [torch.tensor([1, 2]), torch.tensor([3]), torch.tensor([1, 3]), torch.tensor([2])]
    assert belady_miss_rate(steps, 2) == 4 / 6
