"""Raw files through an export's input spec: CSV, TSV (gzipped too) and Parquet with named
columns (:mod:`het.data.table_reader`), and raw Criteo TSV, header-less, as ``het data prepare
criteo`` reads it (:mod:`het.data.criteo_tsv`).

A row's ``row`` is its position among the rows read (0-based): the row number it has in a
directory ``het data prepare`` makes of the same files. Its ``line`` is the line (header
included; Parquet rows from 1), counted over the files in order, as ``prepare`` reports skips.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator

import numpy as np

from het.export.chunk import Chunk, Skipped
from het.export.spec import Inputs


def raw_chunks(paths: list[str], inputs: Inputs, samples: int | None, chunk: int, skipped: Skipped,
               sep: str | None = None, names: list[str] | None = None, keep: list[str] = ()) -> Iterator[Chunk]:
    """The rows of ``paths`` read, in order, ``chunk`` at most at a time (``samples``: stop after so
    many); rows that cannot be read go to ``skipped``. ``sep``, ``names``: how CSV/TSV files are
    read (the separator; the column names of header-less files); ``keep``: columns carried into
    each chunk's ``kept`` as they are."""
    if inputs.source in ("criteo", "criteo-hashed") and names is None and not keep \
            and all(_is_criteo_tsv(p) for p in paths):
        parts = _criteo_tsv(paths, inputs, skipped)
    else:
        parts = _tables(paths, inputs, skipped, sep, names, list(keep))
    done = 0
    for part in parts:
        for lo in range(0, len(part.rows), chunk):
            hi = min(len(part.rows), lo + chunk)
            if samples is not None:
                hi = min(hi, lo + samples - done)
            if hi <= lo:
                return
            yield Chunk(part.dense[lo:hi], part.keys[lo:hi], None if part.labels is None else part.labels[lo:hi],
                        part.rows[lo:hi] + 0, part.lines[lo:hi], {k: v[lo:hi] for k, v in part.kept.items()})
            done += hi - lo
            if samples is not None and done >= samples:
                return


class _Columns:
    """What :func:`het.data.table_reader.batches` reads of a file: the spec's columns, the label
    only where the file has it."""

    def __init__(self, inputs: Inputs, keep: list[str]):
        self.inputs, self.keep = inputs, keep
        self.columns = list(dict.fromkeys([*inputs.columns, *keep]))

    def check(self, names: list[str], path: str) -> None:
        missing = [c for c in self.inputs.columns[1:] if c not in names]
        if missing:
            raise ValueError(f"{path}: column(s) {_few(missing)} not found; the model reads "
                             f"{_few(self.inputs.columns[1:])} and the file has {_few(names)}")
        absent = [c for c in self.keep if c not in names]
        if absent:
            raise ValueError(f"{path}: --keep column(s) {_few(absent)} not found; the file has {_few(names)}")
        self.columns = list(dict.fromkeys([*(c for c in self.inputs.columns if c in names), *self.keep]))


def _tables(paths, inputs: Inputs, skipped: Skipped, sep=None, names=None, keep=()) -> Iterator[Chunk]:
    from het.data.table_reader import batches

    columns = _Columns(inputs, list(keep))
    read = 0
    for src, before, batch, lines, rejected in batches(paths, columns, sep, names):
        parsed = inputs.parse(batch)
        ok = parsed.ok
        bad = np.flatnonzero(~ok)
        entries = [{"line": before + int(lines[i]), "source": paths[src], "source_line": int(lines[i]),
                    "reason": parsed.reasons[int(i)]} for i in bad if int(i) in parsed.reasons]
        entries += [{"line": before + line, "source": paths[src], "source_line": line, "reason": reason}
                    for line, reason in rejected]
        skipped.add(len(bad) + len(rejected), sorted(entries, key=lambda e: e["line"]))
        n = int(ok.sum())
        kept = {c: batch.column(c).to_numpy(zero_copy_only=False)[ok] for c in keep}
        yield Chunk(parsed.dense[ok], parsed.keys[ok], None if parsed.labels is None else parsed.labels[ok],
                    read + np.arange(n), before + lines[ok], kept)
        read += n


def _criteo_tsv(paths, inputs: Inputs, skipped: Skipped) -> Iterator[Chunk]:
    from het.data.criteo_hashed import criteo_keys
    from het.data.criteo_tsv import _OK, _rows

    read = lines_before = 0
    for src, line_no, block in _rows(paths, None, "het predict", False):
        keys = criteo_keys(block.keys) if inputs.source == "criteo-hashed" else \
            inputs.table_keys(inputs.vocabulary().encode(block.keys))
        line = np.arange(len(block.bad_col)) + lines_before + 1
        bad = np.flatnonzero(block.bad_col != _OK)
        skipped.add(len(bad), [{"line": int(line[i]), "source": paths[src], "source_line": line_no + int(i),
                                "reason": block.reason(i)} for i in bad[:Skipped.FIRST]])
        n = len(block.labels)
        yield Chunk(block.dense, keys, block.labels, read + np.arange(n), line[block.bad_col == _OK])
        read += n
        lines_before += len(block.bad_col)


def _is_criteo_tsv(path: str) -> bool:
    """Whether a file looks like raw Criteo: not Parquet, its first line 40 tab-separated fields
    starting with a 0/1 label (no header)."""
    with open(path, "rb") as f:
        head = f.read(4)
    if head == b"PAR1":
        return False
    opener = gzip.open if head[:2] == b"\x1f\x8b" else open
    with opener(path, "rb") as f:
        first = f.readline(1 << 16).rstrip(b"\r\n").split(b"\t")
    return len(first) == 40 and first[0] in (b"0", b"1")


def _few(names: list[str], shown: int = 6) -> str:
    """A list of names for a message: the first few, and how many in all."""
    if len(names) <= shown:
        return str(names)
    return f"{names[:shown]}... ({len(names)} in all)"
