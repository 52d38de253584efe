"""Users' own tables: CSV, TSV (gzipped too) or Parquet -> hashed, memory-mappable arrays -> Batch.

``het data prepare table FILE... OUT --label COL --dense COLS --sparse COLS`` reads the files in
one streaming pass (Arrow's CSV and Parquet readers, block by block: memory does not grow with
the data) and writes het's prepared format (:mod:`het.data.prepared`): a label of 0 or 1, the
dense columns as float32 and the sparse ones as hashed int64 keys (a dynamic PS table).

Hashing: a categorical value's text is hashed with its column's *name*
(:func:`het.data.hashing.hash_strings`), so the keys do not depend on the order of ``--sparse``
nor on the other columns, and a column keeps its keys across files and runs. A missing value
(an empty field, a Parquet null) is the empty string: its column's own "missing" key. Integer
Parquet columns are hashed as their decimal text, as a CSV spells them. Criteo's ``C1``..``C26``
hashed by ``het data prepare criteo --hash`` get the same keys, so a CSV or Parquet copy of the
same rows prepared with ``--log-dense`` gives the same arrays.

Dense values: any decimal number; missing -> 0; with ``log_dense``, Criteo's transform
``log(max(x, 0) + 1)``. A line is skipped (counted; the first ones named with their line
number and reason) when it has the wrong number of columns, a label other than 0 or 1, or a
dense value that is not a finite number. Lines are numbered in their file, header included;
Parquet rows from 1. The split is Criteo's (:func:`het.data.prepared.split_is_test`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from het.data.hashing import hash_strings
from het.data.labels import Positive
from het.data.multi import PAD, POOLINGS, multi_keys
from het.data.numbers import parse_numbers
from het.data.prepared import (HASHED_FORMAT, HASHED_VERSION, PreparedDataset, SkipReport, add_common_flags,
                               check_inputs, print_summary, split_is_test, summary, writing)
from het.data.sketch import DistinctSketch
from het.files import create
from het.data.table_reader import batches, check_columns
from het.data.fitted import Fitter, rewrite
from het.data.transforms import KINDS, describe

__all__ = ["TableDataset", "TableSpec", "hash_column", "parse_numbers", "prepare_table"]

_OK = -1


@dataclass(frozen=True)
class TableSpec:
    """Which columns are what. ``dense`` and ``sparse`` keep their order in the arrays."""

    label: str
    dense: tuple[str, ...]
    sparse: tuple[str, ...]
    log_dense: bool = False
    positive: str | None = None  # which labels are 1 (het.data.labels); None: 0 or 1 only
    dense_transform: str = "auto"  # fitted on the training rows (het.data.transforms); log_dense: Criteo's
    multi: tuple[tuple[str, str], ...] = ()  # sparse columns holding lists: (column, separator)
    bag: int = 8  # a multi-hot column's slots: its first `bag` ids kept
    pooling: str = "mean"  # how a multi-hot column's rows pool into its field's row
    bucket: tuple[str, ...] = ()  # dense columns made quantile-bucket ids (het.data.buckets); all under "bucket"
    buckets: int = 10  # a bucketed column's buckets at most
    min_freq: int = 1  # ids rarer in the training rows share their column's out-of-vocabulary key (het.data.vocab)

    def __post_init__(self):
        Positive(self.positive)  # a malformed --positive is refused before any file is read
        if self.dense_transform not in KINDS:
            raise ValueError(f"dense transform must be one of {KINDS}, got {self.dense_transform!r}")
        if self.dense_transform == "bucket":
            object.__setattr__(self, "bucket", tuple(self.dense))
        if [c for c in self.bucket if c not in self.dense] or (self.bucket and self.log_dense):
            raise ValueError(f"bucketed columns must be dense ones, without --log-dense; got {list(self.bucket)} "
                             f"of dense {list(self.dense)}, --log-dense {self.log_dense}")
        if not isinstance(self.buckets, int) or not 2 <= self.buckets <= 1000 or not isinstance(self.min_freq, int) \
                or self.min_freq < 1:
            raise ValueError(f"expected --buckets in [2, 1000] and --min-freq >= 1, got {self.buckets!r} and "
                             f"{self.min_freq!r}")
        columns = self.columns
        if not self.label or not self.sparse:
            raise ValueError(f"expected a label column and at least one sparse column, got label "
                             f"{self.label!r} and sparse {list(self.sparse)}")
        stray = [c for c, _ in self.multi if c not in self.sparse]
        if stray or self.bag < 1 or self.pooling not in POOLINGS:
            raise ValueError(f"multi-hot columns must be sparse ones, with --multi-size >= 1 and --pooling one of "
                             f"{POOLINGS}; got {stray or ''} size {self.bag}, pooling {self.pooling!r}")
        repeated = sorted({c for c in columns if columns.count(c) > 1})
        if repeated:
            raise ValueError(f"each column may appear once among label, dense and sparse, got {repeated} twice")

    @property
    def columns(self) -> list[str]:
        return [self.label, *self.dense, *self.sparse]

    @property
    def bag_sizes(self) -> list[int]:
        """Keys a sample holds of each sparse column: 1, or ``bag`` for a multi-hot one."""
        seps = dict(self.multi)
        return [self.bag if c in seps else 1 for c in self.sparse]

    @property
    def fitted(self) -> bool:
        """Whether the dense columns are written raw, to be transformed or bucketed by what the
        training rows fit (:mod:`het.data.fitted`)."""
        return bool(self.dense) and not self.log_dense and (self.dense_transform != "none" or bool(self.bucket))

    @property
    def fields(self) -> list[str]:
        """The model's sparse fields: the sparse columns, then the bucketed ones."""
        return [*self.sparse, *self.bucket]

    @property
    def model_dense(self) -> list[str]:
        """The model's dense inputs: the dense columns not bucketed."""
        return [c for c in self.dense if c not in self.bucket]

    def check(self, names: list[str], path: str) -> None:
        """Refuse a file that lacks a column, naming each missing one and the ones it has, or
        whose columns read here are not named once each (which one is meant is ambiguous)."""
        for kind, cols in (("label", [self.label]), ("dense", self.dense), ("sparse", self.sparse)):
            missing = [c for c in cols if c not in names]
            if missing:
                raise ValueError(f"{path}: {kind} column(s) {missing} not found; its columns are {names}")
        for c in self.columns:
            if names.count(c) > 1:
                raise ValueError(f"{path}: column {c!r} appears {names.count(c)} times among its columns, "
                                 f"expected once (which one is meant?): rename the others")


