"""Any int64 is a key (dynamic tables): the cache and its lookahead window treat
negative keys, int64's extremes and the value an empty slot stores (EMPTY) like any other key."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from het.cache.belady import belady_miss_rate
from het.cache.cache import EmbeddingCache
from het.cache.lookahead import Lookahead
from het.cache.policy import EMPTY
from het.config import CacheConfig, TableConfig
from het.data.zipf import zipf_keys

DYNAMIC = TableConfig("ids", rows=None, dim=2)
LO, HI = -2**63, 2**63 - 1
SPECIAL = [EMPTY, LO, HI, 0, -2]  # every one of them a key


def fill(cache, plan, rows):
    """Answer every key of ``plan`` as the PS would a miss: ``rows`` (n, D), clock 0."""
    n = plan.keys.numel()
    return cache.fill(plan, torch.arange(n), rows, torch.zeros(n, dtype=torch.int64))


def test_a_key_equal_to_empty_misses_on_a_fresh_cache_then_hits():
    cache = EmbeddingCache(DYNAMIC, CacheConfig(capacity=5, ways=4))  # 2 sets, 3 disabled slots
    plan = cache.lookup(torch.tensor([EMPTY]))
    assert plan.hit.tolist() == [False] and plan.clocks.tolist() == [-1] and int(plan.slot) >= 0
    assert cache.counters["evictions"] == 0                     # it took an empty slot
    fill(cache, plan, torch.tensor([[7.0, 8.0]]))
    again = cache.lookup(torch.tensor([EMPTY, 5]))
    assert again.hit.tolist() == [True, False] and again.clocks.tolist() == [0, -1]
    out = cache.fill(again, torch.tensor([1]), torch.zeros(1, 2), torch.zeros(1, dtype=torch.int64))  # the miss
    assert out.tolist() == [[7.0, 8.0], [0.0, 0.0]]
    assert sorted(cache.cached_keys.tolist()) == [EMPTY, 5]


@pytest.mark.parametrize("keys", [SPECIAL, [-5, -4, -3, -1], [LO, LO + 1, HI - 1, HI]])
def test_special_keys_are_cached_updated_evicted_and_written_back(keys):
    cache = EmbeddingCache(DYNAMIC, CacheConfig(capacity=len(keys), ways=len(keys), staleness=math.inf))
    keys = torch.tensor(keys)
    plan = cache.lookup(keys)
    rows = torch.arange(2.0 * len(keys)).reshape(-1, 2)
    assert torch.equal(fill(cache, plan, rows), rows)
    assert len(cache.update(plan, torch.ones(len(keys), 2))) == 0     # all cached, none due
    assert int(cache.updates.sum()) == len(keys)                      # every one was live
    hit = cache.lookup(keys)
    out = cache.fill(hit, torch.empty(0, dtype=torch.int64), torch.empty(0, 2), torch.empty(0, dtype=torch.int64))
    assert hit.hit.all() and torch.equal(out, rows - cache.local_lr)  # read-your-writes
    others = torch.arange(100, 100 + len(keys))
    evict = cache.lookup(others)                                      # evicts every special key
    assert cache.counters["evictions"] == len(keys)
    assert sorted(evict.writeback.keys.tolist()) == sorted(keys.tolist())
    assert evict.writeback.counts.tolist() == [1] * len(keys)
    assert sorted(cache.cached_keys.tolist()) == others.tolist()


def test_an_empty_slot_is_never_a_hit_nor_an_eviction_and_flush_ignores_it():
    cache = EmbeddingCache(DYNAMIC, CacheConfig(capacity=64, ways=8, staleness=math.inf))
    assert cache.lookup(torch.tensor([EMPTY, LO, HI])).hit.sum() == 0
    assert cache.counters["evictions"] == 0 and cache.counters["bypasses"] == 0
    assert len(cache.flush()) == 0
    assert int(cache.held.sum()) == 3 and cache.slots == 64


def test_update_of_a_key_that_lost_its_slot_goes_to_the_ps_not_to_the_new_key():
    """Key EMPTY loses its slot to a later lookup before its gradient comes: the gradient
    is returned for the PS, under key EMPTY, and the slot's new key keeps no update."""
    cache = EmbeddingCache(DYNAMIC, CacheConfig(capacity=1, ways=1, staleness=math.inf))
    cache.protect = 0  # let the next lookup take the slot of a key whose step is not over
    first = cache.lookup(torch.tensor([EMPTY]))
    fill(cache, first, torch.zeros(1, 2))
    second = cache.lookup(torch.tensor([3]))
    fill(cache, second, torch.zeros(1, 2))
    out = cache.update(first, torch.ones(1, 2))
    assert out.keys.tolist() == [EMPTY] and int(cache.updates.sum()) == 0


