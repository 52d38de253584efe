"""How many rows admission can save on a job's data: the keys seen in at least N worker-steps.

A key is admitted once pushes touched it in N worker-steps, so with ``--admit-after N`` a
dynamic table stores about the keys that N or more (step, rank) batches hold, whatever the cache
does: fewer where a key's N sightings lie further apart than the sketch's aging window, a few
more that its collisions admit early. This script counts them exactly for the default CTR job (2 workers, 1,000 steps of 512 samples), or for the job the flags name:

    .venv/bin/python docs/scripts/admission_bound.py [--steps 1000] [--workers 2]
"""

import argparse

import numpy as np

from het.train.config import TrainConfig
from het.train.tasks import CTRTask


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    cfg = TrainConfig(**({"steps": args.steps} if args.steps else {}), workers=args.workers)
    task = CTRTask(cfg)
    per_batch = [np.unique(task.batch(step, rank, cfg.workers, "cpu").sparse.numpy())
                 for step in range(cfg.steps) for rank in range(cfg.workers)]
    _, steps_seen = np.unique(np.concatenate(per_batch), return_counts=True)
    print(f"{len(steps_seen):,} distinct keys in {cfg.steps} steps x {cfg.workers} workers x {cfg.batch} samples")
    for n in (1, 2, 3, 4, 5, 8):
        kept = int((steps_seen >= n).sum())
        print(f"seen in >= {n} worker-steps: {kept:,} ({1 - kept / len(steps_seen):.1%} fewer rows than every key)")


if __name__ == "__main__":
    main()
