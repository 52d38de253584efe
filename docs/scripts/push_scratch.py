"""What a push costs a shard under a memory budget besides the rows it changes: the peak RSS
over the request's start, per key and in records (a row and its Adagrad state), for pushes of
new keys into a dynamic table of dim 64 with a disk tier (het.ps.server.budget's SCRATCH_RECORDS).

    .venv/bin/python docs/scripts/push_scratch.py [--keys 65536] [--memory-mib 64] [--rounds 4]

Before each request the allocator's free pages go back (malloc_trim) and the kernel's peak is
reset (/proc/self/clear_refs), so the peak is the request's own. Linux only.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile

import numpy as np

from het.config import OptimizerConfig, ShardConfig, TableConfig
from het.ps.protocol.messages import Message, Op
from het.ps.server.shard import Shard
from het.ps.server.store.dynamic import release_freed_memory


def _rss_and_peak() -> tuple[int, int]:
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return int(status["VmRSS"].split()[0]) << 10, int(status["VmHWM"].split()[0]) << 10


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=65536)
    p.add_argument("--memory-mib", type=int, default=64)
    p.add_argument("--rounds", type=int, default=4)
    args = p.parse_args()
    dim = 64
    table = TableConfig("t", rows=None, dim=dim, optimizer=OptimizerConfig("adagrad", lr=0.05))
    state = tempfile.mkdtemp(prefix="het-scratch-")
    try:
        shard = Shard(ShardConfig((table,), memory=args.memory_mib << 20), state_dir=state)
        rng = np.random.default_rng(0)
        record = 4 * 2 * dim  # a row and its Adagrad state
        out = []
        for step in range(1, args.rounds + 1):
            keys = np.unique(rng.integers(0, 1 << 40, args.keys)).astype(np.int64)
            grads = (rng.normal(size=(len(keys), dim)) * 0.01).astype(np.float32)
            release_freed_memory()
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # the peak RSS starts again from now
            before, _ = _rss_and_peak()
            reply = shard.handle(Message(Op.PUSH, step, {"table": "t", "step": step},
                                         [keys, grads, np.ones(len(keys), np.int64)]))
            assert "error" not in reply.meta, reply.meta
            peak = _rss_and_peak()[1] - before
            out.append({"keys": len(keys), "peak_mb": peak / 1e6, "bytes_per_key": peak / len(keys),
                        "records_per_key": peak / len(keys) / record})
        shard.close()
        print(json.dumps({"pushes": out}, indent=1))
    finally:
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