# ---- one batch -> arrays ------------------------------------------------------------------------

def hash_column(name: str, arr: pa.Array) -> np.ndarray:
    """Keys of a column's values; nulls are the empty string (missing). Short values (at most
    16 bytes: ids, codes, Criteo's hex) are hashed where they lie, which beats finding the
    distinct ones first; longer ones are dictionary-encoded by Arrow and each distinct value
    hashed once. Measured on 200k values, best of 5, here: 8-byte hex ids (all distinct) 13 ms
    where they lie against 29 ms through the dictionary; 50-byte names of 50 categories 76 ms
    against 8 ms.

    Shape:
        (n,) -> (n,) int64.

    Example:
        >>> k = hash_column("C1", pa.array(["68fd1e64", None, "68fd1e64", ""]))
        >>> bool(k[0] == k[2]), bool(k[1] == k[3]), bool(k[0] == k[1])
        (True, True, False)
        >>> long = pa.array(["a rather long category name, past 16 bytes", None, ""])
        >>> k = hash_column("C1", long); bool(k[1] == k[2]), bool(k[0] == hash_column("C1", long[:1])[0])
        (True, True)
    """
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        arr = pc.cast(arr, pa.string())  # integers as their decimal text, as a CSV has them
    arr = pc.fill_null(arr, "")
    if (pc.max(pc.binary_length(arr)).as_py() or 0) <= 16:
        return _hash_strings(name, arr)
    encoded = pc.dictionary_encode(arr)
    return _hash_strings(name, encoded.dictionary)[encoded.indices.to_numpy(zero_copy_only=False)]


def _hash_strings(name: str, arr: pa.Array) -> np.ndarray:
    """:func:`het.data.hashing.hash_strings` over an Arrow string array without nulls, in place."""
    width = np.int64 if pa.types.is_large_string(arr.type) else np.int32
    offsets = np.frombuffer(arr.buffers()[1], width)[arr.offset:arr.offset + len(arr) + 1]
    data = arr.buffers()[2]
    return hash_strings(name, np.zeros(0, np.uint8) if data is None else np.frombuffer(data, np.uint8), offsets)


