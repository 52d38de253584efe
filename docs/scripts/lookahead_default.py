"""The default job with and without a lookahead window, in turn, pair by pair:
samples/s and sparse bytes per sample of each, and their ratios.

    .venv/bin/python docs/scripts/lookahead_default.py --depths 0,8,32 --pairs 3 --steps 600
    .venv/bin/python docs/scripts/lookahead_default.py --depths 32,128 --batch 128   # e2e's batch

Each run is `het train --steps N --cache-lookahead D [--batch B] --quiet --json` (the default job otherwise: Wide&Deep,
synthetic Criteo, 2 workers, s = 100, a 10% LFU cache, over loopback). Runs of one round go in turn
(depth 0, then each depth), so a slow spell of the shared machine hits every depth alike; the
last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile


def run(depth: int, steps: int, log_dir: str, batch: int | None = None) -> dict:
    extra = [] if batch is None else ["--batch", str(batch)]
    out = subprocess.run([sys.executable, "-m", "het", "train", "--steps", str(steps), "--cache-lookahead", str(depth),
                          *extra, "--quiet", "--json", "--log-dir", log_dir], check=True, capture_output=True, text=True)
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    return {"samples_per_s": summary["samples_per_s"], "sparse_bytes_per_sample": summary["sparse_bytes_per_sample"],
            "hit_rate": summary["hit_rate"], "auc": summary.get("auc")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--depths", default="0,8,32", help="lookahead depths; the first is the baseline")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch", type=int, default=None, help="samples per worker per step (default: the job's)")
    args = p.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    runs = {d: [] for d in depths}
    with tempfile.TemporaryDirectory(prefix="het-lookahead-") as tmp:
        for i in range(args.pairs):
            for d in depths:
                r = run(d, args.steps, f"{tmp}/r{i}-d{d}", args.batch)
                runs[d].append(r)
                print(f"round {i + 1} depth {d}: {r['samples_per_s']:,.0f} samples/s, "
                      f"{r['sparse_bytes_per_sample']:,.1f} sparse B/sample, hit rate {r['hit_rate']:.4f}",
                      file=sys.stderr, flush=True)
    base = depths[0]
    result = {"steps": args.steps, "batch": args.batch, "pairs": args.pairs, "depths": {}}
    for d in depths:
        speed = [r["samples_per_s"] / b["samples_per_s"] for r, b in zip(runs[d], runs[base])]
        result["depths"][d] = {
            "samples_per_s": [r["samples_per_s"] for r in runs[d]],
            "sparse_bytes_per_sample": statistics.median(r["sparse_bytes_per_sample"] for r in runs[d]),
            "hit_rate": statistics.median(r["hit_rate"] for r in runs[d]),
            "auc": statistics.median(r["auc"] for r in runs[d]) if runs[d][0]["auc"] is not None else None,
            "speed_vs_base": {"median": statistics.median(speed), "min": min(speed), "max": max(speed)},
        }
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
