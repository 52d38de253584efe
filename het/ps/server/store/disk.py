"""A shard's disk tier: rows as fixed-width records in append-only segment files.

A record is its row's float32 words and one more word, its check (:func:`checks`: a 32-bit
hash of the words and of the record's offset in its segment), read back against it every time:
a record changed, cut off (read as zeros) or read from another place is a
:class:`het.files.DamagedFile` naming the file and the bytes, never a row.

A record is written once and never changed: a row written again gets a new record at the end
of the current segment, and its old one becomes garbage. So a save hard-links the segment
files (:meth:`Segments.link_into`) and later writes cannot change what it holds, and no save
copies the disk tier. Segments whose records are mostly garbage are rewritten by the owner
(:meth:`het.ps.server.store.tiers.TieredRows.compact`), then unlinked (a save's links keep their data).

- **Writes** are one ``os.pwrite`` of a contiguous buffer per segment a batch reaches.
- **Reads** are one ``pread`` a record, several threads at once (het's native core: a random
  read of a record not in the page cache waits on the disk, and threads keep several in flight;
  the segments are opened ``POSIX_FADV_RANDOM``, no read-ahead). Without the native core, each
  segment is mapped read-only (``MADV_RANDOM``) and its records taken with one ``numpy.take``;
  then ``MADV_DONTNEED`` drops the mapped pages from the process's RSS.
- **Memory**: per segment a count of its live records; the slot that wrote each record (its
  owner, int32) only while its segment is written. A full segment's owners go to a checked side
  file (``seg-N.owners``, :mod:`het.arrayfile`), read again when the segment is compacted: there a
  record is live when its owner's place still names it (:meth:`het.ps.server.store.tiers.TieredRows.compact`).
  So a stored row costs its place and nothing per record, garbage included (owners in DRAM
  would cost 4 bytes a record: ~8 a row, with the tier's one dead record a live one).

Measured against a row file written in place, LMDB and RocksDB in docs/RESULTS.md ("Disk tier:
candidate stores").
"""

from __future__ import annotations

import mmap
import os

import numpy as np
import torch

from het import arrayfile, files, native

SEGMENT_BYTES = 128 << 20  # a segment's size on disk (the last one is written as it fills)
CHECK_RECORDS = 1 << 16  # records read back at once when a whole segment is checked
WRITE_RECORDS = 1 << 14  # records written with one pwrite at most (its block is a copy)
READ_THREADS = 16  # reads in flight at once (het/native/records.cpp): random reads of cold records wait on the disk
_WEIGHT, _SALT, _MIX = np.uint64(0x9E3779B97F4A7C15), np.uint64(0x2545F4914F6CDD1D), np.uint64(0xBF58476D1CE4E5B9)


