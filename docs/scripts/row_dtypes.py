"""The default job (1,000 steps) with its rows stored in each precision, two seeds, in turn:
AUC, the shard's bytes and peak RSS, samples/s, as JSON lines (docs/RESULTS.md, "Half-precision
rows"). Run from the checkout: ``python docs/scripts/row_dtypes.py [--seeds 0,1]``."""

import argparse
import json
import subprocess
import sys


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--dtypes", default="fp32,fp16,bf16")
    args = p.parse_args()
    for seed in args.seeds.split(","):
        for dtype in args.dtypes.split(","):
            out = subprocess.run([sys.executable, "-m", "het", "train", "--table-row-dtype", dtype, "--seed", seed,
                                  "--json", "--quiet"], capture_output=True, text=True, check=True).stdout
            d = json.loads(out.strip().splitlines()[-1])
            ps = d["ps"]
            print(json.dumps({"row_dtype": dtype, "seed": int(seed), "auc": round(d["auc"], 5),
                              "sparse_bytes_per_sample": round(d["sparse_bytes_per_sample"]),
                              "samples_per_s": round(d["samples_per_s"]), "ps_bytes": ps["bytes"],
                              "rows": ps["rows"], "peak_rss_bytes": ps["peak_rss_bytes"]}), flush=True)


if __name__ == "__main__":
    main()
