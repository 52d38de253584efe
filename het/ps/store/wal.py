"""A shard's write-ahead log: every push it applies, appended before the push is acknowledged,
so that a shard killed (-9) and restarted on the same state directory loses nothing it
acknowledged.

Layout, under ``STATE_DIR/wal/``:

- ``base.pt``: the shard's state at the log's start (a save, hard-linked when the shard saves,
  written when it loads), holding ``wal_lsn``, the number of the last push it includes;
- ``log``: records, one per applied push, each ``magic "HWAL" | meta_len u32 | body_len u32 |
  crc32 u32`` then the body: JSON meta (``lsn``, table, step, ``n``, ``dim``, and the request's session and
  seq) and the raw keys
  (int64), gradients (float32, as applied) and counts (int64).

A record is written with one ``write`` call on an append-only descriptor before the reply is
sent: once written, the operating system holds it, whatever happens to the process. ``fsync``
(the disk holds it, whatever happens to the machine) runs at most every ``fsync_s`` seconds,
at the next append. Recovery reads the records in order and stops at the first torn one (a
crash while writing: its push was never acknowledged); it replays those past ``wal_lsn``.
A save truncates the log: records it includes are skipped anyway if a crash comes between.

Use: ``het serve --state-dir DIR --wal`` (``--wal-fsync-s``, default 0.05), or ``ps_wal`` in a
training job, where the local launcher also restarts a dead shard on its address. A push is
logged before it is applied, so one the table refuses (a non-finite result, say) is refused
again, the same way, on replay. Each record keeps its request's session and seq, and a save the
last seq applied per session (``applied``): when a client re-sends its unanswered requests to
the restarted shard (:class:`het.ps.client.PSClient`, ``reconnect_s``), each push is applied
exactly once (see :mod:`het.ps.wire.auth`).
"""

from __future__ import annotations

import json
import os
import struct
import time
import zlib
from typing import Iterator

import numpy as np

_RECORD = struct.Struct("<4sIII")
MAGIC = b"HWAL"


class WriteAheadLog:
    """The append side of a shard's log (see the module).

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     log = WriteAheadLog(d, fsync_s=0)
        ...     lsn = log.append("t", np.array([3]), np.ones((1, 2), np.float32), np.array([1]), step=1)
        ...     log.close()
        ...     [(r["lsn"], r["table"], r["keys"].tolist()) for r in read_log(d)]
        [(1, 't', [3])]
    """

    def __init__(self, directory: str, fsync_s: float = 0.05, lsn: int = 0):
        os.makedirs(directory, exist_ok=True)
        self.directory, self.fsync_s, self.lsn = directory, fsync_s, lsn
        self.fd = os.open(os.path.join(directory, "log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._synced = time.monotonic()
        self.stats = {"wal_records": 0, "wal_bytes": 0, "wal_fsyncs": 0}

    def append(self, table: str, keys: np.ndarray, grads: np.ndarray, counts: np.ndarray, step: int,
               session: tuple[str, int] | None = None, sq: np.ndarray | None = None) -> int:
        """Log one applied push (and its request's session and sequence number, and its sums of
        squared gradients when it carries them); its log sequence number."""
        self.lsn += 1
        head = {"lsn": self.lsn, "table": table, "step": int(step), "n": len(keys), "dim": int(grads.shape[1]),
                "session": session and session[0], "seq": session and session[1]}
        if sq is not None:
            head["sq_width"] = int(sq.shape[1])
        meta = json.dumps(head).encode()
        body = b"".join((meta, np.ascontiguousarray(keys, "<i8").tobytes(),
                         np.ascontiguousarray(grads, "<f4").tobytes(), np.ascontiguousarray(counts, "<i8").tobytes(),
                         b"" if sq is None else np.ascontiguousarray(sq, "<f4").tobytes()))
        record = _RECORD.pack(MAGIC, len(meta), len(body), zlib.crc32(body)) + body
        written = os.write(self.fd, record)
        if written != len(record):  # a full disk: the push must not be acknowledged
            raise OSError(f"write-ahead log: wrote {written} of {len(record)} bytes")
        self.stats["wal_records"] += 1
        self.stats["wal_bytes"] += len(record)
        if time.monotonic() - self._synced >= self.fsync_s:
            self.sync()
        return self.lsn

    def sync(self) -> None:
        os.fsync(self.fd)
        self._synced = time.monotonic()
        self.stats["wal_fsyncs"] += 1

    def truncate(self) -> None:
        """Start the log afresh (a save holds everything logged so far); numbers go on."""
        os.ftruncate(self.fd, 0)
        self.sync()

    def close(self) -> None:
        os.fsync(self.fd)
        os.close(self.fd)


def read_log(directory: str, after: int = 0) -> Iterator[dict]:
    """The records of ``directory/log`` past ``after``, in order, up to the first torn one:
    ``{"lsn", "table", "step", "keys", "grads", "counts", "sq"}`` (``sq`` None when the push
    carried none)."""
    path = os.path.join(directory, "log")
    if not os.path.exists(path):
        return
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    while pos + _RECORD.size <= len(data):
        magic, meta_len, body_len, crc = _RECORD.unpack_from(data, pos)
        body = data[pos + _RECORD.size:pos + _RECORD.size + body_len]
        if magic != MAGIC or len(body) != body_len or zlib.crc32(body) != crc:
            return  # torn at a crash: never acknowledged
        pos += _RECORD.size + body_len
        meta = json.loads(body[:meta_len])
        if meta["lsn"] <= after:
            continue
        n, dim, at = meta["n"], meta["dim"], meta_len
        keys = np.frombuffer(body, "<i8", n, at)
        grads = np.frombuffer(body, "<f4", n * dim, at + 8 * n).reshape(n, dim)
        counts = np.frombuffer(body, "<i8", n, at + 8 * n + 4 * n * dim)
        sq = None
        if meta.get("sq_width"):
            width = meta["sq_width"]
            sq = np.frombuffer(body, "<f4", n * width, at + 16 * n + 4 * n * dim).reshape(n, width).copy()
        yield {**meta, "keys": keys.copy(), "grads": grads.copy(), "counts": counts.copy(), "sq": sq}
