"""A shard's pull and push of 4,096 rows of dim 128, in-process: a fixed table against a dynamic
one holding the same 200,000 ids as raw int64 keys (both fully stored first), their rows in
``--row-dtype``. One thread; the milliseconds of each, per call. With ``--several N``, each push
sums N steps of each row and carries their squares (a worker's cached rows flushed after N
steps, as the default job's Adagrad pushes do; one float a row):

    .venv/bin/python docs/scripts/dynamic_shard_ops.py [--optimizer sgd] [--row-dtype fp32] [--seconds 2] [--several 1]
"""

import argparse
import time

import numpy as np
import torch

from het.config import OptimizerConfig, ShardConfig, TableConfig
from het.ps.protocol.partition import mix
from het.ps.server.shard import Shard


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--optimizer", default="sgd", choices=("sgd", "adagrad", "adam"))
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--row-dtype", default="fp32", choices=("fp32", "fp16", "bf16"))
    p.add_argument("--several", type=int, default=1, help="steps each push sums, its squares sent along")
    args = p.parse_args()
    torch.set_num_threads(1)
    rows, batch, dim = 200_000, 4096, 128
    rng = torch.Generator().manual_seed(0)
    batches = [torch.randperm(rows, generator=rng)[:batch] for _ in range(16)]
    grads, counts = np.full((batch, dim), 1e-3, np.float32), np.ones(batch, np.int64)
    steps = np.full(batch, args.several, np.int64)
    sq = np.full((batch, 1), 1e-6 * args.several, np.float32) if args.several > 1 else None
    for name, size, ids in (("fixed", rows, lambda k: k), ("dynamic", None, mix)):
        table = TableConfig("b", rows=size, dim=dim, optimizer=OptimizerConfig(args.optimizer, lr=0.01),
                            row_dtype=args.row_dtype)
        shard = Shard(ShardConfig((table,)))
        for lo in range(0, rows, batch):  # every row stored
            keys = ids(torch.arange(lo, min(rows, lo + batch))).numpy()
            shard.push("b", keys, grads[:len(keys)].copy(), counts[:len(keys)])
        keyed = [ids(b).numpy() for b in batches]
        for what in ("pull", "push"):
            start, n = time.perf_counter(), 0
            while time.perf_counter() - start < args.seconds:
                keys = keyed[n % len(keyed)]
                if what == "pull":
                    shard.pull("b", keys, lazy=True)
                else:
                    shard.push("b", keys, grads.copy(), steps, sq=sq)
                n += 1
            print(f"{name} {what}: {(time.perf_counter() - start) / n * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
