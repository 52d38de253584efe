"""A shard's write-ahead log: every push it applies, appended before the push is acknowledged,
so that a shard killed (-9) and restarted on the same state directory loses nothing it
acknowledged.

Layout, under ``STATE_DIR/wal/``:

- ``base.pt``: the shard's state at the log's start (a save, hard-linked when the shard saves,
  written when it loads), holding ``wal_lsn``, the number of the last push it includes;
- ``log``: records, one per applied push, each ``magic "HWL2" | meta_len u32 | body_len u32 |
  body crc32 u32 | head crc32 u32`` (the last: the CRC-32 of the 16 bytes before it), then the
  body: JSON meta (``lsn``, table, step, ``n``, ``dim``, and the request's session and seq)
  and the raw keys (int64), gradients (float32, as applied), counts (int64) and sums of
  squares (float32, when the push carried them).

A record is written with one ``write`` call on an append-only descriptor before the reply is
sent: once written, the operating system holds it, whatever happens to the process. ``fsync``
(the disk holds it, whatever happens to the machine) runs at most ``fsync_s`` seconds after a
record is written: at the next append, or from the shard's loop when no request comes
(:meth:`WriteAheadLog.sync_if_due`). A write that fails (a full disk, a file-size limit) is cut
off again before the push is refused, and its number is given to the next record: the log never
holds a fragment or a gap before records that were acknowledged. A save truncates the log:
records it includes are skipped anyway if a crash comes between.

Reading (:func:`scan`) takes the records in order, each numbered one past the one before, and
sorts what follows the last intact one: nothing (the log is whole); a write cut short (less
than a header, a header whose record runs past the end, or zeros, with nothing intact after):
a crash interrupted it before its push was acknowledged, and recovery removes it before the
log takes new records; anything else (a record that does not match its checksums, one out of
sequence, intact records after a bad one) is damage, and the pushes from there may have been
acknowledged: the shard refuses to start, naming them, unless told to recover the prefix
(``het serve --wal-recover-prefix``).

Use: ``het serve --state-dir DIR --wal`` (``--wal-fsync-s``, default 0.05), or ``ps_wal`` in a
training job, where the local launcher also restarts a dead shard on its address. A push is
logged before it is applied, so one the table refuses (a non-finite result, say) is refused
again, the same way, on replay. Each record keeps its request's session and seq, and a save the
last seq applied per session (``applied``): when a client re-sends its unanswered requests to
the restarted shard (:class:`het.ps.client.client.PSClient`, ``reconnect_s``), each push is applied
exactly once (see :mod:`het.ps.protocol.auth`).
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import struct
import time
import zlib
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from het import files

_HEAD = struct.Struct("<4sIIII")
MAGIC = b"HWL2"
OLD = "log.old"  # a log set aside while its base is written in the background


@dataclass
class Scan:
    """What :func:`scan` found in a log: its intact prefix (``end`` bytes, ``records`` of them,
    the last numbered ``last_lsn``) and, past it, ``problem`` (None: nothing), which is
    ``torn`` when it is a write cut short and nothing intact follows."""

    path: str
    end: int = 0
    size: int = 0
    records: int = 0
    last_lsn: int = 0
    problem: str | None = None
    torn: bool = False


class WriteAheadLog:
    """The append side of a shard's log (see the module). ``valid_bytes``: the log's intact
    prefix (:func:`scan`); what follows is cut off before anything is appended.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     log = WriteAheadLog(d, fsync_s=0)
        ...     lsn = log.append("t", np.array([3]), np.ones((1, 2), np.float32), np.array([1]), step=1)
        ...     log.close()
        ...     [(r["lsn"], r["table"], r["keys"].tolist()) for r in read_log(d)]
        [(1, 't', [3])]
    """

    def __init__(self, directory: str, fsync_s: float = 0.05, lsn: int = 0, valid_bytes: int | None = None):
        files.make_directories(directory)
        self.directory, self.fsync_s, self.lsn = directory, fsync_s, lsn
        self.fd = files.open_own(os.path.join(directory, "log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        if valid_bytes is not None and os.fstat(self.fd).st_size > valid_bytes:
            os.ftruncate(self.fd, valid_bytes)  # new records follow the last intact one, not what was after it
            os.fsync(self.fd)
        self._synced = time.monotonic()
        self._unsynced = False  # records written since the last fsync
        self.broken: OSError | None = None  # a failed write that could not be cut off: nothing more is logged
        # wal_log_bytes: the log's size now (what wal_max bounds); wal_bytes: all ever written
        self.stats = {"wal_records": 0, "wal_bytes": 0, "wal_fsyncs": 0, "wal_log_bytes": os.fstat(self.fd).st_size}

    def append(self, table: str, keys: np.ndarray, grads: np.ndarray, counts: np.ndarray, step: int,
               session: tuple[str, int] | None = None, sq: np.ndarray | None = None) -> int:
        """Log one applied push (and its request's session and sequence number, and its sums of
        squared gradients when it carries them); its log sequence number."""
        if self.broken is not None:
            raise OSError(f"write-ahead log: a failed write could not be cut off ({self.broken}); restart the "
                          f"shard, which recovers the log to its last whole record")
        self.lsn += 1
        head = {"lsn": self.lsn, "table": table, "step": int(step), "n": len(keys), "dim": int(grads.shape[1]),
                "session": session and session[0], "seq": session and session[1]}
        if sq is not None:
            head["sq_width"] = int(sq.shape[1])
        meta = json.dumps(head).encode()
        body = b"".join((meta, np.ascontiguousarray(keys, "<i8").tobytes(),
                         np.ascontiguousarray(grads, "<f4").tobytes(), np.ascontiguousarray(counts, "<i8").tobytes(),
                         b"" if sq is None else np.ascontiguousarray(sq, "<f4").tobytes()))
        first = struct.pack("<4sIII", MAGIC, len(meta), len(body), zlib.crc32(body))
        record = first + struct.pack("<I", zlib.crc32(first)) + body
        before = self.stats["wal_log_bytes"]
        try:
            written = os.write(self.fd, record)
            if written != len(record):  # a full disk: the push must not be acknowledged
                raise OSError(f"write-ahead log: wrote {written} of {len(record)} bytes")
        except OSError:
            self.lsn -= 1  # the next record takes this number: no gap
            self._cut_back(before)
            raise
        self._unsynced = True
        self.stats["wal_records"] += 1
        self.stats["wal_bytes"] += len(record)
        self.stats["wal_log_bytes"] += len(record)
        if time.monotonic() - self._synced >= self.fsync_s:
            self.sync()
        return self.lsn

    def _cut_back(self, size: int) -> None:
        """The log cut back to ``size`` bytes, its last whole record, after a failed write."""
        try:
            os.ftruncate(self.fd, size)
        except OSError as e:
            self.broken = e

    def sync(self) -> None:
        os.fsync(self.fd)
        self._synced = time.monotonic()
        self._unsynced = False
        self.stats["wal_fsyncs"] += 1

    def sync_due_in(self) -> float | None:
        """Seconds until the records written since the last fsync are due to be forced to disk
        (0: now), or None when every record is."""
        if not self._unsynced:
            return None
        return max(0.0, self.fsync_s - (time.monotonic() - self._synced))

    def sync_if_due(self) -> None:
        """Force the log to disk when records have waited ``fsync_s`` for it: what bounds the loss
        of a machine crash in time even while no push comes."""
        if self.sync_due_in() == 0.0:
            self.sync()

    def rotate(self) -> None:
        """Set the log aside as ``log.old`` (on disk first) and go on in a new, empty ``log``:
        what a base written in the background (:meth:`het.ps.server.store.state.StateDirectory.rebase`)
        replaces; recovery reads ``log.old`` before ``log``."""
        os.fsync(self.fd)
        os.close(self.fd)
        path = os.path.join(self.directory, "log")
        os.rename(path, os.path.join(self.directory, OLD))
        self.fd = files.open_own(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        files.fsync_directory(self.directory)
        self._synced = time.monotonic()
        self.stats["wal_log_bytes"] = 0

    def truncate(self) -> None:
        """Start the log afresh (a save holds everything logged so far); numbers go on."""
        os.ftruncate(self.fd, 0)
        self.sync()
        self.stats["wal_log_bytes"] = 0

    @property
    def size(self) -> int:
        """Bytes in the log now."""
        return self.stats["wal_log_bytes"]

    def close(self) -> None:
        os.fsync(self.fd)
        os.close(self.fd)


def scan(directory: str, after: int = 0, name: str = "log") -> Scan:
    """The intact prefix of ``directory/name`` and what follows it (see the module). ``after``:
    the last push the log's base holds; a log whose first record is numbered past ``after + 1``
    misses pushes, which is damage too."""
    path = os.path.join(directory, name)
    found = Scan(path)
    with _mapped(path) as data:
        found.size = len(data)
        pos, last = 0, None
        while pos < len(data):
            got = _record_at(data, pos)
            if isinstance(got, str):
                found.problem = f"{path}: {got} at byte {pos}"
                break
            size, meta, _ = got
            expected = after + 1 if last is None else last + 1
            if meta["lsn"] != expected and (last is not None or meta["lsn"] > expected):
                found.problem = (f"{path}: the record at byte {pos} holds push {meta['lsn']}, expected push "
                                 f"{expected}{'' if last is not None else ' (the base holds those before it)'}")
                break
            pos, last, found.records = pos + size, meta["lsn"], found.records + 1
        found.end, found.last_lsn = pos, last or 0
        if found.problem is not None:
            _describe_rest(found, data)
    return found


def _describe_rest(found: Scan, data) -> None:
    """What follows the intact prefix: a write cut short with nothing intact after it (torn),
    or damage, with the intact records after it counted (their pushes would be lost)."""
    pos, intact, lsns = found.end, 0, (None, None)
    at = data.find(MAGIC, pos + 1)
    while at >= 0:
        got = _record_at(data, at)
        if isinstance(got, str):
            at = data.find(MAGIC, at + 1)
            continue
        lsn = got[1]["lsn"]
        intact, lsns = intact + 1, (min(lsns[0] or lsn, lsn), max(lsns[1] or lsn, lsn))
        at = data.find(MAGIC, at + got[0])
    cut = "cut short" in found.problem or not np.frombuffer(data, np.uint8, offset=pos).any()
    found.torn = cut and not intact
    if found.torn:
        found.problem = (f"{found.path}: a write cut short at byte {pos} ({len(data) - pos} bytes: a crash "
                         f"interrupted it before its push was acknowledged)")
    elif intact:
        found.problem += f", and {intact} intact records follow (pushes {lsns[0]}..{lsns[1]})"
    else:
        found.problem += ", and nothing intact follows"


def _record_at(data, pos: int):
    """``(size, meta, meta_len)`` of the intact record at ``pos``, or why there is none, in words."""
    if len(data) - pos < _HEAD.size:
        return f"a header cut short ({len(data) - pos} of {_HEAD.size} bytes)"
    magic, meta_len, body_len, body_crc, head_crc = _HEAD.unpack_from(data, pos)
    if magic == b"HWAL":
        return "a record of an earlier het's log (recover it with that version, then save)"
    if magic != MAGIC or zlib.crc32(data[pos:pos + 16]) != head_crc:
        return "a record header that does not match its checksum"
    end = pos + _HEAD.size + body_len
    if end > len(data):
        return f"a record cut short ({len(data) - pos} of {_HEAD.size + body_len} bytes)"
    body = data[pos + _HEAD.size:end]
    if zlib.crc32(body) != body_crc or meta_len > body_len:
        return "a record that does not match its checksum"
    try:
        meta = json.loads(body[:meta_len])
    except ValueError:
        return "a record whose meta is not JSON"
    return _HEAD.size + body_len, meta, meta_len


def read_log(directory: str, after: int = 0, end: int | None = None, name: str = "log") -> Iterator[dict]:
    """The records of ``directory/name`` past ``after``, in order, up to byte ``end`` (None: up
    to the first one that is not intact): ``{"lsn", "table", "step", "keys", "grads",
    "counts", "sq"}`` (``sq`` None when the push carried none)."""
    path = os.path.join(directory, name)
    with _mapped(path) as data:
        pos, stop = 0, len(data) if end is None else end
        while pos < stop:
            got = _record_at(data, pos)
            if isinstance(got, str):
                return
            size, meta, meta_len = got
            if meta["lsn"] > after:
                yield _arrays(meta, data, pos + _HEAD.size + meta_len)
            pos += size


def _arrays(meta: dict, data, at: int) -> dict:
    """A record with its arrays (copies), which start at byte ``at``."""
    n, dim = meta["n"], meta["dim"]
    keys = np.frombuffer(data, "<i8", n, at).copy()
    grads = np.frombuffer(data, "<f4", n * dim, at + 8 * n).reshape(n, dim).copy()
    counts = np.frombuffer(data, "<i8", n, at + 8 * n + 4 * n * dim).copy()
    sq = None
    if meta.get("sq_width"):
        width = meta["sq_width"]
        sq = np.frombuffer(data, "<f4", n * width, at + 16 * n + 4 * n * dim).reshape(n, width).copy()
    return {**meta, "keys": keys, "grads": grads, "counts": counts, "sq": sq}


@contextlib.contextmanager
def _mapped(path: str):
    """The bytes of the file at ``path``, mapped read-only (empty when there is none)."""
    try:
        fd = files.open_own(path, os.O_RDONLY)
    except FileNotFoundError:
        yield b""
        return
    try:
        if os.fstat(fd).st_size == 0:
            yield b""
            return
        with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as data:
            yield data
    finally:
        os.close(fd)
