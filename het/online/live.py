"""The model a server answers with, and its versions: a base export plus the rows and dense
weights of the deltas applied since, swapped in whole.

A :class:`Version` is immutable once made: the export's tables (memory-mapped, shared by every
version of one base), overlays of the rows the deltas changed (sorted keys and their rows, in
memory: a delta's own, newest first, later merged into one), and the dense model. Applying a
delta makes a new Version (the delta's overlay over the others, the dense weights loaded into a
new module) and :class:`Live` swaps one reference: a batch takes the current Version once and
answers with it, so a request sees one version, never half a delta. Merging the overlays, which
copies every row they hold, happens after the swap (the same version again, with one overlay),
so it adds nothing to how far behind training a server is.
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

    @classmethod
    def of(cls, keys: np.ndarray, rows: np.ndarray) -> Overlay:
        """The overlay of one delta's distinct keys and their rows."""
        order = np.argsort(np.asarray(keys, np.int64), kind="stable")
        return cls(np.asarray(keys, np.int64)[order], np.asarray(rows, np.float32)[order])

    def __len__(self) -> int:
        return len(self.keys)

    def merge(self, keys: np.ndarray, rows: np.ndarray) -> Overlay:
        """A new overlay with ``keys``' rows (distinct keys; newer) over these: this one's rows
        copied in order, the keys it holds overwritten, the others inserted in place (sequential
        copies, where sorting the union would gather every row at random)."""
        keys = np.asarray(keys, np.int64)
        order = np.argsort(keys, kind="stable")
        keys, rows = keys[order], np.asarray(rows, np.float32)[order]
        at = np.searchsorted(self.keys, keys)
        held = np.zeros(len(keys), bool)
        if len(self.keys):
            held = self.keys[np.minimum(at, len(self.keys) - 1)] == keys
        merged = self.rows.copy()
        merged[at[held]] = rows[held]
        fresh = ~held
        return Overlay(np.insert(self.keys, at[fresh], keys[fresh]), np.insert(merged, at[fresh], rows[fresh], axis=0))

    def find(self, keys: np.ndarray) -> np.ndarray:
        """Each key's row in the overlay, -1 when it has none. Shape: (n,) -> (n,)."""
        if not len(self.keys):
            return np.full(len(keys), -1, np.int64)
        at = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        return np.where(self.keys[at] == keys, at, -1)


class OverlaidTable:
    """An export's table with overlays: ``rows(keys)`` as :class:`ExportedTable`, each overlay's
    rows over the base's and over older overlays' (``layers``: newest first)."""

    def __init__(self, base: ExportedTable, layers: tuple[Overlay, ...]):
        self.base, self.layers = base, layers
        self._rows = [torch.from_numpy(layer.rows) for layer in layers]

    @property
    def dim(self) -> int:
        return self.base.dim

    def rows(self, keys: torch.Tensor) -> torch.Tensor:
        keys = keys.reshape(-1)
        out = self.base.rows(keys)
        for layer, rows in zip(reversed(self.layers), reversed(self._rows)):  # oldest first: newer ones win
            at = torch.from_numpy(layer.find(keys.numpy()))
            newer = (at >= 0).nonzero().flatten()
            if len(newer):
                out.index_copy_(0, newer, rows.index_select(0, at.index_select(0, newer)))
        return out


@dataclass(frozen=True)
class Version:
    """One version of the served model: its number, when training made it (wall-clock seconds),
    and the model answering for it."""

    number: int
    trained_at: float
    model: nn.Module
    layers: tuple[dict, ...] = ()  # rows the deltas since its base changed, newest first: {table: Overlay}
    applied_at: float = field(default_factory=time.time)

    def compacted(self) -> dict | None:
        """Its layers merged into one, a table at a time (None: there are none)."""
        if not self.layers:
            return None
        merged = dict(self.layers[-1])
        for layer in reversed(self.layers[:-1]):
            for name, overlay in layer.items():
                merged[name] = merged[name].merge(overlay.keys, overlay.rows) if name in merged else overlay
        return merged


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
    return Version(int(published.get("version", 0)), float(published.get("trained_at", created)), model)
