"""A shard's answer to a pull with reused reply buffers against a new buffer per reply, in turn.

    .venv/bin/python docs/scripts/shard_replies.py

An in-process shard (SGD, 200,000 rows of dim 128) answers encoded PULL requests of 4,096
distinct random rows (`Shard.handle_frames`, as its server loop calls it), the last two replies
kept alive as ZeroMQ keeps frames in flight. "pooled": het.ps.server.store.kernels.ReplyBuffers as the shard
runs it; "fresh": a ``torch.empty`` per reply, as before. Prints one JSON object: ms per reply,
each round, and the medians.
"""

from __future__ import annotations

import collections
import json
import statistics
import time

import numpy as np
import torch

import het.ps.server.store.kernels as table_module
from het.config import OptimizerConfig, ShardConfig, TableConfig
from het.ps.protocol.messages import Message, Op, encode
from het.ps.server.shard import Shard


def main(rounds: int = 6, replies: int = 300) -> None:
    torch.set_num_threads(1)
    table = TableConfig("bench", rows=200_000, dim=128, optimizer=OptimizerConfig("sgd", lr=0.01))
    shard = Shard(ShardConfig((table,)))
    gen = np.random.default_rng(0)
    requests = [encode(Message(Op.PULL, i + 1, {"table": "bench", "lazy": False},
                               [gen.choice(200_000, 4096, replace=False).astype(np.int64)])) for i in range(50)]
    in_flight = collections.deque(maxlen=2)
    pooled = table_module.ReplyBuffers.take

    def fresh(self, rows):
        self._taken = None
        return torch.empty(rows, self.dim)

    ms = {"pooled": [], "fresh": []}
    for _ in range(rounds):
        for mode in ms:
            table_module.ReplyBuffers.take = pooled if mode == "pooled" else fresh
            t0 = time.perf_counter()
            for i in range(replies):
                in_flight.append(shard.handle_frames(requests[i % len(requests)]))
            ms[mode].append(round((time.perf_counter() - t0) / replies * 1e3, 3))
    table_module.ReplyBuffers.take = pooled
    print(json.dumps({"rows": 4096, "dim": 128, "ms_per_reply": ms,
                      "median_pooled": statistics.median(ms["pooled"]), "median_fresh": statistics.median(ms["fresh"])}))


if __name__ == "__main__":
    main()
