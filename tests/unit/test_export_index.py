"""A dynamic table's key index in an export (het.export.index): every stored key found at the
row its build said, no other key found, and the native lookup equal to the NumPy reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from het import native
from het.export.index import BUCKET, HashIndex, build

INT64 = st.integers(-2 ** 63, 2 ** 63 - 1)


@settings(max_examples=60, deadline=None)
@given(stored=st.lists(INT64, unique=True, max_size=400), absent=st.lists(INT64, max_size=100))
def test_every_stored_key_is_found_at_its_row_and_no_other(stored, absent):
    keys = np.array(stored, dtype=np.int64)
    hashes, directory, order = build(keys)
    index = HashIndex(hashes, directory, use_native=False)
    query = np.array([k for k in absent if k not in set(stored)] + stored, dtype=np.int64)
    rows = index.lookup(query)
    n_absent = len(query) - len(stored)
    assert (rows[:n_absent] == -1).all()
    assert np.array_equal(keys[order[rows[n_absent:]]], keys)  # row p holds keys[order[p]]
    assert len(directory) - 1 <= max(1, len(keys) // BUCKET)


@pytest.mark.skipif(native.ops is None, reason="the native core is not built here")
@settings(max_examples=60, deadline=None)
@given(stored=st.lists(INT64, unique=True, max_size=2000), absent=st.lists(INT64, max_size=300),
       wide=st.booleans())
def test_the_native_lookup_equals_the_reference(stored, absent, wide):
    hashes, directory, _ = build(np.array(stored, dtype=np.int64))
    if wide:  # the directory of an index of 2^32 keys or more: int64 entries
        directory = directory.astype(np.int64)
    native_index, reference = HashIndex(hashes, directory), HashIndex(hashes, directory, use_native=False)
    query = np.array(absent + stored[::2], dtype=np.int64)
    assert native_index._native is not None
    assert np.array_equal(native_index.lookup(query), reference.lookup(query))
