"""``het data stream-synthetic``: partitions of synthetic Criteo written over time, with drift.

Partition ``p`` (``OUT/part-00000``, ``part-00001``, ...) holds ``--rows`` samples of
:meth:`het.data.synthetic.SyntheticCriteo.partition`: labelled by the planted model turned by
``p * --drift`` radians, so a model trained on the first partitions loses its edge on the later
ones unless it goes on learning. Each is a prepared directory of hashed ids (a dynamic table's
keys), made whole before it takes its name, then marked complete with ``_SUCCESS``
(:data:`het.data.stream.MARKER`), as a warehouse export writes an hourly partition; one lands
every ``--every`` seconds. A stream can so be run, and tested, anywhere.
"""

from __future__ import annotations

import os
import time

import numpy as np

from het import files
from het.data.prepared import HASHED_FORMAT, HASHED_VERSION, writing
from het.data.stream import MARKER
from het.data.synthetic import SyntheticCriteo, SyntheticCriteoConfig


def partition_name(number: int) -> str:
    return f"part-{number:05d}"


def write_partition(out: str, data: SyntheticCriteo, number: int, rows: int, drift: float) -> str:
    """Write partition ``number`` under ``out`` and mark it complete; its path."""
    path = os.path.join(out, partition_name(number))
    if os.path.exists(os.path.join(path, MARKER)):
        raise ValueError(f"{path} is a complete partition already: write a new stream into another directory")
    batch = data.partition(number, rows, drift)
    with writing(path, data.num_dense, len(data.key_fields)) as w:
        w.add(batch.dense.numpy(), batch.sparse.numpy(), batch.labels.numpy(), np.zeros(rows, bool))
        counts = w.close()
        w.write_meta({"format": HASHED_FORMAT, "version": HASHED_VERSION, "source": "synthetic-stream",
                      "num_rows": None, "num_ids": data.num_rows, "num_dense": data.num_dense,
                      "num_fields": len(data.key_fields), "train_rows": counts["train"], "test_rows": counts["test"],
                      "partition": number, "drift": drift, "angle": number * drift,
                      "synthetic": {"alpha": data.cfg.alpha, "cap": data.cfg.cap, "scale": data.cfg.scale,
                                    "seed": data.cfg.seed}})
    files.write_file(os.path.join(path, MARKER), lambda f: None)
    return path


def write_stream(out: str, partitions: int, every_s: float, rows: int, drift: float,
                 cfg: SyntheticCriteoConfig = SyntheticCriteoConfig(), first: int = 0, say=print) -> list[str]:
    """Write partitions ``first .. first + partitions - 1``, one every ``every_s`` seconds (the
    first at once); their paths."""
    data = SyntheticCriteo(cfg)
    files.make_directories(out)
    written, start = [], time.monotonic()
    for i in range(partitions):
        wait = start + i * every_s - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        written.append(write_partition(out, data, first + i, rows, drift))
        say(f"het data stream-synthetic: {written[-1]} ({rows:,} rows, angle {(first + i) * drift:.3f})")
    return written


def add_parser(data_sub) -> None:
    """Register ``het data stream-synthetic`` on ``het data``'s subparsers."""
    p = data_sub.add_parser("stream-synthetic", help="write partitions of drifting synthetic Criteo over time")
    p.add_argument("out", help="the stream's directory (partitions part-00000, ... in it)")
    p.add_argument("--partitions", type=int, default=24, help="partitions to write (default 24)")
    p.add_argument("--every", type=float, default=10.0, help="seconds between two partitions (default 10; 0: at once)")
    p.add_argument("--rows", type=int, default=50_000, help="samples a partition (default 50,000)")
    p.add_argument("--drift", type=float, default=0.05,
                   help="radians the planted model turns a partition (default 0.05; 0: none)")
    p.add_argument("--first", type=int, default=0, help="the first partition's number (to go on with a stream)")
    p.add_argument("--cap", type=int, default=100_000,
                   help="every field's cardinality at most this (default 100,000, as het train's synthetic data)")
    p.add_argument("--seed", type=int, default=0, help="the data's seed")
    p.set_defaults(func=_main)


def _main(args) -> None:
    for name, value, lo in (("--partitions", args.partitions, 1), ("--rows", args.rows, 1), ("--first", args.first, 0)):
        if value < lo:
            raise SystemExit(f"het data stream-synthetic: {name} must be >= {lo}, got {value}")
    if not args.every >= 0 or not np.isfinite(args.drift):
        raise SystemExit(f"het data stream-synthetic: --every must be >= 0 and --drift a number, got {args.every}, "
                         f"{args.drift}")
    try:
        cfg = SyntheticCriteoConfig(cap=args.cap, seed=args.seed)
        write_stream(args.out, args.partitions, args.every, args.rows, args.drift, cfg, args.first)
    except ValueError as e:
        raise SystemExit(f"het data stream-synthetic: {e}") from None
