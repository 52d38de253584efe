"""A stream of partitions: prepared directories read in order as they land, each once complete.

A partition is a path matching the stream's pattern (a glob, e.g. ``exports/hour=*``): a prepared
directory of hashed ids (:class:`het.data.prepared.PreparedDataset`), or a raw CSV, TSV or Parquet
file or directory of them, prepared when taken (:mod:`het.data.stream_raw`). A directory is
complete once it holds :data:`MARKER`, which its writer puts there after every other file, as
Spark and Hive jobs do; until then nothing of it is read, whatever it already holds. A file is
complete once it holds its final name (a hidden or ``.tmp`` name until then). Complete
partitions are taken in the order of their paths, each read back against its checksums first.

What is never taken, each with its reason in :attr:`PartitionStream.skipped`, and never tried
again: a partition that lands after a later path was taken (out of order: the rows before it
were trained already); one whose files do not read back as ``meta.json`` says (damaged); one
whose content is a taken partition's (a duplicate, by its files' checksums); one of another
shape (its dense and sparse widths).

The taken partitions' training rows form one sequence: row ``r`` of the stream is a row of the
partition whose span holds it. :meth:`PartitionStream.wait_for` waits until the stream holds
some number of rows, and says when no partition came for ``idle_s`` seconds.
"""

from __future__ import annotations

import json
import time
import zlib
from bisect import bisect_right
from typing import Protocol

import numpy as np

from het.data.batch import Batch
from het.data.prepared import HASHED_FORMAT, PreparedDataset
from het.data.stream_raw import MARKER, RawPartitions, complete, default_directory, is_raw


def first_partition(pattern: str) -> str:
    """The first complete partition ``pattern`` matches (what gives a stream's columns)."""
    found = complete(pattern)
    if not found:
        raise ValueError(f"no complete partition (a directory holding its {MARKER}, or a CSV, TSV or Parquet file "
                         f"under its final name) matches {pattern!r}")
    return found[0]


def open_partition(path: str, raw: RawPartitions, verify: bool = True) -> PreparedDataset:
    """Partition ``path``'s rows: a prepared directory's, or a raw partition's preparation."""
    return PreparedDataset(raw.prepared(path) if is_raw(path) else path, verify=verify)


class Source(Protocol):
    """What a stream job reads of its source (:mod:`het.train.streaming`), and all it reads: a
    source of another kind (Kafka's records: each poll a unit named by its offsets) is a module
    giving these. A unit is taken once, in one order every rank and every resumed run repeats.

    Attributes:
        parts: the units taken, in order: ``(name, data)``; ``data`` has ``rows["train"]``,
            ``num_ids``, ``num_dense``, ``num_fields`` and ``rows_between("train", lo, hi)``.
        skipped: units never taken, by name: why.
        rows: rows in the units taken.
    """

    parts: list
    skipped: dict[str, str]
    rows: int

    def wait_for(self, rows: int, idle_s: float | None = None, stop=None) -> bool:
        """Take units until they hold ``rows`` rows (True), or ``idle_s`` passed with none taken."""

    def adopt(self, names: list[str]) -> None:
        """Take exactly ``names``, in order (another rank's, or a checkpoint's, choice)."""

    def rows_between(self, lo: int, hi: int) -> Batch:
        """The stream's rows ``lo .. hi - 1``, across units."""

    def partitions_of(self, lo: int, hi: int) -> np.ndarray:
        """The index in ``parts`` of each row ``lo .. hi - 1``."""


