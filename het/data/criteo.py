"""Real Criteo: raw TSV -> label-encoded, memory-mappable arrays -> Batch.

:func:`prepare` reads the raw files (Kaggle ``train.txt`` or the 1TB day files, ``.gz`` too) in
two streaming passes over blocks of bytes, parsed with numpy (no per-line Python):

1. validate every line and count every categorical id;
2. label-encode and write the rows, block by block, into ``.npy`` files preallocated from pass 1.

Raw line: 40 tab-separated columns (label, I1..I13, C1..C26); malformed lines are skipped and
counted, never re-aligned (:mod:`het.data.criteo_tsv` parses them and says exactly which).

Encoding, as HET does (label encoding with per-field offsets, no hashing): in field ``f``, the ids
seen at least ``min_freq`` times get the local ids ``0 .. k_f - 1`` in increasing hex order, local
id ``k_f`` stands for every rarer id and ``k_f + 1`` for a missing value, so
``cardinalities[f] == k_f + 2``; the global key is ``offsets[f] + local id``. The counts run
over every row read (both splits), as HET's and DLRM's preprocessing do. Dense values become
``log(max(x, 0) + 1)``: real Criteo has a few negative counts (I2 mostly) and they are clamped
to 0, as are missing values.

Split: valid row ``r`` (0-based over the concatenated input, skipped lines not counted) goes to
``test`` when a splitmix64 hash of ``(seed, r)`` falls under ``test_fraction``: deterministic,
independent of the block size, and a skipped line changes no other row's split.

Output in ``out_dir`` (``np.load(path, mmap_mode="r")`` reads each array without loading it):
``{split}_dense.npy`` float32 ``(n, 13)``, ``{split}_sparse.npy`` int64 ``(n, 26)``,
``{split}_labels.npy`` float32 ``(n,)`` for ``split`` in ``train``, ``test``; ``meta.json``
(written last, so a directory without it holds no usable data). Memory is bounded by the
vocabulary (16 bytes per distinct id, a few times that while pass 1 merges its counts) plus one
block of lines, not by the number of rows.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass

import numpy as np

from het.data.criteo_tsv import COLUMNS, NUM_COLUMNS, NUM_FIELDS, _rows, skipped_lines
from het.data.prepared import (HASHED_FORMAT, HASHED_VERSION, PreparedDataset, SkipReport, add_common_flags,
                               check_inputs, print_skipped_and_written, split_is_test, summary, writing)
from het.data.synthetic import NUM_DENSE
from het.data.vocab import KeyCounter

__all__ = ["COLUMNS", "FORMAT", "NUM_COLUMNS", "NUM_FIELDS", "VERSION", "VOCABULARY", "CriteoDataset", "Vocabulary",
           "add_prepare_parser", "cmd_prepare_criteo", "prepare"]

FORMAT, VERSION = "het-criteo", 1
VOCABULARY = "vocab.npy"  # the kept ids, (field << 32) | id ascending: what turns raw values into keys again


# ---- the two passes -------------------------------------------------------------------------

@dataclass(frozen=True)
class Vocabulary:
    """The kept ids of every field, sorted, and each field's layout: what label-encodes raw ids
    into global keys. Shapes: keys (V,) ``(field << 32) | id``, the rest (26,).

    Example:
        >>> v = Vocabulary.from_keys(np.array([7, (2 << 32) | 1]))
        >>> raw = np.full((1, 26), -1); raw[0, 0] = 7; raw[0, 1] = (1 << 32) | 9
        >>> v.encode(raw)[0, :3].tolist()  # field 0's id 7; field 1's unseen 9 (its rare id); field 2 missing
        [0, 3, 7]
    """

    keys: np.ndarray
    first: np.ndarray  # index in ``keys`` of each field's first kept key
    kept: np.ndarray
    offsets: np.ndarray

    @classmethod
    def build(cls, counter: KeyCounter, min_freq: int) -> Vocabulary:
        return cls.from_keys(counter.at_least(min_freq))

    @classmethod
    def from_keys(cls, keys: np.ndarray) -> Vocabulary:
        """The vocabulary of the kept ids ``keys`` (ascending): what :data:`VOCABULARY` holds."""
        keys = np.asarray(keys, dtype=np.int64)
        kept = np.bincount(keys >> 32, minlength=NUM_FIELDS).astype(np.int64)
        first = np.concatenate([[0], np.cumsum(kept)[:-1]])
        cards = kept + 2  # + the rare id and the missing id
        return cls(keys, first, kept, np.concatenate([[0], np.cumsum(cards)[:-1]]).astype(np.int64))

    def encode(self, keys: np.ndarray) -> np.ndarray:
        """Keys from :func:`_parse_hex` -> global keys. Shape: (n, 26) -> (n, 26) int64."""
        pos = np.minimum(np.searchsorted(self.keys, keys), max(len(self.keys) - 1, 0))
        found = (keys >= 0) & (self.keys[pos] == keys) if len(self.keys) else np.zeros(keys.shape, bool)
        local = np.where(found, pos - self.first, np.where(keys < 0, self.kept + 1, self.kept))
        return local + self.offsets


def _count(paths, max_rows, seed, test_fraction, progress) -> tuple[KeyCounter, dict]:
    """Pass 1: id counts, rows per split, positives, skipped lines."""
    counter, report = KeyCounter(), SkipReport()
    stats = {"rows": 0, "test_rows": 0, "positives": 0, "lines": 0}
    for src, line_no, block in _rows(paths, max_rows, "criteo pass 1/2: count ids", progress):
        n = len(block.labels)
        counter.add(block.keys[block.keys >= 0])
        stats["test_rows"] += int(split_is_test(stats["rows"] + np.arange(n), seed, test_fraction).sum())
        stats["positives"] += int(block.labels.sum())
        report.add(*skipped_lines(block, paths[src], line_no, stats["lines"], 0 if report.full else 10))
        stats["rows"] += n
        stats["lines"] += len(block.bad_col)
    counter.merge()
    return counter, {**stats, "skipped": report.skipped, "first_skipped": report.first}


def _write(paths, writer, vocab, stats, max_rows, seed, test_fraction, progress) -> None:
    """Pass 2: encode every valid row and append it to its split."""
    rows = 0
    for _, _, block in _rows(paths, max_rows, "criteo pass 2/2: encode", progress):
        n = len(block.labels)
        is_test = split_is_test(rows + np.arange(n), seed, test_fraction)
        writer.add(block.dense, vocab.encode(block.keys), block.labels, is_test)
        rows += n
    counted = {"train": stats["rows"] - stats["test_rows"], "test": stats["test_rows"]}
    read = writer.close()
    if read != counted:
        raise RuntimeError(f"pass 2 read {read} rows, pass 1 counted {counted}: did the input change?")


def prepare(raw_paths: list[str] | str, out_dir: str, min_freq: int = 1, max_rows: int | None = None,
            test_fraction: float = 0.1, seed: int = 0, progress: bool = True) -> dict:
    """Label-encode raw Criteo TSV files into ``out_dir``; see the module docstring for the format.

    Args:
        raw_paths: raw files (plain or gzip), read in order as one input.
        out_dir: created if needed; written whole or not at all (:func:`het.data.prepared.writing`).
        min_freq: ids seen fewer times in their field share the field's rare id.
        max_rows: stop after this many valid rows (None: read everything).
        test_fraction: expected fraction of the rows that go to the test split, in [0, 1).
        seed: the split is a function of it and of the row index.
        progress: show a progress bar per pass (on stderr).

    Returns:
        The summary: ``meta.json``'s content plus ``seconds`` and ``rows_per_second``.

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> with open(f"{d}/raw.tsv", "w") as f:
        ...     _ = f.write("1\\t5" + "\\t" * 12 + "\\tabcdef01" * 26 + "\\n" + "0\\tx\\n")
        >>> s = prepare([f"{d}/raw.tsv"], f"{d}/out", test_fraction=0.0, progress=False)
        >>> s["rows"], s["skipped"], s["first_skipped"][0]["reason"], s["cardinalities"][:2]
        (1, 1, 'expected 40 tab-separated columns, got 2', [3, 3])
    """
    raw_paths = [raw_paths] if isinstance(raw_paths, str) else list(raw_paths)
    check_inputs(raw_paths, "raw Criteo file", max_rows, test_fraction, seed)
    if not isinstance(min_freq, (int, np.integer)) or isinstance(min_freq, bool) or min_freq < 1:
        raise ValueError(f"min_freq must be an int >= 1, got {min_freq!r}")
    started = time.perf_counter()
    counter, stats = _count(raw_paths, max_rows, seed, test_fraction, progress)
    if stats["rows"] == 0:
        raise ValueError(f"no valid Criteo rows in {raw_paths}: {stats['skipped']} lines skipped, "
                         f"the first: {stats['first_skipped'][:3]}")
    vocab = Vocabulary.build(counter, min_freq)
    del counter
    with writing(out_dir, NUM_DENSE, NUM_FIELDS) as writer:
        _write(raw_paths, writer, vocab, stats, max_rows, seed, test_fraction, progress)
        np.save(os.path.join(writer.out_dir, VOCABULARY), vocab.keys)
        meta = _meta(raw_paths, vocab, stats, min_freq, max_rows, test_fraction, seed)
        writer.write_meta(meta)
    return summary(meta, started)


def _meta(raw_paths, vocab: Vocabulary, stats: dict, min_freq, max_rows, test_fraction, seed) -> dict:
    """The content of ``meta.json``."""
    cards = vocab.kept + 2
    return {"format": FORMAT, "version": VERSION, "rows": stats["rows"],
            "train_rows": stats["rows"] - stats["test_rows"], "test_rows": stats["test_rows"],
            "positives": stats["positives"], "positive_rate": stats["positives"] / stats["rows"],
            "num_fields": NUM_FIELDS, "num_dense": NUM_DENSE, "cardinalities": cards.tolist(),
            "offsets": vocab.offsets.tolist(), "num_rows": int(cards.sum()), "lines": stats["lines"],
            "skipped": stats["skipped"], "first_skipped": stats["first_skipped"], "min_freq": min_freq,
            "max_rows": max_rows, "test_fraction": test_fraction, "seed": seed,
            "dense_transform": "log(max(x, 0) + 1), missing -> 0",
            "id_layout": "per field: kept ids 0..k-1 by hex value, k = rarer than min_freq, k+1 = missing",
            "vocabulary": VOCABULARY,
            "sources": [{"path": p, "bytes": os.path.getsize(p)} for p in raw_paths]}


# ---- reading the prepared arrays ------------------------------------------------------------

class CriteoDataset(PreparedDataset):
    """Batches of a directory written by :func:`prepare` (label-encoded) or by
    :func:`het.data.criteo_hashed.prepare_hashed` (``--hash``: hashed ids), memory-mapped.

    Args:
        out_dir: the directory :func:`prepare` wrote.

    Attributes:
        cardinalities: the 26 fields' sizes (kept ids + the rare id + the missing id); None
            for hashed ids.
        offsets: (26,) int64, field ``f``'s first global key; None for hashed ids.
        num_rows: the number of global keys, i.e. the size of the one embedding table (None
            for hashed ids: a dynamic table).
        num_dense, num_fields: 13 and 26.
        rows: samples per split, e.g. ``{"train": 900, "test": 100}``.
        meta: the content of ``meta.json``.

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> with open(f"{d}/raw.tsv", "w") as f:
        ...     _ = f.write(("0\\t1" + "\\t" * 12 + "\\t0000abcd" * 26 + "\\n") * 3)
        >>> _ = prepare(f"{d}/raw.tsv", d, test_fraction=0.0, progress=False)
        >>> data = CriteoDataset(d)
        >>> data.rows, data.num_rows, data.batch("train", 1, 2).sparse[:, :3].tolist()
        ({'train': 3, 'test': 0}, 78, [[0, 3, 6], [0, 3, 6]])
    """

    kind = "Criteo"
    formats = ((FORMAT, VERSION), (HASHED_FORMAT, HASHED_VERSION))
    command = "het data prepare criteo RAW... {out}"

    def __init__(self, out_dir: str, verify: bool | None = None):
        super().__init__(out_dir, verify)
        hashed = self.meta["format"] == HASHED_FORMAT
        self.cardinalities = None if hashed else tuple(self.meta["cardinalities"])
        self.offsets = None if hashed else np.array(self.meta["offsets"], dtype=np.int64)


# ---- `het data prepare criteo` --------------------------------------------------------------

def add_prepare_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``criteo`` command to ``subparsers`` (``het data prepare``'s)."""
    p = subparsers.add_parser(
        "criteo", help="label-encode raw Criteo TSV (.gz too) into memory-mappable arrays",
        description="Two streaming passes over the raw files: count the ids, then label-encode them "
                    "per field (no hashing) and write OUT/{train,test}_{dense,sparse,labels}.npy and "
                    "OUT/meta.json. Malformed lines are skipped and reported.")
    p.add_argument("raw", nargs="+", help="raw Criteo files (Kaggle train.txt or day files), read in order")
    p.add_argument("out", help="output directory")
    p.add_argument("--hash", action="store_true", help="one pass, no vocabulary: hash every value with its "
                   "column to an int64 key (a dynamic PS table); see het.data.criteo_hashed")
    p.add_argument("--min-freq", type=int, default=1, help="ids seen fewer times share their field's rare id")
    add_common_flags(p)
    p.set_defaults(func=cmd_prepare_criteo)
    return p


