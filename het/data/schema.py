"""A table's schema: which column is the label, which are dense, which are categorical ids, and
which are left out; inferred from the head of the file, written beside the prepared data.

Inference reads the first :data:`SAMPLE_ROWS` rows (Arrow's own types for CSV and TSV, the
file's for Parquet) and gives each column a role:

- ``label``: the column named by ``--label``, else the first named ``label``, ``click``,
  ``clicked``, ``target`` or ``y`` (any case);
- ``ignored``: a column with one value (or none), or one whose every value differs over a
  sample of at least 1,000 rows and that is not a float (a row id): it carries nothing a
  model can learn from;
- ``sparse``: integers in a column named as ids (``user_id``, ``itemId``, ``id``);
- ``dense``: other numbers (integers or floats);
- ``multi``: text whose values are lists (``Action|Comedy``: ``|`` or ``;`` in at least half of
  them, their parts repeating across rows), each part an id;
- ``sparse``: anything else (text), each value an id.

A schema file (``--schema FILE``, TOML) names the roles itself, and flags override both::

    label = "income"
    positive = ">50K"
    dense = ["age", "hours-per-week"]
    sparse = ["workclass", "education"]
    dense_transform = "auto"
    bucket = ["age"]   # dense columns made quantile-bucket ids
    buckets = 10
    min_freq = 2       # ids seen once in training share their column's out-of-vocabulary key
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from het.data.table_reader import _csv_options, _is_parquet, _open, _separator

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SAMPLE_ROWS = 100_000
LABEL_NAMES = ("label", "click", "clicked", "target", "y")
LIST_SEPARATORS = ("|", ";")
_ID_NAME = re.compile(r"(^|[^a-z])id$|Id$|_id$|^id_|ID$", re.IGNORECASE)  # user_id, itemId, movie_id, id
CRITEO_NAMES = ["label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27))]


@dataclass
class Column:
    """What inference saw of one column."""

    name: str
    type: str
    role: str
    why: str
    distinct: int
    missing: float
    low: float | None = None
    high: float | None = None
    sep: str | None = None  # a multi-hot column's separator


@dataclass
class Schema:
    """The roles of a table's columns (see the module docstring)."""

    label: str | None
    dense: list[str]
    sparse: list[str]
    ignored: dict[str, str] = field(default_factory=dict)
    positive: str | None = None
    multi: dict[str, str] = field(default_factory=dict)  # multi-hot columns (among sparse) and their separators
    columns: list[Column] = field(default_factory=list)  # what inference saw, when it ran
    bucket: list[str] = field(default_factory=list)  # dense columns made quantile-bucket ids
    buckets: int | None = None  # their buckets at most (None: the default)
    min_freq: int | None = None  # sparse ids rarer in training share an out-of-vocabulary key (None: 1)
    dense_transform: str | None = None  # the dense columns' transform (None: auto)

    def to_toml(self) -> str:
        """The schema as the TOML ``--schema`` reads."""
        def q(s):
            return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
        lines = [f"label = {q(self.label)}"] if self.label else []
        if self.positive is not None:
            lines.append(f"positive = {q(self.positive)}")
        lines += [f"dense = [{', '.join(map(q, self.dense))}]", f"sparse = [{', '.join(map(q, self.sparse))}]"]
        if self.dense_transform is not None:
            lines.append(f"dense_transform = {q(self.dense_transform)}")
        if self.bucket:
            lines.append(f"bucket = [{', '.join(map(q, self.bucket))}]")
        lines += [f"{k} = {v}" for k, v in (("buckets", self.buckets), ("min_freq", self.min_freq)) if v is not None]
        if self.multi:
            lines += ["", "[multi]", *(f"{q(k)} = {q(v)}" for k, v in self.multi.items())]
        if self.ignored:
            lines += ["", "[ignored]", *(f"{q(k)} = {q(v)}" for k, v in self.ignored.items())]
        return "\n".join(lines) + "\n"


