"""Random reads of 516-byte records (a dim-64 Adagrad row and its check) from a file the page
cache does not hold: through a read-only map, as ``numpy.take`` does, and by ``os.pread`` from 1,
4, 16 and 32 threads (het's disk tier reads with 16, het/native/records.cpp). Prints records/s.
Needs root (it drops the page cache before each way); writes a 2 GiB file under ``--dir`` and
removes it. ``python docs/scripts/tier_reads.py [--dir /tmp] [--records 20000]``."""

import argparse
import mmap
import os
import threading
import time

import numpy as np

RECORD = 516


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--dir", default="/tmp")
    p.add_argument("--records", type=int, default=20000)
    p.add_argument("--gib", type=int, default=2)
    args = p.parse_args()
    path, size = os.path.join(args.dir, "tier_reads.rows"), args.gib << 30
    with open(path, "wb") as f:
        block = os.urandom(1 << 20) * 64
        for _ in range(size // len(block)):
            f.write(block)
    fd = os.open(path, os.O_RDONLY)
    try:
        rng = np.random.default_rng(0)
        n = size // RECORD

        def offsets():
            return np.sort(rng.integers(0, n, args.records)) * RECORD

        drop_caches()
        o = offsets()
        m = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        m.madvise(mmap.MADV_RANDOM)
        t0 = time.perf_counter()
        np.frombuffer(m, dtype=np.uint8)[o[:, None] + np.arange(RECORD)[None, :]]
        print(f"map: {args.records / (time.perf_counter() - t0):,.0f} records/s")
        m.close()
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        for threads in (1, 4, 16, 32):
            drop_caches()
            parts = np.array_split(offsets(), threads)

            def work(part):
                for off in part:
                    os.pread(fd, RECORD, int(off))

            t0 = time.perf_counter()
            pool = [threading.Thread(target=work, args=(part,)) for part in parts]
            for t in pool:
                t.start()
            for t in pool:
                t.join()
            print(f"pread x{threads}: {args.records / (time.perf_counter() - t0):,.0f} records/s")
    finally:
        os.close(fd)
        os.unlink(path)


if __name__ == "__main__":
    main()
