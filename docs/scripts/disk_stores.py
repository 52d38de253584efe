"""Candidate disk stores for a PS shard's disk tier, measured from Python.

A record is one embedding row plus its Adagrad state: 2 * dim float32. For each candidate and
dim, the script loads N records (keys 0..N-1), then measures, in batches of random existing
keys (sorted and unique within a batch, as a shard would hand them over):

- warm reads/s: every file's pages in the OS page cache first; the process's RSS growth over
  the phase (anonymous and file-backed: pages of a file mapped into the process count in RSS);
- cold reads/s: before each batch the store is closed, its files fsync'ed and dropped from the
  page cache (posix_fadvise DONTNEED), and reopened; /proc/self/io says how many bytes the
  batch then read from the device;
- writes/s (overwrites of existing keys; append-segments appends new versions), warm (as the
  store acknowledges them, and including a final sync that makes them durable) and cold (one
  batch after each drop, as for cold reads);
- bytes on disk (st_blocks * 512 of every file) against the records' raw bytes, after the
  load and after the writes;
- kill -9: a child process writes batches of new keys, acknowledging each finished one on a
  pipe, and is killed mid-run; the parent reopens the store and checks every acknowledged
  batch, and counts the rows of the batch in flight that landed.

Candidates: mmap-inplace, append-segments (with and without madvise(MADV_DONTNEED) after each
read), lmdb (sync on, the durable default), lmdb-nosync (sync off, writemap), rocksdict (raw
mode, WAL on, default options). A candidate whose package is missing is skipped, with a note.
Prints one JSON object on stdout and a table on stderr. Scratch files go to a temporary
directory under --dir and are removed at the end.

    .venv/bin/python docs/scripts/disk_stores.py [--dims 64,128] [--stores lmdb,rocksdict]
        [--records N] [--batch 16384] [--dir /var/tmp]
"""

import argparse
import json
import mmap
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

try:
    import lmdb
except ImportError:
    lmdb = None
try:
    import rocksdict
except ImportError:
    rocksdict = None

SEGMENT_BYTES = 64 << 20


def key_bytes(keys: np.ndarray) -> list:
    """8-byte big-endian keys as a list of bytes (big-endian sorts as the integers do)."""
    return keys.astype(">u8").view("V8").tolist()


def row_bytes(rows: np.ndarray) -> list:
    """(n, width) float32 -> n bytes objects, one per record."""
    rows = np.ascontiguousarray(rows, np.float32)
    return rows.view(f"V{rows.shape[1] * 4}").ravel().tolist()


class MmapInplace:
    """One preallocated row file (ftruncate), a numpy view of a MAP_SHARED mapping (what
    numpy.memmap is); reads are a fancy-index take, writes a fancy-index assignment."""

    def __init__(self, path: str, width: int, capacity: int):
        os.makedirs(path, exist_ok=True)
        self.fd = os.open(os.path.join(path, "rows"), os.O_RDWR | os.O_CREAT, 0o644)
        size = capacity * width * 4
        if os.fstat(self.fd).st_size < size:
            os.ftruncate(self.fd, size)
        self.map = mmap.mmap(self.fd, size)
        self.map.madvise(mmap.MADV_RANDOM)  # no read-around: one page per random record
        self.rows = np.frombuffer(self.map, np.float32).reshape(capacity, width)

    def read(self, keys):
        return self.rows[keys]

    def lookup(self, keys):
        return self.read(keys)  # a row never written reads as zeros

    def write(self, keys, rows):
        self.rows[keys] = rows

    def sync(self):
        self.map.flush()

    def close(self):
        del self.rows
        self.map.close()
        os.close(self.fd)


class Segment:
    """A rows file and a keys file of `records` slots each, both preallocated (sparse); the
    rows file mapped read-only."""

    def __init__(self, path: str, records: int, width: int):
        self.rows_fd = os.open(path + ".rows", os.O_RDWR | os.O_CREAT, 0o644)
        self.keys_fd = os.open(path + ".keys", os.O_RDWR | os.O_CREAT, 0o644)
        if os.fstat(self.rows_fd).st_size == 0:
            os.ftruncate(self.rows_fd, records * width * 4)
            os.ftruncate(self.keys_fd, records * 8)
        self.map = mmap.mmap(self.rows_fd, records * width * 4, prot=mmap.PROT_READ)
        self.map.madvise(mmap.MADV_RANDOM)
        self.rows = np.frombuffer(self.map, np.float32).reshape(records, width)

    def close(self):
        del self.rows
        self.map.close()
        os.close(self.rows_fd)
        os.close(self.keys_fd)