def test_negative_and_huge_keys_spread_over_every_set():
    cache = EmbeddingCache(DYNAMIC, CacheConfig(capacity=8 * 32, ways=32))
    for keys in (torch.arange(-4000, 0), torch.arange(HI - 4000, HI), torch.arange(LO, LO + 4000),
                 torch.arange(0, 4000) << 40):
        sets = cache.set_of(keys)
        assert int(sets.min()) >= 0 and int(sets.max()) < cache.num_sets
        assert torch.bincount(sets, minlength=8).min() > 4000 / 8 / 2  # none starved, none flooded


def _bijection(draw, n: int) -> list[int]:
    """``n`` distinct int64 values, EMPTY, negatives and int64's extremes among them, shuffled."""
    rest = draw(st.lists(st.integers(LO, HI).filter(lambda k: k not in SPECIAL), unique=True,
                         min_size=n - len(SPECIAL), max_size=n - len(SPECIAL)))
    return draw(st.permutations(SPECIAL + rest))


def _trace(cache, steps, rows_of):
    """Run ``steps`` (lists of unique keys, in that order) through ``cache``; per step the hits,
    the rows read and the keys written back; and the counters."""
    seen = []
    for keys in steps:
        keys = torch.tensor(keys, dtype=torch.int64)
        plan = cache.lookup(keys)
        out = fill(cache, plan, rows_of(keys))
        due = cache.update(plan, torch.ones(len(keys), 2))
        seen.append((plan.hit.tolist(), out.tolist(), plan.writeback.keys.tolist(), due.keys.tolist()))
    return seen, {k: cache.counters[k] for k in ("hits", "misses", "evictions", "bypasses", "writebacks")}


@settings(max_examples=60, deadline=None)
@given(data=st.data(), policy=st.sampled_from(["lru", "lfu"]), capacity=st.integers(1, 8),
       staleness=st.sampled_from([0, 1, 3]))
def test_a_fully_associative_cache_sees_the_same_trace_under_any_relabelling_of_keys(data, policy, capacity, staleness):
    """One set (placement does not depend on a key's hash): a trace of keys 0..15 and the same
    trace mapped onto arbitrary int64 values (EMPTY and negatives among them) give the same
    hits, misses, evictions, write-backs and rows."""
    n = 16
    steps = data.draw(st.lists(st.lists(st.integers(0, n - 1), unique=True, max_size=6), min_size=1, max_size=15))
    to = _bijection(data.draw, n)
    table = torch.tensor(to)

    def run(keys_of, rows_of):
        cfg = CacheConfig(capacity=capacity, ways=capacity, policy=policy, staleness=staleness)
        return _trace(EmbeddingCache(DYNAMIC, cfg), [keys_of(s) for s in steps], rows_of)

    small = run(lambda s: s, lambda k: k.float()[:, None].expand(-1, 2))
    back = {v: i for i, v in enumerate(to)}  # the rows a key gets: those of its small key
    mapped = run(lambda s: [to[k] for k in s],
                 lambda k: torch.tensor([back[v] for v in k.tolist()], dtype=torch.float32)[:, None].expand(-1, 2))
    assert mapped[1] == small[1]
    for (hit, rows, wb, due), (hit2, rows2, wb2, due2) in zip(small[0], mapped[0]):
        assert (hit2, rows2) == (hit, rows)
        assert wb2 == table[wb].tolist() and due2 == table[due].tolist()


