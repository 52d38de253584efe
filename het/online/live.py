"""The model a server answers with, and its versions: a base export plus the rows and dense
weights of the deltas applied since, swapped in whole.

A :class:`Version` is immutable once made: the export's tables (memory-mapped, shared by every
version of one base), an overlay of the rows the deltas changed (sorted keys and their rows, in
memory), and the dense model. Applying a delta makes a new Version (the overlay merged, the
dense weights loaded into a new module) and :class:`Live` swaps one reference: a batch takes
the current Version once and answers with it, so a request sees one version, never half a delta.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from het.export.model import ExportedModel
from het.export.tables import ExportedTable


class Overlay:
    """Rows that changed since a base: ``keys`` ascending and their float32 ``rows``.

    Example:
        >>> o = Overlay.empty(2).merge(np.array([5, 1]), np.ones((2, 2), np.float32))
        >>> o = o.merge(np.array([5]), np.zeros((1, 2), np.float32))  # a later delta's row wins
        >>> o.keys.tolist(), o.rows[:, 0].tolist()
        ([1, 5], [1.0, 0.0])
    """

    def __init__(self, keys: np.ndarray, rows: np.ndarray):
        self.keys, self.rows = keys, rows

    @classmethod
    def empty(cls, dim: int) -> Overlay:
        return cls(np.zeros(0, np.int64), np.zeros((0, dim), np.float32))

    def __len__(self) -> int:
        return len(self.keys)

    def merge(self, keys: np.ndarray, rows: np.ndarray) -> Overlay:
        """A new overlay with ``keys``' rows (newer) over these."""
        all_keys = np.concatenate([self.keys, np.asarray(keys, np.int64)])
        all_rows = np.concatenate([self.rows, np.asarray(rows, np.float32)])
        # the last occurrence of each key is the newest: unique over the reversed order
        unique, first = np.unique(all_keys[::-1], return_index=True)
        return Overlay(unique, all_rows[::-1][first])

    def find(self, keys: np.ndarray) -> np.ndarray:
        """Each key's row in the overlay, -1 when it has none. Shape: (n,) -> (n,)."""
        if not len(self.keys):
            return np.full(len(keys), -1, np.int64)
        at = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        return np.where(self.keys[at] == keys, at, -1)


class OverlaidTable:
    """An export's table with an overlay: ``rows(keys)`` as :class:`ExportedTable`, the overlay's
    rows over the base's."""

    def __init__(self, base: ExportedTable, overlay: Overlay):
        self.base, self.overlay = base, overlay
        self._rows = torch.from_numpy(overlay.rows)

    @property
    def dim(self) -> int:
        return self.base.dim

    def rows(self, keys: torch.Tensor) -> torch.Tensor:
        keys = keys.reshape(-1)
        if not len(self.overlay):
            return self.base.rows(keys)
        at = torch.from_numpy(self.overlay.find(keys.numpy()))
        newer = (at >= 0).nonzero().flatten()
        if not len(newer):
            return self.base.rows(keys)
        out = self.base.rows(keys) if len(newer) < len(keys) else torch.empty(len(keys), self.dim)
        return out.index_copy_(0, newer, self._rows.index_select(0, at.index_select(0, newer)))


@dataclass(frozen=True)
class Version:
    """One version of the served model: its number, when training made it (wall-clock seconds),
    and the model answering for it."""

    number: int
    trained_at: float
    model: nn.Module
    overlay: Overlay
    applied_at: float = field(default_factory=time.time)


class Live:
    """The current :class:`Version`, swapped atomically."""

    def __init__(self, version: Version):
        self._version = version
        self._lock = threading.Lock()

    @property
    def current(self) -> Version:
        return self._version

    def swap(self, version: Version) -> None:
        with self._lock:
            if version.number < self._version.number:
                raise ValueError(f"version {version.number} is older than the served {self._version.number}")
            self._version = version

    def lag_s(self) -> float:
        """How far the served model is behind training: now minus its version's training time."""
        return max(0.0, time.time() - self._version.trained_at)


def first_version(model: ExportedModel) -> Version:
    """An export as a version: a base of ``het train --publish`` with its number and time, any
    other as version 0 made when it was written."""
    import datetime

    published = model.manifest.get("published") or {}
    created = datetime.datetime.fromisoformat(model.manifest["created"]).timestamp()
    return Version(int(published.get("version", 0)), float(published.get("trained_at", created)), model,
                   Overlay.empty(model.table.dim))
