"""Where a dynamic table's rows live without a memory budget: every record in memory.

:class:`MemoryRows` answers the calls :class:`het.ps.server.store.tiers.TieredRows` answers (a record
is a slot's ``[weight | state]``), so :class:`het.ps.server.store.dynamic.DynamicRows` does not know
which it has; those about a DRAM pool and a disk tier have nothing to do here.
"""

from __future__ import annotations

import torch

from het.ps.server.store.chunks import Chunks
from het.ps.server.store.disk import read_saved


class MemoryRows:
    """Every record in memory (a shard without a budget): rows (float32, or stored in half and
    read as float32) and state by slot."""

    def __init__(self, dim: int, state_width: int, dtype: torch.dtype = torch.float32):
        self.dim = dim
        self.weight = Chunks(dim, dtype)
        self.state = Chunks(state_width, torch.float32) if state_width else None

    def grow_to(self, slots: int) -> None:
        for c in (self.weight, self.state):
            if c is not None:
                c.grow_to(slots)

    def gather_weight(self, slots: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The rows of ``slots`` as float32 (into ``out``, float32 rows only)."""
        if self.weight.dtype != torch.float32:
            return self.weight.gather(slots).float()
        return self.weight.gather(slots, out=out)

    def gather(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.gather_weight(slots), self.state.gather(slots) if self.state is not None else None

    def gather_state(self, slots: torch.Tensor) -> torch.Tensor:
        return self.state.gather(slots)

    def scatter(self, slots: torch.Tensor, weight: torch.Tensor, state: torch.Tensor | None) -> None:
        self.weight.scatter(slots, weight)
        if self.state is not None:
            self.state.scatter(slots, state)

    def release(self, slots: torch.Tensor) -> None:
        pass

    def pageable(self, slots: torch.Tensor) -> None:
        return None  # nothing on disk

    def page_in(self, slots: torch.Tensor) -> int:
        return 0

    def nbytes(self, used: int) -> int:
        return sum(c.nbytes(used) for c in (self.weight, self.state) if c is not None)

    def fixed_bytes(self, used: int) -> int:
        return self.nbytes(used)

    def position_bytes(self) -> int:
        return 0  # no pool: every row is held

    def set_capacity(self, rows: int) -> None:
        pass

    def peek(self, slots: torch.Tensor) -> torch.Tensor:
        """The records of ``slots``. Shape: (n,) -> (n, dim + state_width)."""
        return torch.cat([r for r in self.gather(slots) if r is not None], 1)

    def save(self, slots: torch.Tensor, directory: str) -> None:
        return None  # no files: a save holds the records themselves

    def load(self, slots: torch.Tensor, saved: dict, directory: str) -> None:
        """Take the rows of ``slots`` from a save's disk tier (:meth:`TieredRows.save`), read in
        parts."""
        for part in torch.arange(len(slots)).split(1 << 20):
            records = torch.from_numpy(read_saved(directory, saved, saved["records"][part]))
            self.scatter(slots[part], records[:, :self.dim], records[:, self.dim:])

    def discard(self) -> None:
        pass

    def stats(self, rows: int) -> dict:
        return {"rows_in_memory": rows, "rows_on_disk": 0, "disk_bytes": 0, "disk_reads": 0, "disk_writes": 0}
