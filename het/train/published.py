"""What ``het train --publish DIR`` writes, as files: the names of its versions and a delta's
layout, shared by the publisher (:mod:`het.train.publish`), the compaction of bases
(:mod:`het.export.compact`) and the followers (:mod:`het.online.follow`).

- ``base-<v>/``: an export (:mod:`het.export.layout`) of version ``v``;
- ``delta-<v>.het``: an array file (:mod:`het.arrayfile`) of the rows that changed since
  version ``v - 1``, a table at a time (``keys.<table>`` int64, ``rows.<table>``,
  ``clocks.<table>`` int64: one table, or one a width), and the dense weights
  (``dense.<name>``), its manifest saying the version, the step, when training made it, its
  tables' rows and widths (``tables``), how the rows are stored (``rows_dtype``) and how far they
  may be behind training (``consistency``).

Rows are stored in ``fp32``, ``fp16`` or ``bf16`` (the upper half of each float32, rounded to
nearest even; numpy has no bfloat16, so they are written as uint16): the table's own precision by
default, so a half-precision table publishes what it stores and nothing is rounded twice.
"""

from __future__ import annotations

import os
import re

import numpy as np
import torch

from het import arrayfile

FORMAT = "het-delta"
ROW_DTYPES = ("fp32", "fp16", "bf16")
_NAME = re.compile(r"(base|delta)-(\d+)(\.het)?")


def base_name(version: int) -> str:
    return f"base-{version:08d}"


def delta_name(version: int) -> str:
    return f"delta-{version:08d}.het"


def listing(directory: str) -> tuple[list[int], list[int]]:
    """The versions of the bases and of the deltas in ``directory``, each in order."""
    bases, deltas = [], []
    for name in os.listdir(directory):
        m = _NAME.fullmatch(name)
        if m and m.group(1) == "base" and not m.group(3):
            bases.append(int(m.group(2)))
        elif m and m.group(1) == "delta" and m.group(3):
            deltas.append(int(m.group(2)))
    return sorted(bases), sorted(deltas)


def bytes_under(directory: str) -> int:
    """The bytes of the files under ``directory``."""
    return sum(os.path.getsize(os.path.join(root, f)) for root, _, names in os.walk(directory) for f in names)


def encode_rows(rows: np.ndarray, dtype: str) -> np.ndarray:
    """float32 rows as a delta stores them in ``dtype``. Shape: (n, D) -> (n, D).

    Example:
        >>> r = np.array([[1.0, 1 / 3]], np.float32)
        >>> [decode_rows(encode_rows(r, d), d)[0, 1].item() for d in ROW_DTYPES]
        [0.3333333432674408, 0.333251953125, 0.333984375]
    """
    if dtype not in ROW_DTYPES:
        raise ValueError(f"a delta's rows are one of {ROW_DTYPES}, got {dtype!r}")
    rows = np.ascontiguousarray(rows, np.float32)
    if dtype == "fp16":
        return rows.astype(np.float16)
    if dtype == "bf16":
        return torch.from_numpy(rows).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    return rows


