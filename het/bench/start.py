"""`het bench start`: how long a job takes from the command to its first step, and its shards'
peak memory: ``het train`` (its defaults, or the flags given) started ``--runs`` times, each timed
from its launch to the first step its progress bar shows, then its summary read. ``--vs DIR``
runs the same command from another checkout (``DIR``, e.g. a ``git worktree`` of an earlier
commit) in turn with this one, run by run, and gives the ratio pair by pair."""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

_STEP = re.compile(rb"\| *[1-9]\d*/\d+ ")  # the bar after its first step: "| 1/30 "


def first_step(cmd: list[str], cwd: str | None = None) -> dict:
    """One run of ``cmd`` (a ``het train ... --json`` command): seconds to its first step and to
    its end, and its shards' peak RSS in bytes."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as stdout:  # a file, not a pipe: a long summary cannot block the job
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=stdout, stderr=subprocess.PIPE)
        seen, first = b"", None
        for chunk in iter(lambda: proc.stderr.read1(4096), b""):
            seen = (seen + chunk)[-4096:]
            if first is None and _STEP.search(seen):
                first = time.perf_counter() - start
        proc.wait()
        stdout.seek(0)
        out = stdout.read()
    if proc.returncode != 0 or first is None:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {proc.returncode}): {seen[-300:].decode(errors='replace')}")
    summary = json.loads(out.decode().strip().splitlines()[-1])
    return {"first_step_s": first, "wall_s": time.perf_counter() - start,
            "shard_peak_rss_bytes": summary["ps"]["peak_rss_bytes"]}


def run(flags: list[str], runs: int, vs: str | None) -> dict:
    cmd = [sys.executable, "-m", "het", "train", *flags, "--json"]
    sides = {"here": None} if vs is None else {"here": None, "vs": os.path.abspath(vs)}
    got = {side: [] for side in sides}
    for _ in range(runs):
        for side, cwd in sides.items():  # in turn: a drift of the machine's speed reaches both
            got[side].append(first_step(cmd, cwd))
    out = {"bench": "start", "command": cmd[1:], "runs": runs}
    for side, results in got.items():
        out[side] = {k: {"median": statistics.median(r[k] for r in results), "min": min(r[k] for r in results),
                         "max": max(r[k] for r in results)} for k in results[0]}
    if vs is not None:
        ratios = [h["first_step_s"] / v["first_step_s"] for h, v in zip(got["here"], got["vs"])]
        out["first_step_ratio"] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
    return out


def add_parser(bsub) -> None:
    """Register ``het bench start`` on the subparsers of ``het bench``."""
    p = bsub.add_parser("start", help="seconds from het train's command to its first step, and the shards' peak RSS")
    p.add_argument("--runs", type=int, default=5, help="runs (of each side with --vs)")
    p.add_argument("--vs", default=None, help="another checkout to run the same command from, in turn (a ratio)")
    p.add_argument("--steps", type=int, default=30, help="the job's steps (default: %(default)s)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_main)


def _main(args) -> None:
    if args.runs < 1 or args.steps < 1:
        raise ValueError(f"--runs and --steps must be >= 1, got {args.runs}, {args.steps}")
    if args.vs is not None and not os.path.isfile(os.path.join(args.vs, "het", "__init__.py")):
        raise ValueError(f"--vs expects a checkout of het (a directory holding het/), got {args.vs!r}")
    result = run(["--steps", str(args.steps)], args.runs, args.vs)
    if args.json:
        print(json.dumps(result, sort_keys=True))
        return
    here = result["here"]
    line = (f"first step after {here['first_step_s']['median']:.2f} s (median of {args.runs}); shards' peak RSS "
            f"{here['shard_peak_rss_bytes']['median'] / 1e6:,.0f} MB")
    if "vs" in result:
        line += (f"; {args.vs}: {result['vs']['first_step_s']['median']:.2f} s, ratio "
                 f"{result['first_step_ratio']['median']:.2f} (pairs {result['first_step_ratio']['min']:.2f}-"
                 f"{result['first_step_ratio']['max']:.2f})")
    print(line)
