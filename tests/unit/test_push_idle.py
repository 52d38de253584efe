"""Pushing idle rows before the final flush (EmbeddingCache.take_idle, Embedding.push_idle):
in the last `lookahead` steps the window holds every step left, and the rows none of them
uses are pushed a share a step. Only when they travel changes: the PS ends with the same rows
and clocks, bit for bit, and the same bytes travel; the final flush is smaller."""

import pytest
import torch

from het.cache.cache import EmbeddingCache
from het.config import CacheConfig, OptimizerConfig, TableConfig
from het.nn.embedding import Embedding
from het.ps.local import local_client
from het.train.config import TrainConfig
from het.train.loop import Worker
from het.train.tasks import job_tables

DIM = 4


def cache_with(lookahead: int, native: bool = True) -> EmbeddingCache:
    table = TableConfig("t", rows=100, dim=DIM, optimizer=OptimizerConfig("sgd", lr=0.1))
    # native=False: the PyTorch reference's lookup (and its marks)
    return EmbeddingCache(table, CacheConfig(capacity=32, ways=4, staleness=100, lookahead=lookahead), native=native)


def step(cache: EmbeddingCache, keys: list[int]) -> None:
    """One step of ``keys``: looked up, filled as the PS would, one gradient each."""
    keys = torch.tensor(keys)
    plan = cache.lookup(keys)
    miss = (~plan.hit).nonzero().flatten()
    cache.fill(plan, miss, torch.zeros(len(miss), DIM), torch.zeros(len(miss), dtype=torch.int64))
    cache.update(plan, torch.ones(len(keys), DIM))


@pytest.mark.parametrize("native", [True, False])
def test_take_idle_takes_the_updated_rows_no_announced_step_uses_and_leaves_them_cached_clean(native):
    cache = cache_with(lookahead=4, native=native)
    steps = ([1, 2, 3], [4, 5], [6, 7], [2, 9])
    for keys in steps:  # announced ahead, as the training loop does
        cache.announce(torch.tensor(keys))
    for keys in steps[:3]:
        step(cache, keys)
    # 6 and 7: the last lookup (protect = 1 here); 2: the coming step uses it. Idle: 1, 3, 4, 5
    taken = cache.take_idle(1.0)
    assert sorted(taken.keys.tolist()) == [1, 3, 4, 5]
    assert taken.counts.tolist() == [1] * 4 and torch.equal(taken.grads, torch.ones(4, DIM))
    assert sorted(cache.flush().keys.tolist()) == [2, 6, 7]  # the rest, once each
    assert set(cache.cached_keys.tolist()) == {1, 2, 3, 4, 5, 6, 7}  # all still cached


@pytest.mark.parametrize("native", [True, False])
def test_take_idle_takes_its_share_rounded_up_and_nothing_without_a_window(native):
    cache = cache_with(lookahead=4, native=native)
    for keys in ([1, 2, 3, 4, 5], [6]):
        cache.announce(torch.tensor(keys))
        step(cache, keys)
    assert len(cache.take_idle(0.5)) == 3 and len(cache.take_idle(0.5)) == 1 and len(cache.take_idle(1.0)) == 1
    assert len(cache.take_idle(1.0)) == 0 and len(cache.take_idle(0.0)) == 0
    blind = cache_with(lookahead=0)
    step(blind, [1, 2])
    step(blind, [3])
    assert len(blind.take_idle(1.0)) == 0 and len(blind.flush()) == 3


def train(push_idle: bool, monkeypatch) -> tuple[dict, torch.Tensor, torch.Tensor, dict]:
    """A short default job (one worker, in process): its summary, and every row and clock the
    PS holds after it."""
    with monkeypatch.context() as m:
        if not push_idle:
            m.setattr(Embedding, "push_idle", lambda self, share: None)
        cfg = TrainConfig(steps=60, batch=128, dim=DIM, workers=1, cache={"lookahead": 8})
        client = local_client(job_tables(cfg), lazy_init=cfg.lazy_init)
        worker = Worker(cfg, client)
        worker.train(cfg.steps, progress=False)
    counters = worker.counters()
    rows, clocks = client.wait(client.pull("embedding", torch.arange(worker.task.num_rows)))
    return counters, rows, clocks, worker.embedding.stats()["embedding"]


def test_idle_rows_pushed_early_leave_the_ps_and_the_traffic_as_a_final_flush_would(monkeypatch):
    torch.manual_seed(0)
    early, rows, clocks, stats = train(True, monkeypatch)
    late, rows_late, clocks_late, stats_late = train(False, monkeypatch)
    assert torch.equal(rows, rows_late) and torch.equal(clocks, clocks_late)
    assert {k: stats[k] for k in ("hits", "misses", "pushed_rows")} == \
           {k: stats_late[k] for k in ("hits", "misses", "pushed_rows")}
    for key in ("sparse_pull", "sync"):
        assert early[key] == late[key], key
    # the same rows pushed; a large final flush goes in pieces ordered by key, whose keys
    # delta-code into fewer bytes than the idle pushes' (measured 760,621 against 872,155)
    assert late["sparse_push"] <= early["sparse_push"] <= 1.25 * late["sparse_push"]
    # measured: 108,648 bytes against 1,417,788 (the rows the last step used, and the bypassed)
    assert 0 < early["flush_bytes"] < 0.5 * late["flush_bytes"], (early["flush_bytes"], late["flush_bytes"])
