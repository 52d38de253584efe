"""Columns of numbers, or of their text, read the one way every reader and the export spec share.
A value is bad when it is not a number or not a finite float32 (past +-3.4e38): the model's
inputs are float32, and such a value would reach it as infinity."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_NUMBER = r"^[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$"
FLOAT32_MAX = float(np.finfo(np.float32).max)


def parse_numbers(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(values float64, missing, bad) of a column of numbers or of their text. Shape: (n,) x3."""
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        text = pc.utf8_trim_whitespace(arr)
        missing = pc.fill_null(pc.equal(pc.utf8_length(text), 0), True)
        ok = pc.fill_null(pc.match_substring_regex(text, _NUMBER), False)
        values = pc.cast(pc.if_else(ok, text, None), pa.float64()).to_numpy(zero_copy_only=False)
        missing, ok = missing.to_numpy(zero_copy_only=False), ok.to_numpy(zero_copy_only=False)
        bad = ~missing & (~ok | ~(np.abs(np.where(ok, values, 0.0)) <= FLOAT32_MAX))
        return np.where(ok & ~bad, values, 0.0), missing, bad
    values = pc.cast(arr, pa.float64()).to_numpy(zero_copy_only=False)  # nulls -> NaN
    missing = np.isnan(values)
    bad = ~missing & ~(np.abs(np.where(missing, 0.0, values)) <= FLOAT32_MAX)
    return np.where(missing | bad, 0.0, values), missing, bad
