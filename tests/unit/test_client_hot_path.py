"""The client's short path for hot requests (het.ps.client.hot) against its general path: for any
pull or push, the same frames on the wire, the same results, the same counts; and for any reply,
well formed or not, the same result or the same error. Each test runs with the requests written
and the replies read natively where they can be (``native``), and by Python alone (``python``)."""

import re
import secrets

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from het import native
from het.config import OptimizerConfig, ShardConfig, TableConfig
from het.ps.client import hot
from het.ps.client.client import PSClient
from het.ps.protocol.messages import HEADER, Message, Op, PSError, ProtocolError, encode
from het.ps.server.shard import Shard

ROWS, DIM = 40, 3
TABLES = (TableConfig("t", rows=ROWS, dim=DIM, optimizer=OptimizerConfig("adagrad", lr=0.5)),
          TableConfig("d", rows=None, dim=DIM, optimizer=OptimizerConfig("sgd", lr=0.5)),
          TableConfig("h", rows=ROWS, dim=DIM, row_dtype="fp16", optimizer=OptimizerConfig("sgd", lr=0.5)))


@pytest.fixture(autouse=True, params=["native", "python"])
def reader(request, monkeypatch):
    """Which writer and reader the short path takes first: the native ones (falling back to
    Python's), or Python's alone."""
    if request.param == "native" and native.ops is None:
        pytest.skip("the native core is not built")
    if request.param == "python":
        monkeypatch.setattr(hot, "read_natively", lambda *args: None)
        monkeypatch.setattr(hot, "write_natively", lambda *args: None)
    return request.param


class _Channel:
    """A channel to an in-process shard that keeps every request's frames as bytes, and whose
    replies a test may replace (``rewrite``: reply frames -> frames) or hold back (``late``:
    kept in ``held`` until a test lets them go)."""

    def __init__(self, shard):
        self.shard, self.address, self.sent, self.replies, self.rewrite = shard, "in-process", [], [], None
        self.late, self.held = False, []

    def send(self, frames) -> None:
        wire = [bytes(memoryview(f)) for f in frames]
        self.sent.append(wire)
        out = [bytes(memoryview(f)) for f in self.shard.handle_frames(wire)]
        (self.held if self.late else self.replies).append(self.rewrite(out) if self.rewrite else out)

    def recv(self, timeout_s):
        if not self.replies:
            raise TimeoutError("no reply pending")
        return self.replies.pop(0)

    def close(self) -> None:
        pass


def _pair(shards: int = 1):
    """Two clients of ``shards`` shards each, alike (the same nonces, session and request ids):
    ``fast`` reads by the short path, ``general`` only by the general one."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(secrets, "token_hex", lambda n=16: "5e" * n)
        m.setattr(secrets, "randbits", lambda k: 1 << 40)
        cfgs = [ShardConfig(TABLES, i, shards, max_keys=64) for i in range(shards)]
        fast, general = (PSClient([_Channel(_renonced(Shard(c), i)) for i, c in enumerate(cfgs)], timeout_s=0.3)
                         for _ in range(2))
    general._hot = None
    assert fast._hot is not None
    return fast, general


def _renonced(shard: Shard, i: int) -> Shard:
    """``shard`` with a nonce of its own among its PS's, the same in both clients' PS."""
    shard.nonce = shard.sessions.nonce = shard.sessions.freshness.nonce = f"{i:02d}" * 16
    return shard


@pytest.fixture(params=[1, 3], ids=["one shard", "three shards"])
def pair(request):
    return _pair(request.param)


def _outcome(client, op, args):
    """What a request and its wait give: the result, or the error's type and text."""
    try:
        handle = getattr(client, op)(*args)
        result = client.wait(handle)
    except (PSError, ProtocolError, ValueError, TimeoutError) as e:
        return type(e).__name__, str(e)
    counted = (handle.request_bytes, handle.push_bytes, handle.reply_bytes, dict(client.bytes))
    if op == "pull":
        return result[0].tolist(), result[0].dtype, result[1].tolist(), result[1].dtype, counted
    return result, counted


