"""An export's embedding tables: written from a checkpoint a piece at a time, read back as
memory maps.

A fixed table's rows are stored by key (row ``k`` is key ``k``); a dynamic table's stored rows
in the order of its key index (:mod:`het.export.index`), and a key it never stored (not
admitted, expired, never trained) reads as training reads it: its seeded initial row
(:func:`het.ps.protocol.initial.initial_rows`; decayed to the checkpoint's step where the rows decay,
:mod:`het.decay`), computed when asked, never stored.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import torch

from het.config import TableConfig
from het.decay import RowDecay
from het.export import index as key_index
from het.export import rows as row_codec
from het.export.source import Checkpoint
from het.ps.protocol.initial import initial_rows


def write(ckpt: Checkpoint, name: str, directory: str, dtype: str, progress=None) -> dict:
    """Write table ``name`` of ``ckpt`` under ``directory`` (created) in ``dtype``; its manifest
    entry. Memory: one piece of rows, and for a dynamic table its keys (about 32 bytes each)."""
    cfg = ckpt.tables[name]
    os.makedirs(directory)
    n = ckpt.stored_rows(name)
    values = _create(os.path.join(directory, "rows.npy"), row_codec.STORED[dtype], (n, cfg.dim))
    qparams = _create(os.path.join(directory, "qparams.npy"), np.float16, (n, 2)) if dtype == "int8" else None
    place = _placer(ckpt, name, directory) if cfg.dynamic else None
    done = 0
    for keys, rows in ckpt.table_pieces(name):
        at = keys if place is None else place(keys, done)
        v, q = row_codec.encode(rows, dtype)
        values[at] = v
        if qparams is not None:
            qparams[at] = q
        done += len(keys)
        if progress is not None:
            progress(len(keys))
    if done != n:
        raise ValueError(f"table {name!r}: the checkpoint's shards gave {done} rows, expected {n}")
    for array in (values, qparams):
        if array is not None:
            array.flush()
    return {"config": cfg.to_dict(), "rows": n, "dtype": dtype, "dynamic": cfg.dynamic,
            "bytes": values.nbytes + (qparams.nbytes if qparams is not None else 0),
            **({"decayed_to": ckpt.step} if cfg.optimizer.decays else {})}


def _placer(ckpt: Checkpoint, name: str, directory: str):
    """For a dynamic table: build and write its key index; the function placing each piece's
    rows (their positions in the index's order, checked against their keys)."""
    keys = ckpt.stored_keys(name)
    hashes, directory_, order = key_index.build(keys)
    np.save(os.path.join(directory, "hashes.npy"), hashes)
    np.save(os.path.join(directory, "directory.npy"), directory_)
    where = np.empty(len(order), np.int64)
    where[order] = np.arange(len(order))
    del keys, order

    def place(piece_keys: np.ndarray, start: int) -> np.ndarray:
        at = where[start:start + len(piece_keys)]
        if not np.array_equal(hashes[at], key_index.key_hashes(piece_keys)):
            raise ValueError(f"table {name!r}: the checkpoint's rows came in another order than its keys")
        return at
    return place


def _create(path: str, dtype, shape) -> np.memmap:
    return np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)


class ExportedTable:
    """One table of an export, memory-mapped: ``rows(keys)`` gives float32 rows.

    Args:
        directory: the table's directory in the export.
        entry: its manifest entry (config, rows, dtype).
    """

    def __init__(self, directory: str, entry: dict):
        self.cfg = TableConfig.from_dict(entry["config"])
        self.dtype, self.dynamic = entry["dtype"], entry["dynamic"]
        # rows that decay (het.decay) were brought to this step; a key never stored, from step 0
        self.decay, self.decayed_to = RowDecay(self.cfg.optimizer), int(entry.get("decayed_to", 0))
        self.values = _tensor(np.load(os.path.join(directory, "rows.npy"), mmap_mode="r"))
        self.qparams = (_tensor(np.load(os.path.join(directory, "qparams.npy"), mmap_mode="r"))
                        if self.dtype == "int8" else None)
        expected = (entry["rows"], self.cfg.dim)
        if tuple(self.values.shape) != expected or self.values.dtype != _TORCH[self.dtype]:
            raise ValueError(f"{directory}/rows.npy holds {self.values.dtype} {tuple(self.values.shape)}, the manifest "
                             f"says {self.dtype} {expected}")
        self.index = None
        if self.dynamic:
            self.index = key_index.HashIndex(np.load(os.path.join(directory, "hashes.npy"), mmap_mode="r"),
                                             np.load(os.path.join(directory, "directory.npy")))

    @property
    def dim(self) -> int:
        return self.cfg.dim

    def rows(self, keys: torch.Tensor) -> torch.Tensor:
        """The rows of ``keys`` as float32. Shape: (n,) int64 -> (n, dim)."""
        keys = keys.reshape(-1).to(torch.int64)
        if not self.dynamic:
            if keys.numel():
                lo, hi = torch.aminmax(keys)
                if int(lo) < 0 or int(hi) >= self.cfg.rows:
                    bad = int(lo) if int(lo) < 0 else int(hi)
                    raise ValueError(f"key {bad} out of range for table {self.cfg.name!r} with {self.cfg.rows} rows")
            return self._gather(keys)
        at = torch.from_numpy(self.index.lookup(keys.numpy()))
        fresh = (at < 0).nonzero().flatten()  # keys never stored: their initial rows, made here
        if not len(fresh):
            return self._gather(at)
        # an empty table (a job's first base, before any push) has no row to gather in their place
        out = self._gather(at.index_fill_(0, fresh, 0)) if len(self.values) else torch.zeros(len(keys), self.dim)
        initial = torch.from_numpy(initial_rows(self.cfg, keys.index_select(0, fresh).numpy()))
        if self.decay.active:
            initial = self.decay.bring(initial, torch.zeros(len(fresh), dtype=torch.int64), self.decayed_to)
        return out.index_copy_(0, fresh, initial)

    def _gather(self, at: torch.Tensor) -> torch.Tensor:
        q = self.qparams.index_select(0, at) if self.qparams is not None else None
        return row_codec.decode(self.values.index_select(0, at), q)


_TORCH = {"fp32": torch.float32, "fp16": torch.float16, "int8": torch.uint8}


def _tensor(array: np.ndarray) -> torch.Tensor:
    """A read-only map as a tensor: the export is only read, so torch's warning that the
    array is not writable says nothing here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)
