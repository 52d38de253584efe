"""``het bench missrate``: the paper's Fig. 8, miss rate against cache size.

For each trace and each cache size (a fraction of the table), het's cache runs the trace once per
policy (LRU, LFU, and LFU with ``--lookahead K`` steps of future keys when K > 0), beside two
references computed on the very same steps: Belady's offline replacement (evict the row needed
furthest ahead; the floor) and a static cache of the trace's most-used rows chosen in hindsight.
With whole steps of keys, Belady's rule is a near-floor, not a proven one: on a 12-step trace of a
3,000-node graph, 90 rows, LFU with 2 steps of lookahead in 32-way sets missed 0.925 against its
0.927. Traces:

- ``ctr``: rank 0's keys of the default synthetic Criteo job (2 workers, ``--batch`` samples a
  step); the fraction is of the table's rows.
- ``graph``: the input nodes of GraphSAGE mini-batches (``--seeds-per-batch`` seed nodes,
  ``--fanouts``) on ``--graph``; the fraction is of the graph's nodes.

The paper measured Reddit and ogbn-mag; the figures to compare are the ordering (LFU below LRU at
every size) and the distance to the floor, since these traces are less concentrated.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

FRACS = (0.03, 0.05, 0.10, 0.15)
TRACES = ("ctr", "graph")
GRAPH = "synthetic-graph:200000"  # the graph of docs/RESULTS.md's GraphSAGE cache figures
# Steps per trace: 1,000 as docs/RESULTS.md's cache figures (Belady's reference takes a few
# seconds per size). Short traces overstate the miss rate of every policy (cold start): ctr LFU
# at 10% misses 0.25 over 200 steps, 0.20 over 1,000; compare policies within one run.
BATCHES = {"ctr": 1000, "graph": 1000}
QUICK_BATCHES = {"ctr": 200, "graph": 200}


def load_trace(name: str, batches: int, batch: int = 512, graph: str = GRAPH, fanouts: tuple[int, ...] = (10, 5),
               seeds_per_batch: int = 64, seed: int = 0) -> tuple[list[torch.Tensor], int, dict]:
    """The trace's steps (each a tensor of one step's unique keys), its table rows, and its
    parameters as reported."""
    from het.bench import cache

    if batches <= 0:
        raise ValueError(f"batches must be > 0, got {batches}")
    if name == "ctr":
        steps, rows = cache.ctr_steps(batch, batches)
        params = {"source": "synthetic-criteo, rank 0 of 2 workers", "batch": batch, "rows": rows}
    elif name == "graph":
        steps, rows = cache.graph_steps(graph, tuple(fanouts), seeds_per_batch, batches, seed)
        params = {"graph": graph, "fanouts": list(fanouts), "seeds_per_batch": seeds_per_batch, "nodes": rows}
    else:
        raise ValueError(f"expected a trace in {', '.join(TRACES)}, got {name!r}")
    params.update(batches=batches, lookups=sum(s.numel() for s in steps),
                  distinct_keys=int(torch.unique(torch.cat(steps)).numel()) if steps else 0)
    return steps, rows, params


def measure(steps: list[torch.Tensor], rows: int, fracs=FRACS, lookahead: int = 0, dim: int = 16,
            staleness: float = 100, ways: int = 32, trace: str = "trace", progress=None) -> list[dict]:
    """Miss rates of every policy and reference on ``steps``, for caches of ``frac * rows`` rows.

    Returns one dict per (frac, policy): ``{"trace", "frac", "capacity", "policy", "miss_rate"}``
    with policy one of ``lru``, ``lfu``, ``lfu+lookahead`` (when ``lookahead > 0``), ``belady``
    and ``static-oracle`` (1 - the hit rate of a cache preloaded with the trace's most-used rows: it
    pays no compulsory misses, so on short traces it can sit below Belady's).

    Example:
        >>> steps = [torch.tensor([0, 1, 2]), torch.tensor([0, 3]), torch.tensor([0, 1])]
        >>> [(r["policy"], round(r["miss_rate"], 3)) for r in measure(steps, rows=10, fracs=[0.2])]
        [('lru', 0.714), ('lfu', 0.714), ('belady', 0.571), ('static-oracle', 0.286)]
    """
    from het.bench import cache
    from het.cache.belady import belady_miss_rate

    if lookahead < 0:
        raise ValueError(f"lookahead must be >= 0, got {lookahead}")
    results = []
    for frac in fracs:
        if not 0 < frac <= 1:
            raise ValueError(f"a cache fraction must be in (0, 1], got {frac}")
        capacity = max(1, round(frac * rows))
        t0 = time.perf_counter()
        rates = {}
        for policy, k in (("lru", 0), ("lfu", 0)) + ((("lfu+lookahead", lookahead),) if lookahead else ()):
            r = cache.run(steps, 0, capacity, policy.split("+")[0], dim=dim, staleness=staleness, ways=ways,
                          lookahead=k)
            rates[policy] = r["miss_rate"]
        rates["belady"] = belady_miss_rate(steps, capacity)
        rates["static-oracle"] = 1.0 - cache.static_oracle_hit_rate(steps, capacity)
        for policy, rate in rates.items():
            row = {"trace": trace, "frac": frac, "capacity": capacity, "policy": policy, "miss_rate": rate}
            if policy == "lfu+lookahead":
                row["lookahead"] = lookahead
            results.append(row)
        if progress:
            figures = ", ".join(f"{p} {v:.3f}" for p, v in rates.items())
            progress(f"{trace} {100 * frac:g}% ({capacity:,} rows): {figures} [{time.perf_counter() - t0:.0f} s]")
    return results


def run(traces=TRACES, fracs=FRACS, batches: dict | int | None = None, lookahead: int = 0, batch: int = 512,
        graph: str = GRAPH, fanouts=(10, 5), seeds_per_batch: int = 64, dim: int = 16, staleness: float = 100,
        ways: int = 32, seed: int = 0, progress=None) -> dict:
    """Fig. 8 over ``traces``; ``batches`` is steps per trace (an int for all, a dict by trace, or
    None for :data:`BATCHES`). The result is what ``--json`` prints."""
    if isinstance(batches, int):
        batches = dict.fromkeys(traces, batches)
    batches = {**BATCHES, **(batches or {})}
    t0 = time.perf_counter()
    params, results = {}, []
    for name in traces:
        steps, rows, params[name] = load_trace(name, batches[name], batch, graph, fanouts, seeds_per_batch, seed)
        results += measure(steps, rows, fracs, lookahead, dim, staleness, ways, name, progress)
    return {"bench": "missrate", "fracs": list(fracs), "lookahead": lookahead, "dim": dim, "ways": ways,
            "staleness": staleness, "seed": seed, "traces": params, "results": results,
            "seconds": time.perf_counter() - t0, "threads": torch.get_num_threads()}


def _fracs(text: str) -> tuple[float, ...]:
    try:
        fracs = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected fractions like 0.03,0.05,0.10, got {text!r}") from None
    if not all(0 < f <= 1 for f in fracs):
        raise argparse.ArgumentTypeError(f"expected fractions in (0, 1], got {text!r}")
    return fracs


def _traces(text: str) -> tuple[str, ...]:
    names = tuple(text.split(","))
    if not names or any(n not in TRACES for n in names):
        raise argparse.ArgumentTypeError(f"expected traces among {','.join(TRACES)}, got {text!r}")
    return names


def cmd_missrate(args) -> None:
    torch.set_num_threads(args.threads)
    batches = args.batches if args.batches is not None else (QUICK_BATCHES if args.quick else None)
    result = run(args.traces, args.fracs, batches, args.lookahead, args.batch, args.graph, args.fanouts,
                 args.seeds_per_batch, args.dim, ways=args.ways, seed=args.seed,
                 progress=lambda line: print(line, file=sys.stderr, flush=True))
    if args.json:
        print(json.dumps(result, sort_keys=True, default=str))
        return
    policies = list(dict.fromkeys(r["policy"] for r in result["results"]))
    for name in args.traces:
        print(f"{name}: {json.dumps(result['traces'][name], default=str)}")
        print(f"{'cache':>6} {'rows':>9} " + " ".join(f"{p:>14}" for p in policies))
        for frac in args.fracs:
            rows = {r["policy"]: r for r in result["results"] if r["trace"] == name and r["frac"] == frac}
            print(f"{f'{100 * frac:g}%':>6} {rows['lru']['capacity']:>9,} "
                  + " ".join(f"{rows[p]['miss_rate']:>14.4f}" for p in policies))


def add_parser(bsub) -> None:
    m = bsub.add_parser("missrate", help="Fig. 8: miss rate against cache size, LRU and LFU beside Belady's "
                        "optimum and a static oracle, on the CTR and GraphSAGE traces")
    m.add_argument("--fracs", type=_fracs, default=FRACS, help="cache sizes as fractions of the table "
                   "(default 0.03,0.05,0.10,0.15)")
    m.add_argument("--traces", type=_traces, default=TRACES, help="comma-separated: ctr, graph")
    m.add_argument("--batches", type=int, help="steps of every trace (default: ctr "
                   f"{BATCHES['ctr']}, graph {BATCHES['graph']}; with --quick {QUICK_BATCHES['ctr']} and "
                   f"{QUICK_BATCHES['graph']})")
    m.add_argument("--quick", action="store_true", help="shorter traces (about a minute here)")
    m.add_argument("--lookahead", type=int, default=0, help="K > 0: also LFU seeing K steps of keys ahead "
                   "(column lfu+lookahead)")
    m.add_argument("--batch", type=int, default=512, help="ctr: samples per step")
    m.add_argument("--graph", default=GRAPH, help="graph: a graph spec (cora, synthetic-graph:N, npz:PATH, ...)")
    m.add_argument("--fanouts", type=lambda t: tuple(int(x) for x in t.split(",")), default=(10, 5),
                   help="graph: neighbours per layer")
    m.add_argument("--seeds-per-batch", type=int, default=64, help="graph: seed nodes per step")
    m.add_argument("--dim", type=int, default=16, help="row width (the miss rate does not depend on it)")
    m.add_argument("--ways", type=int, default=32)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--threads", type=int, default=1, help="torch threads")
    m.add_argument("--json", action="store_true", help="the last line of stdout is the result as JSON")
    m.set_defaults(func=cmd_missrate)