def _same(fast, general, op, *args):
    got, want = _outcome(fast, op, args), _outcome(general, op, args)
    assert got == want
    for a, b in zip(fast.channels, general.channels):
        assert a.sent == b.sent  # byte for byte
    return got


def _keys(table: str, draw_keys: list) -> torch.Tensor:
    keys = torch.tensor(draw_keys, dtype=torch.int64)
    return keys * 9_000_000_000_017 if table == "d" else keys  # raw ids past int32 on the dynamic table


_STEP = st.tuples(st.sampled_from(["pull", "push"]), st.sampled_from(["t", "d", "h"]),
                  st.lists(st.integers(0, ROWS - 1), min_size=0, max_size=20), st.booleans(),
                  st.sampled_from(["fp32", "bf16"]), st.integers(1, 3), st.booleans())


@settings(max_examples=60, deadline=None)
@given(shards=st.sampled_from([1, 3]), steps=st.lists(_STEP, min_size=1, max_size=8))
def test_the_short_path_sends_and_reads_what_the_general_path_does(shards, steps):
    """Pulls (lazy or not) and pushes of any keys (none, repeated, ascending: delta-coded, past
    int32, more than one request holds), fp32 or bf16 gradients, counts of any width, on a table of
    float32 rows, one of raw ids and one of half rows (whose replies the short path leaves to the
    general), on one shard or three: the same frames, results and byte counts, and the same
    shards after."""
    fast, general = _pair(shards)
    for op, table, keys, ascending, grad_dtype, count, lazy in steps:
        keys = _keys(table, sorted(set(keys)) if ascending else keys)
        fast.lazy_init = general.lazy_init = lazy
        if op == "pull":
            _same(fast, general, "pull", table, keys)
        else:
            grads = torch.linspace(-1, 1, len(keys) * DIM).reshape(len(keys), DIM)
            counts = torch.full((len(keys),), 300 if count == 3 else count)
            _same(fast, general, "push", table, keys, grads, counts, count, grad_dtype)
    for ours, theirs in zip(fast.channels, general.channels):
        for a, b in zip(ours.shard.tables.values(), theirs.shard.tables.values()):
            assert a.state_dict().keys() == b.state_dict().keys()
            for x, y in zip(a.state_dict().values(), b.state_dict().values()):
                assert type(x) is not torch.Tensor or torch.equal(x, y)


def test_a_step_takes_the_short_path_and_more_keys_than_one_request_the_general(pair, monkeypatch):
    fast, general = pair
    read = []  # every reply a short path read: natively, else by Python's reader
    original, natively = hot.HotPath._read, hot.read_natively
    monkeypatch.setattr(hot.HotPath, "_read", staticmethod(lambda *args: read.append(original(*args)) or read[-1]))

    def counted(*args):
        got = natively(*args)
        if got is not None:
            read.append(got)
        return got

    monkeypatch.setattr(hot, "read_natively", counted)
    keys = torch.tensor([5, 1, 9])  # on three shards, one key each
    _same(fast, general, "push", "t", keys, torch.ones(3, DIM), torch.ones(3, dtype=torch.int64))
    _same(fast, general, "pull", "t", keys)
    assert len(read) == 2 * fast.num_shards and None not in read
    many = torch.arange(ROWS).repeat(6)  # past the shards' max_keys: in parts, by the general path
    _same(fast, general, "pull", "t", many)
    assert len(read) == 2 * fast.num_shards


