"""``het bench cache``: the cache's miss rate and throughput on a key trace.

Each run of ``batch`` consecutive trace keys is one step; its keys are de-duplicated, looked
up, filled from an in-process shard (misses and stale rows), given a gradient, and the rows due
are pushed back. ``keys_per_s`` counts unique keys per second of cache work (lookup, fill,
gradient update, clock bookkeeping, write-back); the shard's own time is measured apart and
reported as ``ps_s``, so ``keys_per_s_with_ps`` is the rate of the whole loop.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from het.cache.cache import EmbeddingCache
from het.config import CacheConfig, OptimizerConfig, ShardConfig, TableConfig
from het.ps.shard import Shard


def load_trace(path: str) -> np.ndarray:
    trace = np.load(path, allow_pickle=False)
    if trace.ndim != 1 or not np.issubdtype(trace.dtype, np.integer):
        raise ValueError(f"{path}: expected a 1-D integer array of keys, got {trace.dtype} of shape {trace.shape}")
    if trace.size and trace.min() < 0:
        raise ValueError(f"{path}: keys must be >= 0, found {int(trace.min())}")
    return trace.astype(np.int64, copy=False)


def trace_steps(trace: np.ndarray, batch: int) -> list[torch.Tensor]:
    """A flat trace cut into steps of ``batch`` keys, each de-duplicated."""
    if batch <= 0:
        raise ValueError(f"batch must be > 0, got {batch}")
    return [torch.unique(torch.from_numpy(trace[i:i + batch])) for i in range(0, len(trace), batch)]


def graph_steps(spec: str, fanouts: tuple[int, ...], seeds_per_batch: int, batches: int, seed: int = 0):
    """The input nodes of successive GraphSAGE mini-batches (the node-embedding access trace),
    and the number of nodes."""
    from het.data.graph import load
    from het.data.sampler import NeighborSampler

    graph = load(spec)
    trace = NeighborSampler(graph, fanouts=fanouts, seed=seed).access_trace(seeds_per_batch, batches, seed)
    return [torch.unique(t) for t in trace], graph.num_nodes


def ctr_steps(batch: int, batches: int, workers: int = 2, cap: int | None = 100_000, alpha: float = 1.05):
    """Rank 0's keys of a synthetic Criteo job (batch ``step * workers``), each step de-duplicated."""
    from het.data.synthetic import SyntheticCriteo, SyntheticCriteoConfig

    data = SyntheticCriteo(SyntheticCriteoConfig(cap=cap, alpha=alpha))
    steps = [torch.unique(data.batch("train", s * workers, batch).sparse) for s in range(batches)]
    return steps, data.num_rows


def static_oracle_hit_rate(steps: list[torch.Tensor], capacity: int) -> float:
    """The hit rate of a cache holding, from the start, the ``capacity`` keys this trace uses most
    (chosen in hindsight): a reference point for any replacement policy."""
    keys = torch.cat(steps)
    if not keys.numel():
        return 0.0
    counts = torch.bincount(keys)
    return float(torch.topk(counts, min(capacity, counts.numel())).values.sum()) / keys.numel()


def run(trace: np.ndarray | list, batch: int, capacity: int, policy: str, dim: int = 128,
        staleness: float = 100, ways: int = 32, warmup: int = 2, device: str = "cpu",
        lookahead: int = 0) -> dict:
    """Drive a cache over ``trace`` (a flat array cut into steps of ``batch`` keys, or a list of
    each step's unique keys); return the figures."""
    steps = trace_steps(trace, batch) if isinstance(trace, np.ndarray) else list(trace)
    num_keys = max((int(k.max()) + 1 for k in steps if k.numel()), default=1)
    table = TableConfig("bench", rows=num_keys, dim=dim, optimizer=OptimizerConfig("sgd", lr=0.01))
    shard = Shard(ShardConfig((table,)))
    cache = EmbeddingCache(table, CacheConfig(capacity=capacity, policy=policy, staleness=staleness, ways=ways,
                                              lookahead=lookahead), device)
    for keys in steps[:lookahead]:  # the data loader runs `lookahead` steps ahead
        cache.announce(keys)
    grad_pool = torch.randn(max((k.numel() for k in steps), default=0), dim, device=device) * 1e-3
    cache_s = ps_s = 0.0
    timed_keys = 0
    for i, keys in enumerate(steps):
        keys = keys.to(device)
        t0 = time.perf_counter()
        if lookahead and i + lookahead < len(steps):
            cache.announce(steps[i + lookahead].to(device))
        plan = cache.lookup(keys)
        t1 = time.perf_counter()
        if len(plan.writeback):
            wb = plan.writeback
            shard.push("bench", wb.keys.cpu().numpy(), wb.grads.cpu().numpy(), wb.counts.cpu().numpy())
        index, rows, clocks = shard.sync("bench", keys.cpu().numpy(), plan.clocks.cpu().numpy(),
                                         None if staleness == math.inf else staleness)
        index, rows, clocks = (torch.from_numpy(a).to(device) for a in (index, rows, clocks))
        index, clocks = index.long(), clocks.long()
        t2 = time.perf_counter()
        out = cache.fill(plan, index, rows, clocks)
        due = cache.update(plan, grad_pool[:out.shape[0]])
        t3 = time.perf_counter()
        if len(due):
            shard.push("bench", due.keys.cpu().numpy(), due.grads.cpu().numpy(), due.counts.cpu().numpy())
        t4 = time.perf_counter()
        if i >= warmup:
            cache_s += (t1 - t0) + (t3 - t2)
            ps_s += (t2 - t1) + (t4 - t3)
            timed_keys += keys.numel()
    stats = cache.stats()
    return {
        "bench": "cache", "policy": policy, "capacity": cache.slots, "ways": cache.ways, "dim": dim,
        "batch": batch, "lookahead": lookahead, "staleness": staleness if staleness != math.inf else "inf", "steps": len(steps),
        "trace_keys": sum(k.numel() for k in steps), "distinct_keys": int(torch.unique(torch.cat(steps)).numel()),
        "lookups": stats.get("lookups", 0), "hits": stats.get("hits", 0), "misses": stats.get("misses", 0),
        "miss_rate": stats["miss_rate"], "bypasses": stats.get("bypasses", 0),
        "static_oracle_hit_rate": static_oracle_hit_rate(steps, cache.slots),
        "evictions": stats.get("evictions", 0), "stale_refreshes": stats.get("stale_refreshes", 0),
        "keys_per_s": timed_keys / cache_s if cache_s else 0.0,
        "keys_per_s_with_ps": timed_keys / (cache_s + ps_s) if cache_s + ps_s else 0.0,
        "cache_s": cache_s, "ps_s": ps_s, "threads": torch.get_num_threads(), "device": str(device),
    }
