"""``het export``: a training checkpoint to a self-contained export directory."""

from __future__ import annotations

import argparse
import json

from het.export.rows import DTYPES


def add_parser(sub) -> None:
    """Register ``het export`` on the ``het`` command's subparsers."""
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