def not_raw_criteo(path: str) -> str | None:
    """Why the file at ``path`` is not Criteo's raw layout (40 tab-separated columns, a 0/1
    label first, no header), pointing to ``prepare table``; None when its first line is a
    tab-separated row (a malformed one is the preparation's to skip).

    Example:
        >>> import tempfile
        >>> path = tempfile.mktemp(suffix=".csv")
        >>> _ = open(path, "w").write("label,I1,C1\\n1,5,68fd1e64\\n")
        >>> "3 comma-separated fields" in not_raw_criteo(path), "prepare table" in not_raw_criteo(path)
        (True, True)
    """
    import gzip

    try:
        with open(path, "rb") as f:
            gz = f.read(2) == b"\x1f\x8b"
        with (gzip.open if gz else open)(path, "rb") as f:
            first = f.readline(1 << 16).decode(errors="replace").rstrip("\r\n")
    except OSError:
        return None  # the preparation names what cannot be read
    fields = first.split("\t")
    label = fields[0].strip()
    header = bool(label) and not label.lstrip("+-").replace(".", "", 1).isdigit()
    if len(fields) > 1 and not header:  # tab-separated rows (a malformed one is skipped, counted)
        return None
    commas = len(first.split(","))
    shape = f"{len(fields)} tab-separated fields" if commas < len(fields) else f"{commas} comma-separated fields"
    return (f"{path} is not Criteo's raw layout (40 tab-separated columns, a 0/1 label first, no header): its "
            f"first line has {shape}, starting {first[:40]!r}; prepare it with `het data prepare table {path} OUT "
            f"--preset criteo` (Criteo's columns, with or without label and header) or `het data prepare table "
            f"{path} OUT` (any table, its columns' roles inferred)")


