"""Raw Criteo TSV -> validated, parsed arrays, block by block, with numpy (no per-line Python).

Raw line: 40 tab-separated columns: label (``0``/``1``), I1..I13 (integers, empty = missing),
C1..C26 (8 hex digits, empty = missing). A line with another column count, a label other than
``0``/``1``, a dense value that is not an integer (at most 20 characters) or a categorical value
that is not empty nor 8 hex digits is skipped and counted, never re-aligned.

:func:`_rows` streams the raw files (plain or gzip) in blocks of bytes cut at line ends and
yields each block parsed (:class:`_Block`); :func:`het.data.criteo.prepare` makes its two passes
over them.
"""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from het.data.synthetic import NUM_DENSE

NUM_FIELDS = 26
NUM_COLUMNS = 1 + NUM_DENSE + NUM_FIELDS
COLUMNS = ("label", *(f"I{i}" for i in range(1, NUM_DENSE + 1)), *(f"C{i}" for i in range(1, NUM_FIELDS + 1)))
_BLOCK_BYTES = 8 << 20
_MAX_LINE = 1 << 20  # longer lines are cut there (a valid line is under 600 bytes, so stays invalid)
_MAX_DENSE_CHARS = 20
_WINDOW = 24  # bytes read from a field's start: _MAX_DENSE_CHARS rounded up to 8
_TAB, _NL, _CR, _MINUS, _ZERO = 9, 10, 13, ord("-"), ord("0")
_OK, _BAD_COLUMNS = -1, -2  # bad_col codes besides the index of the first bad column


# ---- parsing one block of lines ------------------------------------------------------------

@dataclass
class _Block:
    """The lines of one block of bytes, parsed.

    ``bad_col`` (L,): -1 for a valid line, -2 for a wrong column count, else the first bad column.
    ``labels`` (n,), ``dense`` (n, 13), ``keys`` (n, 26) int64 for the n valid lines, in order:
    ``keys`` is ``(field << 32) | id``, or -1 for a missing value.
    """

    buf: bytes
    starts: np.ndarray
    ends: np.ndarray
    bad_col: np.ndarray
    labels: np.ndarray
    dense: np.ndarray
    keys: np.ndarray

    def head(self, lines: int) -> _Block:
        """The first ``lines`` lines only."""
        n = int((self.bad_col[:lines] == _OK).sum())
        return _Block(self.buf, self.starts[:lines], self.ends[:lines], self.bad_col[:lines],
                      self.labels[:n], self.dense[:n], self.keys[:n])

    def reason(self, i: int) -> str:
        """Why line ``i`` of the block was skipped, naming the column and showing its value."""
        parts = self.buf[self.starts[i]:self.ends[i]].split(b"\t")
        col = int(self.bad_col[i])
        if self.ends[i] - self.starts[i] >= _MAX_LINE:
            return f"line longer than {_MAX_LINE} bytes"
        if col == _BAD_COLUMNS:
            return f"expected {NUM_COLUMNS} tab-separated columns, got {len(parts)}"
        text = parts[col].decode("utf-8", "replace")
        text = repr(text if len(text) <= 40 else text[:40] + "...")
        if col == 0:
            return f"label: {text} is not 0 or 1"
        if col <= NUM_DENSE:
            return f"{COLUMNS[col]}: {text} is not an integer (at most {_MAX_DENSE_CHARS} characters)"
        return f"{COLUMNS[col]}: {text} is not 8 hex digits"