def read_schema(path: str) -> dict:
    """A schema TOML file's keys (``label``, ``positive``, ``dense``, ``sparse``, ``multi``,
    ``dense_transform``, ``bucket``, ``buckets``, ``min_freq``, ``ignored``); any other key, or a
    value of the wrong type, is refused."""
    try:
        with open(path, "rb") as f:
            d = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: not valid TOML: {e}") from None
    kinds = {"label": str, "positive": str, "dense": list, "sparse": list, "dense_transform": str, "ignored": dict,
             "multi": dict, "bucket": list, "buckets": int, "min_freq": int}
    for key, value in d.items():
        if key not in kinds:
            raise ValueError(f"{path}: unknown key {key!r}; a schema has {sorted(kinds)}")
        if not isinstance(value, kinds[key]) or (kinds[key] is list and not all(isinstance(v, str) for v in value)) \
                or (kinds[key] is int and isinstance(value, bool)):
            raise ValueError(f"{path}: {key} must be {'a list of column names' if kinds[key] is list else kinds[key].__name__}, "
                             f"got {value!r}")
    return d


def sample(path: str, sep: str | None = None, names: list[str] | None = None, rows: int = SAMPLE_ROWS) -> pa.Table:
    """The first ``rows`` rows of a CSV, TSV (``.gz`` too) or Parquet file, with the types Arrow
    infers (text columns whose values all look like numbers are numbers)."""
    if _is_parquet(path):
        f = pq.ParquetFile(path)
        parts, got = [], 0
        for batch in f.iter_batches(batch_size=min(rows, 1 << 16)):
            parts.append(batch)
            got += batch.num_rows
            if got >= rows:
                break
        return pa.Table.from_batches(parts, schema=f.schema_arrow).slice(0, rows)
    read, parse = _csv_options(_separator(sep, path), names, lambda row: "skip")
    convert = pcsv.ConvertOptions(strings_can_be_null=True)
    parts, got = [], 0
    with _open(path) as stream:
        reader = pcsv.open_csv(stream, read_options=read, parse_options=parse, convert_options=convert)
        for batch in reader:
            parts.append(batch)
            got += batch.num_rows
            if got >= rows:
                break
        schema = reader.schema
    return pa.Table.from_batches(parts, schema=schema).slice(0, rows) if parts else schema.empty_table()


def infer(table: pa.Table, label: str | None = None) -> Schema:
    """Each column's role in ``table`` (a :func:`sample`); ``label`` names the label column."""
    names = table.schema.names
    twice = sorted({c for c in names if names.count(c) > 1})
    if twice:
        raise ValueError(f"column(s) {twice} appear more than once among the columns: rename them")
    if label is not None and label not in names:
        raise ValueError(f"label column(s) [{label!r}] not found; its columns are {names}")
    if label is None:
        label = next((c for c in names if c.lower() in LABEL_NAMES), None)
    columns, dense, sparse, ignored, multi = [], [], [], {}, {}
    for name in names:
        col = look(name, table.column(name), label)
        columns.append(col)
        if col.role == "dense":
            dense.append(name)
        elif col.role in ("sparse", "multi"):
            sparse.append(name)
            if col.role == "multi":
                multi[name] = col.sep
        elif col.role == "ignored":
            ignored[name] = col.why
    return Schema(label, dense, sparse, ignored, columns=columns, multi=multi)


