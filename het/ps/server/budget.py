"""A shard's memory budget (``ShardConfig.memory``, ``het train --shard-memory``): what it gives each
table's DRAM pool, and the allocator kept to it.

What every table holds whatever its pool's size (fixed tables, indexes, clocks, sketches) comes
first; then the scratch of the largest push applied, about :data:`SCRATCH_RECORDS` records a key
(measured: ``python docs/scripts/push_scratch.py``), at most half of what is left, so the pools
never shrink to nothing for it; the pools share the rest equally. glibc keeps the pages a
request's freed scratch held, in every thread's arena: left alone, a shard's RSS grows past its
account by gigabytes, so once the process holds more than the budget past what it held at start,
they are handed back (``malloc_trim``).
"""

from __future__ import annotations

from collections import Counter

from het.process import release_freed_memory, rss_bytes

# a push's scratch in records (a row and its optimizer state) a key: the arrays as they arrived,
# the rows and state gathered, the optimizer's temporaries, the records written and those
# evicted for them (measured 5-10)
SCRATCH_RECORDS = 10


class Budget:
    """``memory`` bytes for ``tables`` (name -> RowStore); ``stats`` counts ``memory_trims``."""

    def __init__(self, memory: int, stats: Counter):
        self.memory, self.stats = memory, stats
        self.scratch_keys = 0  # the most keys a push applied carried
        self.floor = self.trimmed_at = rss_bytes()

    def started(self) -> None:
        """The shard holds its tables: what the process holds now is besides the budget."""
        self.floor = self.trimmed_at = rss_bytes()

    def fit(self, tables: dict, pushed_keys: int = 0) -> None:
        """Size the pools after a push of ``pushed_keys`` keys (or a load)."""
        self.scratch_keys = max(self.scratch_keys, pushed_keys)
        use = {name: t.dram_bytes() for name, t in tables.items()}
        pooled = [name for name, (_, row_bytes) in use.items() if row_bytes]
        if not pooled:
            return
        left = max(0, self.memory - sum(held for held, _ in use.values()))
        scratch = self.scratch_keys * max(row_bytes for _, row_bytes in use.values()) * SCRATCH_RECORDS
        share = (left - min(scratch, left // 2)) // len(pooled)
        for name in pooled:
            tables[name].size_pool(share // use[name][1])

    def keep(self) -> None:
        """After a request: trim once the process holds more than the budget past its start, and
        a sixteenth of the budget past what the last trim left (a trim costs milliseconds)."""
        if rss_bytes() > max(self.floor + self.memory, self.trimmed_at + self.memory // 16):
            release_freed_memory()
            self.trimmed_at = rss_bytes()
            self.stats["memory_trims"] += 1
