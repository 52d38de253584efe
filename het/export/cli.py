"""``het export`` and ``het predict``: a checkpoint to an export, an export to scores."""

from __future__ import annotations

import argparse
import json

from het.export.rows import DTYPES


def add_parser(sub) -> None:
    """Register ``het export`` and ``het predict`` on the ``het`` command's subparsers."""
    e = sub.add_parser("export", help="a training checkpoint -> a self-contained model directory (rows mapped "
                                      "from disk, dense model, input spec)",
                       description="Export a checkpoint (het train --checkpoint DIR) into OUT: the dense model "
                                   "(torch.export where it captures), each table's rows as memory-mappable arrays "
                                   "(fp32, fp16, or int8 with a row-wise scale and bias), a dynamic table's key "
                                   "index, and the input spec that turns raw values into keys as training did. "
                                   "Streams: a table is never in memory whole. Load it with het.load_model(OUT).")
    e.add_argument("checkpoint", help="a checkpoint directory (worker.pt, ps/shard-<i>.pt)")
    e.add_argument("out", help="the export's directory (replaced whole if it holds one)")
    e.add_argument("--dtype", default="fp32", choices=DTYPES, help="how rows are stored (default: %(default)s)")
    e.add_argument("--json", action="store_true", help="the last line of stdout is the summary as JSON")
    e.add_argument("--quiet", action="store_true", help="no progress bar")
    e.set_defaults(func=_export)

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
    p.set_defaults(func=_predict)


def _export(args: argparse.Namespace) -> dict:
    from het.export.writer import export

    s = export(args.checkpoint, args.out, args.dtype, progress=not args.quiet)
    if args.json:
        print(json.dumps(s, sort_keys=True))
        return s
    tables = ", ".join(f"{name}: {t['rows']:,} rows{' (dynamic)' if t['dynamic'] else ''}, {t['bytes'] / 2**20:,.1f} MiB"
                       for name, t in s["tables"].items())
    print(f"het export: {s['model']} at step {s['step']} -> {s['out']} ({s['dtype']}; {tables}; "
          f"{s['bytes'] / 2**20:,.1f} MiB in all, {s['seconds']:.1f} s)")
    if s["dense_program"] is None:
        print(f"het export: the dense model is exported as parameters only: torch.export did not capture it "
              f"({s['dense_program_error']})")
    print(f"load it with het.load_model({s['out']!r}); score with het predict {s['out']} --data ...")
    return s


def _predict(args: argparse.Namespace) -> dict:
    import torch

    from het.export.predict import predict

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    s = predict(args.export, args.data, split=args.split, out=args.out, batch=args.batch, samples=args.samples,
                progress=not args.quiet, verify=True if args.verify else None)
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