def look(name: str, arr: pa.ChunkedArray, label: str | None) -> Column:
    """What inference sees of one column, and its role (``label`` names the label column)."""
    n = len(arr)
    kind = arr.type
    if pa.types.is_nested(kind):
        return Column(name, str(kind), "ignored", "nested values (lists, structs, maps): give --multi COL:SEP for "
                      "a list of ids", 0, arr.null_count / n if n else 0.0)
    if pa.types.is_dictionary(kind):
        arr, kind = arr.cast(kind.value_type), kind.value_type
    text = pa.types.is_string(kind) or pa.types.is_large_string(kind)
    if text:  # an empty field is missing
        arr = pc.if_else(pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(arr)), 0), None, arr)
    missing = arr.null_count / n if n else 0.0
    distinct = len(pc.unique(arr.drop_null())) if n else 0
    numeric = pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)
    low = high = None
    if numeric and n > arr.null_count:
        values = pc.cast(arr, pa.float64())
        low, high = float(pc.min(values).as_py()), float(pc.max(values).as_py())
    col = Column(name, str(kind), "", "", distinct, missing, low, high)
    present = n - arr.null_count
    if name == label:
        col.role, col.why = "label", "named by --label" if name.lower() not in LABEL_NAMES else f"named {name!r}"
    elif distinct <= 1:
        col.role, col.why = "ignored", "one value" if distinct else "no value"
    elif present >= 1000 and distinct == present and not pa.types.is_floating(kind):
        col.role, col.why = "ignored", "every value differs: a row id"
    elif text and (sep := _list_separator(arr)):
        col.role, col.why = "multi", f"lists of ids separated by {sep!r}"
        col.sep = sep
    elif numeric and _ID_NAME.search(name) and not pa.types.is_floating(kind):
        col.role, col.why = "sparse", "integers named as ids: each value an id"
    elif numeric:
        col.role, col.why = "dense", "numbers"
    else:
        col.role, col.why = "sparse", "text: each value an id"
    return col


def _list_separator(arr) -> str | None:
    """The separator of a text column of lists ("Action|Comedy"): one of ``|``, ``;`` found in
    at least half its values, whose parts repeat across rows more than the values do."""
    values = arr.drop_null()
    if len(values) == 0:
        return None
    for sep in LIST_SEPARATORS:
        has = pc.sum(pc.cast(pc.match_substring(values, sep), pa.int64())).as_py() or 0
        if has * 2 >= len(values):
            parts = pc.list_flatten(pc.split_pattern(values, sep))
            if len(pc.unique(parts)) < len(pc.unique(values)):
                return sep
    return None


def describe(schema: Schema, rows: int) -> str:
    """The columns as a table: role, type, distinct values, missing share, range."""
    out = [f"{'column':24} {'role':8} {'type':8} {'distinct':>9} {'missing':>8}  range / why"]
    for c in schema.columns:
        span = f"{_num(c.low)} .. {_num(c.high)}; " if c.low is not None else ""
        more = "+" if c.distinct >= rows else ""
        out.append(f"{c.name[:24]:24} {c.role:8} {c.type[:8]:8} {c.distinct:>8,}{more or ' '} {c.missing:>8.1%}  "
                   f"{span}{c.why}")
    if schema.label is None:
        out.append(f"no label column found (none named {'/'.join(LABEL_NAMES)}): give --label COL")
    return "\n".join(out)


def _num(x: float) -> str:
    return f"{x:.4g}" if not math.isfinite(x) or x != int(x) else f"{int(x):,}"


def looks_like_criteo(path: str, sep: str | None) -> tuple[list[str] | None, bool]:
    """``--preset criteo``: the column names of a Criteo file (40 columns with the label, 39
    without: Kaggle's test file) and whether its first line is a header."""
    with _open(path) as stream:
        first = stream.read(1 << 16).split(b"\n", 1)[0].decode(errors="replace").rstrip("\r")
    fields = first.split(sep or "\t")
    header = any(f.strip() in CRITEO_NAMES for f in fields)
    if header:
        return None, True
    if len(fields) == 40:
        return CRITEO_NAMES, False
    if len(fields) == 39:
        return CRITEO_NAMES[1:], False
    raise ValueError(f"{path}: Criteo's layout has 40 columns (label, I1..I13, C1..C26) or 39 (without the "
                     f"label), its first line has {len(fields)}")


def criteo_schema(names: list[str]) -> Schema:
    """Criteo's roles: ``label``, ``I1..I13`` dense, ``C1..C26`` ids (those of ``names``)."""
    return Schema("label" if "label" in names else None, [c for c in names if c.startswith("I")],
                  [c for c in names if c.startswith("C")])