class AppendSegments:
    """Append-only segment files of SEGMENT_BYTES of rows each. A write appends the batch with
    one os.pwrite per segment it spans (rows first, then key + 1 into the segment's keys file,
    so a key on disk means its row is complete); old versions become garbage. The in-memory
    index (key -> record id) is rebuilt from the keys files on open. A read groups the batch
    by segment, one numpy take per segment, then (release_pages) madvise(MADV_DONTNEED) on
    the segments touched so their pages leave the process's RSS (not the page cache)."""

    def __init__(self, path: str, width: int, capacity: int, release_pages: bool = True):
        os.makedirs(path, exist_ok=True)
        self.path, self.width, self.release_pages = path, width, release_pages
        self.per_segment = SEGMENT_BYTES // (width * 4)
        self.segments = []
        while os.path.exists(self._segment_path(len(self.segments)) + ".rows"):
            self.segments.append(Segment(self._segment_path(len(self.segments)),
                                         self.per_segment, width))
        self.index = np.full(capacity, -1, np.int64)
        self.end = 0  # next record id
        self.dirty = set()
        if self.segments:
            stored = np.concatenate([np.fromfile(self._segment_path(s) + ".keys", np.int64)
                                     for s in range(len(self.segments))])
            ids = np.flatnonzero(stored)
            np.maximum.at(self.index, stored[ids] - 1, ids)  # the latest version wins
            self.end = int(ids[-1]) + 1 if len(ids) else 0

    def _segment_path(self, s):
        return os.path.join(self.path, f"segment-{s:05d}")

    def read(self, keys):
        ids = self.index[keys]
        order = np.argsort(ids)
        ids = ids[order]
        bounds = np.searchsorted(ids, np.arange(len(self.segments) + 1) * self.per_segment)
        rows = np.empty((len(keys), self.width), np.float32)  # in record-id order
        for s in np.flatnonzero(np.diff(bounds)):
            lo, hi = bounds[s], bounds[s + 1]
            # ids are in range by construction; mode="clip" lets take fill `out` unbuffered
            np.take(self.segments[s].rows, ids[lo:hi] - s * self.per_segment, axis=0,
                    out=rows[lo:hi], mode="clip")
            if self.release_pages:
                self.segments[s].map.madvise(mmap.MADV_DONTNEED)
        out = np.empty_like(rows)
        out[order] = rows
        return out

    def lookup(self, keys):
        found = self.index[keys] >= 0
        rows = np.full((len(keys), self.width), np.nan, np.float32)
        rows[found] = self.read(keys[found])
        return rows

    def write(self, keys, rows):
        rows = np.ascontiguousarray(rows, np.float32)
        done = 0
        while done < len(keys):
            s, slot = divmod(self.end, self.per_segment)
            if s == len(self.segments):
                self.segments.append(Segment(self._segment_path(s), self.per_segment, self.width))
            n = min(len(keys) - done, self.per_segment - slot)
            segment = self.segments[s]
            os.pwrite(segment.rows_fd, rows[done:done + n], slot * self.width * 4)
            os.pwrite(segment.keys_fd, keys[done:done + n].astype(np.int64) + 1, slot * 8)
            self.index[keys[done:done + n]] = np.arange(self.end, self.end + n)
            self.end += n
            done += n
            self.dirty.add(s)

    def sync(self):
        for s in self.dirty:
            os.fsync(self.segments[s].rows_fd)
            os.fsync(self.segments[s].keys_fd)
        self.dirty.clear()

    def close(self):
        for segment in self.segments:
            segment.close()


