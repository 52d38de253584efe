"""Shared-secret authentication, with no processes: the MAC frame, the shard's gate, the client's
check of replies, where a secret comes from and which addresses need one."""

import numpy as np
import pytest
import torch

from het.cli import main
from het.config import ShardConfig, TableConfig
from het.ps.client.client import PSClient
from het.ps.protocol.auth import MAC_SIZE, SECRET_ENV, check_bind, is_loopback, load_secret
from het.ps.protocol.messages import (ERROR, OK, SIGNED, AuthError, Message, Op, ProtocolError, PSError, HEADER, decode,
                                  encode)
from het.ps.protocol.transport import LocalTransport
from het.ps.server.process import ServerProcess, _child_env
from het.ps.server.server import ServerThread
from het.ps.server.shard import Shard

SECRET = b"correct horse battery staple"
TABLE = TableConfig("t", rows=16, dim=3)


def signed_push(secret=SECRET):
    keys = np.array([1, 5, 9])
    msg = Message(Op.PUSH, 42, {"table": "t", "step": 3},
                  [keys, np.ones((3, 3), np.float32), np.ones(3, np.int64)])
    return encode(msg, secret)


def flipped(frames, i, byte, bit=0x01):
    out = [bytearray(memoryview(f).cast("B")) for f in frames]
    out[i][byte] ^= bit
    return out


# -- the MAC frame --------------------------------------------------------------------------
def test_signed_round_trip_keeps_everything():
    frames = signed_push()
    assert len(frames) == 5 and len(frames[-1]) == MAC_SIZE
    assert HEADER.unpack_from(frames[0])[4] == SIGNED
    m = decode(frames, SECRET)
    assert (m.op, m.request_id, m.meta, m.status) == (Op.PUSH, 42, {"table": "t", "step": 3}, OK)
    assert [a.tolist() for a in m.arrays] == [[1, 5, 9], [[1.0] * 3] * 3, [1, 1, 1]]


def test_signing_does_not_copy_the_arrays():
    grads = np.ones((1000, 8), np.float32)
    frames = encode(Message(Op.PUSH, 1, {}, [np.arange(1000), grads, np.ones(1000, np.int64)]), SECRET)
    assert frames[2] is grads


def test_unsigned_messages_are_unchanged_and_a_secretless_side_drops_the_mac():
    msg = Message(Op.PULL, 7, {"table": "t"}, [np.arange(3)])
    plain = encode(msg)
    assert len(plain) == 2 and HEADER.unpack_from(plain[0])[4] == 0
    assert decode(signed_push(), None).arrays[0].tolist() == [1, 5, 9]


@pytest.mark.parametrize("frame", range(5))
def test_a_flipped_bit_anywhere_fails(frame):
    frames = signed_push()
    for byte in range(len(memoryview(frames[frame]).cast("B"))):
        bad = flipped(frames, frame, byte)
        with pytest.raises(ProtocolError) as e:
            decode(bad, SECRET)
        if frame > 0 or byte >= 5:  # past magic and version, the MAC is checked before anything
            assert isinstance(e.value, AuthError), (frame, byte, e.value)


def test_frames_cannot_be_re_split():
    header, keys, grads, counts, mac = signed_push()
    raw = [bytes(memoryview(a).cast("B")) for a in (keys, grads, counts)]
    moved = [header, raw[0] + raw[1][:4], raw[1][4:], raw[2], mac]  # same bytes, other boundaries
    with pytest.raises(AuthError, match="bad signature"):
        decode(moved, SECRET)


def test_missing_or_wrong_mac_fails_with_a_clear_message():
    with pytest.raises(AuthError, match="request is not signed: this shard requires a shared secret"):
        decode(encode(Message(Op.INFO, 1)), SECRET)
    with pytest.raises(AuthError, match="reply is not signed: this client requires a shared secret"):
        decode(encode(Message(Op.INFO, 1)), SECRET, what="reply")
    with pytest.raises(AuthError, match=r"bad signature: wrong shared secret\?"):
        decode(signed_push(b"another secret"), SECRET)
    with pytest.raises(AuthError, match="bad signature"):
        decode(signed_push()[:-1], SECRET)  # flag set, MAC frame dropped: the last array is no MAC
    with pytest.raises(ProtocolError, match="no MAC frame"):
        decode(signed_push()[:1], SECRET)


def test_unknown_header_flags_are_refused():
    frames = flipped(encode(Message(Op.INFO, 1)), 0, 7, 0x80)
    with pytest.raises(ProtocolError, match="unknown header flags 0x80"):
        decode(frames)