def cmd_prepare_criteo(args: argparse.Namespace) -> dict:
    """Run :func:`prepare` (or, with ``--hash``, :func:`het.data.criteo_hashed.prepare_hashed`)
    with the parsed flags and print its summary; a file not in Criteo's raw layout is refused
    first, pointing to ``prepare table``."""
    problem = next((p for p in map(not_raw_criteo, args.raw) if p), None)
    if problem:
        raise SystemExit(f"het data prepare criteo: {problem}")
    if getattr(args, "hash", False):
        from het.data.criteo_hashed import cmd_prepare_hashed

        return cmd_prepare_hashed(args)
    try:
        s = prepare(args.raw, args.out, min_freq=args.min_freq, max_rows=args.max_rows,
                    test_fraction=args.test_fraction, seed=args.seed, progress=not args.quiet)
    except (ValueError, OSError) as e:
        raise SystemExit(f"het data prepare criteo: {e}") from None
    if args.json:
        print(json.dumps(s, sort_keys=True))
        return s
    print(f"criteo: {s['rows']:,} rows ({s['train_rows']:,} train, {s['test_rows']:,} test) from "
          f"{len(s['sources'])} file(s) in {s['seconds']:.2f} s ({s['rows_per_second']:,.0f} rows/s)")
    print(f"positive rate {s['positive_rate']:.4f}; {s['num_rows']:,} ids in {NUM_FIELDS} fields "
          f"(min freq {s['min_freq']})")
    print_skipped_and_written(s, args.out, "criteo")
    return s
