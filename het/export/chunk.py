"""What ``het predict`` reads, a chunk at a time (:class:`Chunk`), and the raw rows it could not
read (:class:`Skipped`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Chunk:
    """Rows to score. Shapes: dense (n, D) float32, keys (n, L) int64 (the table's), labels (n,)
    float32 or None, rows (n,) int64 (position in the input: 0-based, of the rows read), lines
    (n,) int64 or None (line in the raw input, as ``het data prepare`` numbers them), kept
    (``--keep``): raw input columns carried into the output, each (n,)."""

    dense: np.ndarray
    keys: np.ndarray
    labels: np.ndarray | None
    rows: np.ndarray
    lines: np.ndarray | None = None
    kept: dict = field(default_factory=dict)


@dataclass
class Skipped:
    """Rows of raw input not read: all counted, the first :data:`FIRST` with their line and why."""

    FIRST = 10
    count: int = 0
    first: list = field(default_factory=list)

    def add(self, count: int, entries: list[dict]) -> None:
        self.count += count
        self.first = (self.first + entries)[:self.FIRST]
