"""Multi-hot columns: a list of ids in one field ("Action|Comedy", or a list), each id hashed
with its column's name as a single id is, laid in a bag of ``size`` slots; slots past the
list's end hold :data:`PAD`, which pooling leaves out (an empty list pools to zeros). The one
function both the preparation and an export's input spec use, so a list becomes the same keys
in training and in serving.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from het.data.hashing import hash_strings

PAD = int(np.iinfo(np.int64).min)  # a bag's empty slot: left out of its pooled row
POOLINGS = ("mean", "sum")


def parse_multi(text: str) -> tuple[str, str]:
    """``--multi COL:SEP`` -> (column, separator).

    Example:
        >>> parse_multi("genres:|"), parse_multi("tags::")
        (('genres', '|'), ('tags', ':'))
    """
    col, colon, sep = text.partition(":")
    if not col or not colon or not sep:
        raise ValueError(f"--multi: expected COL:SEP (e.g. genres:|), got {text!r}")
    return col, sep


def multi_keys(name: str, arr: pa.Array, sep: str, size: int) -> tuple[np.ndarray, np.ndarray]:
    """``(keys (n, size) int64, truncated (n,) bool)`` of a column of separated text, or of lists;
    tokens are trimmed, empty ones (and a missing value) dropped, the first ``size`` kept.

    Example:
        >>> keys, cut = multi_keys("g", pa.array(["a|b", None, " b ||c|a"]), "|", 2)
        >>> bool(keys[0, 1] == keys[2, 0]), bool((keys[1] == PAD).all()), cut.tolist()
        (True, True, [False, False, True])
    """
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    n = len(arr)
    if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
        lists = pc.fill_null(arr, pa.scalar([], arr.type))
        tokens = pc.cast(pc.list_flatten(lists), pa.string())
    else:
        text = pc.fill_null(pc.cast(arr, pa.string()), "")
        lists = pc.split_pattern(text, sep)
        tokens = pc.list_flatten(lists)
    owner = pc.list_parent_indices(lists).to_numpy(zero_copy_only=False)
    tokens = pc.fill_null(pc.utf8_trim_whitespace(tokens), "")
    keep = pc.greater(pc.utf8_length(tokens), 0).to_numpy(zero_copy_only=False)
    owner = owner[keep]
    kept = tokens.filter(pa.array(keep))
    first = np.searchsorted(owner, np.arange(n))  # each row's first kept token (owner is sorted)
    slot = np.arange(len(owner)) - first[owner]
    fits = slot < size
    keys = np.full((n, size), PAD, np.int64)
    if len(kept):
        hashed = _hash(name, kept)
        keys[owner[fits], slot[fits]] = hashed[fits]
    truncated = np.zeros(n, bool)
    truncated[owner[~fits]] = True
    return keys, truncated


def _hash(name: str, arr: pa.Array) -> np.ndarray:
    arr = arr.cast(pa.large_string()).cast(pa.string()) if pa.types.is_large_string(arr.type) else arr
    arr = pa.concat_arrays([arr]) if arr.offset else arr
    offsets = np.frombuffer(arr.buffers()[1], np.int32)[:len(arr) + 1]
    data = arr.buffers()[2]
    return hash_strings(name, np.zeros(0, np.uint8) if data is None else np.frombuffer(data, np.uint8), offsets)
