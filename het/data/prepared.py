"""het's prepared format, shared by every ``het data prepare``: the one writer of a prepared
directory (:func:`writing`) and its one reader (:class:`PreparedDataset`).

A prepared directory holds ``{split}_dense.npy`` float32 ``(n, D)``, ``{split}_sparse.npy`` int64
``(n, F)`` and ``{split}_labels.npy`` float32 ``(n,)`` for ``split`` in ``train``, ``test``, and
``meta.json``, written last (a directory without it holds no usable data). Its ``num_rows``
is the size of the embedding table the keys index, or None when the keys are hashed 64-bit
ids (format ``het-hashed``: the job makes a dynamic table); ``num_ids`` estimates the distinct
keys the data holds (what sizes a worker's cache).

A preparation writes into a temporary directory and puts it in place only once complete
(:func:`het.files.atomic_directory`): a failure, a Ctrl-C or a refused input leaves the output
directory as it was, a previous preparation in it included. ``meta.json`` holds the CRC-32 of
every 4 MiB of every other file and its own: a file changed or cut off is refused, named with
the bytes, before a batch is read from it.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import zlib
from collections.abc import Iterator

import numpy as np
import torch

from het.data.batch import Batch
from het.data.sketch import distinct_per_field
from het.files import DamagedFile, atomic_directory, block_crcs, check_blocks, create

__all__ = ["ARRAYS", "HASHED_FORMAT", "HASHED_VERSION", "MAX_REPORTED", "SPLITS", "PreparedDataset",
           "SkipReport", "SplitWriter", "check_inputs", "print_summary", "split_is_test", "summary", "writing"]

ARRAYS = {"dense": np.float32, "sparse": np.int64, "labels": np.float32}  # per split
SPLITS = ("train", "test")  # what a prepared directory stores (validation is carved from train: het.data.validation)
HASHED_FORMAT, HASHED_VERSION = "het-hashed", 1
MAX_REPORTED = 10  # skipped lines reported one by one; all of them are counted
_HEADER_BYTES = 128  # an .npy header of fixed size, rewritten in place once the row count is known
VERIFY_BYTES = 256 << 20  # verify=None: every file's blocks checked when the directory holds at most this


def field_ids(directory: str, meta: dict) -> list[int]:
    """Distinct keys of each field in a prepared directory's training split, as written (what
    ``--dim auto`` sizes a field's width by)."""
    keys = np.load(os.path.join(directory, "train_sparse.npy"), mmap_mode="r")
    sizes = meta.get("bag_sizes") or [1] * int(meta["num_fields"])
    blocks = (keys[lo:lo + (1 << 16)] for lo in range(0, len(keys), 1 << 16))
    return distinct_per_field(blocks, sizes, meta.get("pad_key"))


def read_meta(path: str) -> dict:
    """``meta.json``, checked against its own CRC-32 where it has one (one prepared before
    checksums has none); DamagedFile names it otherwise."""
    try:
        with open(path) as f:
            meta = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise DamagedFile(f"{path}: not the JSON het wrote ({e}): damaged; prepare the data again") from None
    crc = meta.pop("crc32", None) if isinstance(meta, dict) else None
    if crc is not None and zlib.crc32(json.dumps(meta, sort_keys=True).encode()) != crc:
        raise DamagedFile(f"{path}: does not match its checksum: changed or damaged; prepare the data again")
    return meta


def check_files(directory: str, meta: dict, command: str, verify: bool | None = None) -> None:
    """A prepared directory's files against the sizes and CRC-32s ``meta.json`` holds: every block
    (``verify``), none but the sizes (False), or every block when the files hold at most
    :data:`VERIFY_BYTES` and the sizes only beyond (None: a worker of a big table starts at once).
    DamagedFile names the file and the bytes; a directory prepared before checksums passes."""
    entries = meta.get("files") or {}
    total = sum(e["bytes"] for e in entries.values())
    for name, entry in sorted(entries.items()):
        full = verify or (verify is None and total <= VERIFY_BYTES)
        check_blocks(os.path.join(directory, name), entry if full else {**entry, "crc32": []},
                     f"prepare it again with `{command}`")


