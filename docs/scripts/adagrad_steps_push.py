"""A push of several Adagrad steps (a worker's cached row flushed after several steps, with its
squares: het.adagrad's rule) on a fixed table's shard slice, native against the PyTorch
reference, in-process, in turn.

    .venv/bin/python docs/scripts/adagrad_steps_push.py

4,096 distinct rows of dim 128 into 200,000, each summing 1-100 steps with their squared
gradients (one float a row); ms per push, min-max over 3 rounds of 20, and the ratio of the medians.
"""

from __future__ import annotations

import statistics
import time

import torch

from het.config import OptimizerConfig, TableConfig
from het.ps.server.store.fixed import FixedRows


def main() -> None:
    torch.set_num_threads(1)
    cfg = TableConfig("t", rows=200_000, dim=128, optimizer=OptimizerConfig("adagrad", lr=0.05))
    gen = torch.Generator().manual_seed(0)
    tables = {"native": FixedRows(cfg, 0, 1), "reference": FixedRows(cfg, 0, 1, native=False)}
    rounds = {name: [] for name in tables}
    for _ in range(3):
        for name, table in tables.items():
            times = []
            for _ in range(20):
                local = torch.randperm(200_000, generator=gen)[:4096]
                grads = torch.randn(4096, 128, generator=gen) * 1e-2
                counts = torch.randint(1, 101, (4096,), generator=gen)
                sq = (grads * grads).mean(1, keepdim=True) / counts[:, None]
                start = time.perf_counter()
                table.push(local, grads, counts, 1, sq=sq)
                times.append(time.perf_counter() - start)
            rounds[name].append(statistics.median(times) * 1e3)
    for name, ms in rounds.items():
        print(f"{name}: {min(ms):.2f}-{max(ms):.2f} ms per push")
    print(f"ratio of medians: {statistics.median(rounds['reference']) / statistics.median(rounds['native']):.2f}x")


if __name__ == "__main__":
    main()
