"""het's share of a worker's step by sampling, a cross-check of `het bench profile` (cProfile).

    py-spy record --full-filenames --format raw --rate 250 -o /tmp/job.raw -- \\
        .venv/bin/python docs/scripts/het_share_sampled.py --steps 600
    .venv/bin/python docs/scripts/het_share_sampled.py --share /tmp/job.raw

The first runs what `het bench profile` profiles (one rank of the default job, in-process
shard, one torch thread: 20 steps of warm-up, then ``--steps``) with no profiler in the process;
py-spy samples its stacks from outside. The second reads py-spy's raw stacks. A sample of the
training loop counts as het's when its stack holds a frame of het's machinery (het.cache,
het.native, het.nn, het.ps, het.staleness) and as the shard's when it holds
``Shard.handle_frames``. The caches' flush at the end is left out. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time

HET = ("/het/cache/", "/het/native/", "/het/nn/", "/het/ps/", "/het/staleness.py")


def share(path: str) -> dict:
    loop = het = shard = 0
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            frames = stack.split(";")
            if not any(fr.startswith("Worker.train (") for fr in frames):
                continue
            if any(fr.startswith("Embedding.flush (") for fr in frames):
                continue
            loop += int(count)
            if any(h in fr for fr in frames for h in HET):
                het += int(count)
                shard += int(count) * any(fr.startswith("Shard.handle_frames (") for fr in frames)
    if not loop:
        raise SystemExit(f"{path}: no samples of Worker.train (recorded with --full-filenames?)")
    return {"samples": loop, "het_fraction": het / loop, "shard_fraction": shard / loop,
            "worker_het_fraction": (het - shard) / (loop - shard)}


def run(steps: int) -> dict:
    import torch

    from het.ps.client import PSClient
    from het.train.config import TrainConfig
    from het.train.loop import Worker
    from het.train.tasks import job_tables

    torch.set_num_threads(1)
    cfg = TrainConfig(eval_samples=0, workers=1)
    worker = Worker(cfg, PSClient.local(job_tables(cfg), cfg.servers, lazy_init=cfg.lazy_init))
    worker.train(20, 0, progress=False)
    t0 = time.perf_counter()
    worker.train(20 + steps, 20, progress=False)
    return {"steps": steps, "ms_per_step_with_flush": 1e3 * (time.perf_counter() - t0) / steps}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--steps", type=int, help="run the job this many steps (under py-spy)")
    g.add_argument("--share", metavar="RAW", help="py-spy's raw output to read")
    args = p.parse_args()
    print(json.dumps(share(args.share) if args.share else run(args.steps)))


if __name__ == "__main__":
    main()
