"""``het bench memory``: does a dynamic table's memory follow the rows training touched?

A shard process holds one dynamic table. Pushes reach ``keys`` distinct keys drawn from the
whole int64 range, each pushed ``passes`` times; then the shard's own account of its bytes
(rows, optimizer state, index, meta, sketch) and its resident memory are compared with the
bare minimum, ``keys`` rows plus their optimizer state (``ideal_bytes``). The RSS figure is the
growth over the RSS of the shard after one push of 16 rows (the interpreter, torch and its
lazily made pools are not the table's). A fixed table
over the same id space is tried too: it cannot be allocated.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from het.config import OptimizerConfig, ShardConfig, TableConfig
from het.ps.client.client import PSClient
from het.ps.server.process import ServerProcess
from het.ps.server.store import optim
from het.ps.server.store.fixed import FixedRows


def distinct_keys(n: int, seed: int = 0) -> np.ndarray:
    """``n`` distinct int64 keys, uniform over the whole int64 range."""
    rng = np.random.default_rng(seed)
    keys = np.unique(rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, size=n + n // 100 + 16,
                                  dtype=np.int64, endpoint=True))
    return rng.permutation(keys)[:n]


def run(keys: int = 1_000_000, dim: int = 64, optimizer: str = "adagrad", batch: int = 8192,
        passes: int = 2, admit_after: int = 1) -> dict:
    table = TableConfig("ids", rows=None, dim=dim, optimizer=OptimizerConfig(optimizer, lr=0.01),
                        admit_after=admit_after)
    all_keys = torch.from_numpy(distinct_keys(keys))
    grads = torch.full((batch, dim), 1e-3)
    counts = torch.ones(batch, dtype=torch.int64)
    with ServerProcess(ShardConfig((table,), max_keys=max(batch, 1 << 18))) as server:
        client = PSClient.connect([server.address])
        try:
            # one small push first: torch's lazily made pools and kernels are not the table's
            client.wait(client.push("ids", all_keys[:16], grads[:16], counts[:16]))
            empty = client.stats()[0]
            t0 = time.perf_counter()
            for _ in range(passes):
                for lo in range(0, keys, batch):
                    k = all_keys[lo:lo + batch]
                    client.wait(client.push("ids", k, grads[:len(k)], counts[:len(k)]))
            push_s = time.perf_counter() - t0
            full = client.stats()[0]
        finally:
            client.close()
    state_per_row = sum(optim.make(table.optimizer, 0, dim).state_widths(dim).values())
    ideal = keys * 4 * (dim + state_per_row)
    stats = full["tables"]["ids"]
    return {"bench": "memory", "keys": keys, "dim": dim, "optimizer": optimizer, "passes": passes,
            "rows": stats["rows"], "ideal_bytes": ideal, "table_bytes": stats["bytes"],
            "bytes_ratio": stats["bytes"] / ideal, "rss_growth_bytes": full["rss_bytes"] - empty["rss_bytes"],
            "rss_ratio": (full["rss_bytes"] - empty["rss_bytes"]) / ideal,
            "peak_rss_growth_ratio": (full["peak_rss_bytes"] - empty["rss_bytes"]) / ideal,
            "push_rows_per_s": passes * keys / push_s, "fixed_table": fixed_table_attempt(dim, optimizer)}


def fixed_table_attempt(dim: int, optimizer: str) -> str:
    """What allocating a fixed table over the whole int64 id space gives (one shard's half)."""
    cfg = TableConfig("ids", rows=(1 << 63) - 1, dim=dim, optimizer=OptimizerConfig(optimizer, lr=0.01))
    try:
        FixedRows(cfg, 0, 2)
    except (RuntimeError, MemoryError, OverflowError, ValueError) as e:
        return f"refused: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
    return "allocated"  # pragma: no cover - no machine has 2^62 rows of memory


def add_parser(bsub) -> None:
    """Register ``het bench memory`` on the subparsers of ``het bench``."""
    q = bsub.add_parser("memory", help="a dynamic table's bytes and RSS against the rows it stores")
    q.add_argument("--keys", type=int, default=1_000_000, help="distinct int64 keys pushed")
    q.add_argument("--dim", type=int, default=64)
    q.add_argument("--optimizer", default="adagrad", choices=("sgd", "adagrad", "adam"))
    q.add_argument("--batch", type=int, default=8192)
    q.add_argument("--passes", type=int, default=2, help="pushes of every key")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=_main)


def _main(args) -> None:
    import json

    r = run(keys=args.keys, dim=args.dim, optimizer=args.optimizer, batch=args.batch, passes=args.passes)
    if args.json:
        print(json.dumps(r, sort_keys=True))
    else:
        print(f"{r['rows']:,} rows of dim {r['dim']} ({r['optimizer']}): {r['table_bytes'] / 1e6:,.0f} MB by the "
              f"shard's account ({r['bytes_ratio']:.2f}x the rows and state), RSS grew {r['rss_growth_bytes'] / 1e6:,.0f}"
              f" MB ({r['rss_ratio']:.2f}x); a fixed table over int64: {r['fixed_table']}")
