"""Where a dynamic table's rows live under a memory budget: the hot ones in memory, the others
on disk.

:class:`TieredRows` and :class:`het.ps.server.store.records.MemoryRows` (all in memory) keep a slot's
row and optimizer state together (a record ``[weight | state]``) and answer the same calls, so
:class:`het.ps.server.store.dynamic.DynamicRows` does not know which it has.

:class:`TieredRows`, for a shard with a memory budget (``het serve --memory``):

- **DRAM tier**: a pool of positions holding records, as many as the shard's budget leaves
  room for (:meth:`set_capacity`); per slot its position (-1: not in memory) and its record on
  disk (-1: none, or stale: the row in memory is newer). The index and the clocks stay in DRAM
  (:class:`het.ps.server.store.dynamic.DynamicRows`).
- **Disk tier**: append-only segment files (:class:`het.ps.server.store.disk.Segments`).
- **Moves**: a row read or written comes into memory; when the pool is full the least recently
  used rows (``lru``) or the least used since they came in (``lfu``) leave, 1/16 of the pool at
  a time so that choosing victims is paid rarely. A row leaving is written to disk unless its
  record there is current (it was only read). A batch larger than the pool is served too: the
  rows that do not fit are read from disk, or written there, directly.
- **Garbage**: past as many dead records as live ones, the segments with the most garbage are
  rewritten (:meth:`compact`).
"""

from __future__ import annotations

import os
from collections import Counter

import numpy as np
import torch

from het import files
from het.choices import POLICIES
from het.ps.server.store.chunks import Chunks
from het.ps.server.store.disk import SEGMENT_BYTES, Segments, read_saved

POS, REC = 0, 1  # the columns of a slot's place: position in memory, record on disk
NARROW = torch.iinfo(torch.int32).max  # places held in int32 up to this
BLOCK = 1 << 13  # pool positions per chunk: the pool grows and shrinks by whole chunks
SHRINK_SLACK = 32  # a pool that must shrink goes 1/32 below, so that small shrinks to come cost nothing
EVICT_SHARE = 16  # room made at once: what the batch needs plus 1/16 of the pool
WRITE_RECORDS = 1 << 14  # records gathered and written to disk at once when rows leave the pool
COMPACT_RECORDS = 1 << 15  # live records a request's compaction moves at most, WRITE_RECORDS at a time: ~0.5 s of cold reads