# -- the shard ------------------------------------------------------------------------------
def test_shard_refuses_and_counts_unauthenticated_requests_and_keeps_serving():
    shard = Shard(ShardConfig((TABLE,)), secret=SECRET)
    for frames in (encode(Message(Op.STOP, 1)), encode(Message(Op.STOP, 2), b"wrong"),
                   flipped(encode(Message(Op.STOP, 3), SECRET), 0, 20)):
        reply = decode(shard.handle_frames(frames))  # unsigned: the sender may not hold the secret
        assert reply.status == ERROR and reply.meta["kind"] == "AuthError"
    assert not shard.stopping, "an unauthenticated STOP must not stop the shard"
    assert shard.stats["unauthenticated"] == 3 and shard.stats["errors"] == 0
    fresh = {"nonce": shard.nonce, "session": "s" * 16, "seq": 1}  # what PSClient adds when it signs
    pull = encode(Message(Op.PULL, 4, {"table": "t", **fresh}, [np.array([2, 3])]), SECRET)
    reply = decode(shard.handle_frames(pull), SECRET, what="reply")  # signed
    assert reply.status == OK and reply.request_id == 4 and reply.arrays[0].shape == (2, 3)
    with pytest.raises(AuthError):
        decode(shard.handle_frames(pull), b"wrong", what="reply")


def test_shard_without_a_secret_counts_no_unauthenticated_requests():
    shard = Shard(ShardConfig((TABLE,)))
    assert decode(shard.handle_frames(encode(Message(Op.INFO, 1)))).status == OK
    assert shard.stats_dict()["unauthenticated"] == 0


@pytest.mark.parametrize("secret, error", [("text", TypeError), (b"", ValueError)])
def test_a_secret_must_be_non_empty_bytes(secret, error):
    with pytest.raises(error, match="secret"):
        Shard(ShardConfig((TABLE,)), secret=secret)


# -- the client -----------------------------------------------------------------------------
def local_client(shard_secret, client_secret):
    transport = LocalTransport()
    name = transport.bind("local-0", Shard(ShardConfig((TABLE,)), secret=shard_secret))
    return PSClient([transport.connect(name)], secret=client_secret), transport.shards[name]


def test_client_with_the_secret_works():
    client, shard = local_client(SECRET, SECRET)
    keys = torch.tensor([1, 4])
    client.wait(client.push("t", keys, torch.ones(2, 3), torch.ones(2, dtype=torch.int64)))
    assert client.wait(client.pull("t", keys))[1].tolist() == [1, 1]
    assert shard.stats["unauthenticated"] == 0


@pytest.mark.parametrize("secret, says", [(None, "not signed"), (b"wrong", "bad signature")])
def test_client_without_the_secret_gets_the_shards_refusal(secret, says):
    with pytest.raises(PSError, match=f"AuthError: .*{says}"):
        local_client(SECRET, secret)


def test_client_with_a_secret_refuses_unsigned_replies():
    with pytest.raises(AuthError, match="reply is not signed.*same shared secret"):
        local_client(None, SECRET)


def test_client_refuses_a_reply_with_a_bad_mac():
    client, _ = local_client(SECRET, SECRET)
    channel = client.channels[0]
    send = channel.send

    def tampering_send(frames):
        send(frames)
        reply = channel.replies.pop()
        reply[3][0] ^= 0x01  # a bit of the first built mark (an untouched row: no row or clock is sent)
        channel.replies.append(reply)

    channel.send = tampering_send
    with pytest.raises(AuthError, match="PS shard 0 .*bad signature"):
        client.wait(client.pull("t", torch.tensor([1])))


# -- where a secret comes from, and where it is needed ---------------------------------------
def test_load_secret_from_a_file_or_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    assert load_secret(None) is None
    f = tmp_path / "secret"
    f.write_bytes(b"\x00\xffbinary\n")
    assert load_secret(str(f)) == b"\x00\xffbinary"
    monkeypatch.setenv(SECRET_ENV, "from-env")
    assert load_secret(None) == b"from-env"
    assert load_secret(str(f)) == b"\x00\xffbinary", "a file given wins over the environment"


def test_empty_or_missing_secrets_are_errors(tmp_path, monkeypatch):
    empty = tmp_path / "empty"
    empty.write_bytes(b"\n")
    with pytest.raises(ValueError, match="empty secret"):
        load_secret(str(empty))
    with pytest.raises(ValueError, match="cannot read the secret file"):
        load_secret(str(tmp_path / "absent"))
    monkeypatch.setenv(SECRET_ENV, "")
    with pytest.raises(ValueError, match=f"{SECRET_ENV} holds an empty secret"):
        load_secret(None)


@pytest.mark.parametrize("address, loopback", [
    ("127.0.0.1:5555", True), ("localhost:1", True), ("[::1]:0", True), ("tcp://127.0.0.1:0", True),
    ("127.0.0.2:5555", True), ("ipc:///tmp/shard", True), ("0.0.0.0:5555", False), ("*:5555", False),
    ("10.1.2.3:5555", False), ("tcp://[::]:1", False), ("eth0:5555", False), ("example.com:1", False)])
def test_loopback_addresses(address, loopback):
    assert is_loopback(address) is loopback


