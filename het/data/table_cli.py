"""``het data prepare table`` and ``het data describe``: a user's table, its schema inferred from
its head (:mod:`het.data.schema`) or given (``--schema``, flags), then prepared
(:func:`het.data.table.prepare_table`) with the schema written beside the data."""

from __future__ import annotations

import argparse
import json
import sys

from het.data.multi import POOLINGS, parse_multi
from het.data.prepared import add_common_flags, print_summary
from het.data.schema import Schema, criteo_schema, describe, infer, look, looks_like_criteo, read_schema, sample
from het.data.table import TableSpec, prepare_table
from het.data.transforms import KINDS


def add_reading_flags(p: argparse.ArgumentParser) -> None:
    """How a CSV or TSV file is read: what every command reading users' files shares."""
    p.add_argument("--sep", default=None, help="CSV/TSV separator (default: tab for .tsv, else comma)")
    p.add_argument("--no-header", action="store_true", help="CSV/TSV files have no header line: give --names")
    p.add_argument("--names", default=None, help="comma-separated column names of header-less files")
    p.add_argument("--preset", choices=("criteo",), default=None,
                   help="criteo: Criteo's raw layout, tab-separated, with or without its label column and header")


def _split(text) -> tuple[str, ...]:
    return tuple(c.strip() for c in text.split(",") if c.strip()) if text else ()


def reading(args, path: str) -> tuple[str | None, list[str] | None]:
    """(separator, column names of a header-less file) from the reading flags."""
    if args.no_header != bool(args.names):
        raise ValueError(f"--no-header and --names go together, got --no-header {args.no_header} "
                         f"and --names {args.names!r}")
    sep, names = args.sep, list(_split(args.names)) or None
    if args.preset == "criteo":
        sep = sep or "\t"
        found, header = looks_like_criteo(path, sep)
        names = names or (None if header else found)
    return sep, names


def schema_of(args, path: str, sep, names) -> tuple[Schema, str]:
    """The schema the flags, ``--schema`` and inference give, and where it came from."""
    given = read_schema(args.schema) if args.schema else {}
    if args.preset == "criteo":
        columns = names or list(sample(path, sep, None, rows=1).schema.names)
        base, source = criteo_schema(columns), "Criteo's layout"
    elif given.get("dense") is not None or given.get("sparse") is not None or args.dense is not None \
            or args.sparse is not None:  # any column flag: the columns are as given (the others none)
        base, source = Schema(None, [], []), "given"
    else:
        base, source = infer(sample(path, sep, names), args.label or given.get("label")), "inferred from the head"
    label = args.label or given.get("label") or base.label
    dense = list(_split(args.dense)) if args.dense is not None else given.get("dense", base.dense)
    sparse = list(_split(args.sparse)) if args.sparse is not None else given.get("sparse", base.sparse)
    dense = [c for c in dense if c != label]
    sparse = [c for c in sparse if c != label]
    positive = args.positive if args.positive is not None else given.get("positive")
    multi = {**base.multi, **given.get("multi", {}), **dict(parse_multi(m) for m in args.multi or ())}
    multi = {c: sep for c, sep in multi.items() if c != label}
    dense = [c for c in dense if c not in multi]
    sparse += [c for c in multi if c not in sparse]
    if label is None:
        raise ValueError(f"no label column: give --label COL (inference looks for a column named label, click, "
                         f"clicked, target or y); the columns are {[c.name for c in base.columns] or 'unread'}")
    def setting(name):
        flag = getattr(args, name)
        return flag if flag is not None else given.get(name)

    bucket = list(_split(args.bucket)) if args.bucket is not None else given.get("bucket", [])
    return Schema(label, dense, sparse, base.ignored, positive, columns=base.columns, multi=multi, bucket=bucket,
                  buckets=setting("buckets"), min_freq=setting("min_freq"),
                  dense_transform=setting("dense_transform")), source


def column_warnings(path: str, sep, names, schema: Schema) -> list[str]:
    """One line for each column the schema uses that carries nothing (one value) or that looks
    like a row id (every value differs), from the file's head."""
    used = [*schema.dense, *schema.sparse]
    seen = {c.name: c for c in schema.columns}
    if not seen:  # the columns were given: look at the ones used (a repeated column not read is no matter)
        head = sample(path, sep, names)
        names_read = head.schema.names
        seen = {name: look(name, head.column(name), None) for name in used if names_read.count(name) == 1}
    return [f"column {name!r} ({seen[name].why}) carries nothing a model can learn from"
            for name in used if name in seen and seen[name].role == "ignored"]


