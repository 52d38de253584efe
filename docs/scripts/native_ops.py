"""het's native operators against their PyTorch/numpy reference, in-process, one thread.

    .venv/bin/python docs/scripts/native_ops.py

Prints one JSON object: milliseconds per call of ``initial_rows`` (100,000 keys at dim 128), of
a fixed table's push (4,096 distinct rows of dim 128 into 200,000, each optimizer) and of a
step's unique keys and inverse (13,312 keys; reference ``torch.unique``), native and reference
in turn for ``--rounds`` rounds, and the ratio of the medians. The reference path is
``het.ps.protocol.initial.hash_rows`` (initial_rows) and ``FixedRows(..., native=False)`` (push). Not native,
timed the same way: ``Embedding.forward``'s per-key gather by ``index_select`` (the "native"
column) against the ``rows[inverse]`` it replaced, forward and backward.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

from het import native
from het.config import OptimizerConfig, TableConfig
from het.ps.protocol.initial import hash_rows, initial_counters, initial_rows
from het.ps.server.store.fixed import FixedRows


def time_initial_rows(use_native: bool, keys: np.ndarray, table: TableConfig) -> float:
    t0 = time.perf_counter()
    if use_native:
        initial_rows(table, keys)
    else:
        counters, salt = initial_counters(table, keys)
        hash_rows(counters, table.dim, salt, table.init_scale)
    return (time.perf_counter() - t0) * 1000


def time_push(table: FixedRows, batches: list, dim: int) -> float:
    grads, counts = torch.full((len(batches[0]), dim), 1e-3), torch.ones(len(batches[0]), dtype=torch.int64)
    t0 = time.perf_counter()
    for b in batches:
        table.push(b, grads.clone(), counts, 1)
    return (time.perf_counter() - t0) * 1000 / len(batches)


def time_unique(use_native: bool, keys: torch.Tensor, reps: int = 200) -> float:
    t0 = time.perf_counter()
    for _ in range(reps):
        native.unique_inverse(keys) if use_native else torch.unique(keys, return_inverse=True)
    return (time.perf_counter() - t0) * 1000 / reps


def time_gather(fast: bool, rows: torch.Tensor, inverse: torch.Tensor, grad: torch.Tensor, reps: int = 50) -> float:
    """Embedding.forward's per-key gather and its backward: index_select, or rows[inverse] before."""
    leaf = rows.clone().requires_grad_()
    t0 = time.perf_counter()
    for _ in range(reps):
        leaf.grad = None
        (leaf.index_select(0, inverse) if fast else leaf[inverse]).backward(grad)
    return (time.perf_counter() - t0) * 1000 / reps


def summary(native_ms: list, reference_ms: list) -> dict:
    return {"native_ms": [round(x, 2) for x in native_ms], "reference_ms": [round(x, 2) for x in reference_ms],
            "speedup_of_medians": statistics.median(reference_ms) / statistics.median(native_ms)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    if native.ops is None:
        raise SystemExit("the native core is not built: run `make native`")
    torch.set_num_threads(1)
    out = {}
    table = TableConfig("t", rows=None, dim=128)
    keys = np.random.default_rng(0).integers(0, 1 << 40, 100_000)
    time_initial_rows(False, keys, table)  # first touch of the output pages, not counted
    runs = {True: [], False: []}
    for _ in range(args.rounds):
        for use_native in (True, False):
            runs[use_native].append(time_initial_rows(use_native, keys, table))
    out["initial_rows_100k_x_128"] = summary(runs[True], runs[False])
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randperm(200_000, generator=gen)[:4096] for _ in range(20)]
    for name in ("sgd", "adagrad", "adam"):
        cfg = TableConfig("t", rows=200_000, dim=128, optimizer=OptimizerConfig(name, lr=0.01))
        tables = {use_native: FixedRows(cfg, 0, 1, native=use_native) for use_native in (True, False)}
        time_push(tables[True], batches[:2], 128)  # warm-up
        runs = {True: [], False: []}
        for _ in range(args.rounds):
            for use_native in (True, False):
                runs[use_native].append(time_push(tables[use_native], batches, 128))
        out[f"push_4096_x_128_{name}"] = summary(runs[True], runs[False])
    # a default job's step: 512 samples x 26 fields of ids below 2.6M
    keys = torch.randint(0, 2_600_000, (512 * 26,), generator=gen)
    time_unique(True, keys, 20), time_unique(False, keys, 20)  # warm-up
    runs = {True: [], False: []}
    for _ in range(args.rounds):
        for use_native in (True, False):
            runs[use_native].append(time_unique(use_native, keys))
    out["unique_inverse_13312"] = summary(runs[True], runs[False])
    # the same step's per-key gather, forward and backward (not native: index_select against
    # the advanced indexing it replaced), 5,000 unique rows of dim 128
    rows, inverse = torch.randn(5000, 128, generator=gen), torch.randint(0, 5000, (512 * 26,), generator=gen)
    grad = torch.randn(512 * 26, 128, generator=gen)
    time_gather(True, rows, inverse, grad, 5), time_gather(False, rows, inverse, grad, 5)  # warm-up
    runs = {True: [], False: []}
    for _ in range(args.rounds):
        for fast in (True, False):
            runs[fast].append(time_gather(fast, rows, inverse, grad))
    out["gather_forward_backward_13312_x_128"] = summary(runs[True], runs[False])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
