"""The training loop (het.train.loop) on the default job, short and in process: the fast
versions of the slow acceptance tests in tests/cluster/test_train.py (its AUC, and het's cut of
sparse bytes against mode hybrid), and the summary's figures.

One worker trains against in-process shards (as `het bench profile` does): the default job
(Wide&Deep, synthetic Criteo, Adagrad, a 10% LFU cache at s = 100, lazy rows) for the
acceptance's 300 steps, at dim 32 instead of 128 and on one worker instead of two, so a run
takes a few seconds. Every figure is deterministic: one worker, seeded data, no sockets.
"""

import pytest
import torch

from het.ps.local import local_client
from het.train.config import TrainConfig
from het.train.loop import Worker
from het.train.summary import summarise
from het.train.tasks import job_tables

STEPS, DIM, EVAL_SAMPLES = 300, 32, 8192


def short_run(mode: str) -> dict:
    """``het train --mode MODE --steps 300 --dim 32 --workers 1``'s summary, in this process."""
    cfg = TrainConfig(mode=mode, staleness=100, steps=STEPS, dim=DIM, workers=1, eval_samples=EVAL_SAMPLES)
    worker = Worker(cfg, local_client(job_tables(cfg), lazy_init=cfg.lazy_init))
    run = worker.train(STEPS, progress=False)
    metrics = worker.evaluate(EVAL_SAMPLES)
    return summarise(cfg, 1, cfg.servers, STEPS, run["wall_s"], [worker.counters()], metrics, worker.task.num_rows)


@pytest.fixture(scope="module")
def runs():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the local cluster gives each process here (het.dist.launch)
    try:
        return {mode: short_run(mode) for mode in ("het", "hybrid")}
    finally:
        torch.set_num_threads(threads)


def test_the_short_default_job_learns_well_above_chance(runs):
    """Measured: het s=100 AUC 0.769, hybrid 0.792, planted 0.824. With the rows frozen (the
    cache drops every gradient) or a Wide&Deep that ignores its embeddings, both reach only
    0.704, from the dense features alone: 0.74 fails a model or cache that stops learning rows."""
    for mode, s in runs.items():
        assert s["planted_auc"] > 0.8, mode
        assert 0.74 < s["auc"] < s["planted_auc"], (mode, s["auc"], s["planted_auc"])
        assert s["logloss"] < 0.52, mode  # measured 0.475 and 0.455; the base rate alone scores 0.573
    assert runs["het"]["hit_rate"] > 0.7 and runs["hybrid"]["hit_rate"] == 0


def test_the_short_default_job_cuts_sparse_bytes_against_hybrid(runs):
    """The acceptance job's cut is >= 80% (docs/RESULTS.md, "Lazy rows"); this short run's,
    measured: het 602.1 B/sample, hybrid 2,765.1: 78.2%. Without lazy rows the same pair cuts
    72.1% (835.6 vs 2,990.9), with a cache that never hits 1.9%: 75% fails both."""
    het, hybrid = runs["het"], runs["hybrid"]
    assert het["lazy_init"] and hybrid["lazy_init"]
    cut = 1 - het["sparse_bytes_per_sample"] / hybrid["sparse_bytes_per_sample"]
    assert cut >= 0.75, f"het sends {cut:.1%} fewer sparse bytes per sample than hybrid, not 75%"


def test_the_summary_counts_the_final_flush_apart(runs):
    """het's cache holds updates not pushed yet when training ends: the final flush pushes them,
    and the summary gives its time and share of the sparse bytes (already in the totals). The
    last lookahead steps push the rows no step left uses (tests/unit/test_push_idle.py), so
    the flush is left with the rows the last steps used. Mode hybrid has no cache: its flush
    is the last step's gradients."""
    het, hybrid = runs["het"], runs["hybrid"]
    sparse = het["sparse_bytes_per_sample"] * het["samples"]
    assert 0 < het["flush"]["sparse_bytes"] < sparse and het["flush"]["s"] > 0
    assert het["flush"]["share_of_sparse"] == pytest.approx(het["flush"]["sparse_bytes"] / sparse)
    # whole rows: each DIM floats of gradient, its key (int32, or a step of 1-2 bytes from the one
    # before), its count (1-8 bytes) and, when it sums several steps, Adagrad's squares' float
    flushed = het["flush"]["sparse_bytes"]
    assert any(n * (4 * DIM + 2) <= flushed <= n * (4 * DIM + 16) for n in range(1, flushed // (4 * DIM) + 1))
    # measured: 1.6% of het's sparse bytes (14.7% when the flush pushed every updated row),
    # 0.35% of hybrid's
    assert 0 < het["flush"]["share_of_sparse"] < 0.05 and 0 < hybrid["flush"]["share_of_sparse"] < 0.01
