"""Random row updates on 4 KiB pages against transparent huge pages (het.memory), in turn.

    .venv/bin/python docs/scripts/hugepages.py [--rows 100000 1000000]

For each table size: two pairs of (rows, pending) float32 arrays of dim 128, one pair allocated
with ``HET_HUGEPAGES=0`` (4 KiB pages), one by het.memory's advice (2 MiB pages where the kernel
has them). Each iteration draws 5,200 distinct random rows (a default job's unique keys a step)
and times, on each pair in turn (the order alternating), what a cache's update touches: an
``index_add_`` of a gradient into both arrays and an ``index_select`` of the rows. Prints one JSON
object: per size, the medians and the median of the per-iteration ratios 4 KiB / huge, and the
kernel's AnonHugePages over the huge pair (0: the kernel gave none, the comparison is moot).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from het import memory


def huge_kib() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("AnonHugePages:"))


def compare(rows: int, dim: int, touched: int, iters: int) -> dict:
    pairs = {}
    for huge in (False, True):
        os.environ[memory.ENV] = "1" if huge else "0"
        pairs[huge] = (memory.zeros(rows, dim), memory.zeros(rows, dim))
    os.environ.pop(memory.ENV)
    grads = torch.randn(touched, dim)
    times = {False: [], True: []}
    for it in range(iters):
        idx = torch.randperm(rows)[:touched]
        for huge in ((False, True) if it % 2 else (True, False)):
            table, pending = pairs[huge]
            t0 = time.perf_counter()
            table.index_add_(0, idx, grads)
            pending.index_add_(0, idx, grads)
            table.index_select(0, idx)
            times[huge].append(time.perf_counter() - t0)
    return {"rows": rows, "mib_per_array": rows * dim * 4 / 2**20,
            "ms_4k": 1e3 * statistics.median(times[False]), "ms_huge": 1e3 * statistics.median(times[True]),
            "ratio_4k_over_huge": statistics.median(a / b for a, b in zip(times[False], times[True])),
            "anon_huge_kib": huge_kib()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000])
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--touched", type=int, default=5200)
    p.add_argument("--iters", type=int, default=600)
    args = p.parse_args()
    torch.set_num_threads(1)
    print(json.dumps({"threads": 1, "touched": args.touched, "dim": args.dim,
                      "sizes": [compare(r, args.dim, args.touched, args.iters) for r in args.rows]}))


if __name__ == "__main__":
    main()
