"""Real Criteo with hashed ids (``het data prepare criteo --hash``): one streaming pass, no
vocabulary, memory independent of the data's size.

Each categorical value is hashed with its column's name (``C1`` .. ``C26``) to an int64 key,
exactly as :mod:`het.data.table` hashes a column of text: the value's 8 hex digits, spelled in
lower case (as Criteo writes them), through :func:`het.data.hashing.hash_strings`; a missing
value is the empty string, so every field has its own "missing" key. A table holding the same
rows (``label,I1..I13,C1..C26``) prepared with ``het data prepare table --log-dense`` gives the
same arrays. Dense values, malformed lines and the train/test split are as in
:func:`het.data.criteo.prepare`. ``meta.json`` says ``num_rows: null`` (a dynamic PS table) and
``num_ids``, the distinct keys estimated with a KMV sketch (:mod:`het.data.sketch`).
"""

from __future__ import annotations

import json
import os
import time

import numpy as np

from het.data.criteo_tsv import COLUMNS, NUM_FIELDS, _rows, skipped_lines
from het.data.hashing import hash_ids, string_ids
from het.data.prepared import (HASHED_FORMAT, HASHED_VERSION, SkipReport, check_inputs, print_summary, split_is_test,
                               summary, writing)
from het.data.sketch import DistinctSketch
from het.data.synthetic import NUM_DENSE

__all__ = ["SPARSE_COLUMNS", "cmd_prepare_hashed", "criteo_keys", "prepare_hashed"]

SPARSE_COLUMNS = COLUMNS[1 + NUM_DENSE:]  # C1 .. C26: the names the keys are salted with
_SHIFTS = np.arange(28, -1, -4, dtype=np.uint64)  # the 8 nibbles of an id, first character first


def criteo_keys(keys: np.ndarray) -> np.ndarray:
    """Parsed Criteo ids (``(field << 32) | id``, -1 when missing) -> hashed int64 keys.

    Shape:
        (n, 26) -> (n, 26) int64.

    Example:
        >>> from het.data.hashing import hash_strings
        >>> k = criteo_keys(np.array([[0x68fd1e64] + [-1] * 25]))
        >>> text = np.frombuffer(b"68fd1e64", np.uint8)
        >>> bool(k[0, 0] == hash_strings("C1", text, [0, 8])[0]), bool(k[0, 1] == hash_strings("C2", text, [0, 0])[0])
        (True, True)
    """
    nibbles = ((keys[..., None].astype(np.uint64) >> _SHIFTS) & np.uint64(0xF)).astype(np.uint8)  # (n, 26, 8)
    text = np.where(nibbles < 10, nibbles + np.uint8(ord("0")), nibbles + np.uint8(ord("a") - 10))
    words = np.ascontiguousarray(text).view(np.uint64)[..., 0]  # (n, 26): the 8 characters, little-endian
    missing = keys < 0
    words[missing] = 0
    lengths = np.where(missing, 0, 8)
    out = np.empty(keys.shape, np.int64)
    for f, name in enumerate(SPARSE_COLUMNS):  # a loop over the 26 fields, not over the keys
        out[:, f] = hash_ids(name, string_ids(words[:, f:f + 1], lengths[:, f]))
    return out


def prepare_hashed(raw_paths: list[str] | str, out_dir: str, max_rows: int | None = None,
                   test_fraction: float = 0.1, seed: int = 0, progress: bool = True) -> dict:
    """Hash raw Criteo TSV files into ``out_dir`` in one pass; see the module docstring.

    Args:
        raw_paths: raw files (plain or gzip), read in order as one input.
        out_dir: created if needed; written whole or not at all (:func:`het.data.prepared.writing`).
        max_rows, test_fraction, seed, progress: as in :func:`het.data.criteo.prepare`.

    Returns:
        The summary: ``meta.json``'s content plus ``seconds`` and ``rows_per_second``.

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> with open(f"{d}/raw.tsv", "w") as f:
        ...     _ = f.write("1\\t5" + "\\t" * 12 + "\\tabcdef01" * 26 + "\\n" + "0\\tx\\n")
        >>> s = prepare_hashed([f"{d}/raw.tsv"], f"{d}/out", test_fraction=0.0, progress=False)
        >>> s["rows"], s["skipped"], s["num_rows"], s["num_ids"]
        (1, 1, None, 26)
    """
    raw_paths = [raw_paths] if isinstance(raw_paths, str) else list(raw_paths)
    check_inputs(raw_paths, "raw Criteo file", max_rows, test_fraction, seed)
    started = time.perf_counter()
    with writing(out_dir, NUM_DENSE, NUM_FIELDS) as writer:
        stats = _write(raw_paths, writer, max_rows, seed, test_fraction, progress)
        if stats["rows"] == 0:
            raise ValueError(f"no valid Criteo rows in {raw_paths}: {stats['skipped']} lines skipped, "
                             f"the first: {stats['first_skipped'][:3]}")
        meta = {"format": HASHED_FORMAT, "version": HASHED_VERSION, "source": "criteo", **stats,
                "positive_rate": stats["positives"] / stats["rows"], "num_fields": NUM_FIELDS,
                "num_dense": NUM_DENSE, "num_rows": None, "label": COLUMNS[0], "dense": list(COLUMNS[1:1 + NUM_DENSE]),
                "sparse": list(SPARSE_COLUMNS), "max_rows": max_rows, "test_fraction": test_fraction, "seed": seed,
                "dense_transform": "log(max(x, 0) + 1), missing -> 0",
                "id_layout": "hashed: hash_strings(column name, the value's text), missing = the empty string",
                "sources": [{"path": p, "bytes": os.path.getsize(p)} for p in raw_paths]}
        writer.write_meta(meta)
    return summary(meta, started)


def _write(paths, writer, max_rows, seed, test_fraction, progress) -> dict:
    """The one pass: hash, split and write every valid row; count the distinct keys."""
    sketch, report = DistinctSketch(), SkipReport()
    rows = positives = lines = 0
    for src, line_no, block in _rows(paths, max_rows, "criteo --hash", progress):
        n = len(block.labels)
        keys = criteo_keys(block.keys)
        writer.add(block.dense, keys, block.labels, split_is_test(rows + np.arange(n), seed, test_fraction))
        sketch.add(keys)
        report.add(*skipped_lines(block, paths[src], line_no, lines, 0 if report.full else 10))
        rows, positives, lines = rows + n, positives + int(block.labels.sum()), lines + len(block.bad_col)
    sizes = writer.close()
    return {"rows": rows, "train_rows": sizes["train"], "test_rows": sizes["test"], "positives": positives,
            "lines": lines, "skipped": report.skipped, "first_skipped": report.first,
            "num_ids": sketch.estimate(), "num_ids_exact": sketch.exact}


def cmd_prepare_hashed(args) -> dict:
    """``het data prepare criteo --hash``: run :func:`prepare_hashed` and print its summary."""
    if args.min_freq != 1:
        raise SystemExit(f"het data prepare criteo: --hash keeps every id, --min-freq must be 1, got {args.min_freq}")
    try:
        s = prepare_hashed(args.raw, args.out, max_rows=args.max_rows, test_fraction=args.test_fraction,
                           seed=args.seed, progress=not args.quiet)
    except (ValueError, OSError) as e:
        raise SystemExit(f"het data prepare criteo: {e}") from None
    if args.json:
        print(json.dumps(s, sort_keys=True))
    else:
        print_summary("criteo --hash", s, args.out, "criteo")
    return s