def split_is_test(rows: np.ndarray, seed: int, test_fraction: float) -> np.ndarray:
    """Whether each valid row (0-based index over the whole input) is a test row: a splitmix64
    hash of ``(seed, row)`` under ``test_fraction``. Shape: (n,) -> (n,) bool."""
    with np.errstate(over="ignore"):
        z = rows.astype(np.uint64) ^ (np.uint64(seed) * np.uint64(0xD1B54A32D192ED03))
        z = z + np.uint64(0x9E3779B97F4A7C15)  # splitmix64
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) / 2.0 ** 53 < test_fraction


# ---- writing, in one pass ---------------------------------------------------------------------

class _GrowingNpy:
    """An ``.npy`` file written row block by row block when the row count is not known in
    advance: a header of fixed size, the rows appended, the header's shape rewritten at the end."""

    def __init__(self, path: str, dtype, row_shape: tuple):
        self.path, self.dtype, self.row_shape, self.rows = path, np.dtype(dtype), row_shape, 0
        self.file = create(path)
        self.file.write(self._header(0))

    def _header(self, rows: int) -> bytes:
        d = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False,
             "shape": (rows, *self.row_shape)}
        text = repr(d).encode("latin1")
        text += b" " * (_HEADER_BYTES - 10 - len(text) - 1) + b"\n"
        return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text

    def append(self, rows: np.ndarray) -> None:
        self.file.write(np.ascontiguousarray(rows, dtype=self.dtype).tobytes())
        self.rows += len(rows)

    def close(self) -> None:
        if self.file.closed:
            return
        self.file.seek(0)
        self.file.write(self._header(self.rows))
        self.file.close()


class SplitWriter:
    """The six arrays of a prepared directory, appended to block by block in one pass, and
    its ``meta.json``.

    Args:
        out_dir: an existing directory, without the arrays' names.
        num_dense, num_fields: the width of the dense and sparse arrays.

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> w = SplitWriter(d, num_dense=2, num_fields=3)
        >>> w.add(np.ones((4, 2)), np.arange(12).reshape(4, 3), np.zeros(4), np.array([0, 1, 0, 0], bool))
        >>> w.close()
        {'train': 3, 'test': 1}
        >>> np.load(f"{d}/test_sparse.npy", mmap_mode="r").tolist()
        [[3, 4, 5]]
    """

    def __init__(self, out_dir: str, num_dense: int, num_fields: int):
        self.out_dir = out_dir
        shapes = {"dense": (num_dense,), "sparse": (num_fields,), "labels": ()}
        self.arrays = {}
        try:
            for split in SPLITS:
                for name, dtype in ARRAYS.items():
                    path = os.path.join(out_dir, f"{split}_{name}.npy")
                    self.arrays[split, name] = _GrowingNpy(path, dtype, shapes[name])
        except BaseException:
            self.abort()
            raise

    def add(self, dense: np.ndarray, sparse: np.ndarray, labels: np.ndarray, is_test: np.ndarray) -> None:
        """Append a block of rows to their splits. Shape: (n, D), (n, F), (n,), (n,) bool."""
        for split, mask in (("train", ~is_test), ("test", is_test)):
            for name, value in (("dense", dense), ("sparse", sparse), ("labels", labels)):
                self.arrays[split, name].append(value[mask])

    def close(self) -> dict:
        """Finish the files; returns the rows per split."""
        for array in self.arrays.values():
            array.close()
        return {split: self.arrays[split, "labels"].rows for split in SPLITS}

    def abort(self) -> None:
        """Close the files, finished or not (their directory is about to go)."""
        for array in self.arrays.values():
            array.file.close()

    def write_meta(self, meta: dict) -> None:
        """Write ``meta.json``, last: the directory is usable from this moment on. It holds the
        CRC-32s of every other file, a block at a time (``files``), and of itself (``crc32``); for
        hashed keys, each field's distinct keys in the training split (``field_ids``)."""
        if meta.get("format") == HASHED_FORMAT and "field_ids" not in meta:  # hashed keys: each field's counted
            meta = {**meta, "field_ids": field_ids(self.out_dir, meta)}
        names = sorted(n for n in os.listdir(self.out_dir) if n != "meta.json")
        meta = {**meta, "files": {n: block_crcs(os.path.join(self.out_dir, n)) for n in names}}
        meta["crc32"] = zlib.crc32(json.dumps(meta, sort_keys=True).encode())
        with create(os.path.join(self.out_dir, "meta.json")) as f:
            f.write(json.dumps(meta, indent=1).encode())