def _zipf_steps(keys: int, steps: int, batch: int, seed: int) -> list[torch.Tensor]:
    trace = zipf_keys(keys, 1.0, steps * batch, seed=seed)
    return [torch.unique(torch.from_numpy(trace[i:i + batch])) for i in range(0, len(trace), batch)]


@pytest.mark.parametrize("capacity,seed", [(16, 0), (64, 1)])
def test_a_window_over_the_whole_trace_is_beladys_optimum_for_any_keys(capacity, seed):
    """As tests/unit/test_lookahead.py, on keys mapped (order kept, so each step's sorted keys
    stay in the same order) onto int64 values spanning the whole range, EMPTY among them."""
    steps = _zipf_steps(2000, 40, 50, seed)
    values = np.unique(np.random.default_rng(seed).integers(LO, HI, 4000, dtype=np.int64, endpoint=True))
    values = np.unique(np.concatenate([values[:2000 - len(SPECIAL)], SPECIAL]))
    assert len(values) == 2000 and EMPTY in values
    mapped = [torch.from_numpy(values[s.numpy()]) for s in steps]
    rates = []
    for trace in (steps, mapped):
        cache = EmbeddingCache(DYNAMIC, CacheConfig(capacity=capacity, ways=capacity, lookahead=len(trace),
                                                    staleness=100))
        for keys in trace:
            cache.announce(keys)
        for keys in trace:
            plan = cache.lookup(keys)
            sent = torch.nonzero(~plan.hit).flatten()
            cache.fill(plan, sent, torch.zeros(len(sent), 2), torch.zeros(len(sent), dtype=torch.int64))
        rates.append(cache.stats()["miss_rate"])
    assert rates[1] == rates[0] == pytest.approx(belady_miss_rate(mapped, capacity, depth=1), abs=0)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), looked_up=st.integers(0, 10), depth=st.integers(1, 4))
def test_the_window_gives_the_same_next_uses_under_any_relabelling_of_keys(data, looked_up, depth):
    n = 12
    steps = data.draw(st.lists(st.lists(st.integers(0, n - 1), max_size=6), min_size=1, max_size=10))
    to = torch.tensor(_bijection(data.draw, n))
    small, mapped = Lookahead(depth), Lookahead(depth)
    for keys in steps:
        assert small.announce(torch.tensor(keys, dtype=torch.int64)) == mapped.announce(to[keys])
    for keys in steps[-4 * depth:][:looked_up]:
        keys = torch.unique(torch.tensor(keys, dtype=torch.int64))
        assert small.advance(keys) and mapped.advance(torch.unique(to[keys]))
    assert mapped.next_use(to).tolist() == small.next_use(torch.arange(n)).tolist()
    assert mapped.next_use(torch.tensor([n])).tolist() == small.next_use(torch.tensor([n])).tolist()


def test_bench_cache_runs_on_raw_int64_ids():
    """`het bench cache`'s driver on a trace of raw ids (negative ones too) uses a dynamic table;
    its miss rate is the small keys' within a point (only the sets differ)."""
    import numpy as np

    from het.bench.cache import run
    from het.ps.protocol.partition import mix

    trace = np.random.default_rng(0).zipf(1.2, 40_000) % 10_000
    small = run(trace, 2048, 1000, "lru", dim=8)
    raw = run(mix(torch.from_numpy(trace)).numpy(), 2048, 1000, "lru", dim=8)
    assert abs(small["miss_rate"] - raw["miss_rate"]) < 0.01
