"""Storage that grows in chunks: rows of a fixed width, addressed by slot, never copied to grow.

A dynamic table does not know how many rows it will hold. Doubling one tensor would copy every
row on each growth and hold both copies meanwhile; here a new chunk is added instead, as large
as everything before it (``first`` rows at least), so a table of ``n`` rows has about
``log2(n / first)`` chunks and nothing is ever copied. A chunk is taken with ``torch.empty``,
which touches no page: its pages become resident as slots are written, and slots are handed out
from the lowest (:class:`het.ps.server.store.dynamic.DynamicRows`), so resident memory follows the slots in
use, not the capacity reserved (``nbytes`` counts the slots in use). Reads and writes group the
slots by chunk, then one ``index_select`` / ``index_copy_`` per chunk touched.
"""

from __future__ import annotations

import numpy as np
import torch

from het import native

FIRST = 1 << 18


class Chunks:
    """Slots ``0 .. capacity - 1`` of rows ``(width,)`` of ``dtype``.

    Example:
        >>> c = Chunks(2, torch.float32, first=4)
        >>> c.grow_to(10); c.capacity, len(c.parts)
        (16, 3)
        >>> c.scatter(torch.tensor([9, 0]), torch.tensor([[1., 2.], [3., 4.]]))
        >>> c.gather(torch.tensor([0, 9])).tolist()
        [[3.0, 4.0], [1.0, 2.0]]
    """

    def __init__(self, width: int, dtype: torch.dtype, first: int = FIRST, fixed: bool = False):
        self.width, self.dtype, self.first, self.fixed = width, dtype, first, fixed  # fixed: every chunk ``first`` rows
        self.parts: list[torch.Tensor] = []
        self.starts = torch.zeros(0, dtype=torch.int64)
        self.capacity = 0

    def nbytes(self, used: int) -> int:
        """Bytes of slots ``0 .. used - 1`` (the reserve past them is not resident)."""
        return used * self.width * torch.empty(0, dtype=self.dtype).element_size()

    def grow_to(self, rows: int) -> None:
        """Make room for slots up to ``rows - 1``."""
        while self.capacity < rows:
            size = self.first if self.fixed else max(self.first, self.capacity)
            self.parts.append(torch.empty(size, self.width, dtype=self.dtype))
            self.starts = torch.cat([self.starts, torch.tensor([self.capacity])])
            self.capacity += size

    def widen(self, dtype: torch.dtype) -> None:
        """Hold every slot in ``dtype`` (a wider one) from here on; the slots keep their values."""
        self.parts = [p.to(dtype) for p in self.parts]
        self.dtype = dtype

    def truncate(self, rows: int) -> None:
        """Free the chunks that hold only slots ``rows`` and past (their memory goes back)."""
        while self.parts and int(self.starts[-1]) >= rows:
            self.capacity = int(self.starts[-1])
            self.parts.pop()
            self.starts = self.starts[:-1]

    def _groups(self, slots: torch.Tensor):
        """(chunk, positions in ``slots`` or None for all, slots within the chunk) per chunk touched."""
        low, high = torch.aminmax(slots)
        if int(low) < 0 or int(high) >= self.capacity:
            bad = int(low) if int(low) < 0 else int(high)
            raise IndexError(f"slot {bad} out of range [0, {self.capacity})")
        if len(self.parts) == 1:
            yield self.parts[0], None, slots
            return
        slots = slots.contiguous()  # a column of a (n, 2) tensor, often
        chunk = torch.searchsorted(self.starts, slots, right=True) - 1
        for c, part in enumerate(self.parts):
            pos = (chunk == c).nonzero().flatten()
            if len(pos) == len(slots):
                yield part, None, slots - int(self.starts[c])
            elif len(pos):
                yield part, pos, slots.index_select(0, pos) - int(self.starts[c])

    def gather(self, slots: torch.Tensor, missing: bool = False, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rows at ``slots``; with ``missing``, a slot of -1 (a key not stored) gives a row of
        zeros; into ``out`` where given (a reused buffer). Shape: (n,) -> (n, width)."""
        if not len(slots):
            return torch.empty(0, self.width, dtype=self.dtype)
        if self._native:  # one pass, the chunk of a slot by bit arithmetic, rows ahead prefetched
            out = torch.empty(len(slots), self.width, dtype=self.dtype) if out is None else out
            native.ops.chunk_gather(self.parts, self._bits, self.fixed, slots.contiguous(), out, missing)
            return out
        if out is not None:
            out[:] = self.gather(slots, missing)
            return out
        if missing:
            out = torch.zeros(len(slots), self.width, dtype=self.dtype)
            held = (slots >= 0).nonzero().flatten()
            if len(held):
                out[held] = self.gather(slots[held])
            return out
        # numpy's take and fancy assignment copy whole rows at a time: about twice as fast here
        # as torch's index_select / index_copy_ on CPU tensors (a shard's storage is on the CPU)
        if self.dtype == torch.bfloat16:  # numpy has no bfloat16: torch's ops
            out = torch.empty(len(slots), self.width, dtype=self.dtype)
            for part, pos, local in self._groups(slots):
                rows = part.index_select(0, local)
                if pos is None:
                    return rows
                out[pos] = rows
            return out
        out = None
        for part, pos, local in self._groups(slots):
            rows = part.numpy().take(local.numpy(), axis=0)
            if pos is None:
                return torch.from_numpy(rows)
            if out is None:
                out = np.empty((len(slots), self.width), dtype=rows.dtype)
            out[pos.numpy()] = rows
        return torch.from_numpy(out)

    def scatter(self, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """Write ``rows`` at ``slots`` (unique). Shape: (n,), (n, width)."""
        if not len(slots):
            return
        if self._native:
            native.ops.chunk_scatter(self.parts, self._bits, self.fixed, slots.contiguous(),
                                     rows.to(self.dtype).contiguous())
            return
        rows = rows.to(self.dtype)
        if self.dtype == torch.bfloat16:
            for part, pos, local in self._groups(slots):
                part.index_copy_(0, local, rows if pos is None else rows[pos])
            return
        values = rows.numpy()
        for part, pos, local in self._groups(slots):
            part.numpy()[local.numpy()] = values if pos is None else values[pos.numpy()]

    @property
    def _native(self) -> bool:
        """Whether reads and writes take the native pass (het.native built, chunks of 2^k slots)."""
        return native.ops is not None and self.parts and self.first & (self.first - 1) == 0

    @property
    def _bits(self) -> int:
        return self.first.bit_length() - 1

    def column(self, col: int, rows: int) -> torch.Tensor:
        """Column ``col`` of slots ``0 .. rows - 1``, as one tensor (a copy). Shape: (rows,)."""
        return torch.cat([p[:, col] for p in self.parts])[:rows] if self.parts else torch.empty(0, dtype=self.dtype)
