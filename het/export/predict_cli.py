"""``het predict``: an export's scores for a data set (:func:`het.export.predict.predict`)."""

from __future__ import annotations

import argparse
import json
import os

from het.data.table_cli import add_reading_flags, reading


def add_parser(sub) -> None:
    """Register ``het predict`` on the ``het`` command's subparsers."""
    p = sub.add_parser("predict", help="score a data set with an export, streamed: AUC, log loss, one score per row",
                       description="Score DATA with the export OUT in chunks of --batch rows, with bounded memory. "
                                   "DATA: synthetic-criteo, synthetic-criteo-1tb, table:DIR, criteo:DIR, or raw "
                                   "CSV/TSV/Parquet (or raw Criteo TSV) files, comma-separated, read through the "
                                   "export's input spec; rows that cannot be read are skipped and counted.")
    p.add_argument("export", help="an export directory (het export writes one)")
    p.add_argument("--data", required=True, help="what to score (see above)")
    p.add_argument("--split", choices=("test", "train", "all"), default=None,
                   help="default: test for prepared and synthetic data, all for raw files")
    p.add_argument("--out", default=None, help="scores.csv or scores.parquet: row, line, label, score per row")
    p.add_argument("--batch", type=int, default=4096, help="rows scored at once (default: %(default)s)")
    p.add_argument("--samples", type=int, default=None, help="score the first N rows only")
    p.add_argument("--verify", action="store_true", help="check every file's checksums first, whatever its size")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--json", action="store_true", help="the last line of stdout is the summary as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_reading_flags(p)
    p.add_argument("--keep", default="", help="raw files: comma-separated input columns written beside each score "
                   "in --out (e.g. id,user)")
    p.set_defaults(func=_predict)


def _predict(args: argparse.Namespace) -> dict:
    import torch

    from het.export.predict import predict

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        sep, names = reading(args, args.data.split(",")[0]) if os.path.isfile(args.data.split(",")[0]) else (None, None)
    except (ValueError, OSError) as e:
        raise SystemExit(f"het predict: {e}") from None
    s = predict(args.export, args.data, split=args.split, out=args.out, batch=args.batch, samples=args.samples,
                progress=not args.quiet, verify=True if args.verify else None, sep=sep, names=names,
                keep=[c.strip() for c in args.keep.split(",") if c.strip()])
    if args.json:
        print(json.dumps(s, sort_keys=True, default=str))
        return s
    metrics = (f"; AUC {s['auc']:.4f}, log loss {s['logloss']:.4f} over {s['labelled']:,} labelled rows"
               if s.get("labelled") else "")
    print(f"het predict: {s['rows']:,} rows of {s['data']} ({s['split']}) in {s['seconds']:.1f} s "
          f"({s['samples_per_s']:,.0f} rows/s){metrics}")
    if s["skipped"]:
        print(f"skipped {s['skipped']:,} row(s) that could not be read:")
        for e in s["first_skipped"]:
            print(f"  line {e['line']} ({e['source']}:{e['source_line']}): {e['reason']}")
    if s["out"]:
        print(f"wrote {s['out']}")
    return s