def _rewrites():
    """Replies made wrong in every way the short path checks: each must come out as the general
    path has it (an error, or the same result read the long way)."""
    def header(**fields):
        def rewrite(frames):
            names = ("magic", "version", "op", "status", "flags", "rid", "meta_len")
            values = dict(zip(names, HEADER.unpack_from(frames[0])))
            values.update({k: (v(values[k]) if callable(v) else v) for k, v in fields.items()})
            return [HEADER.pack(*values.values()) + frames[0][HEADER.size:], *frames[1:]]
        return rewrite

    def meta(text_of):
        def rewrite(frames):
            text = text_of(frames[0][HEADER.size:].decode()).encode()
            head = HEADER.unpack_from(frames[0])
            return [HEADER.pack(*head[:6], len(text)) + text, *frames[1:]]
        return rewrite

    return {
        "as is": lambda f: f,
        "bad magic": header(magic=b"XXXX"),
        "another version": header(version=lambda v: v + 1),
        "another op": header(op=int(Op.INFO)),
        "an error status": header(status=1),
        "signed flag": header(flags=1),
        "another request's id": header(rid=lambda r: r + 7),
        "meta length off": header(meta_len=lambda n: n + 1),
        "short header": lambda f: [f[0][:10], *f[1:]],
        "meta not JSON": meta(lambda t: "{" + t),
        "meta a list": meta(lambda t: "[" + t + "]"),
        "an extra field": meta(lambda t: '{"x":1,' + t[1:]),
        "applied not an int": meta(lambda t: t.replace('"applied":', '"applied":0.5,"y":')),
        "rows of another dtype": meta(lambda t: t.replace('["f4"', '["i4"')),
        "a size a float": meta(lambda t: re.sub(r'\["f4",\[(\d+),', r'["f4",[\1.0,', t)),
        "a size a bool": meta(lambda t: t.replace('["u1",[1]]', '["u1",[true]]')),
        "an empty message": lambda f: [],
        "rows of another shape": meta(lambda t: re.sub(r'\["f4",\[(\d+),(\d+)\]\]', r'["f4",[\2,\1]]', t)),
        "clocks of float": meta(lambda t: t.replace('],["u1",[', '],["f4",[', 1)),
        "a frame short": lambda f: [*f[:-1], f[-1][:-1]] if len(f) > 1 else f,
        "a frame long": lambda f: [*f[:-1], f[-1] + b"\0"] if len(f) > 1 else f,
        "the rows' frame long": lambda f: [f[0], f[1] + b"\0" * 4, *f[2:]] if len(f) > 1 else f,
        "a frame more": lambda f: [*f, b"\0"],
        "a frame less": lambda f: f[:-1] if len(f) > 1 else f,
        "a row marked built": lambda f: [*f[:3], bytes([1]) + f[3][1:]] if len(f) == 4 else f,
    }


@pytest.mark.parametrize("name, rewrite", list(_rewrites().items()))
def test_a_reply_the_short_path_does_not_prove_well_formed_is_read_as_the_general_path_reads_it(pair, name, rewrite):
    fast, general = pair
    keys = torch.tensor([5, 1, 9, 30])
    _same(fast, general, "push", "t", keys, torch.ones(4, DIM), torch.ones(4, dtype=torch.int64))
    for client in pair:
        client.channels[0].rewrite = rewrite
    _same(fast, general, "push", "t", keys, torch.ones(4, DIM), torch.ones(4, dtype=torch.int64))
    _same(fast, general, "pull", "t", keys)
    _same(fast, general, "pull", "t", torch.tensor([2, 5, 7, 8, 30, 31, 32, 33, 34]))  # rows left to build


def test_a_reply_that_came_before_its_wait_is_read_by_the_general_path(pair):
    """Two requests in flight, waited for in the other order: the first reply off the wire is
    the other's, kept; each gives what it gives by the general path."""
    fast, general = pair
    keys = torch.tensor([3, 4])
    outcomes = []
    for client in pair:
        pull = client.pull("t", keys)
        push = client.push("t", keys, torch.ones(2, DIM), torch.ones(2, dtype=torch.int64))
        outcomes.append((client.wait(push), client.wait(pull)[1].tolist(), client.link.stray_replies))
    assert outcomes[0] == outcomes[1] == (2, [0, 0], 0)


def test_half_rows_sent_as_float32_are_refused_as_the_general_path_refuses_them():
    """A table of fp16 rows whose reply claims float32 rows of the right size: the short path,
    which knows the table, leaves it to the general path's refusal."""
    def as_float32(frames):
        head, rows, *rest = frames
        text = head[HEADER.size:].decode().replace('["i2",', '["f4",', 1)
        return [HEADER.pack(*HEADER.unpack_from(head)[:6], len(text)) + text.encode(), bytes(2 * len(rows)), *rest]

    fast, general = _pair()
    keys = torch.tensor([2, 5])
    _same(fast, general, "push", "h", keys, torch.ones(2, DIM), torch.ones(2, dtype=torch.int64))
    for client in (fast, general):
        client.lazy_init = False
        client.channels[0].rewrite = as_float32
    kind, text = _same(fast, general, "pull", "h", keys)
    assert kind == "PSError" and "int16" in text


