import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from het.config import ShardConfig, TableConfig
from het.ps.protocol.integers import delta_keys, narrow, undelta_keys, widen
from het.ps.protocol.messages import ERROR, MAGIC, VERSION, Message, Op, ProtocolError, VersionError, HEADER, decode, encode
from het.ps.server.shard import Shard


def test_round_trip_keeps_arrays_and_meta():
    keys = np.array([1, 2**40 + 3, 2**62], dtype=np.int64)  # ids far above 2^24 stay exact
    rows = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    msg = decode(encode(Message(Op.PUSH, 42, {"table": "t", "step": 9}, [keys, rows])))
    assert (msg.op, msg.request_id, msg.meta) == (Op.PUSH, 42, {"table": "t", "step": 9})
    assert msg.arrays[0].tolist() == keys.tolist()
    assert np.array_equal(msg.arrays[1], rows)


@pytest.mark.parametrize("code", [">i8", ">i4", ">i2", ">f4", "=i8", "<f4", "u1"])
def test_arrays_of_either_byte_order_arrive_with_their_values(code):
    values = np.array([[1, -2, 3], [2**14, 5, 0]]) if code != "u1" else np.array([[1, 2, 3], [200, 5, 0]])
    sent = values.astype(code)
    got = decode(encode(Message(Op.PUSH, 3, {}, [sent, sent.T]))).arrays  # a transposed one too
    assert got[0].dtype.byteorder in "<|=" and got[0].tolist() == values.tolist()
    assert got[1].tolist() == values.T.tolist()


def test_rejects_float64_arrays():
    with pytest.raises(ProtocolError, match="int64, int32, int16, float32 or uint8, got float64"):
        encode(Message(Op.PULL, 1, {}, [np.zeros(3)]))


def _header(version=VERSION, op=1, meta=b"{}", magic=MAGIC):
    return HEADER.pack(magic, version, op, 0, 0, 7, len(meta)) + meta


@pytest.mark.parametrize("frames, match", [
    ([], "empty message"),
    ([b"xx"], "header frame of 2 bytes"),
    ([_header(magic=b"NOPE")], "bad magic"),
    ([_header(op=99)], "unknown op 99"),
    ([_header(meta=b"{not json")], "not JSON"),
    ([_header(meta=b"[1]")], "JSON object"),
    ([_header(meta=b'{"arrays": [["i8", [2]]]}')], "carries 0"),
    ([_header(meta=b'{"arrays": [["i8", [2]]]}'), b"123"], "needs 16"),
    ([_header(meta=b'{"arrays": [["f8", [1]]]}'), b"12345678"], "spec"),
])
def test_malformed_messages_raise_protocol_error(frames, match):
    with pytest.raises(ProtocolError, match=match):
        decode(frames)


def test_version_mismatch_is_named():
    with pytest.raises(VersionError, match=f"protocol version {VERSION + 1}: this side speaks version {VERSION}"):
        decode([_header(version=VERSION + 1)])


def test_shard_answers_malformed_requests_with_errors_and_keeps_serving():
    shard = Shard(ShardConfig((TableConfig("t", rows=10, dim=2),)))
    for bad in ([b"garbage"], [_header(version=VERSION + 1)], [_header(meta=b'{"arrays": 5}')]):
        reply = decode(shard.handle_frames(bad))
        assert reply.status == ERROR and reply.meta["error"]
    bad_key = decode(shard.handle_frames(encode(Message(Op.PULL, 3, {"table": "t"}, [np.array([10])]))))
    assert bad_key.status == ERROR and "key 10 out of range for table 't' with 10 rows" in bad_key.meta["error"]
    good = decode(shard.handle_frames(encode(Message(Op.PULL, 4, {"table": "t"}, [np.array([9])]))))
    assert good.status == 0 and good.request_id == 4 and good.arrays[0].shape == (1, 2)
    assert shard.stats["errors"] == 4


