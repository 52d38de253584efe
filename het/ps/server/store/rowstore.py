"""The one interface a shard reaches its tables through, and the function that opens them.

A table's slice on a shard is a :class:`RowStore`: a fixed table's dense rows
(:class:`het.ps.server.store.fixed.FixedRows`), or a dynamic table's stored rows
(:class:`het.ps.server.store.dynamic.DynamicRows`), all in memory or, under a shard's memory budget,
tiered between a DRAM pool and disk (:class:`het.ps.server.store.tiers.TieredRows`). The shard asks
each the same questions and never which kind it holds.

A key is *located* once per request (:meth:`RowStore.locate`): a fixed table's local row, a
dynamic table's ``(key, slot)``. Every other call takes those locations (``at``).
"""

from __future__ import annotations

import os
import shutil
from typing import Callable, Protocol

import numpy as np
import torch

from het.config import ShardConfig, TableConfig
from het.ps.server.store import saves
from het.ps.server.store.dynamic import DynamicRows
from het.ps.server.store.fixed import FixedRows
from het.ps.server.store.optim import SparseOptimizer


class RowStore(Protocol):
    """One table's slice on a shard: rows, clocks and optimizer state.

    Shape: keys (n,) int64; ``at`` as :meth:`locate` gives it; rows (n, D); clocks (n,).
    """

    cfg: TableConfig
    optimizer: SparseOptimizer  # the table's update rule (its state may live in the store)
    step: int  # the largest step a push named
    on_remove: Callable[[torch.Tensor], None] | None  # told the keys of rows the store forgets (expiry, budget)
    # whether push itself refuses non-finite gradients (they make a non-finite result, which it
    # refuses, and it reads the gradients only): the shard need not check them first
    refuses_non_finite_grads: bool

    def check_keys(self, keys: torch.Tensor) -> str:
        """Why ``keys`` do not belong to this slice ('' when they do): out of the table's
        range, or another shard's."""

    def locate(self, keys: torch.Tensor) -> torch.Tensor:
        """Where ``keys`` (checked) live, for the calls below."""

    def clocks_of(self, at: torch.Tensor) -> torch.Tensor:
        """The rows' clocks (0 for a row never pushed). Shape: -> (n,)."""

    def rows_to_send(self, at: torch.Tensor, lazy: bool, half: bool = False) -> tuple[list, int]:
        """A reply's arrays for the rows ``at``: ``[rows]``, or with ``lazy`` ``[rows of the
        touched ones, built (n,) uint8]`` (1: untouched, left for the client to build); and
        how many rows were sent. Rows are float32, or with ``half``, where the table stores
        them in half precision, their 16 bits as int16 (:func:`het.ps.protocol.halves.as_bits`)."""

    def pull_reply(self, at: torch.Tensor, lazy: bool) -> tuple[list, int] | None:
        """A PULL's reply arrays made in one pass, where the store has one: the touched rows of
        ``at``, their clocks in the narrowest integers that hold them, the built marks a bit a
        row; and how many rows were sent. None: the shard makes them from :meth:`rows_to_send`
        and :meth:`clocks_of`, the reference it is held to."""

    def wire_pull(self, keys: np.ndarray, lazy: bool) -> tuple[list, int] | None:
        """:meth:`pull_reply` straight from a request's keys as they travel (int32 or int64, not
        yet checked), where the store reads them natively; None: the shard's checked path
        answers, and names what is wrong."""

    def wire_push(self, keys: np.ndarray, grads: np.ndarray, counts: np.ndarray, step: int) -> int | None:
        """:meth:`push` straight from a request's keys, float32 gradients and counts as they
        travel, where the store reads them natively: the rows applied; ValueError as
        :meth:`push`'s; None (nothing changed): the shard's checked path applies it, or names
        what is wrong."""

    def decayed_to(self, at: torch.Tensor) -> torch.Tensor:
        """The step each row ``at`` was last brought to by its optimizer's decay (its state
        ``decayed``, :mod:`het.decay`; 0 for a row never pushed); a table that decays only.
        Shape: -> (n,) int64."""

    def local_state(self, at: torch.Tensor, full: bool) -> np.ndarray:
        """The optimizer state a worker's cache follows the rows with
        (:meth:`het.ps.server.store.optim.SparseOptimizer.local_state`). Shape: -> (n, 1) or (n, D)."""

    def push(self, at: torch.Tensor, grads: torch.Tensor, counts: torch.Tensor, step: int,
             sq: torch.Tensor | None = None) -> None:
        """Apply the optimizer to ``grads`` and add ``counts`` to the clocks, all or nothing:
        ValueError (nothing changed) for a result that is not finite or a clock past
        MAX_CLOCK."""

    def pageable(self, at: torch.Tensor) -> torch.Tensor | None:
        """What of the rows ``at`` lives on disk and :meth:`page_in` may bring into DRAM
        before the step that uses them; None when nothing of this store is on disk."""

    def page_in(self, pageable: torch.Tensor) -> int:
        """Bring rows :meth:`pageable` named into DRAM; how many came."""

    def dram_bytes(self) -> tuple[int, int]:
        """``(bytes held in DRAM whatever the pool's size, bytes one more pooled row costs)``;
        the second is 0 for a store without a DRAM pool (everything in memory)."""

    def size_pool(self, rows: int) -> None:
        """Hold at most ``rows`` rows in the DRAM pool (a store without one ignores it)."""

    def state_dict(self, rows_dir: str | None = None) -> dict:
        """What a save holds of this slice; a store with files on disk links them into
        ``rows_dir`` instead of copying their rows."""

    def check_state(self, saved: dict, path: str) -> None:
        """Refuse (ValueError) a save that does not fit this slice, before anything changes."""

    def load_state_dict(self, saved: dict, rows_dir: str | None = None) -> None:
        """Take :meth:`state_dict`'s output (checked); ``rows_dir``: where its files are."""

    def stats(self) -> dict:
        """Rows held and their bytes (``rows``, ``bytes``), and the store's own counters."""

    def close(self) -> None:
        """Let go of the store's files (a save holds links of its own)."""


def open_stores(cfg: ShardConfig, state_dir: str | None) -> dict[str, RowStore]:
    """Every table's slice on shard ``cfg.index``, by name. Under a memory budget a dynamic
    table's rows are tiered, with their disk tier in ``state_dir/tier`` (emptied first: what
    an earlier run left there is not state, saves are)."""
    tier = None
    if cfg.memory is not None:
        if state_dir is None:
            raise ValueError("a memory budget needs a state directory for its disk tier (het serve --state-dir DIR)")
        tier = os.path.join(state_dir, "tier")
        shutil.rmtree(tier, ignore_errors=True)
    return {t.name: _open(t, cfg, tier) for t in cfg.tables}


def _open(table: TableConfig, cfg: ShardConfig, tier: str | None) -> RowStore:
    if not table.dynamic:
        return FixedRows(table, cfg.index, cfg.num_shards)
    disk_dir = None if tier is None else os.path.join(tier, saves.table_dir(table.name))
    return DynamicRows(table, cfg.index, cfg.num_shards, disk_dir, cfg.memory_policy)


def sent_of(asked: torch.Tensor, rows: list, n_sent: int) -> torch.Tensor:
    """Of the rows ``asked``, those whose values a reply carries (:meth:`RowStore.rows_to_send`
    gave ``rows``, ``n_sent`` of them): all, or in a lazy reply the touched ones. A row left for
    the client to build has clock 0 and its initial optimizer state, which stay behind too."""
    if n_sent == len(asked):
        return asked
    return asked[torch.from_numpy(rows[-1]) == 0]
