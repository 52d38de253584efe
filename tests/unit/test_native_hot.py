"""The native writer of a client's hot requests (``native.ops.hot_head``) and its narrowing of
integers (``native.ops.narrow_ints``) against the Python they stand for: the same bytes, the same
dtypes and values; None where the Python writer must take over. (The reader, ``hot_reply``, is
held to the Python reader in tests/unit/test_client_hot_path.py.)"""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from het import native
from het.config import TableConfig
from het.ps.client import hot
from het.ps.client.requests import keys_to_send
from het.ps.protocol.integers import _narrowest, _torch_ints
from het.ps.protocol.messages import HEADER, MAGIC, OK, VERSION, Op, specs_text

pytestmark = pytest.mark.skipif(native.ops is None, reason="the native core is not built")

_INT64 = st.integers(-(1 << 63), (1 << 63) - 1)


def _reference(values: torch.Tensor, narrowest: int):
    lo, hi = (0, 0) if len(values) == 0 else (int(values.min()), int(values.max()))
    code = _narrowest(lo, hi)
    codes = ["u1", "i2", "i4", "i8"]
    code = codes[max(codes.index(code), narrowest)] if code != "i8" else "i8"
    return values.to(_torch_ints()[code]), lo, hi


@settings(max_examples=300, deadline=None)
@given(values=st.one_of(st.lists(_INT64, max_size=40), st.lists(st.integers(-70_000, 70_000), max_size=40),
                        st.lists(st.integers(0, 300), max_size=40)),
       narrowest=st.sampled_from([0, 1, 2]))
def test_integers_are_narrowed_as_the_reference_narrows_them(values, narrowest):
    values = torch.tensor(values, dtype=torch.int64)
    got, lo, hi = native.ops.narrow_ints(values, narrowest)
    want, want_lo, want_hi = _reference(values, narrowest)
    assert got.dtype == want.dtype and torch.equal(got, want) and (lo, hi) == (want_lo, want_hi)


def test_keys_travel_as_int32_where_they_fit_and_strided_keys_as_contiguous_ones():
    dynamic = TableConfig("ids", rows=None, dim=2)
    for keys in (torch.tensor([5, -3, 2**31 - 1]), torch.tensor([2**31, 0]), torch.tensor([-(2**31) - 1])):
        _, wire = keys_to_send(dynamic, keys)
        fits = int(keys.min()) >= -(2**31) and int(keys.max()) < 2**31
        assert wire.dtype == (torch.int32 if fits else torch.int64) and torch.equal(wire.long(), keys)
    keys = torch.arange(20) * 3
    strided, whole = keys_to_send(dynamic, keys[::2]), keys_to_send(dynamic, keys[::2].clone())
    assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(strided, whole))
    with pytest.raises(ValueError, match="key 10 out of range"):
        keys_to_send(TableConfig("t", rows=10, dim=2), torch.tensor([3, 10]))


def _python_head(op: Op, rid: int, head: str, arrays: list):
    text = f"{head}{specs_text(arrays)}]}}".encode()
    return HEADER.pack(MAGIC, VERSION, op, OK, 0, rid, len(text)) + text, sum(a.nbytes for a in arrays)


@pytest.mark.parametrize("arrays", [
    [np.arange(5, dtype=np.int32)],
    [np.arange(3, dtype=np.int64), np.ones((3, 4), np.float32), np.ones(3, np.uint8)],
    [np.zeros(0, np.int32), np.zeros((0, 7), np.float32), np.zeros(0, np.int16)],
    [np.arange(2, dtype=np.int16).reshape(2, 1)],
])
def test_a_request_head_is_written_as_the_python_writer_writes_it(arrays):
    head = '{"lazy":true,"table":"t","session":"ab","seq":3,"nonce":"cd","arrays":['
    for op, rid in ((Op.PULL, 1), (Op.PUSH, (1 << 64) - 1)):
        assert native.ops.hot_head(op, rid, head, arrays) == _python_head(op, rid, head, arrays)
        assert hot.write_natively(op, rid, head, arrays) == _python_head(op, rid, head, arrays)


@pytest.mark.parametrize("array", [np.ones((4, 3), np.float32).T, np.arange(10, dtype=np.int32)[::2],
                                   np.ones(3, ">i4"), np.ones(3, np.float64), np.ones(3, np.int8)])
def test_an_array_not_contiguous_or_not_of_a_wire_dtype_is_left_to_the_python_writer(array):
    assert native.ops.hot_head(Op.PUSH, 1, "{", [np.arange(3, dtype=np.int32), array]) is None
