import numpy as np
import pytest

from het.config import ShardConfig, TableConfig
from het.ps.protocol import (ERROR, MAGIC, VERSION, Message, Op, ProtocolError, VersionError, _HEADER, decode,
                             encode)
from het.ps.shard import Shard


def test_round_trip_keeps_arrays_and_meta():
    keys = np.array([1, 2**40 + 3, 2**62], dtype=np.int64)  # ids far above 2^24 stay exact
    rows = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    msg = decode(encode(Message(Op.PUSH, 42, {"table": "t", "step": 9}, [keys, rows])))
    assert (msg.op, msg.request_id, msg.meta) == (Op.PUSH, 42, {"table": "t", "step": 9})
    assert msg.arrays[0].tolist() == keys.tolist()
    assert np.array_equal(msg.arrays[1], rows)


def test_rejects_float64_arrays():
    with pytest.raises(ProtocolError, match="int64, int32, int16, float32 or uint8, got float64"):
        encode(Message(Op.PULL, 1, {}, [np.zeros(3)]))


def _header(version=VERSION, op=1, meta=b"{}", magic=MAGIC):
    return _HEADER.pack(magic, version, op, 0, 0, 7, len(meta)) + meta


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