def _parse_block(buf: bytes) -> _Block:
    """Parse complete lines (``buf`` ends with a newline) with array operations only."""
    a = np.frombuffer(buf + bytes(_WINDOW), dtype=np.uint8)  # padded: every window stays inside
    ends = np.flatnonzero(a == _NL)  # (L,)
    starts = np.concatenate([[0], ends[:-1] + 1])
    ends = ends - ((ends > starts) & (a[np.maximum(ends - 1, 0)] == _CR))  # drop a trailing \r
    tabs = np.flatnonzero(a == _TAB)
    first_tab = np.searchsorted(tabs, starts)
    bad_col = np.where(np.searchsorted(tabs, ends) - first_tab == NUM_COLUMNS - 1, _OK, _BAD_COLUMNS)
    good = np.flatnonzero(bad_col == _OK)
    cuts = tabs[first_tab[good, None] + np.arange(NUM_COLUMNS - 1)]  # (n, 39)
    fstart = np.concatenate([starts[good, None], cuts + 1], axis=1)  # (n, 40)
    flen = np.concatenate([cuts, ends[good, None]], axis=1) - fstart  # (n, 40)

    label_char = a[fstart[:, 0]]
    label_bad = (flen[:, 0] != 1) | ((label_char != _ZERO) & (label_char != _ZERO + 1))
    dense, dense_bad = _parse_dense(a, fstart[:, 1:1 + NUM_DENSE], flen[:, 1:1 + NUM_DENSE])
    keys, keys_bad = _parse_hex(a, fstart[:, 1 + NUM_DENSE:], flen[:, 1 + NUM_DENSE:])
    bad = np.concatenate([label_bad[:, None], dense_bad, keys_bad], axis=1)  # (n, 40)
    row_bad = bad.any(axis=1)
    bad_col[good[row_bad]] = bad[row_bad].argmax(axis=1)
    ok = ~row_bad
    return _Block(buf, starts, ends, bad_col, (label_char[ok] - _ZERO).astype(np.float32),
                  dense[ok], keys[ok])


