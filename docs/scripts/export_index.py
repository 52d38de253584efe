"""A dynamic table's key index in an export, against the alternatives: bytes a key and ms to look
up a batch's keys (4,096 samples x 26 fields, 15% of them never stored), one core.

- hash-sorted + directory (het.export.index): splitmix64 hashes ascending, a bucket directory,
  looked up natively (het/native/index.cpp) and by its NumPy reference;
- sorted keys + np.searchsorted over all of them (8 bytes a key);
- sorted keys + searchsorted of the batch's keys sorted first;
- a Python dict of key -> row (the baseline a loader would write first).

    .venv/bin/python docs/scripts/export_index.py --keys 1000000,10000000
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch

from het.export.index import HashIndex, build


def best_ms(fn, repeat: int = 7) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * min(times)


def measure(n: int, batch: int, rng) -> dict:
    keys = rng.integers(-2 ** 63, 2 ** 63 - 1, n, dtype=np.int64)
    stored = keys[rng.integers(0, n, int(batch * 0.85))]
    query = np.concatenate([stored, rng.integers(-2 ** 63, 2 ** 63 - 1, batch - len(stored), dtype=np.int64)])
    rng.shuffle(query)
    hashes, directory, _ = build(keys)
    index, reference = HashIndex(hashes, directory), HashIndex(hashes, directory, use_native=False)
    ordered = np.sort(keys)

    def searchsorted():
        at = np.minimum(np.searchsorted(ordered, query), n - 1)
        return np.where(ordered[at] == query, at, -1)

    def searchsorted_sorted():
        order = np.argsort(query)
        at = np.minimum(np.searchsorted(ordered, query[order]), n - 1)
        return at

    out = {"keys": n, "batch_keys": batch,
           "hash_directory": {"bytes_per_key": (hashes.nbytes + directory.nbytes) / n,
                              "lookup_ms": best_ms(lambda: index.lookup(query)),
                              "numpy_lookup_ms": best_ms(lambda: reference.lookup(query))},
           "sorted_searchsorted": {"bytes_per_key": 8.0, "lookup_ms": best_ms(searchsorted)},
           "sorted_searchsorted_sorted_batch": {"bytes_per_key": 8.0, "lookup_ms": best_ms(searchsorted_sorted)}}
    if n <= 2_000_000:
        before = _rss()
        table = dict(zip(keys.tolist(), range(n)))
        out["python_dict"] = {"bytes_per_key": (_rss() - before) / n,
                              "lookup_ms": best_ms(lambda: [table.get(k, -1) for k in query.tolist()], 3)}
        del table
    return out


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", default="1000000,10000000")
    p.add_argument("--batch", type=int, default=4096 * 26)
    args = p.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    results = [measure(int(n), args.batch, rng) for n in args.keys.split(",")]
    json.dump(results, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