class PartitionStream:
    """The partitions matching ``pattern``, taken in order as they complete (see the module): a
    :class:`Source`.

    Args:
        pattern: a glob of partition directories.
        poll_s: how often :meth:`wait_for` looks for new partitions.

    Attributes:
        parts: the partitions taken, in order: ``(path, data)``.
        skipped: the partitions never taken, by path: why.
    """

    def __init__(self, pattern: str, poll_s: float = 0.5, raw: RawPartitions | None = None):
        self.pattern, self.poll_s = pattern, poll_s
        self.raw = raw or RawPartitions(default_directory(pattern))
        self.parts: list[tuple[str, PreparedDataset]] = []
        self.skipped: dict[str, str] = {}
        self._starts = [0]  # each partition's first row in the stream, then the stream's rows
        self._contents: dict[int, str] = {}  # a checksum of a taken partition's files' checksums: its path

    @property
    def rows(self) -> int:
        """Rows in the partitions taken."""
        return self._starts[-1]

    def refresh(self) -> int:
        """Take the partitions completed since the last call, in order; how many were taken."""
        taken = {path for path, _ in self.parts}
        found = complete(self.pattern)
        before = len(self.parts)
        for path in found:
            if path in taken or path in self.skipped:
                continue
            why = self._refusal(path)
            if why:
                self.skipped[path] = why
        return len(self.parts) - before

    def _refusal(self, path: str) -> str:
        """Take ``path``, or say why not."""
        if self.parts and path < self.parts[-1][0]:
            return f"out of order: it completed after {self.parts[-1][0]} was taken"
        try:
            data = open_partition(path, self.raw)
        except (ValueError, OSError) as e:
            return f"damaged, or neither a prepared directory nor a CSV, TSV or Parquet table: {e}"
        if data.meta.get("format") != HASHED_FORMAT or data.num_rows is not None:
            return "not of hashed ids (het data prepare table, or het data stream-synthetic)"
        if self.parts:
            first = self.parts[0][1]
            if (data.num_dense, data.num_fields) != (first.num_dense, first.num_fields):
                return (f"{data.num_dense} dense and {data.num_fields} sparse columns, the stream's "
                        f"{first.num_dense} and {first.num_fields}")
        content = zlib.crc32(json.dumps(data.meta.get("files"), sort_keys=True).encode())
        if data.meta.get("files") and content in self._contents:
            return f"a duplicate of {self._contents[content]} (the same files)"
        self._contents[content] = path
        self.parts.append((path, data))
        self._starts.append(self.rows + data.rows["train"])
        return ""

    def adopt(self, paths: list[str]) -> None:
        """Take ``paths`` as the partitions, in that order: those past the ones taken are opened
        (their sizes checked: the stream that chose them read their blocks back). Every rank of a
        job so reads the partitions rank 0 took."""
        if [p for p, _ in self.parts] != paths[:len(self.parts)]:
            raise ValueError(f"partitions {paths[:len(self.parts)]} were asked for, this stream holds "
                             f"{[p for p, _ in self.parts]}")
        for path in paths[len(self.parts):]:
            data = open_partition(path, self.raw, verify=False)
            self.parts.append((path, data))
            self._starts.append(self.rows + data.rows["train"])

    def wait_for(self, rows: int, idle_s: float | None = None, stop=None) -> bool:
        """Wait until the stream holds ``rows`` rows: True; False once ``idle_s`` seconds passed
        without a partition taken (None: wait for ever), or once ``stop()`` says so."""
        last = time.monotonic()
        while self.rows < rows:
            if stop is not None and stop():
                return False
            if self.refresh():
                last = time.monotonic()
                continue
            if idle_s is not None and time.monotonic() - last >= idle_s:
                return False
            time.sleep(self.poll_s)
        return True

    def partition_of(self, row: int) -> int:
        """The index in :attr:`parts` of the partition holding stream row ``row``."""
        if not 0 <= row < self.rows:
            raise ValueError(f"row {row} is not in the stream's {self.rows} rows")
        return bisect_right(self._starts, row) - 1

    def partitions_of(self, lo: int, hi: int) -> np.ndarray:
        """The index in :attr:`parts` of each stream row ``lo .. hi - 1``. Shape: (hi - lo,)."""
        return np.searchsorted(np.asarray(self._starts), np.arange(lo, hi), side="right") - 1

    def rows_between(self, lo: int, hi: int) -> Batch:
        """Stream rows ``lo .. hi - 1``, in order, across partitions. Shape: as
        :meth:`PreparedDataset.rows_between`."""
        if not 0 <= lo <= hi <= self.rows or not self.parts:
            raise ValueError(f"rows {lo}..{hi} are not in the stream's {self.rows} rows")
        pieces = []
        while lo < hi:
            i = self.partition_of(lo)
            end = min(hi, self._starts[i + 1])
            pieces.append(self.parts[i][1].rows_between("train", lo - self._starts[i], end - self._starts[i]))
            lo = end
        return Batch.cat(pieces) if pieces else self.parts[0][1].rows_between("train", 0, 0)
