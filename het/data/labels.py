"""A label column of any values -> 0/1: ``--positive VALUES``.

``VALUES`` is either a comparison with a number (``">=4"``, ``">3.5"``, ``"<0"``, ``"==1"``,
``"!=0"``): a row is positive when its label, read as a number, passes it (a label that is not a
number is a bad row); or a comma-separated list of values (``">50K"``, ``"yes,y"``): a row is
positive when its label's text, trimmed, is one of them, and negative otherwise. Without it a
label must be 0 or 1. A missing label is a bad row either way.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from het.data.numbers import parse_numbers

_COMPARISON = re.compile(r"^\s*(>=|<=|==|!=|>|<)\s*([-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?)\s*$")
_OPS = {">=": operator.ge, "<=": operator.le, "==": operator.eq, "!=": operator.ne, ">": operator.gt,
        "<": operator.lt}


@dataclass(frozen=True)
class Positive:
    """Which labels are positive (see the module docstring); ``None`` text: 0 or 1 only.

    Example:
        >>> y, bad = Positive(">=4").labels(pa.array(["5", "3", "x", None]))
        >>> y.tolist(), bad.tolist()
        ([1.0, 0.0, 0.0, 0.0], [False, False, True, True])
        >>> Positive(">50K").labels(pa.array([">50K", "<=50K"]))[0].tolist()
        [1.0, 0.0]
    """

    text: str | None = None

    def __post_init__(self):
        if self.text is not None and not self.values and not _COMPARISON.match(self.text):
            raise ValueError(f"--positive: expected a comparison such as '>=4' or a comma-separated list of "
                             f"values, got {self.text!r}")

    @property
    def values(self) -> tuple[str, ...]:
        if self.text is None or _COMPARISON.match(self.text):
            return ()
        return tuple(v.strip() for v in self.text.split(",") if v.strip())

    def labels(self, arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """``(labels (n,) float32 of 0 and 1, bad (n,) bool)``; a bad row's label is 0."""
        if pa.types.is_dictionary(arr.type):
            arr = arr.dictionary_decode()
        match = _COMPARISON.match(self.text) if self.text is not None else None
        if self.text is None or match:
            y, missing, bad = parse_numbers(arr)
            bad = bad | missing
            if match:
                y = _OPS[match.group(1)](y, float(match.group(2))).astype(np.float64)
            else:
                bad = bad | ((y != 0) & (y != 1))
            return np.where(bad, 0.0, y).astype(np.float32), bad
        text = pc.utf8_trim_whitespace(pc.cast(arr, pa.string()))
        missing = pc.fill_null(pc.equal(pc.utf8_length(text), 0), True).to_numpy(zero_copy_only=False)
        hit = pc.fill_null(pc.is_in(text, value_set=pa.array(self.values, pa.string())), False)
        return hit.to_numpy(zero_copy_only=False).astype(np.float32) * ~missing, missing

    def describe(self) -> str:
        if self.text is None:
            return "0 or 1"
        return f"positive when {self.text}" if _COMPARISON.match(self.text) else f"positive: {list(self.values)}"