def checks(rows: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Each record's check: its words weighted by odd constants and summed, its offset in its
    segment mixed in, folded to 32 bits. A word changed moves the sum (an odd weight keeps every
    bit), and a record of zeros or from another offset does not match.
    Shape: (n, w) float32, (n,) -> (n,) uint32.

    Example:
        >>> rows = np.ones((2, 3), np.float32)
        >>> c = checks(rows, np.array([0, 1]))
        >>> c.dtype, bool(c[0] != c[1]), bool(checks(np.zeros((1, 3), np.float32), np.array([0]))[0] != 0)
        (dtype('uint32'), True, True)
    """
    words = np.ascontiguousarray(rows, dtype=np.float32).view(np.uint32).astype(np.uint64)
    weights = np.arange(1, words.shape[1] + 1, dtype=np.uint64) * _WEIGHT | np.uint64(1)
    h = (words * weights).sum(1, dtype=np.uint64) ^ (np.asarray(offsets, dtype=np.uint64) + _SALT) * _MIX
    h ^= h >> np.uint64(31)
    h *= _WEIGHT
    h ^= h >> np.uint64(32)
    return (h & np.uint64(0xFFFFFFFF)).astype(np.uint32)


def verify(records: np.ndarray, offsets: np.ndarray, path: str) -> np.ndarray:
    """The rows of ``records`` (their check in the last word) read at ``offsets`` of the
    segment file ``path``; DamagedFile naming the first that does not match its check.
    Shape: (n, w + 1), (n,) -> (n, w) (a view)."""
    rows, stored = records[:, :-1], records[:, -1].view(np.uint32)
    bad = np.flatnonzero(checks(rows, offsets) != stored)
    if len(bad):
        off, size = int(offsets[bad[0]]), records.shape[1] * 4
        raise files.DamagedFile(f"{path}: record {off} (bytes {off * size}..{(off + 1) * size - 1}) does not match "
                                f"its check, nor do {len(bad) - 1} more of the {len(records)} read: damaged")
    return rows


class Segments:
    """Records of ``width`` float32 in append-only files under ``directory``; a record is
    addressed by its number ``segment * per_segment + offset``.

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> s = Segments(d, width=2, segment_bytes=48)  # 4 records (2 words and a check) per segment
        >>> recs = s.append(np.arange(12, dtype=np.float32).reshape(6, 2), torch.arange(6))
        >>> recs.tolist(), len(s.files)
        ([0, 1, 2, 3, 4, 5], 2)
        >>> s.read(torch.tensor([5, 0])).tolist()
        [[10.0, 11.0], [0.0, 1.0]]
        >>> s.kill(torch.tensor([0, 1, 2])); s.live, s.dead
        (3, 3)
        >>> s.close()
    """

    def __init__(self, directory: str, width: int, segment_bytes: int = SEGMENT_BYTES):
        self.directory, self.width = directory, width
        self.record_bytes = 4 * (width + 1)  # the row's words and its check
        self.per_segment = max(1, segment_bytes // self.record_bytes)
        files.make_directories(directory)
        self.files: dict[int, _Segment] = {}
        self.next = 0  # the next record's number
        self.live = self.dead = 0
        self.reads = self.writes = 0

    # -- records ----------------------------------------------------------------------------
    def append(self, rows: np.ndarray, owners: torch.Tensor) -> torch.Tensor:
        """Write ``rows`` as new records owned by ``owners`` (slots); their numbers. Shape:
        (n, width), (n,) -> (n,)."""
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        n, done = len(rows), 0
        records = torch.arange(self.next, self.next + n)
        while done < n:
            seg, off = divmod(self.next, self.per_segment)
            k = min(n - done, self.per_segment - off, WRITE_RECORDS)  # the block below is scratch: bounded
            f = self.files.get(seg) or self._open(seg)
            block = np.empty((k, self.width + 1), dtype=np.float32)
            block[:, :self.width] = rows[done:done + k]
            block.view(np.uint32)[:, self.width] = checks(rows[done:done + k], np.arange(off, off + k))
            os.pwrite(f.fd, memoryview(block).cast("B"), off * self.record_bytes)
            f.own(off, owners[done:done + k].numpy())
            f.live += k
            f.written = off + k
            if f.written == self.per_segment:  # full: its owners leave DRAM for their side file
                f.close_owners()
            self.next += k
            done += k
        self.live += n
        self.writes += n
        return records

    def read(self, records: torch.Tensor) -> np.ndarray:
        """The rows of ``records``, each checked (DamagedFile for one that does not match).
        Shape: (n,) -> (n, width)."""
        if native.ops is None or not len(records):
            return self._read_mapped(records)
        seg = records // self.per_segment
        local = (records - seg * self.per_segment).numpy()
        segs, inverse = torch.unique(seg, return_inverse=True)
        fds = torch.tensor([self.files[s].fd for s in segs.tolist()], dtype=torch.int32)[inverse]
        got = torch.empty(len(records), self.width + 1)
        native.ops.read_records(fds, torch.from_numpy(local * self.record_bytes), self.record_bytes, got,
                                READ_THREADS)
        got = got.numpy()
        self.reads += len(records)
        bad = np.flatnonzero(checks(got[:, :-1], local) != got[:, -1].view(np.uint32))
        if len(bad):  # named by the first damaged record's segment
            first = int(bad[0])
            verify(got[first:first + 1], local[first:first + 1], self.files[int(seg[first])].path)
        return got[:, :-1]

    def _read_mapped(self, records: torch.Tensor) -> np.ndarray:
        """:meth:`read` through each segment's read-only map (het's native core not built)."""
        out = np.empty((len(records), self.width), dtype=np.float32)
        if not len(records):
            return out
        seg = records // self.per_segment
        segs, inverse = torch.unique(seg, return_inverse=True)
        local = (records - seg * self.per_segment).numpy()
        for i, s in enumerate(segs.tolist()):  # one take per segment touched, not per record
            pos = (inverse == i).nonzero().flatten().numpy()
            f = self.files[s]
            got = f.rows().take(local[pos], axis=0)
            f.drop_pages()
            out[pos] = verify(got, local[pos], f.path)
        self.reads += len(records)
        return out

    def kill(self, records: torch.Tensor) -> None:
        """Mark ``records`` (unique, live) garbage: rows written again or forgotten."""
        if not len(records):
            return
        seg = records // self.per_segment
        local = (records - seg * self.per_segment).numpy()
        segs, counts = torch.unique(seg, return_counts=True)
        for s, c in zip(segs.tolist(), counts.tolist()):
            self.files[s].live -= c
        self.live -= len(records)
        self.dead += len(records)

    # -- segments ---------------------------------------------------------------------------
    def sparse_segments(self, want: int) -> list[int]:
        """Closed segments with the most garbage, until they hold ``want`` dead records (the
        current one, still filling, is never chosen)."""
        current = self.next // self.per_segment
        closed = sorted((f.live - f.written, s) for s, f in self.files.items() if s != current and not f.unreadable)
        chosen, dead = [], 0
        for neg_dead, s in closed:
            if dead >= want or neg_dead == 0:
                break
            chosen.append(s)
            dead -= neg_dead
        return chosen

    def owned_records(self, seg: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A segment's records and the slot that wrote each (live or not: a record is live when
        its owner's place still names it), read from its side file when the segment is full;
        DamagedFile when that file is (the segment is not offered for compaction again)."""
        f = self.files[seg]
        try:
            owners = f.read_owners()
        except files.DamagedFile:
            f.unreadable = True
            raise
        offs = np.flatnonzero(owners >= 0)
        return torch.from_numpy(offs + seg * self.per_segment), torch.from_numpy(owners[offs].astype(np.int64))

    def drop(self, seg: int) -> None:
        """Forget a segment whose live records were moved: its file is unlinked (a save that
        linked it keeps it)."""
        f = self.files.pop(seg)
        self.live -= f.live
        self.dead -= f.written - f.live
        f.close()
        os.unlink(f.path)
        if os.path.lexists(f.owners_path):
            os.unlink(f.owners_path)

    def link_into(self, directory: str) -> dict[int, str]:
        """Hard-link every segment into ``directory`` (copied where links are impossible);
        segment -> file name."""
        files.make_directories(directory)
        names = {}
        for s, f in self.files.items():
            names[s] = os.path.basename(f.path)
            files.link_or_copy(f.path, os.path.join(directory, names[s]))
        return names

    def adopt(self, path: str, owners: np.ndarray) -> int:
        """Take a saved segment file (linked, not copied) as a new closed segment whose records
        ``0 .. len(owners) - 1`` are owned by ``owners`` (-1: garbage); its number."""
        seg = -(-self.next // self.per_segment)  # past the current one, which stays open
        f = self._open(seg, source=path)
        f.own(0, owners)
        f.written, f.live = len(owners), int((owners >= 0).sum())
        f.close_owners()
        self.next = (seg + 1) * self.per_segment
        self.live += f.live
        self.dead += f.written - f.live
        return seg

    @property
    def nbytes(self) -> int:
        """Bytes written to the segment files (live records and garbage)."""
        return sum(f.written for f in self.files.values()) * self.record_bytes

    @property
    def memory_bytes(self) -> int:
        """DRAM this tier holds: the owners of the records of the segments still written."""
        return sum(4 * len(f.owners) for f in self.files.values())

    def close(self) -> None:
        for f in self.files.values():
            f.close()
        self.files.clear()

    def _open(self, seg: int, source: str | None = None) -> "_Segment":
        path = os.path.join(self.directory, f"seg-{seg:06d}.rows")
        for old in (path, _owners_path(path)):
            if os.path.lexists(old):  # never written through: a save may hold a link to it
                os.unlink(old)
        if source is not None:
            files.link_or_copy(source, path)
        f = _Segment(path, self.per_segment, self.record_bytes, self.width + 1)
        self.files[seg] = f
        return f


def _owners_path(path: str) -> str:
    return path[:-len(".rows")] + ".owners"


class _Segment:
    """One segment file: its descriptor, its read-only map (made on the first read), and the
    owner of each record (-1: not written; garbage keeps its owner), in DRAM while the segment
    is written, then in its side file. ``width``: a record's words."""

    def __init__(self, path: str, per_segment: int, record_bytes: int, width: int):
        self.path, self.width, self.owners_path = path, width, _owners_path(path)
        self.unreadable = False  # its side file was damaged: never compacted
        self.fd = files.open_own(path, os.O_RDWR | os.O_CREAT)
        os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_RANDOM)  # random records: read-ahead would waste the disk
        self.size = per_segment * record_bytes
        if os.fstat(self.fd).st_size < self.size:
            os.ftruncate(self.fd, self.size)  # sparse: blocks are allocated as records are written
        self.owners = np.empty(0, dtype=np.int32)  # grows as records are written
        self.written = self.live = 0
        self.closed = False  # full: its owners in the side file
        self._map: mmap.mmap | None = None
        self._rows: np.ndarray | None = None

    def own(self, offset: int, owners: np.ndarray) -> None:
        """Set the owners of records ``offset ..``, the array grown (doubling) to hold them."""
        end = offset + len(owners)
        if end > len(self.owners):
            grown = np.full(max(end, 2 * len(self.owners)), -1, dtype=np.int32)
            grown[:len(self.owners)] = self.owners
            self.owners = grown
        self.owners[offset:end] = owners

    def close_owners(self) -> None:
        """Write the owners to the side file (checked, fsynced, renamed into place) and free them."""
        arrayfile.write(self.owners_path, {"owners": self.owners[:self.written]}, {"segment": self.path})
        self.owners = np.empty(0, dtype=np.int32)
        self.closed = True

    def read_owners(self) -> np.ndarray:
        """The owner of each record written (from the side file once the segment is full)."""
        if not self.closed:
            return self.owners[:self.written]
        _, arrays = arrayfile.read(self.owners_path)
        owners = arrays["owners"]
        if owners.dtype != np.int32 or len(owners) != self.written:
            raise files.DamagedFile(f"{self.owners_path}: expected {self.written} int32 owners, "
                                    f"got {len(owners)} {owners.dtype}")
        return owners

    def rows(self) -> np.ndarray:
        if self._rows is None:
            self._map = mmap.mmap(self.fd, self.size, prot=mmap.PROT_READ)
            self._map.madvise(mmap.MADV_RANDOM)
            self._rows = np.frombuffer(self._map, dtype=np.float32).reshape(-1, self.width)
        return self._rows

    def drop_pages(self) -> None:
        """Unmap the pages a read faulted in: they leave the process's RSS, not the page cache."""
        if self._map is not None:
            self._map.madvise(mmap.MADV_DONTNEED)

    def close(self) -> None:
        self._rows = None  # the map cannot close while an array views it
        if self._map is not None:
            self._map.close()
            self._map = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def read_saved(directory: str, saved: dict, records: torch.Tensor) -> np.ndarray:
    """Rows of ``records`` from a save's segment files in ``directory``
    (:meth:`het.ps.server.store.tiers.TieredRows.save` said which), without taking the files, each
    checked when the save's records carry checks (format 2; DamagedFile names one that does
    not match, or a file cut off). Shape: (n,) -> (n, width)."""
    per, width = saved["per_segment"], saved["width"]
    stride = width + int(bool(saved.get("checks")))
    seg, local = (records // per).numpy(), (records % per).numpy()
    out = np.empty((len(records), width), dtype=np.float32)
    for s in np.unique(seg):
        pos = np.flatnonzero(seg == s)
        path = os.path.join(directory, saved["segments"][int(s)])
        mm = np.memmap(path, dtype=np.float32, mode="r")
        held = len(mm) // stride
        if local[pos].max() >= held:
            raise files.DamagedFile(f"{path}: holds {held} records, record {local[pos].max()} is asked for: cut off")
        got = mm[:held * stride].reshape(held, stride).take(local[pos], axis=0)
        del mm
        out[pos] = verify(got, local[pos], path) if stride > width else got
    return out


def check_saved(directory: str, saved: dict) -> None:
    """Read every record of a save's disk tier back against its check, in blocks of
    :data:`CHECK_RECORDS` (:func:`read_saved`): a load checks them all before it changes
    anything."""
    records, _ = torch.sort(saved["records"])
    for part in records.split(CHECK_RECORDS):
        read_saved(directory, saved, part)