def test_binding_beyond_loopback_needs_a_secret():
    check_bind("0.0.0.0:5555", SECRET)
    cfg = ShardConfig((TABLE,))
    for start in (ServerThread, ServerProcess):  # refused before any socket or process exists
        with pytest.raises(ValueError, match="'0.0.0.0:0'.*--secret-file PATH or the environment variable HET_SECRET"):
            start(cfg, bind="0.0.0.0:0")


def test_het_serve_refuses_an_empty_secret_file(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    with pytest.raises(SystemExit) as e:
        main(["serve", "--secret-file", str(empty), "--table", "t:8:2", "--bind", "0.0.0.0:0"])
    assert e.value.code == 2 and "empty secret" in capsys.readouterr().err


def test_server_process_passes_the_secret_in_the_environment_only(monkeypatch):
    monkeypatch.setenv(SECRET_ENV, "inherited")
    assert SECRET_ENV not in _child_env(None), "secret=None must not pass on this process's secret"
    assert _child_env(b"\xffk")[SECRET_ENV].encode("utf-8", "surrogateescape") == b"\xffk"


# -- replay -------------------------------------------------------------------------------

class Recording:
    """A channel that keeps a copy of every request it carries (what an eavesdropper captures)."""

    def __init__(self, inner):
        self.inner, self.sent = inner, []

    def send(self, frames):
        self.sent.append([bytes(memoryview(f)) for f in frames])
        self.inner.send(frames)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def recorded_client(shard: Shard):
    from het.ps.client.client import PSClient
    from het.ps.protocol.transport import LocalTransport

    transport = LocalTransport()
    channel = Recording(transport.connect(transport.bind("s", shard)))
    return PSClient([channel], secret=SECRET), channel


def test_a_replayed_signed_push_is_refused_counted_and_changes_nothing():
    shard = Shard(ShardConfig((TABLE,)), secret=SECRET)
    client, channel = recorded_client(shard)
    client.wait(client.push("t", torch.tensor([2]), torch.ones(1, 3), torch.ones(1, dtype=torch.int64)))
    push = channel.sent[-1]
    shard.tables["t"].build_all()  # every row's value (a shard builds rows on first touch)
    weight, clocks = shard.tables["t"].weight.clone(), shard.tables["t"].clocks.clone()
    for _ in range(3):
        reply = decode(shard.handle_frames(push), SECRET, what="reply")
        assert reply.status == ERROR and "replayed request" in reply.meta["error"]
    assert torch.equal(shard.tables["t"].weight, weight) and torch.equal(shard.tables["t"].clocks, clocks)
    assert shard.stats["replays"] == 3
    # the client carries on: its next requests are fresh
    assert client.wait(client.pull("t", torch.tensor([2])))[1].tolist() == [1]


def test_a_replayed_signed_stop_does_not_stop_the_shard():
    shard = Shard(ShardConfig((TABLE,)), secret=SECRET)
    client, channel = recorded_client(shard)
    client.stop_servers()
    stop = channel.sent[-1]
    shard.stopping = False  # a new run of the shard on the same secret
    reply = decode(shard.handle_frames(stop), SECRET, what="reply")
    assert reply.status == ERROR and not shard.stopping and shard.stats["replays"] == 1


def test_a_capture_from_an_earlier_run_of_the_shard_is_stale():
    first = Shard(ShardConfig((TABLE,)), secret=SECRET)
    client, channel = recorded_client(first)
    client.wait(client.push("t", torch.tensor([1]), torch.ones(1, 3), torch.ones(1, dtype=torch.int64)))
    restarted = Shard(ShardConfig((TABLE,)), secret=SECRET)  # a new incarnation: a new nonce
    reply = decode(restarted.handle_frames(channel.sent[-1]), SECRET, what="reply")
    assert reply.status == ERROR and "nonce" in reply.meta["error"]
    assert int(restarted.tables["t"].clocks[1]) == 0


# -- replies bound to their session --------------------------------------------------------------

def test_a_recorded_reply_is_not_taken_by_another_session_and_a_stale_clock_is_not_believed():
    """Client A's signed reply, recorded, handed to client B as B waits for its own: B's
    request ids are its own (a random start per session), so it drops A's and takes its own."""
    shard = Shard(ShardConfig((TABLE,)), secret=SECRET)
    transport = LocalTransport()
    name = transport.bind("s", shard)
    a_channel, b_channel = transport.connect(name), transport.connect(name)
    a, b = PSClient([a_channel], secret=SECRET), PSClient([b_channel], secret=SECRET)
    handle = a.pull("t", torch.tensor([2]))
    recorded = list(a_channel.replies[-1])  # clock 0
    assert a.wait(handle)[1].tolist() == [0]
    a.wait(a.push("t", torch.tensor([2]), torch.ones(1, 3), torch.ones(1, dtype=torch.int64)))
    handle = b.pull("t", torch.tensor([2]))
    b_channel.replies.appendleft(recorded)  # the replay reaches B first
    assert b.wait(handle)[1].tolist() == [1] and b.link.stray_replies == 1
    assert a.link.next_id() != b.link.next_id()