class SkipReport:
    """Skipped lines: all counted, the first :data:`MAX_REPORTED` (by line) kept with a reason."""

    def __init__(self):
        self.skipped, self.first = 0, []

    def add(self, count: int, entries: list[dict]) -> None:
        """``count`` more skipped lines; ``entries`` describe some of them (``line`` first)."""
        self.skipped += count
        self.first = sorted(self.first + entries, key=lambda e: e["line"])[:MAX_REPORTED]

    @property
    def full(self) -> bool:
        return len(self.first) >= MAX_REPORTED


@contextlib.contextmanager
def writing(out_dir: str, num_dense: int, num_fields: int) -> Iterator[SplitWriter]:
    """The one way a prepared directory is written: yields a :class:`SplitWriter` on a temporary
    directory; the rows are added, the writer closed, ``meta.json`` written; when the ``with``
    block ends without an error the directory takes ``out_dir``'s place (made if missing; in an
    existing one, its arrays and ``meta.json`` are replaced, ``meta.json`` last, a user's other
    files kept). On an error ``out_dir`` is left as it was.

    Example:
        >>> import tempfile
        >>> out = os.path.join(tempfile.mkdtemp(), "out")
        >>> with writing(out, num_dense=1, num_fields=1) as w:
        ...     w.add(np.ones((2, 1)), np.ones((2, 1)), np.ones(2), np.zeros(2, bool))
        ...     w.write_meta({"rows": sum(w.close().values())})
        >>> with writing(out, num_dense=1, num_fields=1) as w:
        ...     raise ValueError("column 'prise' not found")
        Traceback (most recent call last):
        ...
        ValueError: column 'prise' not found
        >>> json.load(open(os.path.join(out, "meta.json")))["rows"]  # the first preparation, intact
        2
    """
    with atomic_directory(out_dir, marker="meta.json") as tmp:
        writer = SplitWriter(tmp, num_dense, num_fields)
        try:
            yield writer
        finally:
            writer.abort()


def summary(meta: dict, started: float) -> dict:
    """A preparation's returned summary: ``meta.json``'s content, ``seconds`` since ``started``
    (``time.perf_counter()``) and ``rows_per_second``."""
    seconds = time.perf_counter() - started
    return {**meta, "seconds": seconds, "rows_per_second": meta["rows"] / max(seconds, 1e-9)}


def check_inputs(paths: list[str], kind: str, max_rows, test_fraction, seed) -> None:
    """Refuse the arguments every preparation takes that cannot work; ``kind`` names the files
    in errors (``"raw Criteo file"``)."""
    def is_int(x):
        return isinstance(x, (int, np.integer)) and not isinstance(x, bool)
    if not paths:
        raise ValueError(f"expected at least one {kind}, got none")
    for path in paths:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{kind} {path!r} does not exist")
    if max_rows is not None and (not is_int(max_rows) or max_rows < 1):
        raise ValueError(f"max_rows must be None or an int >= 1, got {max_rows!r}")
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction must lie in [0, 1), got {test_fraction!r}")
    if not is_int(seed) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")


# ---- reading ----------------------------------------------------------------------------------

