"""Milliseconds a step in each of het's native operators, in the default job, without a profiler.

    .venv/bin/python docs/scripts/native_op_times.py [--steps 500]

Runs what `het bench profile` profiles (one rank of the default job, in-process shard, one
torch thread: 30 steps of warm-up, then ``--steps``), with every function of ``het.native.ops``
timed around its call by ``time.perf_counter`` (the lookahead window's methods are not: they
belong to an object the module makes). Prints one JSON object: the step and each operator's
milliseconds a step. To compare two commits, run it from each worktree in turn
(``PYTHONPATH=<worktree>``), each with its own build.
"""

from __future__ import annotations

import argparse
import collections
import json
import time

import torch

from het import native
from het.ps.local import local_client


class _Timed:
    """``het.native.ops`` with each function's time added up by name."""

    def __init__(self, ops, seconds: collections.Counter):
        self._ops, self._seconds = ops, seconds

    def __getattr__(self, name):
        f = getattr(self._ops, name)
        if not callable(f) or name[:1].isupper():  # constants and classes as they are
            return f

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return f(*args, **kwargs)
            finally:
                self._seconds[name] += time.perf_counter() - start
        return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500)
    args = parser.parse_args()
    if native.ops is None:
        raise SystemExit("het's native core is not built (`make` builds it)")
    seconds: collections.Counter = collections.Counter()
    native.ops = _Timed(native.ops, seconds)

    from het.ps.client.client import PSClient
    from het.train.config import TrainConfig
    from het.train.loop import Worker
    from het.train.tasks import job_tables

    torch.set_num_threads(1)
    cfg = TrainConfig()
    worker = Worker(cfg, local_client(job_tables(cfg), cfg.servers, lazy_init=cfg.lazy_init))
    worker.train(30, 0, progress=False)
    seconds.clear()
    start = time.perf_counter()
    worker.train(30 + args.steps, 30, progress=False)  # ends with the caches' flush
    step = (time.perf_counter() - start) / args.steps
    print(json.dumps({"steps": args.steps, "step_ms": 1e3 * step,
                      "ms_per_step": {k: 1e3 * v / args.steps for k, v in seconds.most_common()}}))


if __name__ == "__main__":
    main()