def decode_rows(rows: np.ndarray, dtype: str) -> np.ndarray:
    """A delta's stored rows as float32 (exact: every fp16 and bf16 value is a float32)."""
    if dtype not in ROW_DTYPES:
        raise ValueError(f"a delta's rows are one of {ROW_DTYPES}, got {dtype!r}")
    if dtype == "bf16":
        return (np.asarray(rows, np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
    return np.asarray(rows, np.float32)


def write_delta(path: str, tables: dict, dense: dict, meta: dict) -> int:
    """Write a delta: each table's ``(keys, rows, clocks)`` (``{name: ...}``; rows already stored as
    ``meta["rows_dtype"]``) and the dense weights; its bytes on disk."""
    arrays = {f"{kind}.{name}": a for name, t in tables.items() for kind, a in zip(("keys", "rows", "clocks"), t)}
    sizes = {name: {"rows": len(t[0]), "dim": int(t[1].shape[1])} for name, t in tables.items()}
    return arrayfile.write(path, {**arrays, **{f"dense.{k}": v for k, v in dense.items()}},
                           {"format": FORMAT, **meta, "tables": sizes})


def read_delta(path: str, version: int) -> tuple[dict, dict, dict]:
    """``(meta, {table: (keys, rows float32)}, dense)`` of the delta of ``version`` at ``path``,
    its checksums checked; ArrayFileError when it is not that version's whole delta."""
    meta, arrays = arrayfile.read(path)
    if meta.get("version") != version or meta.get("format") != FORMAT:
        raise arrayfile.ArrayFileError(f"{path}: holds {meta.get('format')!r} version {meta.get('version')!r}, "
                                       f"expected {FORMAT} {version}")
    dtype = meta.get("rows_dtype", "fp32")
    try:
        if isinstance(meta.get("tables"), dict):
            tables = {n: (arrays[f"keys.{n}"], decode_rows(arrays[f"rows.{n}"], dtype)) for n in meta["tables"]}
        else:  # a delta of one table, its arrays unnamed
            tables = {meta.get("table", "embedding"): (arrays["keys"], decode_rows(arrays["rows"], dtype))}
    except (KeyError, ValueError) as e:
        raise arrayfile.ArrayFileError(f"{path}: not a delta's arrays ({type(e).__name__}: {e})") from None
    dense = {name[len("dense."):]: a for name, a in arrays.items() if name.startswith("dense.")}
    return meta, tables, dense


def _not_in(keys: np.ndarray, sorted_keys: np.ndarray) -> np.ndarray:
    """Which of ``keys`` are not in ``sorted_keys`` (ascending): a binary search each, where
    ``np.isin`` sorts both again for every piece (two thirds of the publishing thread's time,
    py-spy on the default job).

    Example:
        >>> _not_in(np.array([5, 1, 9, 7]), np.array([1, 7])).tolist()
        [True, False, True, False]
    """
    if not len(sorted_keys):
        return np.ones(len(keys), bool)
    at = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
    return sorted_keys[at] != keys


def delta_arrays(pieces: list, view, dim: int, buffer: list) -> tuple:
    """A delta's keys, rows and clocks: the shards' changed rows (``pieces``: keys, rows, clocks
    each) with rank 0's copies (``view``: keys, rows, clocks; None: none) in place of theirs where
    both hold a key. The rows are copied once, into ``buffer[0]``, grown as needed and kept for
    the next version: arrays of hundreds of MB made afresh for each version cost the publishing
    thread more in page faults than in copies (py-spy, the default job).

    Example:
        >>> pieces = [(np.array([3, 5]), np.array([[3.], [5.]], np.float32), np.array([1, 1]))]
        >>> view = (np.array([5, 7]), np.array([[50.], [70.]], np.float32), np.array([2, 2]))
        >>> keys, rows, clocks = delta_arrays(pieces, view, 1, [None])
        >>> keys.tolist(), rows.ravel().tolist(), clocks.tolist()
        ([3, 5, 7], [3.0, 50.0, 70.0], [1, 2, 2])
    """
    if view is None:
        view = (np.zeros(0, np.int64), np.zeros((0, dim), np.float32), np.zeros(0, np.int64))
    vk, vr, vc = (np.asarray(a) for a in view)
    ordered = np.sort(vk)
    keeps = [_not_in(k, ordered) for k, _, _ in pieces]  # a shard's row that rank 0's copy replaces goes
    counts = [int(np.count_nonzero(m)) for m in keeps]
    n = sum(counts) + len(vk)
    if buffer[0] is None or len(buffer[0]) < n or buffer[0].shape[1] != dim:
        buffer[0] = np.empty((n + n // 4, dim), np.float32)  # room to grow: versions vary in size
    rows, at = buffer[0][:n], 0
    for (_, r, _), keep, count in zip(pieces, keeps, counts):
        np.compress(keep, r, axis=0, out=rows[at:at + count])
        at += count
    rows[at:] = vr
    keys = np.concatenate([k[m] for (k, _, _), m in zip(pieces, keeps)] + [vk.astype(np.int64)])
    clocks = np.concatenate([c[m].astype(np.int64) for (_, _, c), m in zip(pieces, keeps)] + [vc.astype(np.int64)])
    return keys, rows, clocks