def _convert(batch: pa.RecordBatch, spec: TableSpec):
    """(labels (n,) float32, dense (n, D) float32, sparse (n, F) int64, bad column (n,) int:
    -1 for a valid row, else the index in ``spec.columns`` of its first bad column)."""
    n = batch.num_rows
    label, bad = Positive(spec.positive).labels(batch.column(spec.label))
    bads = [bad]
    dense = np.zeros((n, len(spec.dense)), np.float32)
    for j, name in enumerate(spec.dense):
        x, missing, bad = parse_numbers(batch.column(name))
        bads.append(bad)
        if spec.fitted:  # raw, NaN where missing: the transform is fitted and applied after the pass
            dense[:, j] = np.where(missing, np.nan, x)
        else:
            dense[:, j] = np.log1p(np.where(x > 0, x, 0.0)) if spec.log_dense else x  # -0.0 -> 0, as Criteo
    seps, sizes = dict(spec.multi), spec.bag_sizes
    sparse = np.empty((n, sum(sizes)), np.int64)
    col = 0
    for name, size in zip(spec.sparse, sizes):
        if name in seps:  # truncated lists are counted in the summary, not refused
            sparse[:, col:col + size] = multi_keys(name, batch.column(name), seps[name], size)[0]
        else:
            sparse[:, col] = hash_column(name, batch.column(name))
        col += size
    bads = np.stack(bads + [np.zeros(n, bool)] * len(spec.sparse), axis=1)  # (n, columns)
    bad_col = np.where(bads.any(axis=1), bads.argmax(axis=1), _OK)
    return label.astype(np.float32), dense, sparse, bad_col


def _reason(batch: pa.RecordBatch, spec: TableSpec, i: int, col: int) -> str:
    """Why row ``i`` of the batch was skipped, naming its column and value."""
    name = spec.columns[col]
    text = batch.column(name)[i].as_py()
    text = repr("" if text is None else str(text)[:40])
    if col == 0:
        return f"label {name!r}: {text} is not {Positive(spec.positive).describe()}" if spec.positive is None \
            else f"label {name!r}: {text} is missing or not a number"
    return f"{name}: {text} is not a finite number"


# ---- the pass -----------------------------------------------------------------------------------

def prepare_table(paths: list[str] | str, out_dir: str, spec: TableSpec, sep: str | None = None,
                  names: list[str] | None = None, max_rows: int | None = None, test_fraction: float = 0.1,
                  seed: int = 0, progress: bool = True, max_skipped: float = 0.01, schema_toml: str | None = None,
                  fitted: dict | None = None, extra_meta: dict | None = None) -> dict:
    """Hash CSV, TSV or Parquet files into ``out_dir`` in one pass; see the module docstring.

    Args:
        paths: the files, read in order as one input; Parquet is told by its magic bytes, gzip
            too; the separator by ``sep``, else ``.tsv`` (``.tsv.gz``) means tab, other names comma.
        out_dir: created if needed; written whole or not at all (:func:`het.data.prepared.writing`).
        spec: the label, dense and sparse columns.
        names: the column names of CSV/TSV files without a header line (None: the first line).
        max_rows, test_fraction, seed, progress: as in :func:`het.data.criteo.prepare`.
        max_skipped: the largest share of the lines that may be skipped; past it nothing is written.
        schema_toml: the schema used, written beside the data as ``schema.toml`` (``--schema`` reads it).
        fitted: what :meth:`het.data.fitted.Fitter.fit` gave an earlier preparation, applied
            instead of fitting on these rows (a stream's partitions share their first one's).
        extra_meta: more entries of ``meta.json``.

    Returns:
        The summary: ``meta.json``'s content plus ``seconds`` and ``rows_per_second``.

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> with open(f"{d}/t.csv", "w") as f:
        ...     _ = f.write("y,price,city\\n1,2.5,Paris\\n0,,Oslo\\n2,1,Rome\\n1,abc,Oslo\\n0,3\\n")
        >>> spec = TableSpec("y", ("price",), ("city",), dense_transform="none")
        >>> s = prepare_table(f"{d}/t.csv", f"{d}/out", spec, test_fraction=0.0, progress=False, max_skipped=0.7)
        >>> s["rows"], s["skipped"], [(e["line"], e["reason"]) for e in s["first_skipped"]]
        (2, 3, [(4, "label 'y': '2' is not 0 or 1"), (5, "price: 'abc' is not a finite number"), (6, "expected 3 ','-separated columns, got 2")])
        >>> data = TableDataset(f"{d}/out")
        >>> data.num_rows, data.num_ids, data.batch("train", 0, 2).dense.tolist()
        (None, 2, [[2.5], [0.0]])
    """
    paths = [paths] if isinstance(paths, str) else list(paths)
    check_inputs(paths, "table file", max_rows, test_fraction, seed)
    check_columns(paths, spec, sep, names)
    started = time.perf_counter()
    with writing(out_dir, len(spec.dense), sum(spec.bag_sizes)) as writer:
        stats, fitter = _write(paths, writer, spec, sep, names, max_rows, seed, test_fraction, progress)
        _check_rows(stats, spec, paths, max_skipped)
        fitted = fitter.fit() if fitted is None else fitted
        if any(v is not None for v in fitted.values()):
            rewrite(writer.out_dir, spec, fitted)
        meta = {**_meta(spec, stats, fitted, paths, max_rows, test_fraction, seed), **(extra_meta or {})}
        if schema_toml is not None:
            with create(os.path.join(writer.out_dir, "schema.toml")) as f:
                f.write(schema_toml.encode())
        writer.write_meta(meta)
    return summary(meta, started)


