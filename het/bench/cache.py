"""``het bench cache``: the cache's miss rate and throughput on a key trace.

Each run of ``batch`` consecutive trace keys is one step; its keys are de-duplicated, looked
up, filled from an in-process shard (misses and stale rows), given a gradient, and the rows due
are pushed back. ``keys_per_s`` counts unique keys per second of cache work (lookup, fill,
gradient update, clock bookkeeping, write-back); the shard's own time is measured apart and
reported as ``ps_s``, so ``keys_per_s_with_ps`` is the rate of the whole loop.
``row_touch_keys_per_s`` is the floor measured in the same run: keys per second of only a
gather and an ``index_add_`` of one random row per key (:func:`row_touch_keys_per_s`).
``native`` says which path ran (het.native's C++ step, or the PyTorch reference).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from het.cache.cache import EmbeddingCache
from het.config import CacheConfig, OptimizerConfig, ShardConfig, TableConfig
from het.ps.server.shard import Shard
from het.staleness import bound_to_wire, format_staleness


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
    counts = torch.unique(keys, return_counts=True)[1]  # any int64 key (bincount: only small, >= 0)
    return float(torch.topk(counts, min(capacity, counts.numel())).values.sum()) / keys.numel()


def row_touch_keys_per_s(steps: list[torch.Tensor], rows: int, dim: int, device: str = "cpu", seed: int = 0) -> float:
    """The floor under any cache's cost per key, on this machine: keys per second of only
    touching rows, a gather and an ``index_add_`` of one random row per key of each step in a
    table of ``rows`` rows of ``dim`` floats (what a lookup's hits and an update cost at least)."""
    gen = torch.Generator().manual_seed(seed)
    table = torch.randn(max(rows, 1), dim, device=device)
    slots = [torch.randint(0, max(rows, 1), (k.numel(),), generator=gen).to(device) for k in steps]
    total = 0.0
    for s in slots:
        t0 = time.perf_counter()
        out = table.index_select(0, s)
        table.index_add_(0, s, out)
        if table.device.type == "cuda":
            torch.cuda.synchronize()
        total += time.perf_counter() - t0
    return sum(k.numel() for k in steps) / total if total else 0.0


def bench_table(steps: list[torch.Tensor], dim: int) -> TableConfig:
    """Label-encoded keys: a fixed table over them; raw int64 ids (negative ones too): a dynamic one."""
    small = all(k.numel() == 0 or (int(k.min()) >= 0 and int(k.max()) < 1 << 31) for k in steps)
    rows = max((int(k.max()) + 1 for k in steps if k.numel()), default=1) if small else None
    return TableConfig("bench", rows=rows, dim=dim, optimizer=OptimizerConfig("sgd", lr=0.01))


def run(trace: np.ndarray | list, batch: int, capacity: int, policy: str, dim: int = 128,
        staleness: float = 100, ways: int = 32, warmup: int = 2, device: str = "cpu",
        lookahead: int = 0) -> dict:
    """Drive a cache over ``trace`` (a flat array cut into steps of ``batch`` keys, or a list of
    each step's unique keys; any int64 keys: a trace with keys outside [0, 2^31) runs on a
    dynamic table); return the figures."""
    steps = trace_steps(trace, batch) if isinstance(trace, np.ndarray) else list(trace)
    table = bench_table(steps, dim)
    shard = Shard(ShardConfig((table,)))
    cache = EmbeddingCache(table, CacheConfig(capacity=capacity, policy=policy, staleness=staleness, ways=ways,
                                              lookahead=lookahead), device)
    for keys in steps[:lookahead]:  # the data loader runs `lookahead` steps ahead
        cache.announce(keys)
    grad_pool = torch.randn(max((k.numel() for k in steps), default=0), dim, device=device) * 1e-3
    cache_s = ps_s = lookup_s = 0.0
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
                                         bound_to_wire(staleness))
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
            lookup_s += t1 - t0
            cache_s += (t1 - t0) + (t3 - t2)
            ps_s += (t2 - t1) + (t4 - t3)
            timed_keys += keys.numel()
    stats = cache.stats()
    return {
        "bench": "cache", "policy": policy, "capacity": cache.slots, "ways": cache.ways, "dim": dim,
        "batch": batch, "lookahead": lookahead, "staleness": format_staleness(staleness), "steps": len(steps),
        "trace_keys": sum(k.numel() for k in steps), "distinct_keys": int(torch.unique(torch.cat(steps)).numel()),
        "lookups": stats.get("lookups", 0), "hits": stats.get("hits", 0), "misses": stats.get("misses", 0),
        "miss_rate": stats["miss_rate"], "bypasses": stats.get("bypasses", 0),
        "static_oracle_hit_rate": static_oracle_hit_rate(steps, cache.slots),
        "evictions": stats.get("evictions", 0), "stale_refreshes": stats.get("stale_refreshes", 0),
        "keys_per_s": timed_keys / cache_s if cache_s else 0.0,
        "keys_per_s_with_ps": timed_keys / (cache_s + ps_s) if cache_s + ps_s else 0.0,
        "cache_s": cache_s, "lookup_s": lookup_s, "fill_update_s": cache_s - lookup_s, "ps_s": ps_s,
        "threads": torch.get_num_threads(), "device": str(device), "native": cache.native,
        "row_touch_keys_per_s": row_touch_keys_per_s(steps[warmup:], cache.slots, dim, device),
    }