def test_a_wait_again_after_a_timeout_counts_the_late_reply_stray_as_the_general_path_does():
    fast, general = _pair()
    outcomes = []
    for client in (fast, general):
        channel = client.channels[0]
        channel.late = True
        handle = client.push("t", torch.tensor([1, 2]), torch.ones(2, DIM), torch.ones(2, dtype=torch.int64))
        with pytest.raises(TimeoutError):
            client.wait(handle)
        channel.replies.extend(channel.held)  # the reply comes after its wait gave up
        try:
            outcomes.append(client.wait(handle))
        except TimeoutError as e:
            outcomes.append(("TimeoutError", str(e)))
        outcomes.append(client.link.stray_replies)
    assert outcomes[:2] == outcomes[2:] and outcomes[1] == 1


_EDIT = st.tuples(st.integers(0, 90), st.integers(0, 3), st.text(alphabet='0123456789[]{}",:fiu. -e', max_size=3))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(0, 12), dim=st.integers(1, 4), clock=st.sampled_from(["u1", "i2", "i4", "i8"]),
       marks=st.booleans(), edit=st.one_of(st.none(), _EDIT), op=st.sampled_from([Op.PULL, Op.PUSH]))
def test_the_native_reader_reads_a_reply_as_the_python_reader_or_leaves_it(reader, n, dim, clock, marks, edit, op):
    """Replies in the text a shard writes, and that text edited anywhere (its meta length kept
    true): the native reader reads the shard's text, and reads nothing the Python reader does
    not read the same (else it leaves the reply to it)."""
    if reader == "python":
        pytest.skip("the native reader against the Python one: once")
    table = TableConfig("t", rows=ROWS, dim=dim)
    rid = 77
    if op is Op.PULL:
        clocks = np.arange(n, dtype={"u1": "u1", "i2": "<i2", "i4": "<i4", "i8": "<i8"}[clock])
        arrays = [np.linspace(-1, 1, n * dim, dtype=np.float32).reshape(n, dim), clocks]
        arrays += [np.zeros((n + 7) // 8, np.uint8)] if marks else []
        frames = [bytes(memoryview(f)) for f in encode(Message(op, rid, {}, arrays))]
    else:
        frames = [bytes(memoryview(f)) for f in encode(Message(op, rid, {"applied": n}, []))]
    if edit is not None:
        at, cut, text = edit
        meta = frames[0][HEADER.size:].decode()
        meta = (meta[:at] + text + meta[at + cut:]).encode()
        frames[0] = HEADER.pack(*HEADER.unpack_from(frames[0])[:6], len(meta)) + meta
    got, want = native.ops.hot_reply(frames, op, rid, n, dim), hot.HotPath._read(op, rid, frames, n, table)
    if edit is None:
        assert got is not None  # the shard's own text: read natively
    if got is None:
        return
    assert want is not None
    if op is Op.PUSH:
        assert got == (want.meta["applied"], 0)
    else:
        assert torch.equal(got[0], torch.from_numpy(want.arrays[0].copy()))
        assert got[1].dtype == torch.int64 and torch.equal(got[1], torch.from_numpy(want.arrays[1]).long())
        assert got[2] == sum(a.nbytes for a in want.arrays)


def test_gradients_and_keys_not_contiguous_are_sent_as_the_general_path_sends_them(pair):
    """A transposed gradient tensor and strided keys: the same bytes as the general path's
    (written by the Python writer, which lays them out first)."""
    fast, general = pair
    keys = (torch.arange(8) * 4)[::2]
    grads = torch.arange(4 * DIM, dtype=torch.float32).reshape(DIM, 4).t()
    assert not grads.is_contiguous() and not keys.is_contiguous()
    _same(fast, general, "push", "t", keys, grads, torch.ones(4, dtype=torch.int64))
    _same(fast, general, "pull", "t", keys)