def _meta(spec: TableSpec, stats: dict, fitted: dict, paths, max_rows, test_fraction, seed) -> dict:
    """``meta.json``: the rows, the model's columns and what was fitted on the training rows."""
    transforms, buckets, vocab = fitted["dense_transforms"], fitted["buckets"], fitted["vocabulary"]
    fields, sizes = spec.fields, spec.bag_sizes + [1] * len(spec.bucket)
    num_ids = (vocab["ids"] + len(spec.sparse)) if vocab else stats["num_ids"]
    num_ids += sum(t["buckets"] + 1 for t in buckets or [])
    layout = "hashed: hash_strings(column name, the value's text), missing = the empty string"
    if vocab:
        layout += f"; ids seen fewer than {spec.min_freq} times in the training rows: the column's oov key"
    described = [describe(transforms)] if transforms else []
    described += [f"{t['column']} {t['buckets']} buckets" for t in buckets or []]
    return {"format": HASHED_FORMAT, "version": HASHED_VERSION, "source": "table", **stats,
            "num_ids": num_ids, "num_ids_exact": bool(vocab) or stats["num_ids_exact"],
            "positive_rate": stats["positives"] / stats["rows"], "num_fields": len(fields),
            "num_dense": len(spec.model_dense), "num_rows": None, "label": spec.label, "dense": spec.model_dense,
            "sparse": fields, "max_rows": max_rows, "test_fraction": test_fraction, "seed": seed,
            **({"bag_sizes": sizes, "multi": dict(spec.multi), "pad_key": PAD, "pooling": spec.pooling}
               if spec.multi else {}),
            "dense_transform": "log(max(x, 0) + 1), missing -> 0" if spec.log_dense else
            ("fitted on the training rows: " + ", ".join(described) if described else "x, missing -> 0"),
            "dense_transforms": transforms, "buckets": buckets, "positive": spec.positive,
            "vocabulary": {k: v for k, v in vocab.items() if k != "keys"} if vocab else None,
            "id_layout": layout, "sources": [{"path": p, "bytes": os.path.getsize(p)} for p in paths]}