class TieredRows:
    """Records by slot: the hot ones in a pool of ``capacity`` positions, the others on disk
    under ``directory``.

    Example:
        >>> import tempfile
        >>> t = TieredRows(dim=2, state_width=0, directory=tempfile.mkdtemp(), capacity=2)
        >>> t.grow_to(3)
        >>> t.scatter(torch.arange(3), torch.arange(6.).reshape(3, 2), None)  # 3 rows, room for 2
        >>> t.stats(3)["rows_in_memory"], t.stats(3)["rows_on_disk"]
        (2, 1)
        >>> t.gather_weight(torch.tensor([2, 0])).tolist()
        [[4.0, 5.0], [0.0, 1.0]]
        >>> t.close()
    """

    def __init__(self, dim: int, state_width: int, directory: str, capacity: int = 0, policy: str = "lru",
                 segment_bytes: int = SEGMENT_BYTES):
        if policy not in POLICIES:
            raise ValueError(f"memory policy must be one of {POLICIES}, got {policy!r}")
        self.dim, self.width, self.policy = dim, dim + state_width, policy
        self.place = Chunks(2, torch.int32)  # per slot: POS, REC; 64-bit once a record number outgrows 32
        self.pool = Chunks(self.width, torch.float32, first=BLOCK, fixed=True)
        self.slot_of = torch.empty(0, dtype=torch.int64)  # per position: its slot (-1: free)
        self.score = torch.empty(0, dtype=torch.int64)  # per position: last use (lru) or uses (lfu)
        self.free = torch.empty(0, dtype=torch.int64)  # free positions below ``high``
        self.high = 0  # positions handed out at least once since the pool last shrank
        self.capacity = capacity
        self.tick = 0
        self.slots = 0
        self.disk = Segments(directory, self.width, segment_bytes)
        self.counters = Counter(evicted_to_disk=0, paged_in=0, compactions=0)

    # -- the store's calls ------------------------------------------------------------------
    def grow_to(self, slots: int) -> None:
        if slots > self.slots:
            self.place.grow_to(slots)
            new = torch.arange(self.slots, slots)
            self._set_place(new, torch.full((len(new), 2), -1, dtype=torch.int64))
            self.slots = slots

    def gather_weight(self, slots: torch.Tensor) -> torch.Tensor:
        return self._records(slots)[:, :self.dim].contiguous()

    def gather(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        records = self._records(slots)
        return records[:, :self.dim], records[:, self.dim:] if self.width > self.dim else None

    def gather_state(self, slots: torch.Tensor) -> torch.Tensor:
        return self._records(slots)[:, self.dim:].contiguous()

    def scatter(self, slots: torch.Tensor, weight: torch.Tensor, state: torch.Tensor | None) -> None:
        """Write the rows of ``slots`` (unique): their records on disk are stale from now."""
        records = weight if state is None else torch.cat([weight, state], 1)
        place = self._place(slots)
        stale = place[:, REC] >= 0
        self.disk.kill(place[stale, REC])
        place[:, REC] = -1
        hot = (place[:, POS] >= 0).nonzero().flatten()
        if len(hot):
            self.pool.scatter(place[hot, POS], records[hot])
            self._touch(place[hot, POS])
        self._set_place(slots, place)
        cold = (place[:, POS] < 0).nonzero().flatten()
        if len(cold):
            self._bring_in(slots[cold], records[cold], place[cold, REC], pinned=place[hot, POS])
        self._compact_if_sparse()

    def release(self, slots: torch.Tensor) -> None:
        """Forget the rows of ``slots``: their positions and records are free."""
        place = self._place(slots)
        pos = place[place[:, POS] >= 0, POS]
        self.slot_of[pos] = -1
        self.free = torch.cat([self.free, pos])
        self.disk.kill(place[place[:, REC] >= 0, REC])
        self._set_place(slots, torch.full_like(place, -1))

    def pageable(self, slots: torch.Tensor) -> torch.Tensor:
        """The rows :meth:`page_in` may bring in: any of ``slots`` may be on disk."""
        return slots

    def page_in(self, slots: torch.Tensor) -> int:
        """Bring the rows of ``slots`` on disk into memory (ahead of a request that needs them);
        how many came."""
        slots = torch.unique(slots)
        place = self._place(slots)
        cold = ((place[:, POS] < 0) & (place[:, REC] >= 0)).nonzero().flatten()
        if len(cold):
            records = torch.from_numpy(self.disk.read(place[cold, REC]))
            self._bring_in(slots[cold], records, place[cold, REC], pinned=place[place[:, POS] >= 0, POS])
            self.counters["paged_in"] += len(cold)
        return len(cold)

    def set_capacity(self, rows: int) -> None:
        """Hold at most ``rows`` records in memory from now on. A pool that must shrink goes a
        little lower; one may grow once there is room for 1/16 more."""
        rows = max(0, rows)
        if rows > self.capacity + rows // 16:
            self.capacity = rows
        if rows >= self.capacity:
            return
        self.capacity = rows = rows - rows // SHRINK_SLACK
        in_use = (self.slot_of[rows:self.high] >= 0).nonzero().flatten() + rows
        self._evict_positions(in_use)  # those past the new end
        over = self.in_memory - rows
        if over > 0:
            self._evict(over, pinned=torch.empty(0, dtype=torch.int64))
        self.free = self.free[self.free < rows]
        self.high = min(self.high, rows)
        self.slot_of, self.score = self.slot_of[:self.high], self.score[:self.high]
        self.pool.truncate(rows)

    @property
    def in_memory(self) -> int:
        return self.high - len(self.free)

    def nbytes(self, used: int) -> int:
        """DRAM held: the slots' places, the pool (positions handed out), its per-position
        arrays and the owners of the records of the segment being written."""
        return self.fixed_bytes(used) + (4 * self.width + 16) * self.high

    def fixed_bytes(self, used: int) -> int:
        """DRAM held besides the pool's positions: the slots' places, free positions, the open segment's owners."""
        return self.place.nbytes(used) + 8 * len(self.free) + self.disk.memory_bytes

    def position_bytes(self) -> int:
        """DRAM one more position in the pool costs."""
        return 4 * self.width + 16

    def stats(self, rows: int) -> dict:
        return {"rows_in_memory": self.in_memory, "rows_on_disk": rows - self.in_memory,
                "disk_bytes": self.disk.nbytes, "disk_reads": self.disk.reads, "disk_writes": self.disk.writes,
                "memory_capacity_rows": self.capacity, **self.counters}

    def close(self) -> None:
        self.disk.close()

    def discard(self) -> None:
        """Close the disk tier and remove its files (a save holds its own links to them)."""
        self.close()
        for name in os.listdir(self.disk.directory):
            os.unlink(os.path.join(self.disk.directory, name))

    # -- moving rows ------------------------------------------------------------------------
    def _place(self, slots: torch.Tensor) -> torch.Tensor:
        """The places of ``slots`` as int64. Shape: (n,) -> (n, 2)."""
        return self.place.gather(slots).long()

    def _set_place(self, slots: torch.Tensor, place: torch.Tensor) -> None:
        """Set the places of ``slots``; the whole column pair widens to 64 bits, once, when a
        value outgrows 32 (a disk tier past 2^31 records: a terabyte of rows on one shard)."""
        if self.place.dtype == torch.int32 and len(place) and int(place.max()) > NARROW:
            self.place.widen(torch.int64)
        self.place.scatter(slots, place.to(self.place.dtype))

    def _records(self, slots: torch.Tensor) -> torch.Tensor:
        """The records of ``slots`` (stored ones); those on disk come into memory."""
        place = self._place(slots)
        hot = place[:, POS] >= 0
        if bool(hot.all()):
            self._touch(place[:, POS])
            return self.pool.gather(place[:, POS])
        out = torch.empty(len(slots), self.width)
        h, c = hot.nonzero().flatten(), (~hot).nonzero().flatten()
        if len(h):
            out[h] = self.pool.gather(place[h, POS])
            self._touch(place[h, POS])
        cold, inverse = torch.unique(slots[c], return_inverse=True)  # a pull may name a key twice
        records = torch.empty(len(cold), dtype=torch.int64).scatter_(0, inverse, place[c, REC])
        rows = torch.from_numpy(self.disk.read(records))
        out[c] = rows[inverse]
        self._bring_in(cold, rows, records, pinned=place[h, POS])
        return out

    def _bring_in(self, slots, records, disk_records, pinned) -> None:
        """Put ``records`` of ``slots`` (not in memory) into the pool, making room; what does
        not fit stays on disk, written there if it has no current record."""
        room = self.capacity - self.in_memory
        if room < len(slots):
            self._evict(len(slots) - room + self.capacity // EVICT_SHARE, pinned)
            room = self.capacity - self.in_memory
        fit = min(len(slots), max(room, 0))
        if fit:
            pos = self._positions(fit)
            self.pool.scatter(pos, records[:fit])
            self.slot_of[pos] = slots[:fit]
            self.score[pos] = self.tick if self.policy == "lru" else 1
            self._set_place(slots[:fit], torch.stack([pos, disk_records[:fit]], 1))
        if fit < len(slots):
            rest, recs = slots[fit:], disk_records[fit:]
            unwritten = (recs < 0).nonzero().flatten()
            if len(unwritten):
                new = self.disk.append(records[fit:][unwritten].numpy(), rest[unwritten])
                self._set_place(rest[unwritten], torch.stack([torch.full_like(new, -1), new], 1))

    def _positions(self, n: int) -> torch.Tensor:
        reused = self.free[len(self.free) - min(n, len(self.free)):]
        self.free = self.free[:len(self.free) - len(reused)]
        fresh = torch.arange(self.high, self.high + n - len(reused))
        if len(fresh):
            self.high += len(fresh)
            self.pool.grow_to(self.high)
            grow = self.high - len(self.slot_of)
            if grow > 0:
                self.slot_of = torch.cat([self.slot_of, torch.full((grow,), -1, dtype=torch.int64)])
                self.score = torch.cat([self.score, torch.zeros(grow, dtype=torch.int64)])
        return torch.cat([reused, fresh])

    def _touch(self, pos: torch.Tensor) -> None:
        self.tick += 1
        if self.policy == "lru":
            self.score[pos] = self.tick
        else:
            self.score[pos] += 1

    def _evict(self, n: int, pinned: torch.Tensor) -> None:
        """Move the ``n`` coldest rows in memory, except those at ``pinned``, to disk."""
        score = self.score[:self.high].clone()
        score[self.slot_of[:self.high] < 0] = torch.iinfo(torch.int64).max  # free: never chosen
        score[pinned] = torch.iinfo(torch.int64).max
        n = min(n, self.in_memory - len(pinned))
        if n > 0:
            self._evict_positions(torch.topk(score, n, largest=False).indices)

    def _evict_positions(self, pos: torch.Tensor) -> None:
        if not len(pos):
            return
        slots = self.slot_of[pos]
        place = self._place(slots)
        unwritten = (place[:, REC] < 0).nonzero().flatten()  # changed since read: written now
        for part in unwritten.split(WRITE_RECORDS):  # a batch at a time: the scratch stays small
            place[part, REC] = self.disk.append(self.pool.gather(pos[part]).numpy(), slots[part])
        place[:, POS] = -1
        self._set_place(slots, place)
        self.slot_of[pos] = -1
        self.free = torch.cat([self.free, pos])
        self.counters["evicted_to_disk"] += len(pos)

    def _compact_if_sparse(self) -> None:
        if self.disk.dead > max(self.disk.live, self.disk.per_segment):
            try:
                self.compact(COMPACT_RECORDS)
            except files.DamagedFile:  # a segment left as it is: its damaged record is refused when read
                self.counters["compactions_stopped"] += 1

    def compact(self, most: int | None = None) -> None:
        """Move the live records of the segments with the most garbage to the end of the tier,
        :data:`WRITE_RECORDS` at a time, until about half the garbage is gone or ``most`` were
        moved (None: no bound), and drop each segment left with none. A row in memory whose
        record is there loses it instead (it is written when it leaves). Bounded, as it runs
        inside a request: in time (a 42M-row tier's garbage is millions of records, minutes of
        cold reads in which a job would take the shard for dead) and in memory (a whole
        segment's live records at once are hundreds of MB of scratch past the budget); a
        segment left part moved is taken up again by the next requests."""
        moved = 0
        for seg in self.disk.sparse_segments(self.disk.dead // 2):
            records, slots = self.disk.owned_records(seg)
            live = (self._place(slots)[:, REC] == records).nonzero().flatten()  # its owner's place names it
            records, slots = records[live], slots[live]
            for part in torch.arange(len(records)).split(WRITE_RECORDS):
                if most is not None and moved >= most:
                    break
                place = self._place(slots[part])
                hot = place[:, POS] >= 0
                place[hot, REC] = -1
                cold = (~hot).nonzero().flatten()
                if len(cold):
                    place[cold, REC] = self.disk.append(self.disk.read(records[part][cold]), slots[part][cold])
                self.disk.kill(records[part])
                self._set_place(slots[part], place)
                moved += len(part)
            if self.disk.files[seg].live == 0:
                self.disk.drop(seg)
            if most is not None and moved >= most:
                break
        self.counters["compactions"] += 1

    # -- persistence ------------------------------------------------------------------------
    def flush(self) -> None:
        """Write every row in memory without a current record to disk (they stay in memory)."""
        pos = (self.slot_of[:self.high] >= 0).nonzero().flatten()
        slots = self.slot_of[pos]
        place = self._place(slots)
        unwritten = (place[:, REC] < 0).nonzero().flatten()
        if len(unwritten):
            rows = self.pool.gather(pos[unwritten])
            place[unwritten, REC] = self.disk.append(rows.numpy(), slots[unwritten])
            self._set_place(slots, place)

    def save(self, slots: torch.Tensor, directory: str) -> dict:
        """Link the disk tier into ``directory``, every row in memory written first; what a save
        holds to find the rows of ``slots`` there again (:meth:`load`)."""
        self.flush()
        return {"records": self._place(slots)[:, REC].clone(), "segments": self.disk.link_into(directory),
                "per_segment": self.disk.per_segment, "width": self.width, "checks": True}

    def load(self, slots: torch.Tensor, saved: dict, directory: str) -> None:
        """Take the rows of ``slots`` from a save's disk tier (:meth:`save`): its segment files
        linked in as they are when their layout is this one's, read and written otherwise (the
        save's records were checked before: :func:`het.ps.server.store.disk.check_saved`)."""
        records = saved["records"]
        layout = (saved["per_segment"], saved["width"], bool(saved.get("checks")))
        if layout != (self.disk.per_segment, self.width, True):
            for part in torch.arange(len(slots)).split(1 << 20):
                rows = torch.from_numpy(read_saved(directory, saved, records[part]))
                self.scatter(slots[part], rows[:, :self.dim], rows[:, self.dim:] if self.width > self.dim else None)
            return
        per = self.disk.per_segment
        seg, off = records // per, records % per
        new = torch.empty_like(records)
        for s, name in saved["segments"].items():
            mine = (seg == s).nonzero().flatten()
            owners = np.full(int(off[mine].max()) + 1 if len(mine) else 0, -1, dtype=np.int32)
            owners[off[mine].numpy()] = slots[mine].numpy()
            new[mine] = self.disk.adopt(os.path.join(directory, name), owners) * per + off[mine]
        self._set_place(slots, torch.stack([torch.full_like(new, -1), new], 1))

    def peek(self, slots: torch.Tensor) -> torch.Tensor:
        """The records of ``slots``, none of them moved. Shape: (n,) -> (n, width)."""
        place = self._place(slots)
        out = torch.empty(len(slots), self.width)
        hot = place[:, POS] >= 0
        out[hot] = self.pool.gather(place[hot, POS])
        out[~hot] = torch.from_numpy(self.disk.read(place[~hot, REC]))
        return out
