"""Users' tables on disk -> Arrow record batches, block by block, each row with its line number.

CSV and TSV (gzipped too, told by gzip's magic bytes) through Arrow's streaming CSV reader, which
parses quoted fields and rejects lines with the wrong number of columns (reported with their line
numbers by its handler: :class:`_LineNumbers` turns those gaps into every kept row's line);
Parquet (told by its magic bytes ``PAR1``) through ``iter_batches``, its rows numbered from 1.
Every column :mod:`het.data.table` reads comes as text from a CSV, so it validates the values.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

__all__ = ["batches", "check_columns"]

_BLOCK_BYTES = 8 << 20
_PARQUET_ROWS = 1 << 16


class _LineNumbers:
    """The line of each row Arrow's CSV reader keeps: the lines it rejects (reported with their
    numbers by its handler) are the gaps. Holds the rejected lines of about one block."""

    def __init__(self, first_line: int):
        self.first, self.rows, self.pruned = first_line, 0, 0
        self.rejected: list[int] = []

    def next(self, n: int) -> np.ndarray:
        """The lines of the next ``n`` kept rows. Shape: (n,) int64."""
        rejected = np.sort(np.array(self.rejected, np.int64))
        kept_before = rejected - self.first - self.pruned - np.arange(len(rejected))  # kept rows before each
        k = self.rows + np.arange(n)
        lines = self.first + k + self.pruned + np.searchsorted(kept_before, k, side="right")
        self.rows += n
        if n:  # forget the rejected lines behind us: memory of one block, whatever the file's size
            done = rejected < lines[-1]
            self.pruned += int(done.sum())
            self.rejected = rejected[~done].tolist()
        return lines


def _csv_batches(path: str, spec, sep: str | None, names: list[str] | None):
    """(batch, the rows' lines, rejected lines as (line, reason)) per block of a CSV/TSV file."""
    sep = _separator(sep, path)
    rejected: list[tuple[int, str]] = []

    def on_invalid(row):
        rejected.append((row.number, f"expected {row.expected_columns} {sep!r}-separated columns, "
                                     f"got {row.actual_columns}"))
        return "skip"

    read, parse = _csv_options(sep, names, on_invalid)
    convert = pcsv.ConvertOptions(column_types={c: pa.string() for c in spec.columns}, strings_can_be_null=False,
                                  quoted_strings_can_be_null=False)
    spec.check(_csv_header(path, read, parse), path)
    rejected.clear()
    convert.include_columns = spec.columns
    lines = _LineNumbers(1 if names else 2)
    with _open(path) as stream:
        for batch in pcsv.open_csv(stream, read_options=read, parse_options=parse, convert_options=convert):
            lines.rejected += [line for line, _ in rejected]
            yield batch, lines.next(batch.num_rows), rejected[:]
            rejected.clear()


def _separator(sep: str | None, path: str) -> str:
    """``sep``, or by the name: tab for ``.tsv`` (``.tsv.gz``), else comma."""
    return sep if sep is not None else "\t" if path.removesuffix(".gz").endswith(".tsv") else ","


def _csv_options(sep: str, names: list[str] | None, on_invalid=None):
    """Arrow's read and parse options of a CSV/TSV file."""
    read = pcsv.ReadOptions(use_threads=False, block_size=_BLOCK_BYTES, column_names=names)
    parse = pcsv.ParseOptions(delimiter=sep, invalid_row_handler=on_invalid, ignore_empty_lines=False)
    return read, parse


def _csv_header(path: str, read, parse) -> list[str]:
    """The column names of a CSV/TSV file: ``read``'s own, else its first line's. Only that line
    is parsed, fully and with no Python row handler: a streaming reader left reading ahead with
    one lets Arrow's I/O thread take the GIL while the interpreter exits, which aborts the
    process ("terminate called without an active exception")."""
    if read.column_names:
        return list(read.column_names)
    head = bytearray()
    with _open(path) as peek:
        while b"\n" not in head:
            block = peek.read(1 << 16)
            if not block:
                break
            head += block
    line = bytes(head).split(b"\n", 1)[0] + b"\n"
    options = pcsv.ReadOptions(use_threads=False)
    only = pcsv.ParseOptions(delimiter=parse.delimiter, quote_char=parse.quote_char)
    return pcsv.read_csv(pa.BufferReader(line), read_options=options, parse_options=only).schema.names


def _open(path: str):
    """An Arrow stream of the file, gunzipped when it starts with gzip's magic bytes."""
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    return pa.CompressedInputStream(pa.OSFile(path), "gzip") if gz else pa.OSFile(path)


def _parquet_batches(path: str, spec):
    """As :func:`_csv_batches` for a Parquet file: rows numbered from 1, none rejected."""
    f = pq.ParquetFile(path)
    _check_parquet(f.schema_arrow, spec, path)
    row = 0
    for batch in f.iter_batches(batch_size=_PARQUET_ROWS, columns=spec.columns):
        yield batch, row + 1 + np.arange(batch.num_rows), []
        row += batch.num_rows


def _check_parquet(schema: pa.Schema, spec, path: str) -> None:
    spec.check(schema.names, path)
    for name in spec.columns:
        kind = schema.field(name).type
        if pa.types.is_nested(kind):
            raise ValueError(f"{path}: column {name!r} holds {kind}, expected numbers or text (one value a row, "
                             f"not lists, structs or maps)")


def _is_parquet(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"PAR1"


def check_columns(paths, spec, sep, names) -> None:
    """Refuse, before any row is read, a file that lacks a column ``spec`` names, names one
    twice, or holds one that is nested (Parquet lists, structs, maps): a ValueError naming the
    file and the column."""
    for path in paths:
        try:
            if _is_parquet(path):
                _check_parquet(pq.read_schema(path), spec, path)
            else:
                read, parse = _csv_options(_separator(sep, path), names, lambda row: "skip")
                spec.check(_csv_header(path, read, parse), path)
        except (pa.ArrowException, EOFError) as e:
            raise ValueError(f"{path}: {e}") from None



def batches(paths, spec, sep, names):
    """(source index, lines before it, batch, its rows' lines, rejected (line, reason)) for every
    block of every file, read in order; ``spec`` (a :class:`het.data.table.TableSpec`) names the
    columns read. A file that cannot be read is a ValueError naming it."""
    before = 0
    for src, path in enumerate(paths):
        try:
            parts = _parquet_batches(path, spec) if _is_parquet(path) else _csv_batches(path, spec, sep, names)
            last = 0
            for batch, lines, rejected in parts:
                yield src, before, batch, lines, rejected
                last = max([last, *lines[-1:].tolist(), *(line for line, _ in rejected)])
        except (pa.ArrowException, EOFError) as e:
            raise ValueError(f"{path}: {e}") from None
        before += last
