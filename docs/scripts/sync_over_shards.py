"""A sync's CPU over several shards, in one thread (the shards in-process, no ZeroMQ): ``--keys``
random distinct keys of a table of 1,000,000 rows (Adagrad, every row pushed once), every one a
miss (clock -1), so every row comes back; the client's merge of the shards' replies (rows,
clocks and positions laid out in the keys' order) timed apart. Milliseconds a sync, the mean of
``--syncs``:

    .venv/bin/python docs/scripts/sync_over_shards.py [--shards 3 --keys 20000 --dim 64 --syncs 200]
"""

import argparse
import json
import time

import torch

from het.config import OptimizerConfig, ShardConfig, TableConfig
from het.ps.client import client as client_module
from het.ps.client.client import PSClient
from het.ps.protocol.transport import LocalChannel
from het.ps.server.shard import Shard

ROWS = 1_000_000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shards", type=int, default=3)
    p.add_argument("--keys", type=int, default=20_000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--syncs", type=int, default=200)
    args = p.parse_args()
    torch.set_num_threads(1)
    table = TableConfig("t", rows=ROWS, dim=args.dim, optimizer=OptimizerConfig("adagrad", lr=0.01))
    client = PSClient([LocalChannel(Shard(ShardConfig((table,), i, args.shards)), f"shard-{i}")
                       for i in range(args.shards)])
    gen = torch.Generator().manual_seed(0)
    batches = [torch.unique(torch.randint(0, ROWS, (args.keys,), generator=gen)) for _ in range(8)]
    for keys in batches:
        client.wait(client.push("t", keys, torch.full((len(keys), args.dim), 1e-3),
                                torch.ones(len(keys), dtype=torch.int64)))
    misses = [torch.full((len(keys),), -1, dtype=torch.int64) for keys in batches]
    merged = [0.0]
    merge = client_module.merge

    def timed(*a):
        start = time.thread_time()
        try:
            return merge(*a)
        finally:
            merged[0] += time.thread_time() - start

    client_module.merge = timed
    start = time.thread_time()
    for i in range(args.syncs):
        client.wait(client.sync("t", batches[i % len(batches)], misses[i % len(batches)], 0))
    total = time.thread_time() - start
    print(json.dumps({"shards": args.shards, "keys": len(batches[0]), "dim": args.dim,
                      "sync_ms": round(total * 1e3 / args.syncs, 3),
                      "merge_ms": round(merged[0] * 1e3 / args.syncs, 3)}))


if __name__ == "__main__":
    main()