class Lmdb:
    """LMDB: 8-byte big-endian keys, record bytes as values; one write transaction per batch
    (cursor.putmulti), one read transaction per batch (cursor.getmulti). readahead=False
    (MADV_RANDOM on the map), as for the mapped stores above. nosync: sync and metasync off
    and writemap on (a commit is not flushed; survives a process crash, not a power loss)."""

    def __init__(self, path: str, width: int, capacity: int, nosync: bool = False):
        self.width = width
        map_size = max(4 << 30, 4 * capacity * width * 4)
        self.env = lmdb.open(path, map_size=map_size, readahead=False, sync=not nosync,
                             metasync=not nosync, writemap=nosync)

    def read(self, keys):
        # buffers=True (memoryviews into the map, joined inside the txn) took twice as long
        with self.env.begin() as txn:
            pairs = txn.cursor().getmulti(key_bytes(keys))
        if len(pairs) != len(keys):
            raise KeyError(f"{len(keys) - len(pairs)} of {len(keys)} keys not in the store")
        data = b"".join([value for _, value in pairs])
        return np.frombuffer(data, np.float32).reshape(len(keys), self.width)

    def lookup(self, keys):
        with self.env.begin() as txn:
            pairs = txn.cursor().getmulti(key_bytes(keys))
        rows = np.full((len(keys), self.width), np.nan, np.float32)
        if pairs:
            found = np.frombuffer(b"".join([k for k, _ in pairs]), ">u8")
            values = np.frombuffer(b"".join([v for _, v in pairs]), np.float32)
            rows[np.searchsorted(keys, found)] = values.reshape(len(found), self.width)
        return rows

    def write(self, keys, rows):
        with self.env.begin(write=True) as txn:
            txn.cursor().putmulti(zip(key_bytes(keys), row_bytes(rows)))

    def sync(self):
        self.env.sync(True)

    def close(self):
        self.env.close()