class PreparedDataset:
    """Batches of a prepared directory, memory-mapped: the interface of
    :class:`het.data.synthetic.SyntheticCriteo` (without a planted model), for any number of
    dense and sparse columns.

    Args:
        out_dir: a directory written by ``het data prepare`` (:func:`writing`), of one of the
            class's ``formats``: ``(format, version)`` pairs (here: hashed ids).
        verify: its files read back against ``meta.json``'s CRC-32s: every block (True), their
            sizes alone (False), or every block up to :data:`VERIFY_BYTES` in all (None).

    Attributes:
        num_rows: the size of the embedding table, or None for hashed ids (a dynamic table).
        num_ids: the distinct keys in the data (an estimate for hashed ids).
        num_dense, num_fields: the widths of ``dense`` and ``sparse``.
        rows: samples per split, e.g. ``{"train": 900, "test": 100}``.
        meta: the content of ``meta.json``.

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> w = SplitWriter(d, num_dense=1, num_fields=2)
        >>> w.add(np.ones((3, 1)), np.arange(6).reshape(3, 2), np.ones(3), np.zeros(3, bool))
        >>> w.write_meta({"format": HASHED_FORMAT, "version": HASHED_VERSION, "num_rows": None,
        ...               "num_ids": 6, "num_dense": 1, "num_fields": 2, **dict(zip(("train_rows",
        ...               "test_rows"), w.close().values()))})
        >>> data = PreparedDataset(d)
        >>> data.num_rows, data.num_ids, data.batch("train", 1, 2).sparse.tolist()
        (None, 6, [[4, 5], [0, 1]])
    """

    has_planted = False
    kind = "prepared"  # how errors name the directory
    formats = ((HASHED_FORMAT, HASHED_VERSION),)
    command = "het data prepare"  # how errors say to prepare one ({out}: the directory)

    def __init__(self, out_dir: str, verify: bool | None = None):
        meta_path = os.path.join(out_dir, "meta.json")
        if not os.path.isfile(meta_path):
            raise ValueError(f"{out_dir!r} holds no meta.json: prepare it first with "
                             f"`{self.command.format(out=out_dir)}`")
        meta = read_meta(meta_path)
        if (meta.get("format"), meta.get("version")) not in self.formats:
            raise ValueError(f"{meta_path} is format {meta.get('format')!r} version {meta.get('version')!r}, "
                             f"expected {' or '.join(f'{f!r} version {v}' for f, v in self.formats)}: "
                             f"prepare it again")
        self.meta = meta
        check_files(out_dir, meta, self.command.format(out=out_dir), verify)
        self.num_rows = None if meta["num_rows"] is None else int(meta["num_rows"])
        self.num_ids = int(meta.get("num_ids", self.num_rows))
        self.num_dense, self.num_fields = int(meta["num_dense"]), int(meta["num_fields"])
        self.rows = {"train": int(meta["train_rows"]), "test": int(meta["test_rows"])}
        if meta.get("bag_sizes"):  # multi-hot columns (het.data.multi): bags of keys, padded
            self.bag_sizes = tuple(int(b) for b in meta["bag_sizes"])
            self.pad_key, self.pooling = int(meta["pad_key"]), str(meta.get("pooling", "mean"))
        shapes = {"dense": (self.num_dense,), "sparse": (sum(getattr(self, "bag_sizes", (1,) * self.num_fields)),),
                  "labels": ()}
        self._arrays = {}
        for split in SPLITS:
            for name, dtype in ARRAYS.items():
                a = np.load(os.path.join(out_dir, f"{split}_{name}.npy"), mmap_mode="r")
                if a.dtype != dtype or a.shape != (self.rows[split], *shapes[name]):
                    raise ValueError(f"{split}_{name}.npy holds {a.dtype} {a.shape}, meta.json says "
                                     f"{np.dtype(dtype)} {(self.rows[split], *shapes[name])}")
                self._arrays[split, name] = a

    def batch(self, split: str, index: int, size: int) -> Batch:
        """Samples ``index * size .. (index + 1) * size - 1`` of ``split``, wrapping around its end.

        Shape:
            dense (size, D) float32, sparse (size, F) int64, labels (size,) float32.
        """
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        for name, v in (("index", index), ("size", size)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < (name == "size"):
                raise ValueError(f"{name} must be an int >= {int(name == 'size')}, got {v!r}")
        n = self.rows[split]
        if n == 0:
            raise ValueError(f"split {split!r} of this {self.kind} directory has no rows")
        start = index * size % n
        if start + size <= n:  # the common case: one contiguous slice, copied out of the map
            take = lambda a: np.array(a[start:start + size])  # noqa: E731
        else:
            idx = (start + np.arange(size)) % n
            take = lambda a: np.take(a, idx, axis=0)  # noqa: E731
        return Batch(*(torch.from_numpy(take(self._arrays[split, name])) for name in ARRAYS))


    def take(self, split: str, rows: np.ndarray) -> Batch:
        """The samples at ``rows`` (indices into ``split``), in that order. Shape: as :meth:`batch`."""
        rows = np.asarray(rows, np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= self.rows[split]):
            raise ValueError(f"rows {rows.min()}..{rows.max()} out of split {split!r}'s {self.rows[split]}")
        order = np.argsort(rows, kind="stable")  # read in file order, put back in the order asked
        back = np.empty_like(order)
        back[order] = np.arange(len(order))
        return Batch(*(torch.from_numpy(np.take(self._arrays[split, name], rows[order], axis=0)[back])
                       for name in ARRAYS))

    def rows_between(self, split: str, lo: int, hi: int) -> Batch:
        """Samples ``lo .. hi - 1`` of ``split``, in order (no wrapping). Shape: as :meth:`batch`.

        Example (the directory of the class's example): ``data.rows_between("train", 1, 3)``."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if not 0 <= lo <= hi <= self.rows[split]:
            raise ValueError(f"rows {lo}..{hi} out of split {split!r}'s {self.rows[split]}")
        return Batch(*(torch.from_numpy(np.array(self._arrays[split, name][lo:hi])) for name in ARRAYS))


def print_summary(command: str, s: dict, out_dir: str, data: str) -> None:
    """The human summary of a one-pass preparation (``s``: its returned summary); ``data`` is
    what ``het train --data`` takes to train on it."""
    print(f"{command}: {s['rows']:,} rows ({s['train_rows']:,} train, {s['test_rows']:,} test) from "
          f"{len(s['sources'])} file(s) in {s['seconds']:.2f} s ({s['rows_per_second']:,.0f} rows/s)")
    print(f"positive rate {s['positive_rate']:.4f}; {s['num_fields']} sparse and {s['num_dense']} dense "
          f"columns; about {s['num_ids']:,} distinct hashed ids")
    print_skipped_and_written(s, out_dir, data)


def print_skipped_and_written(s: dict, out_dir: str, data: str) -> None:
    """The end of every preparation's human summary: the lines skipped, and what was written."""
    print(f"skipped {s['skipped']:,} malformed line(s)" + (":" if s["skipped"] else ""))
    for skip in s["first_skipped"]:
        print(f"  line {skip['line']} ({skip['source']}:{skip['source_line']}): {skip['reason']}")
    if s["skipped"] > len(s["first_skipped"]):
        print(f"  ... and {s['skipped'] - len(s['first_skipped']):,} more")
    print(f"wrote {os.path.join(out_dir, 'meta.json')} and the train/test arrays; "
          f"train on it with `het train --data {data}:{out_dir}`")


def add_common_flags(p) -> None:
    """The flags every ``het data prepare`` command shares: the split, a row limit, the output."""
    p.add_argument("--max-rows", type=int, default=None, help="stop after this many valid rows")
    p.add_argument("--test-fraction", type=float, default=0.1, help="fraction of rows in the test split")
    p.add_argument("--seed", type=int, default=0, help="seed of the train/test split")
    p.add_argument("--json", action="store_true", help="the last line of stdout is the summary as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