@pytest.mark.parametrize("values, code", [
    ([], "uint8"), ([0, 255], "uint8"), ([256], "int16"), ([-1, 0], "int16"), ([-(1 << 15), (1 << 15) - 1], "int16"),
    ([1 << 15], "int32"), ([-1, (1 << 31) - 1], "int32"), ([1 << 31], "int64"), ([-(1 << 31) - 1], "int64")])
def test_integers_travel_in_the_narrowest_type_that_holds_them(values, code):
    for array in (np.array(values, np.int64), torch.tensor(values, dtype=torch.int64)):
        out = narrow(array)
        assert str(out.dtype).removeprefix("torch.") == code
        assert widen(np.asarray(out), "clocks").tolist() == list(values)  # and come back exact


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-1, 1 << 62), max_size=40))
def test_narrow_then_widen_is_the_identity(values):
    sent = decode(encode(Message(Op.SYNC, 1, {}, [narrow(np.array(values, np.int64))]))).arrays[0]
    assert widen(sent, "clocks").tolist() == values and widen(sent, "clocks").dtype == np.int64


def test_widen_refuses_what_is_not_an_integer_array_of_the_wire():
    for bad in (np.array([1.0], np.float32), np.array([1], np.uint16)):
        with pytest.raises(ValueError, match=f"counts must be integers \\(uint8, int16, int32, int64\\), got {bad.dtype}"):
            widen(bad, "counts")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.integers(-(1 << 40), 1 << 40), st.integers(-(1 << 63), (1 << 63) - 1)),
                min_size=2, max_size=60, unique=True), st.booleans())
def test_ascending_keys_travel_as_narrow_steps_and_come_back_exact(keys, wide):
    keys = sorted(keys)
    fits32 = -(1 << 31) <= keys[0] and keys[-1] < 1 << 31
    array = np.array(keys, np.int32 if fits32 and not wide else np.int64)
    coded = delta_keys(array)
    if coded is None:  # only when the steps (as Python ints: none wraps) take as many bytes as the keys
        longest = max(b - a for a, b in zip(keys, keys[1:]))
        assert next(w for w, top in ((1, 255), (2, 32767), (4, 2**31 - 1), (8, 2**64)) if longest <= top) \
            >= array.itemsize
        return
    keys = array
    steps, first = coded
    assert steps.itemsize < keys.itemsize and steps[0] == 0
    sent = decode(encode(Message(Op.SYNC, 1, {"deltas": {"0": first}}, [steps]))).arrays[0]
    assert undelta_keys(sent, first, 1 << 18).tolist() == keys.tolist()


def test_keys_out_of_order_are_sent_as_they_are():
    assert delta_keys(np.array([3, 3, 9], np.int32)) is None and delta_keys(np.array([7], np.int32)) is None
    # descending int64 keys whose difference wraps past 2^63 are out of order too, not a step of 1
    assert delta_keys(np.array([2**63 - 1, -2**63], np.int64)) is None
    steps, first = delta_keys(np.array([-2**63, 2**63 - 1], np.int64)) or (None, None)
    assert steps is None  # a step of 2^64 - 1 is no narrower than the keys


@pytest.mark.parametrize("steps, first, match", [
    (np.array([0, 2], np.int64), 5, "at most 4 bytes"), (np.array([[0, 2]], np.int16), 5, "1-D array"),
    (np.array([1, 2], np.int16), 5, "0 first"), (np.array([0, 0], np.int16), 5, "steps of at least 1"),
    (np.array([0, -3], np.int16), 5, "steps of at least 1"), (np.array([0, 9], np.uint8), 1.5, "must be an int64"),
    (np.array([0, 9], np.uint8), (1 << 63) - 3, "pass the largest int64"), (np.zeros(5, np.uint8), 0, "1 to 4")])
def test_malformed_delta_coded_keys_are_refused_by_name(steps, first, match):
    with pytest.raises(ValueError, match=match):
        undelta_keys(steps, first, 4)