class RocksDict:
    """RocksDB through rocksdict: raw mode, default options (WAL on, not synced per write);
    batch reads db[list_of_keys], writes one WriteBatch per batch."""

    def __init__(self, path: str, width: int, capacity: int):
        self.width = width
        options = rocksdict.Options(raw_mode=True)
        options.create_if_missing(True)
        self.db = rocksdict.Rdict(path, options)

    def read(self, keys):
        values = self.db[key_bytes(keys)]
        return np.frombuffer(b"".join(values), np.float32).reshape(len(keys), self.width)

    def lookup(self, keys):
        values = self.db[key_bytes(keys)]
        empty = np.full(self.width, np.nan, np.float32).tobytes()
        data = b"".join([empty if v is None else v for v in values])
        return np.frombuffer(data, np.float32).reshape(len(keys), self.width)

    def write(self, keys, rows):
        batch = rocksdict.WriteBatch(raw_mode=True)
        for key, value in zip(key_bytes(keys), row_bytes(rows)):
            batch.put(key, value)
        self.db.write(batch)

    def sync(self):
        self.db.flush_wal(True)

    def settle(self):
        """Flush the memtable and wait for background compactions to end (at most 60 s)."""
        self.db.flush(True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (
                self.db.property_int_value("rocksdb.compaction-pending")
                or self.db.property_int_value("rocksdb.num-running-compactions")):
            time.sleep(0.2)

    def close(self):
        self.db.close()


# name -> (class, keyword arguments, the package it needs)
CANDIDATES = {
    "mmap-inplace": (MmapInplace, {}, None),
    "append-segments": (AppendSegments, {}, None),
    "lmdb": (Lmdb, {}, "lmdb"),
    "lmdb-nosync": (Lmdb, {"nosync": True}, "lmdb"),
    "rocksdict": (RocksDict, {}, "rocksdict"),
}
MISSING = {name for name, module in (("lmdb", lmdb), ("rocksdict", rocksdict)) if module is None}


def open_store(name, path, width, capacity, **extra):
    cls, kwargs, _ = CANDIDATES[name]
    return cls(path, width, capacity, **{**kwargs, **extra})


def store_files(path):
    return [os.path.join(d, f) for d, _, files in os.walk(path) for f in files]


def disk_bytes(path):
    return sum(os.stat(f).st_blocks * 512 for f in store_files(path))


def drop_page_cache(path):
    """fsync and POSIX_FADV_DONTNEED every file of a closed store; None, or why it failed."""
    try:
        for f in store_files(path):
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)  # dirty pages are not dropped
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    except (OSError, AttributeError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def fill_page_cache(path):
    """Read every data extent of every file (holes of sparse files are skipped)."""
    for f in store_files(path):
        fd = os.open(f, os.O_RDONLY)
        try:
            size, offset = os.fstat(fd).st_size, 0
            while offset < size:
                try:
                    offset = os.lseek(fd, offset, os.SEEK_DATA)
                except OSError:  # ENXIO: no data past offset
                    break
                end = os.lseek(fd, offset, os.SEEK_HOLE)
                while offset < end:
                    offset += len(os.pread(fd, min(8 << 20, end - offset), offset))
        finally:
            os.close(fd)


def rss():
    """(anonymous, file-backed) resident bytes of this process."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("RssAnon", "RssFile", "RssShmem"):
                fields[name] = int(value.split()[0]) * 1024
    return fields["RssAnon"], fields["RssFile"] + fields.get("RssShmem", 0)


def device_read_bytes():
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("read_bytes"))


def new_rows(rng, keys, width):
    """Random records with column 0 = the key, so a read can be checked."""
    rows = rng.random((len(keys), width), np.float32)
    rows[:, 0] = keys
    return rows


def random_keys(rng, records, batch):
    return np.sort(rng.choice(records, batch, replace=False))


def load(store, records, width, rng, chunk=65536):
    """Write keys 0..records-1 in order, sync (and settle); seconds in the store's calls."""
    busy = 0.0
    for lo in range(0, records, chunk):
        keys = np.arange(lo, min(records, lo + chunk))
        rows = new_rows(rng, keys, width)
        start = time.perf_counter()
        store.write(keys, rows)
        busy += time.perf_counter() - start
    start = time.perf_counter()
    store.sync()
    if hasattr(store, "settle"):
        store.settle()
    return busy + time.perf_counter() - start


def warm_reads(store, records, batch, rng, passes, max_seconds):
    """Read batches until `passes` * records keys or max_seconds; the timed part is the read
    call alone. Returns records/s and RSS growth (peak over the phase, sampled per batch)."""
    anon0, file0 = rss()
    peak_anon, peak_file, n, busy = anon0, file0, 0, 0.0
    deadline = time.monotonic() + max_seconds
    while n < passes * records and time.monotonic() < deadline:
        keys = random_keys(rng, records, batch)
        start = time.perf_counter()
        rows = store.read(keys)
        busy += time.perf_counter() - start
        assert np.array_equal(rows[:, 0], keys), "a read returned the wrong rows"
        n += len(keys)
        anon, file = rss()
        peak_anon, peak_file = max(peak_anon, anon), max(peak_file, file)
        del rows
    return {"warm_read_per_s": n / busy, "warm_records_read": n,
            "rss_growth_anon_mb": (peak_anon - anon0) / 1e6,
            "rss_growth_file_mb": (peak_file - file0) / 1e6}


def cold(name, path, width, records, batch, rng, batches, what):
    """Each batch: drop the closed store's files from the page cache, reopen, read or overwrite
    one batch (timed), close. Device bytes read count the timed call only."""
    n, busy, device = 0, 0.0, 0
    for _ in range(batches):
        failed = drop_page_cache(path)
        if failed:
            return {f"cold_{what}_per_s": None, "cold_note": f"page cache not dropped: {failed}"}
        store = open_store(name, path, width, records)
        keys = random_keys(rng, records, batch)
        rows = new_rows(rng, keys, width)
        before, start = device_read_bytes(), time.perf_counter()
        if what == "read":
            rows = store.read(keys)
        else:
            store.write(keys, rows)
        busy += time.perf_counter() - start
        device += device_read_bytes() - before
        assert np.array_equal(rows[:, 0], keys), "a read returned the wrong rows"
        n += len(keys)
        store.close()
    return {f"cold_{what}_per_s": n / busy, f"cold_{what}_device_bytes_per_record": device / n}


def warm_writes(store, records, width, batch, rng, max_seconds):
    """Overwrite random existing keys until `records` keys or max_seconds, then sync."""
    n, busy = 0, 0.0
    deadline = time.monotonic() + max_seconds
    while n < records and time.monotonic() < deadline:
        keys = random_keys(rng, records, batch)
        rows = new_rows(rng, keys, width)
        start = time.perf_counter()
        store.write(keys, rows)
        busy += time.perf_counter() - start
        n += len(keys)
    start = time.perf_counter()
    store.sync()
    sync_s = time.perf_counter() - start
    assert np.array_equal(store.read(keys), rows), "the last write does not read back"
    return {"warm_write_per_s": n / busy, "warm_write_per_s_with_sync": n / (busy + sync_s),
            "final_sync_s": sync_s, "records_written": n}


def kill_batch(b, keys, width):
    """What batch b of the kill test writes: b + 1 everywhere, the key in column 0."""
    rows = np.full((len(keys), width), b + 1, np.float32)
    rows[:, 0] = keys
    return rows


def kill_order(records):
    return np.random.default_rng(1).permutation(records)


def kill_writer(name, path, width, records, batch):
    """The child of the kill test: fresh store, batches of new keys, one ack line each."""
    store = open_store(name, path, width, records)
    order = kill_order(records)
    for b in range(records // batch):
        keys = np.sort(order[b * batch:(b + 1) * batch])
        store.write(keys, kill_batch(b, keys, width))
        print(b, flush=True)
    store.close()


def kill_test(name, path, width, records, batch, acks_before_kill):
    """SIGKILL the writer half a batch after its acks_before_kill-th ack, then check the store."""
    child = subprocess.Popen([sys.executable, __file__, "--kill-writer", name, path, str(width),
                              str(records), str(batch)], stdout=subprocess.PIPE, text=True)
    acked, times = [], []
    try:
        for line in child.stdout:
            acked.append(int(line))
            times.append(time.monotonic())
            if len(acked) == acks_before_kill:
                time.sleep((times[-1] - times[0]) / (len(times) - 1) / 2)
                child.send_signal(signal.SIGKILL)
        # lines already in the pipe are acks too
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
    result = {"batches_acked": len(acked), "killed": child.returncode == -signal.SIGKILL}
    try:
        store = open_store(name, path, width, records)
    except Exception as e:
        return {**result, "opens_after_kill": False, "acked_batches_intact": False,
                "open_error": f"{type(e).__name__}: {e}"}
    order = kill_order(records)
    intact = True
    for b in acked:
        keys = np.sort(order[b * batch:(b + 1) * batch])
        intact &= bool(np.array_equal(store.lookup(keys), kill_batch(b, keys, width)))
    inflight = len(acked)
    keys = np.sort(order[inflight * batch:(inflight + 1) * batch])
    landed = np.all(store.lookup(keys) == kill_batch(inflight, keys, width), axis=1)
    store.close()
    return {**result, "opens_after_kill": True, "acked_batches_intact": intact,
            "inflight_rows_landed": int(landed.sum()), "inflight_rows": len(keys)}


def measure(name, root, dim, records, args):
    width = 2 * dim
    path = os.path.join(root, f"{name}-{dim}")
    rng = np.random.default_rng(0)
    raw = records * width * 4
    result = {"store": name, "dim": dim, "records": records, "record_bytes": width * 4,
              "loadavg_before": os.getloadavg()[0]}  # the machine is shared: say how busy
    store = open_store(name, path, width, records)
    result["load_per_s"] = records / load(store, records, width, rng)
    result["disk_x_raw_loaded"] = disk_bytes(path) / raw
    store.close()
    fill_page_cache(path)
    store = open_store(name, path, width, records)
    result.update(warm_reads(store, records, args.batch, rng, args.read_passes, args.read_seconds))
    store.close()
    if name == "append-segments":
        store = open_store(name, path, width, records, release_pages=False)
        kept = warm_reads(store, records, args.batch, rng, args.read_passes, args.read_seconds)
        store.close()
        result.update({f"{k}_without_madvise": v for k, v in kept.items()})
    for what in ("read", "write"):
        result.update(cold(name, path, width, records, args.batch, rng, args.cold_batches, what))
    fill_page_cache(path)
    store = open_store(name, path, width, records)
    result.update(warm_writes(store, records, width, args.batch, rng, args.write_seconds))
    if hasattr(store, "settle"):
        store.settle()
    store.close()
    result["disk_x_raw_after_writes"] = disk_bytes(path) / raw
    shutil.rmtree(path)
    result.update(kill_test(name, path + "-kill", width, records, args.batch, args.kill_after))
    shutil.rmtree(path + "-kill")
    return result


def machine():
    with open("/proc/cpuinfo") as f:
        cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "?")
    with open("/proc/meminfo") as f:
        mem = int(f.readline().split()[1]) * 1024
    versions = {"python": platform.python_version(), "numpy": np.__version__}
    if lmdb:
        versions["lmdb"] = f"{lmdb.__version__} (LMDB {'.'.join(map(str, lmdb.version()))})"
    if rocksdict:
        from importlib.metadata import version
        versions["rocksdict"] = version("rocksdict")
    return {"cpu": cpu, "cores": os.cpu_count(), "mem_gib": round(mem / 2**30, 1),
            "kernel": platform.release(), "versions": versions}


NOTES = [
    "keys of a batch are unique and sorted; rows come back in key order",
    "read and write rates count the store call only (key generation and checks untimed), "
    "including the conversion to and from the binding's bytes objects",
    "mapped stores use MADV_RANDOM (lmdb: readahead=False); rocksdb opens files with "
    "advise_random (its default)",
    "RSS growth: peak over the warm reads minus RSS before; file-backed RSS counts the pages of "
    "the store's files mapped into the process (they are in the page cache either way)",
    "cold: close, fsync, POSIX_FADV_DONTNEED on every file, reopen (index and metadata reads "
    "of the reopen are untimed); cold_device_bytes_per_record is /proc/self/io read_bytes",
    "warm writes: after reading every file into the page cache; cold writes: as cold reads, "
    "one batch after each drop (a store that updates in place reads the old page first)",
    "writes of lmdb (sync on) are durable on return; the others only after the final sync "
    "(warm_write_per_s_with_sync); append-segments' garbage is never collected here",
    "kill -9: a process crash, not a power loss: page-cache contents survive it",
]


COLUMNS = (  # header, result field, format
    ("store", "store", "{}"), ("dim", "dim", "{}"),
    ("warm rd/s", "warm_read_per_s", "{:,.0f}"), ("cold rd/s", "cold_read_per_s", "{:,.0f}"),
    ("warm wr/s", "warm_write_per_s", "{:,.0f}"),
    ("+sync wr/s", "warm_write_per_s_with_sync", "{:,.0f}"),
    ("cold wr/s", "cold_write_per_s", "{:,.0f}"),
    ("disk/raw", "disk_x_raw_loaded", "{:.2f}"), ("after wr", "disk_x_raw_after_writes", "{:.2f}"),
    ("RSS file MB", "rss_growth_file_mb", "{:,.0f}"), ("RSS anon MB", "rss_growth_anon_mb", "{:,.0f}"),
    ("acked ok", "acked_batches_intact", "{}"), ("opens", "opens_after_kill", "{}"),
)


def table(results):
    rows = [[head for head, _, _ in COLUMNS]]
    rows += [["n/a" if r.get(field) is None else form.format(r[field])
              for _, field, form in COLUMNS] for r in results]
    return "\n".join(f"{row[0]:<16}" + "".join(f"{c:>12}" for c in row[1:]) for row in rows)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--kill-writer":
        name, path, width, records, batch = sys.argv[2:7]
        return kill_writer(name, path, int(width), int(records), int(batch))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stores", default=",".join(CANDIDATES), help="comma-separated candidates")
    p.add_argument("--dims", default="64,128")
    p.add_argument("--records", type=int, default=None,
                   help="records per store (default: 2,000,000 at dim 64, the same 1 GiB at others)")
    p.add_argument("--batch", type=int, default=16384)
    p.add_argument("--read-passes", type=float, default=1.0, help="warm reads: keys read / records")
    p.add_argument("--read-seconds", type=float, default=10.0, help="warm reads: at most this long")
    p.add_argument("--cold-batches", type=int, default=3)
    p.add_argument("--write-seconds", type=float, default=5.0)
    p.add_argument("--kill-after", type=int, default=8, help="acks before the SIGKILL")
    p.add_argument("--dir", default="/var/tmp", help="scratch directory (on the disk measured)")
    args = p.parse_args()
    names = args.stores.split(",")
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown:
        p.error(f"unknown stores {unknown}; expected some of {list(CANDIDATES)}")
    skipped = {n: f"package {CANDIDATES[n][2]} not installed"
               for n in names if CANDIDATES[n][2] in MISSING}
    results = []
    root = tempfile.mkdtemp(prefix="disk_stores-", dir=args.dir)
    try:
        for dim in map(int, args.dims.split(",")):
            records = args.records or 2_000_000 * 64 // dim
            for name in names:
                if name in skipped:
                    continue
                print(f"{name} dim {dim}: {records:,} records", file=sys.stderr, flush=True)
                start = time.monotonic()
                results.append(measure(name, root, dim, records, args))
                results[-1]["seconds"] = round(time.monotonic() - start, 1)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    settings = {k: v for k, v in vars(args).items() if k != "stores"}
    print(json.dumps({"machine": machine(), "settings": settings, "skipped": skipped,
                      "notes": NOTES, "results": results}, indent=1))
    print(table(results), file=sys.stderr)


if __name__ == "__main__":
    main()