def _write(paths, writer, spec, sep, names, max_rows, seed, test_fraction, progress) -> tuple[dict, Fitter]:
    """The one pass: convert, split and write every valid row; count the distinct keys."""
    from tqdm import tqdm

    sketch, report, fitter = DistinctSketch(), SkipReport(), Fitter(spec)
    by_reason = {"label": 0, "dense": 0, "columns": 0}
    rows = positives = 0
    with tqdm(unit=" rows", desc="table", disable=not progress) as bar:
        for src, before, batch, lines, rejected in batches(paths, spec, sep, names):
            arrays = (*_convert(batch, spec), lines)  # labels, dense, sparse, bad column, lines
            if max_rows is not None:
                batch, arrays, rejected = _head(batch, arrays, rejected, max_rows - rows)
            labels, dense, sparse, bad_col, lines = arrays
            ok = bad_col == _OK
            n = int(ok.sum())
            is_test = split_is_test(rows + np.arange(n), seed, test_fraction)
            writer.add(dense[ok], sparse[ok], labels[ok], is_test)
            fitter.add(dense[ok][~is_test], sparse[ok][~is_test], rows + np.flatnonzero(~is_test))
            sketch.add(sparse[ok])
            by_reason["label"] += int((bad_col == 0).sum())
            by_reason["dense"] += int((bad_col > 0).sum())
            by_reason["columns"] += len(rejected)
            report.add(len(rejected) + len(bad_col) - n,
                       [] if report.full else _entries(paths[src], before, batch, spec, lines, bad_col, rejected))
            rows, positives = rows + n, positives + int(labels[ok].sum())
            bar.update(n)
            if max_rows is not None and rows >= max_rows:
                break
    sizes = writer.close()
    return {"rows": rows, "train_rows": sizes["train"], "test_rows": sizes["test"], "positives": positives,
            "skipped": report.skipped, "skipped_by_reason": by_reason, "first_skipped": report.first,
            "num_ids": sketch.estimate(), "num_ids_exact": sketch.exact}, fitter


def _check_rows(stats: dict, spec: TableSpec, paths: list[str], max_skipped: float) -> None:
    """Refuse a preparation with no rows, too many lines skipped, or a label of one class."""
    rows, skipped = stats["rows"], stats["skipped"]
    named = {"label": "bad label", "dense": "bad dense value", "columns": "wrong number of columns"}
    reasons = ", ".join(f"{n:,} {named[why]}" for why, n in stats["skipped_by_reason"].items() if n)
    if rows == 0:
        raise ValueError(f"no valid rows in {paths}: {skipped:,} lines skipped ({reasons}), "
                         f"the first: {stats['first_skipped'][:3]}")
    if skipped > max_skipped * (rows + skipped):
        hint = (f"; to map label {spec.label!r} to 0/1 give --positive (a list of values, or a comparison "
                f"such as '>=4')") if stats["skipped_by_reason"]["label"] and spec.positive is None else ""
        raise ValueError(f"{skipped:,} of {rows + skipped:,} lines skipped ({reasons}), more than "
                         f"--max-skipped {max_skipped:g} of them; the first: "
                         f"{[e['reason'] for e in stats['first_skipped'][:3]]}{hint}")
    if stats["positives"] in (0, rows):
        raise ValueError(f"label {spec.label!r} has one class in all {rows:,} rows read (positives: "
                         f"{stats['positives']:,}): expected both 0 and 1"
                         f"{'' if spec.positive else '; give --positive to say which values are 1'}")


def _head(batch, arrays, rejected, rows_left: int):
    """A batch cut after its ``rows_left``-th valid row (the lines after it are left unread)."""
    valid = np.flatnonzero(arrays[3] == _OK)
    if len(valid) < rows_left:
        return batch, arrays, rejected
    cut = int(valid[rows_left - 1]) + 1
    last = int(arrays[4][cut - 1])
    return batch.slice(0, cut), tuple(a[:cut] for a in arrays), [r for r in rejected if r[0] < last]


def _entries(path, before, batch, spec, lines, bad_col, rejected) -> list[dict]:
    """The skipped lines of a batch worth reporting, in line order (a few at most)."""
    bad = np.flatnonzero(bad_col != _OK)[:10]
    out = [(int(lines[i]), _reason(batch, spec, int(i), int(bad_col[i]))) for i in bad] + rejected[:10]
    return [{"line": before + line, "source": path, "source_line": line, "reason": reason}
            for line, reason in sorted(out)[:10]]


class TableDataset(PreparedDataset):
    """Batches of a directory written by :func:`prepare_table` (see :class:`PreparedDataset`)."""

    kind = "table"
    command = "het data prepare table FILE... {out} --label COL --sparse COLS"