def add_prepare_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``table`` command to ``subparsers`` (``het data prepare``'s)."""
    p = subparsers.add_parser(
        "table", help="your own CSV, TSV (.gz too) or Parquet: hashed ids, memory-mappable arrays",
        description="One streaming pass over the files: a 0/1 label, dense columns as floats under transforms "
                    "fitted on the training rows, categorical columns hashed with their column name to int64 "
                    "keys (a dynamic PS table); writes OUT/{train,test}_{dense,sparse,labels}.npy, OUT/schema.toml "
                    "and OUT/meta.json. Without column flags the columns' roles are inferred from the file's "
                    "head (see `het data describe`). Malformed lines are skipped and reported. Train with "
                    "`het train --data table:OUT`.")
    p.add_argument("files", nargs="+", help="CSV, TSV or Parquet files, read in order as one input")
    p.add_argument("out", help="output directory")
    p.add_argument("--label", default=None, help="the label column (default: inferred)")
    p.add_argument("--dense", default=None, help="comma-separated dense (numeric) columns (default: inferred)")
    p.add_argument("--sparse", default=None, help="comma-separated categorical columns (default: inferred)")
    p.add_argument("--schema", default=None, metavar="TOML", help="the roles from a file (schema.toml of an "
                   "earlier preparation); flags override it")
    add_reading_flags(p)
    p.add_argument("--positive", default=None, help="which label values are 1: a comma-separated list "
                   "(e.g. '>50K') or a comparison with a number (e.g. '>=4'); default: labels are 0 or 1")
    p.add_argument("--multi", action="append", metavar="COL:SEP", help="a column of lists of ids (e.g. "
                   "genres:|), one bag a sample; repeat for several (default: inferred)")
    p.add_argument("--multi-size", type=int, default=8, help="a multi-hot column's ids kept a sample (the first; "
                   "default: %(default)s)")
    p.add_argument("--pooling", choices=POOLINGS, default="mean", help="how a multi-hot column's rows pool into "
                   "one (default: %(default)s)")
    p.add_argument("--dense-transform", default=None, choices=KINDS,
                   help="dense columns' transform, fitted on the training rows and kept with the data (default "
                   "auto: log1p then standardised for a non-negative right-skewed column, else standardised)")
    p.add_argument("--bucket", default=None, metavar="COLS", help="comma-separated dense columns made ids: "
                   "quantile buckets fitted on the training rows (--dense-transform bucket: every dense column)")
    p.add_argument("--buckets", type=int, default=None, help="a bucketed column's buckets at most (default 10)")
    p.add_argument("--min-freq", type=int, default=None, help="ids seen fewer times in the training rows share "
                   "their column's out-of-vocabulary key, as unseen ones do (default 1: every id its own key)")
    p.add_argument("--max-skipped", type=float, default=0.01,
                   help="the largest share of lines that may be skipped (malformed); past it nothing is written")
    p.add_argument("--log-dense", action="store_true", help="dense x -> log(max(x, 0) + 1), as Criteo, "
                   "nothing fitted (instead of --dense-transform)")
    add_common_flags(p)
    p.set_defaults(func=cmd_prepare_table)
    return p


def cmd_prepare_table(args: argparse.Namespace) -> dict:
    """Resolve the schema, run :func:`prepare_table`, print its summary and the schema used."""
    try:
        if not 0 <= args.max_skipped <= 1:
            raise ValueError(f"--max-skipped must lie in [0, 1], got {args.max_skipped}")
        sep, names = reading(args, args.files[0])
        schema, source = schema_of(args, args.files[0], sep, names)
        spec = TableSpec(schema.label, tuple(schema.dense), tuple(schema.sparse), log_dense=args.log_dense,
                         positive=schema.positive, dense_transform=schema.dense_transform or "auto",
                         multi=tuple(schema.multi.items()), bag=args.multi_size, pooling=args.pooling,
                         bucket=tuple(schema.bucket), buckets=schema.buckets or 10,
                         min_freq=schema.min_freq or 1)
        s = prepare_table(args.files, args.out, spec, sep=sep, names=names, max_rows=args.max_rows,
                          test_fraction=args.test_fraction, seed=args.seed, progress=not args.quiet,
                          max_skipped=args.max_skipped, schema_toml=schema.to_toml())
    except (ValueError, OSError) as e:
        raise SystemExit(f"het data prepare table: {e}") from None
    s["schema_source"] = source
    s["warnings"] = column_warnings(args.files[0], sep, names, schema)
    for line in s["warnings"]:
        print(f"het data prepare table: warning: {line}", file=sys.stderr)
    if args.json:
        print(json.dumps(s, sort_keys=True))
    else:
        print_summary("table", s, args.out, "table")
        print(f"schema ({source}; in {args.out}/schema.toml): label {schema.label!r}"
              f"{' positive ' + repr(schema.positive) if schema.positive else ''}; dense {schema.dense}; "
              f"sparse {schema.sparse}" + (f"; multi-hot {schema.multi}" if schema.multi else "")
              + (f"; ignored {schema.ignored}" if schema.ignored else ""))
        if s.get("dense_transforms"):
            print(f"dense transforms: {s['dense_transform']}")
    return s


def add_describe_parser(data_sub) -> None:
    """``het data describe FILE``: the inferred schema, nothing written."""
    p = data_sub.add_parser("describe", help="each column's inferred role, type, distinct values, missing share "
                            "and range, from the file's head; writes nothing")
    p.add_argument("file", help="a CSV, TSV (.gz too) or Parquet file")
    p.add_argument("--label", default=None, help="the label column (default: inferred)")
    p.add_argument("--rows", type=int, default=100_000, help="rows of the head read")
    add_reading_flags(p)
    p.add_argument("--json", action="store_true", help="the schema as JSON on the last line")
    p.set_defaults(func=cmd_describe)


def cmd_describe(args) -> dict:
    try:
        sep, names = reading(args, args.file)
        head = sample(args.file, sep, names, rows=args.rows)
        schema = infer(head, args.label or ("label" if args.preset == "criteo" and "label" in head.schema.names
                                            else None))
    except (ValueError, OSError) as e:
        raise SystemExit(f"het data describe: {e}") from None
    print(f"{args.file}: {head.num_rows:,} rows read, {head.num_columns} columns")
    print(describe(schema, head.num_rows))
    out = {"label": schema.label, "dense": schema.dense, "sparse": schema.sparse, "ignored": schema.ignored,
           "rows_read": head.num_rows, "columns": [vars(c) for c in schema.columns]}
    if args.json:
        print(json.dumps(out))
    return out
