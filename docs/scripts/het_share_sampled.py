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

Where a worker's het samples stand (the shard's answers left out), by their innermost frame:
``worker_native_fraction``, on a line of het that calls the native core or the batch's row
gather (``index_select``); the rest, ``worker_glue_fraction``, is het's Python and the small
torch and numpy calls it makes. ``worker_client_fraction``: those under the PS client's verbs
(``PSClient.*``: requests built and sent, replies read and merged), the request path's share.
``leaves``: the most sampled innermost frames, with their share of a worker's step.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import linecache
import time

HET = ("/het/cache/", "/het/native/", "/het/nn/", "/het/ps/", "/het/staleness.py")


# het lines that run the native core (the lookahead's Window too), or gather the batch's rows
NATIVE_LINE = ("native.", "_window.", "index_select(")


def share(path: str, top: int = 12) -> dict:
    loop = het = shard = native = client = 0
    leaves: collections.Counter = collections.Counter()
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            frames, count = stack.split(";"), int(count)
            if not any(fr.startswith("Worker.train (") for fr in frames):
                continue
            if any(fr.startswith("Embedding.flush (") for fr in frames):
                continue
            loop += count
            if any(h in fr for fr in frames for h in HET):
                het += count
                if any(fr.startswith("Shard.handle_frames (") for fr in frames):
                    shard += count
                    continue
                leaves[frames[-1]] += count
                native += count * _runs_native(frames[-1])
                client += count * any(fr.startswith("PSClient.") for fr in frames)
    if not loop:
        raise SystemExit(f"{path}: no samples of Worker.train (recorded with --full-filenames?)")
    worker = loop - shard
    return {"samples": loop, "het_fraction": het / loop, "shard_fraction": shard / loop,
            "worker_het_fraction": (het - shard) / worker, "worker_native_fraction": native / worker,
            "worker_glue_fraction": (het - shard - native) / worker, "worker_client_fraction": client / worker,
            "leaves": [{"frame": fr, "fraction": n / worker, "native": _runs_native(fr)}
                       for fr, n in leaves.most_common(top)]}


@functools.cache
def _runs_native(frame: str) -> bool:
    """Whether py-spy's frame ``"name (path:line)"`` stands on a line of het's that calls the
    native core (or is in het.native) or gathers the batch's rows."""
    where = frame[frame.rfind("(") + 1:-1]
    path, _, line = where.rpartition(":")
    if not any(h in path for h in HET) or not line.isdigit():
        return False
    if "/het/native/" in path:
        return True
    try:
        text = linecache.getline(path, int(line))
    except OSError:
        return False
    return any(n in text for n in NATIVE_LINE)


def run(steps: int) -> dict:
    import torch

    from het.ps.local import local_client
    from het.train.config import TrainConfig
    from het.train.loop import Worker
    from het.train.tasks import job_tables

    torch.set_num_threads(1)
    cfg = TrainConfig(eval_samples=0, workers=1)
    worker = Worker(cfg, local_client(job_tables(cfg), cfg.servers, lazy_init=cfg.lazy_init))
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
