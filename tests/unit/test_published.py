"""The publish directory's files (het.train.published) and the publish settings."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from het import arrayfile
from het.train.config import TrainConfig
from het.train.published import ROW_DTYPES, decode_rows, delta_arrays, encode_rows, read_delta, write_delta


@settings(max_examples=60, deadline=None)
@given(arrays(np.float32, st.tuples(st.integers(0, 5), st.integers(1, 4)),
              elements=st.floats(-1e4, 1e4, width=32)), st.sampled_from(ROW_DTYPES))
def test_stored_rows_read_back_as_the_nearest_value_of_their_precision(rows, dtype):
    back = decode_rows(encode_rows(rows, dtype), dtype)
    assert back.dtype == np.float32 and back.shape == rows.shape
    if dtype == "fp32":
        assert np.array_equal(back, rows)
    elif dtype == "fp16":
        assert np.array_equal(back, rows.astype(np.float16).astype(np.float32))
    else:  # bf16: 8 significant bits, rounded to nearest; below its normal range, half its smallest step
        assert np.all(np.abs(back - rows) <= np.maximum(np.abs(rows) * 2.0 ** -8, 2.0 ** -134))
    assert np.array_equal(decode_rows(encode_rows(back, dtype), dtype), back)  # a stored row is stored as it is


def test_a_delta_reads_back_and_another_versions_file_is_refused(tmp_path):
    path = str(tmp_path / "d.het")
    rows = np.arange(6, dtype=np.float32).reshape(3, 2) / 3
    narrow = np.ones((2, 1), np.float32)
    write_delta(path, {"embedding_2": (np.array([4, 1, 9]), encode_rows(rows, "bf16"), np.ones(3, np.int64)),
                       "embedding_1": (np.array([5, 6]), encode_rows(narrow, "bf16"), np.ones(2, np.int64))},
                {"w": np.ones(2, np.float32)}, {"version": 7, "rows_dtype": "bf16"})
    meta, tables, dense = read_delta(path, 7)
    keys, back = tables["embedding_2"]
    assert keys.tolist() == [4, 1, 9] and np.allclose(back, rows, rtol=2 ** -8) and dense["w"].tolist() == [1, 1]
    assert tables["embedding_1"][0].tolist() == [5, 6] and meta["tables"]["embedding_1"] == {"rows": 2, "dim": 1}
    with pytest.raises(arrayfile.ArrayFileError, match="expected het-delta 8"):
        read_delta(path, 8)
    one = str(tmp_path / "one.het")  # a delta of one table whose arrays are unnamed: its table's rows
    arrayfile.write(one, {"keys": np.array([3]), "rows": rows[:1], "clocks": np.ones(1, np.int64)},
                    {"format": "het-delta", "version": 2, "table": "embedding"})
    assert read_delta(one, 2)[1]["embedding"][0].tolist() == [3]


def test_bounded_publishing_needs_a_finite_staleness_bound():
    with pytest.raises(ValueError, match="bounded needs a finite staleness"):
        TrainConfig.from_dict({"staleness": "inf", "publish": {"dir": "p", "consistency": "bounded"}})
    for consistency in ("flush", None):
        TrainConfig.from_dict({"staleness": "inf", "publish": {"dir": "p", "consistency": consistency}})
    with pytest.raises(ValueError, match="publish.consistency"):
        TrainConfig.from_dict({"publish": {"dir": "p", "consistency": "sometimes"}})
    with pytest.raises(ValueError, match="publish.dtype"):
        TrainConfig.from_dict({"publish": {"dir": "p", "dtype": "int8"}})


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(-5, 40), unique=True, max_size=12), max_size=4),
       st.lists(st.integers(-5, 40), unique=True, max_size=10))
def test_rank_0s_copies_replace_the_shards_rows_of_the_same_keys(pieces_keys, view_keys):
    """Keys are unique within a piece (a shard's page) and within the view; a key may be in
    several pieces (shards) only under distinct tables, never here."""
    seen, pieces = set(), []
    for ks in pieces_keys:
        ks = [k for k in ks if k not in seen]
        seen.update(ks)
        k = np.array(ks, np.int64)
        pieces.append((k, k[:, None].astype(np.float32) * [1, 1], np.ones(len(k), np.int64)))
    vk = np.array(view_keys, np.int64)
    view = (vk, vk[:, None].astype(np.float32) * [10, 10], np.full(len(vk), 2, np.int64))
    keys, rows, clocks = delta_arrays(pieces, view, 2, [None])
    want = {int(k): (float(k), 1) for k in seen}
    want.update({int(k): (10.0 * k, 2) for k in vk})
    assert sorted(keys.tolist()) == sorted(want) and len(keys) == len(want)
    for k, r, c in zip(keys.tolist(), rows, clocks.tolist()):
        assert (r.tolist(), c) == ([want[k][0]] * 2, want[k][1])
