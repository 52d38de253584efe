"""The lookahead window: announced steps, next uses, and Belady's rule in the cache."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from het import CacheConfig, Embedding, OptimizerConfig, TableConfig, native
from het.cache.belady import belady_miss_rate
from het.cache.cache import EmbeddingCache
from het.cache.lookahead import NEVER, Lookahead
from het.data.zipf import zipf_keys
from het.ps.local import local_client
from reference import train_side_by_side


WINDOWS = [False] + ([True] if native.ops is not None else [])  # the reference, and the native index if built


@pytest.mark.parametrize("use_native", WINDOWS)
@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.lists(st.integers(0, 20), max_size=8), min_size=1, max_size=12),
       looked_up=st.integers(0, 12), depth=st.integers(1, 4))
def test_next_use_is_the_first_announced_step_not_yet_looked_up(use_native, steps, looked_up, depth):
    window = Lookahead(depth, native=use_native)
    numbers = [window.announce(torch.tensor(k, dtype=torch.int64)) for k in steps]
    kept = steps[-4 * depth:]                       # the queue keeps the newest 4 * depth steps
    kept_numbers = numbers[-4 * depth:]
    done = 0
    for keys in kept[:looked_up]:
        assert window.advance(torch.unique(torch.tensor(keys, dtype=torch.int64)))
        done += 1
    query = torch.arange(22)
    expect = [next((n for n, k in zip(kept_numbers[done:], kept[done:]) if q in k), NEVER) for q in range(22)]
    assert window.next_use(query).tolist() == expect
    away = window.steps_away(window.next_use(query))
    now = kept_numbers[done - 1] if done else 0
    assert away.tolist() == [e - now if e != NEVER else NEVER for e in expect]


@pytest.mark.skipif(native.ops is None, reason="het's native core is not built (`make` builds it)")
@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), depth=st.integers(1, 6), key_space=st.sampled_from([10, 100, 1 << 62]))
def test_the_native_index_kept_step_by_step_answers_as_the_reference(seed, depth, key_space):
    """Announcements and lookups interleaved as a trainer makes them (announced ahead, some
    lookups of steps never announced, the queue overflowing): the same next uses at every step."""
    gen = torch.Generator().manual_seed(seed)
    fast, ref = Lookahead(depth, native=True), Lookahead(depth)
    assert fast._window is not None and ref._window is None
    ahead = []
    for _ in range(40):
        for _ in range(int(torch.randint(0, 3, (1,), generator=gen))):  # 0-2 announcements a step
            keys = torch.randint(-(key_space // 2), key_space // 2 + 1, (int(torch.randint(0, 12, (1,), generator=gen)),),
                                 generator=gen)
            assert fast.announce(keys) == ref.announce(keys)
            ahead.append(torch.unique(keys))
        step = ahead.pop(0) if ahead and bool(torch.rand(1, generator=gen) < 0.8) else torch.tensor([3, 5])
        assert fast.advance(step) == ref.advance(step)
        query = torch.cat([step, torch.randint(-key_space // 2, key_space // 2 + 1, (8,), generator=gen)])
        assert torch.equal(fast.next_use(query), ref.next_use(query))


def test_a_lookup_that_was_not_announced_leaves_the_window_alone():
    window = Lookahead(2)
    window.announce(torch.tensor([1, 2]))
    assert not window.advance(torch.tensor([7]))      # say, an evaluation batch
    assert window.next_use(torch.tensor([1])).tolist() == [1]
    with pytest.raises(ValueError, match="depth"):
        Lookahead(0)


def _replay(cache: EmbeddingCache, steps: list[torch.Tensor]) -> float:
    for keys in steps:
        plan = cache.lookup(keys)
        sent = torch.nonzero(~plan.hit).flatten()
        cache.fill(plan, sent, torch.zeros(sent.numel(), cache.table.dim), torch.zeros(sent.numel(), dtype=torch.int64))
        cache.update(plan, torch.zeros(keys.numel(), cache.table.dim))
    return cache.stats()["miss_rate"]


def _zipf_steps(keys: int, alpha: float, steps: int, batch: int, seed: int) -> list[torch.Tensor]:
    trace = zipf_keys(keys, alpha, steps * batch, seed=seed)
    return [torch.unique(torch.from_numpy(trace[i:i + batch])) for i in range(0, len(trace), batch)]


@pytest.mark.parametrize("capacity,seed", [(16, 0), (64, 1), (200, 2)])
def test_a_window_over_the_whole_trace_is_beladys_optimum(capacity, seed):
    """Fully associative (one set), every step announced: exactly Belady's furthest-next-use rule,
    and never below the floor that also breaks ties on the uses after."""
    steps = _zipf_steps(2000, 1.0, 40, 50, seed)
    table = TableConfig("t", rows=2000, dim=2)
    cache = EmbeddingCache(table, CacheConfig(capacity=capacity, ways=capacity, lookahead=len(steps), staleness=100))
    for keys in steps:
        cache.announce(keys)
    rate = _replay(cache, steps)
    assert rate == pytest.approx(belady_miss_rate(steps, capacity, depth=1), abs=0)
    assert rate >= belady_miss_rate(steps, capacity)


def test_a_short_window_misses_less_than_the_policy_alone():
    steps = _zipf_steps(50_000, 1.05, 120, 2048, seed=3)
    table = TableConfig("t", rows=50_000, dim=2)
    rates = {}
    for k in (0, 8):
        cache = EmbeddingCache(table, CacheConfig(capacity=5000, lookahead=k, staleness=100))
        for i, keys in enumerate(steps):
            if k and i == 0:
                for ahead in steps[:k]:
                    cache.announce(ahead)
            if k and i + k < len(steps):
                cache.announce(steps[i + k])
            plan = cache.lookup(keys)
            sent = torch.nonzero(~plan.hit).flatten()
            cache.fill(plan, sent, torch.zeros(sent.numel(), 2), torch.zeros(sent.numel(), dtype=torch.int64))
            cache.update(plan, torch.zeros(keys.numel(), 2))
        rates[k] = cache.stats()["miss_rate"]
    assert rates[8] < rates[0]
    assert rates[8] >= belady_miss_rate(steps, 5000)


def test_wrong_announcements_cost_hits_never_correctness(cluster_factory):
    """At s = 0 with misleading hints the rows still match nn.Embedding + SGD."""
    rows, lr = 60, 0.05
    table = TableConfig("embedding", rows=rows, dim=8, optimizer=OptimizerConfig("sgd", lr=lr))
    cluster = cluster_factory([table], 2)
    emb = Embedding(tables=table, client=cluster.client(),
                    cache=CacheConfig(capacity=24, staleness=0, ways=8, lookahead=4))
    rng = np.random.default_rng(0)
    for _ in range(40):
        emb.announce(torch.from_numpy(rng.integers(0, rows, 10)))
    assert train_side_by_side(emb, rows, "sgd", lr) <= 1e-5
    assert emb.stats()["embedding"]["hits"] > 0


def test_the_worker_announces_the_batches_it_trains_on():
    from het.ps.client.client import PSClient
    from het.train.config import TrainConfig
    from het.train.loop import Worker
    from het.train.tasks import job_tables

    def batches(lookahead):
        cfg = TrainConfig(steps=6, batch=32, dim=4, cache={"lookahead": lookahead}, eval_samples=0,
                          synthetic={"cap": 1000})
        worker = Worker(cfg, local_client(job_tables(cfg), 1))
        made = [worker.upcoming.batch(s).sparse for s in range(6)]
        return made, worker.embedding.caches["embedding"].window

    plain, no_window = batches(0)
    ahead, window = batches(3)
    assert no_window is None
    assert all(torch.equal(a, b) for a, b in zip(plain, ahead))
    assert window.announced == 6 + 3  # every step up to 3 ahead of the last one asked for