def _chars(a: np.ndarray, start: np.ndarray, width: int) -> np.ndarray:
    """The ``width`` bytes from every ``start`` (a multiple of 8). Shape: (n, m) -> (n, m, width)."""
    words = np.ndarray((len(a) - _WINDOW, width // 8), dtype=np.uint64, buffer=a, strides=(1, 8))
    return words[start].view(np.uint8)  # a gather of unaligned 8-byte words: fast


def _any8(b: np.ndarray) -> np.ndarray:
    """``b.any(-1)`` for a bool array whose last axis is a multiple of 8, 8 bytes at a time."""
    return (b.view(np.uint64) != 0).any(-1)


def _parse_dense(a, start, length) -> tuple[np.ndarray, np.ndarray]:
    """Optionally signed decimal integers -> ``log1p(max(x, 0))``. Shape: (n, 13) -> (n, 13) x2."""
    width = -(-min(int(length.max(initial=0)), _MAX_DENSE_CHARS) // 8) * 8
    chars = _chars(a, start, width)  # (n, 13, W)
    digit = chars - np.uint8(_ZERO)  # wraps around below '0', so one compare finds the digits
    inside = np.arange(width) < length[..., None]
    is_digit = inside & (digit <= 9)
    neg = (length > 0) & (a[start] == _MINUS)
    stray = inside & ~is_digit & ~((np.arange(width) == 0) & neg[..., None])  # a leading "-" is fine
    bad = (length > _MAX_DENSE_CHARS) | _any8(stray) | ((length > 0) & ~_any8(is_digit))  # last: "-"
    # Digits read as if the field filled the window, then shifted right: exact below 2**53.
    padded = np.where(is_digit, digit, np.uint8(0)).astype(np.float64) @ (10.0 ** np.arange(width)[::-1])
    value = padded / 10.0 ** np.clip(width - length, 0, width)
    value[neg] = 0.0  # missing values are already 0
    return np.log1p(value).astype(np.float32), bad


def _parse_hex(a, start, length) -> tuple[np.ndarray, np.ndarray]:
    """8-hex-digit ids -> ``(field << 32) | id``, -1 if missing. Shape: (n, 26) -> (n, 26) x2."""
    chars = _chars(a, start, 8)  # (n, 26, 8)
    is_hex = (chars - np.uint8(_ZERO) <= 9) | ((chars | np.uint8(0x20)) - np.uint8(ord("a")) <= 5)
    full = length == 8
    bad = (~full & (length != 0)) | (full & _any8(~is_hex))
    # The 8 characters as one little-endian word, turned into nibbles then packed, 8 at a time.
    x, u = chars.view(np.uint64)[..., 0], np.uint64
    x = (x & u(0x0F0F0F0F0F0F0F0F)) + (x >> u(6) & u(0x0101010101010101)) * u(9)  # 'a', 'A' -> 10
    for shift, mask in ((4, 0x00FF00FF00FF00FF), (8, 0x0000FFFF0000FFFF), (16, 0x00000000FFFFFFFF)):
        x = (x & u(mask)) << u(shift) | (x >> u(2 * shift) & u(mask))  # first character on top
    keys = x.astype(np.int64) | (np.arange(start.shape[1], dtype=np.int64) << 32)
    return np.where(full, keys, -1), bad


# ---- reading the raw files ------------------------------------------------------------------

def _open(path: str):
    """(raw file, line stream): gzip when the file starts with gzip's magic bytes."""
    raw = open(path, "rb")
    if raw.read(2) == b"\x1f\x8b":
        raw.seek(0)
        return raw, gzip.GzipFile(fileobj=raw, mode="rb")
    raw.seek(0)
    return raw, raw


def _blocks(paths: list[str], bar: tqdm) -> Iterator[tuple[int, int, _Block]]:
    """(source index, first line number in that source (1-based), parsed block) for every block."""
    for src, path in enumerate(paths):
        raw, stream = _open(path)
        with raw, stream:
            carry, line_no, pos = b"", 1, 0
            while True:
                chunk = _read(stream, path)
                bar.update(raw.tell() - pos)
                pos = raw.tell()
                buf = carry + chunk
                cut = buf.rfind(b"\n") + 1 if chunk else len(buf)
                if chunk and cut == 0:
                    carry = buf[:_MAX_LINE]  # an endless line: keep its head only
                    continue
                if cut:
                    block = _parse_block(buf[:cut] if buf[cut - 1] == _NL else buf + b"\n")
                    yield src, line_no, block
                    line_no += len(block.bad_col)
                carry = buf[cut:]
                if not chunk:
                    break


def _read(stream, path: str) -> bytes:
    """The next block of bytes; a gzip file cut short or damaged is a ValueError naming it (gzip
    raises EOFError or zlib.error, which say neither which file nor what to do)."""
    try:
        return stream.read(_BLOCK_BYTES)
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise ValueError(f"{path}: a truncated or damaged gzip file ({e}): download or copy it again") from None


def _rows(paths: list[str], max_rows: int | None, desc: str, progress: bool
          ) -> Iterator[tuple[int, int, _Block]]:
    """As :func:`_blocks`, stopped after ``max_rows`` valid rows (skipped lines past it unread)."""
    total = sum(os.path.getsize(p) for p in paths)
    rows = 0
    with tqdm(total=total, unit="B", unit_scale=True, desc=desc, disable=not progress) as bar:
        for src, line_no, block in _blocks(paths, bar):
            n = len(block.labels)
            if max_rows is not None and rows + n >= max_rows:
                valid = np.flatnonzero(block.bad_col == _OK)
                yield src, line_no, block.head(int(valid[max_rows - rows - 1]) + 1)
                return
            rows += n
            yield src, line_no, block


def skipped_lines(block: _Block, path: str, line_no: int, before: int, most: int = 10) -> tuple[int, list[dict]]:
    """A block's skipped lines: how many, and the first ``most`` described (``line``: over the
    whole input, ``before`` lines read earlier; ``source_line``: in ``path``)."""
    bad = np.flatnonzero(block.bad_col != _OK)
    return len(bad), [{"line": before + int(i) + 1, "source": path, "source_line": line_no + int(i),
                       "reason": block.reason(i)} for i in bad[:most]]