def add_parser(bsub) -> None:
    """Register ``het bench cache`` on the subparsers of ``het bench``."""
    from het.choices import POLICIES
    from het.staleness import staleness_flag

    c = bsub.add_parser("cache", help="cache miss rate and unique keys/s on a trace or a Zipf stream")
    c.add_argument("--trace", help="1-D int64 .npy of keys in access order")
    c.add_argument("--graph", help="a graph (cora, planetoid:DIR, npz:PATH, synthetic-graph): the trace is "
                   "GraphSAGE's node accesses, --batch seed nodes a step; --capacity-frac is of the nodes")
    c.add_argument("--ctr", action="store_true", help="the trace is rank 0's keys of the default synthetic "
                   "Criteo job (2 workers), --batch samples a step; --capacity-frac is of the table")
    c.add_argument("--fanouts", type=lambda t: tuple(int(x) for x in t.split(",")), default=(10, 5),
                   help="with --graph: neighbours per layer")
    c.add_argument("--alpha", type=float, default=1.05, help="Zipf exponent of the generated stream")
    c.add_argument("--keys", type=int, default=1_000_000, help="distinct keys of the generated stream")
    c.add_argument("--batches", type=int, default=200, help="steps of the generated stream")
    c.add_argument("--batch", type=int, default=4096, help="trace keys per step (de-duplicated); "
                   "with --graph, seed nodes per step")
    c.add_argument("--capacity", type=int, help="cache rows")
    c.add_argument("--capacity-frac", type=float, help="cache rows as a fraction of the distinct keys")
    c.add_argument("--policy", default="lfu", choices=POLICIES)
    c.add_argument("--dim", type=int, default=128)
    c.add_argument("--staleness", type=staleness_flag, default=100)
    c.add_argument("--ways", type=int, default=32)
    c.add_argument("--lookahead", type=int, default=0, help="steps of keys the cache sees ahead "
                   "(Belady's rule within that window; 0: the policy alone)")
    c.add_argument("--belady", action="store_true", help="also Belady's optimal miss rate on the same trace "
                   "(the floor; a slow reference)")
    c.add_argument("--threads", type=int, default=1, help="torch threads (the target is for one core)")
    c.add_argument("--device", default="cpu")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=_main)


def _trace(args) -> tuple:
    """The flags' trace and its distinct keys."""
    from het.data.zipf import zipf_keys

    if args.graph:
        return graph_steps(args.graph, args.fanouts, args.batch, args.batches, args.seed)
    if args.ctr:
        return ctr_steps(args.batch, args.batches)
    if args.trace:
        trace = load_trace(args.trace)
        return trace, int(np.unique(trace).size)
    return zipf_keys(args.keys, args.alpha, args.batch * args.batches, seed=args.seed), args.keys


def _main(args) -> None:
    import json

    torch.set_num_threads(args.threads)
    trace, distinct = _trace(args)
    if args.capacity is not None:
        capacity = args.capacity
    elif args.capacity_frac is not None:
        capacity = max(1, int(round(args.capacity_frac * distinct)))
    else:
        raise SystemExit("het bench cache: give --capacity N or --capacity-frac F")
    result = run(trace, args.batch, capacity, args.policy, dim=args.dim, staleness=args.staleness,
                 ways=args.ways, device=args.device, lookahead=args.lookahead)
    if args.belady:
        from het.cache.belady import belady_miss_rate

        steps = trace_steps(trace, args.batch) if isinstance(trace, np.ndarray) else trace
        result["belady_miss_rate"] = belady_miss_rate(steps, capacity)
    if args.graph:
        result.update(graph=args.graph, fanouts=list(args.fanouts), nodes=distinct, seeds_per_batch=args.batch)
    elif args.ctr:
        result.update(ctr="synthetic-criteo rank 0 of 2", rows=distinct, samples_per_batch=args.batch)
    elif args.trace:
        result.update(trace=args.trace)
    else:
        result.update(alpha=args.alpha, keys=args.keys)
    if args.json:
        print(json.dumps(result, sort_keys=True, default=str))
    else:
        print(f"miss rate {result['miss_rate']:.4f} over {result['lookups']} lookups; "
              f"{result['keys_per_s']:,.0f} unique keys/s through the cache "
              f"({'native' if result['native'] else 'reference'} path; "
              f"{result['keys_per_s_with_ps']:,.0f} with the in-process shard); only touching the rows: "
              f"{result['row_touch_keys_per_s']:,.0f} keys/s")
