"""The coming steps' one owner (het.nn.upcoming): which batches are made, announced and synced
early, and when, as the training loop drives it; the queues' one cap."""

import pytest
import torch

from het.config import CacheConfig
from het.nn import Embedding
from het.ps.local import local_client
from het.train.config import TrainConfig
from het.train.loop import Worker
from het.train.tasks import job_tables


def recorded_job(monkeypatch, steps: int, lookahead: int, prefetch: bool = True, staleness: int = 100) -> list:
    """The events of a short job: ("make", step), ("announce", step), ("prefetch", step), in order."""
    cfg = TrainConfig(steps=steps, batch=16, dim=4, cache={"lookahead": lookahead}, prefetch=prefetch, staleness=staleness,
                      eval_samples=0, workers=1, synthetic={"cap": 500})
    worker = Worker(cfg, local_client(job_tables(cfg), 1))
    events, step_of = [], {}
    make, announce, prefetch_keys = worker.upcoming.make, Embedding.announce, Embedding.prefetch

    def made(step):
        batch = make(step)
        step_of[id(batch.sparse)] = step
        events.append(("make", step))
        return batch

    worker.upcoming.make = made
    with monkeypatch.context() as m:
        m.setattr(Embedding, "announce", lambda self, keys, *a, **k: events.append(
            ("announce", step_of[id(keys)])) or announce(self, keys, *a, **k))
        m.setattr(Embedding, "prefetch", lambda self, keys, *a, **k: events.append(
            ("prefetch", step_of[id(keys)])) or prefetch_keys(self, keys, *a, **k))
        worker.train(steps, progress=False)
    return events


def test_the_loop_announces_lookahead_steps_ahead_and_syncs_one_step_early(monkeypatch):
    """Steps 0..5, lookahead 2: steps 0-2 made and announced before step 0, one more a step (none
    past the last); step 0's sync and step 1's sent at step 0, then each step's next."""
    events = recorded_job(monkeypatch, steps=6, lookahead=2)
    announced = [e for e in events if e[0] != "make"]
    assert announced == [("announce", 0), ("announce", 1), ("announce", 2), ("announce", 3),
                         ("prefetch", 0), ("prefetch", 1), ("announce", 4), ("prefetch", 2), ("announce", 5),
                         ("prefetch", 3), ("prefetch", 4), ("prefetch", 5)]
    assert [s for kind, s in events if kind == "make"] == list(range(6))  # each batch made once


def test_without_lookahead_nothing_is_announced_and_at_s0_nothing_is_synced_early(monkeypatch):
    assert [e for e in recorded_job(monkeypatch, steps=4, lookahead=0) if e[0] != "make"] == [
        ("prefetch", 0), ("prefetch", 1), ("prefetch", 2), ("prefetch", 3)]
    assert [e for e in recorded_job(monkeypatch, steps=4, lookahead=2, staleness=0) if e[0] != "make"] == [
        ("announce", s) for s in range(4)]  # BSP: every push applied before the next pull


def test_steps_asked_out_of_order_start_afresh():
    emb = Embedding(100, 4, cache=CacheConfig(capacity=16, staleness=10, lookahead=2))
    made = []
    emb.upcoming.follow(lambda step: made.append(step) or torch.tensor([step]), keys=lambda b: b, ahead=2)
    emb.upcoming.batch(0)
    emb.upcoming.batch(1)
    assert emb.upcoming.batch(7).tolist() == [7]  # a resume: steps 7-9 made afresh
    assert made == [0, 1, 2, 3, 7, 8, 9]


@pytest.mark.parametrize("depth", [1, 3])
def test_announcements_nobody_looks_up_are_capped_once_for_both_queues(depth):
    emb = Embedding(1000, 4, cache=CacheConfig(capacity=64, staleness=10, lookahead=depth))
    window = emb.caches["embedding"].window
    for i in range(10 * depth):
        emb.announce(torch.tensor([i, i + 1]))
    assert window.most_queued == 4 * depth
    assert len(window.queue) == len(emb.upcoming._announced["embedding"]) == window.most_queued


def test_an_announced_lookup_reuses_its_unique_and_an_early_sync_is_used_once():
    emb = Embedding(100, 4, cache=CacheConfig(capacity=16, staleness=10, lookahead=2))
    keys = torch.tensor([5, 3, 5, 9])
    emb.announce(keys)
    unique, inverse = emb.upcoming._announced["embedding"][0][1:]
    assert unique.tolist() == [3, 5, 9] and inverse.tolist() == [1, 0, 1, 2]
    emb.prefetch(keys)
    assert emb.prefetching() and not emb.upcoming._announced["embedding"]  # the sync's lookup took it
    emb(keys).sum().backward()
    assert not emb.prefetching() and emb.stats()["embedding"]["lookups"] == 3
