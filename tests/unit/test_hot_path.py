"""The shard's short path for hot requests (het.ps.server.hot) against the general path: for any request,
well formed or not, the same reply byte for byte, the same counters, the same tables. Requests are
written in the order of fields het's client writes (the text the native reader reads); each test
runs with hot requests read natively where they can be (``native``), and by Python alone
(``python``)."""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from het import native
from het.config import OptimizerConfig, ShardConfig, TableConfig
from het.ps.protocol.integers import delta_keys
from het.ps.protocol.limits import MAX_CLOCK
from het.ps.protocol.messages import HEADER, Message, Op, encode
from het.ps.server import hot
from het.ps.server.changes import Changes
from het.ps.server.shard import Shard
from het.ps.server.store.fixed import FixedRows

ROWS, DIM = 40, 3
TABLES = (TableConfig("t", rows=ROWS, dim=DIM, optimizer=OptimizerConfig("adagrad", lr=0.5)),
          TableConfig("d", rows=None, dim=DIM, optimizer=OptimizerConfig("sgd", lr=0.5)),
          TableConfig("s", rows=ROWS, dim=DIM, optimizer=OptimizerConfig("sgd", lr=2.0)))
FIXED = ("t", "s")
SESSION = "s" * 32


@pytest.fixture(autouse=True, params=["native", "python"])
def reader(request, monkeypatch):
    """Which reader reads a hot request first: the native one (falling back to Python's), or Python's alone."""
    if request.param == "native" and native.ops is None:
        pytest.skip("the native core is not built")
    if request.param == "python":
        monkeypatch.setattr(hot, "read_natively", lambda *args: None)
    return request.param


def _ordered(meta: dict) -> dict:
    """``meta`` in the order of fields het's client writes: ``lazy`` or ``step`` first."""
    first = {k: meta[k] for k in ("lazy", "step") if k in meta}
    return {**first, **{k: v for k, v in meta.items() if k not in first}}


def _pair(**options):
    """Two shards of the same tables: one answering through the short path, one only through the general."""
    cfg = ShardConfig(TABLES, max_keys=16, **options)
    return Shard(cfg), Shard(cfg)


def _general(shard, frames, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(hot, "answer", lambda shard, frames: None)
        return shard.handle_frames(frames)


def _request(op, rid, meta, arrays, nonce):
    return encode(Message(op, rid, {**_ordered(meta), "nonce": nonce}, arrays))


def _same(a, b, fast, general, monkeypatch):
    """Frames ``a`` to the fast shard and ``b`` (the same request, naming the other's nonce) to the
    general one: the same reply bytes. The hot one's reply."""
    got, want = fast.handle_frames(a), _general(general, b, monkeypatch)
    assert [bytes(memoryview(f)) for f in got] == [bytes(memoryview(f)) for f in want]
    return got


def _state(shard):
    out = {}
    for name in FIXED:
        t = shard.tables[name]
        t.build_all()  # every row as a save holds it (a shard builds rows on first touch)
        state = [v.clone() for v in t.optimizer.state.values()]
        out[name] = [t.weight.clone(), t.clocks.clone(), t.touched.clone(), *state]
    return out


def _counters(shard):
    return {k: v for k, v in shard.stats.items() if k != "busy_s"}


def _check_same_shards(fast, general):
    assert _counters(fast) == _counters(general)
    for name in FIXED:
        for x, y in zip(_state(fast)[name], _state(general)[name], strict=True):
            assert torch.equal(x, y)
    assert fast.sessions.applied == general.sessions.applied


def _both(fast, general, op, rid, meta, arrays, monkeypatch):
    return _same(_request(op, rid, meta, arrays, fast.nonce), _request(op, rid, meta, arrays, general.nonce),
                 fast, general, monkeypatch)


def test_the_short_path_answers_a_steps_pull_and_push_as_the_general_path_does(monkeypatch, reader):
    fast, general = _pair()
    answered = []
    answer = hot.answer
    monkeypatch.setattr(hot, "answer", lambda shard, frames: answered.append(answer(shard, frames)) or answered[-1])
    keys = np.array([3, 7, 3, 11], np.int32)
    _both(fast, general, Op.PULL, 1, {"table": "t", "lazy": True, "session": SESSION, "seq": 1}, [keys], monkeypatch)
    grads = np.arange(12, dtype=np.float32).reshape(4, DIM)
    _both(fast, general, Op.PUSH, 2, {"table": "t", "step": 2, "session": SESSION, "seq": 2},
          [keys, grads, np.array([1, 2, 1, 1], np.uint8)], monkeypatch)
    for seq, lazy in ((3, True), (4, False)):
        _both(fast, general, Op.PULL, seq, {"table": "t", "lazy": lazy, "session": SESSION, "seq": seq},
              [keys.astype(np.int64)], monkeypatch)
    # the session's first request went the general way; the short path read every one after it
    assert [a is not None for a in answered] == [False, True, True, True]
    if reader == "native":  # in the client's text: every one read natively
        frames = _request(Op.PULL, 9, {"table": "t", "lazy": True, "session": SESSION, "seq": 9}, [keys], fast.nonce)
        assert native.ops.hot_request(frames, fast.nonce, 1 << 62, 1 << 30) is not None
    _check_same_shards(fast, general)


@pytest.mark.parametrize("index, shards", [(0, 1), (1, 2)])
@pytest.mark.parametrize("table", FIXED)
def test_a_fixed_table_reads_a_hot_pull_and_push_from_their_arrays_as_they_travel(monkeypatch, reader, table, index,
                                                                                   shards):
    """With the native core, a fixed float32 table answers the short path's pull and push from
    the request's keys and counts as they came (RowStore.wire_pull, wire_push), not through the
    shard's checked verbs; the replies and tables are the general path's all the same."""
    if native.ops is None:
        pytest.skip("the native core is not built")
    fast, general = _pair(index=index, num_shards=shards)  # keys 3, 7, 11: shard 1's of 2 too
    read = []
    for name in ("wire_pull", "wire_push"):
        monkeypatch.setattr(FixedRows, name, lambda self, *a, _f=getattr(FixedRows, name): read.append(_f(self, *a))
                            or read[-1])
    keys = np.array([3, 7, 3, 11], np.int32)
    for shard in (fast, general):  # the session's first request: the general path's
        shard.handle_frames(_request(Op.PULL, 1, {"table": table, "lazy": True, "session": SESSION, "seq": 1},
                                     [keys], shard.nonce))
    _both(fast, general, Op.PUSH, 2, {"table": table, "step": 1, "session": SESSION, "seq": 2},
          [keys, np.ones((4, DIM), np.float32), np.array([1, 2, 1, 1], np.uint8)], monkeypatch)
    _both(fast, general, Op.PULL, 3, {"table": table, "lazy": True, "session": SESSION, "seq": 3}, [keys],
          monkeypatch)
    assert len(read) == 2 and all(r is not None for r in read)
    _check_same_shards(fast, general)


def test_a_push_past_the_clocks_maximum_is_refused_alike_and_changes_nothing(monkeypatch, reader):
    fast, general = _pair()
    for shard in (fast, general):
        shard.handle_frames(_request(Op.PULL, 1, {"table": "s", "lazy": True, "session": SESSION, "seq": 1},
                                     [np.array([0])], shard.nonce))
        shard.tables["s"].clocks[7] = MAX_CLOCK - 1
    reply = _both(fast, general, Op.PUSH, 2, {"table": "s", "step": 1, "session": SESSION, "seq": 2},
                  [np.array([3, 7], np.int32), np.ones((2, DIM), np.float32), np.array([1, 2], np.uint8)], monkeypatch)
    assert b"refused" in bytes(memoryview(reply[0])) and fast.stats["refused_pushes"] == 1
    assert int(fast.tables["s"].clocks[3]) == 0 and not bool(fast.tables["s"].touched[3])
    _check_same_shards(fast, general)


@pytest.mark.parametrize("held", ["logged", "followed", "budget"])
def test_a_push_logged_followed_or_under_a_budget_goes_to_the_shards_own_push(monkeypatch, reader, tmp_path, held):
    """The short path leaves a push that is logged, whose table's changes a reader follows, or on a
    shard held to a memory budget to Shard.push (which logs it, records its keys, fits the budget)."""
    shard = Shard(ShardConfig(TABLES, max_keys=16, memory=(1 << 30) if held == "budget" else None),
                  state_dir=str(tmp_path), wal=held == "logged")
    if held == "followed":
        shard.changes["s"] = Changes()
    monkeypatch.setattr(FixedRows, "wire_push", lambda *args: pytest.fail("the store was asked"))
    answered, push = [], Shard.push
    monkeypatch.setattr(Shard, "push", lambda self, *a, **k: answered.append("push") or push(self, *a, **k))
    shard.handle_frames(_request(Op.PULL, 1, {"table": "s", "lazy": True, "session": SESSION, "seq": 1},
                                 [np.array([0])], shard.nonce))
    keys = np.array([3, 7], np.int32)
    frames = _request(Op.PUSH, 2, {"table": "s", "step": 1, "session": SESSION, "seq": 2},
                      [keys, np.ones((2, DIM), np.float32), np.array([1, 1], np.uint8)], shard.nonce)
    assert hot.answer(shard, frames) is not None and answered == ["push"]
    assert int(shard.tables["s"].clocks[3]) == 1 and shard.sessions.applied[SESSION] == 2
    if held == "followed":
        assert shard.changes["s"].take(8)[0].tolist() == [3, 7]
    shard.close()


def test_ascending_keys_sent_delta_coded_take_the_short_path(monkeypatch, reader):
    """A client sends ascending keys as the steps between them (a dense table's in mode ps, a
    flush's): the short path decodes them as the general path does, natively where it reads."""
    fast, general = _pair()
    answered = []
    answer = hot.answer
    monkeypatch.setattr(hot, "answer", lambda shard, frames: answered.append(answer(shard, frames)) or answered[-1])
    _both(fast, general, Op.PULL, 1, {"table": "t", "lazy": True, "session": SESSION, "seq": 1}, [np.array([0])],
          monkeypatch)
    steps, first = delta_keys(np.array([2, 5, 6, 30], np.int32))
    pull = {"table": "t", "lazy": False, "session": SESSION, "seq": 2, "deltas": {"0": first}}
    push = {"table": "t", "step": 1, "session": SESSION, "seq": 3, "deltas": {"0": first}}
    grads, counts = np.ones((4, DIM), np.float32), np.array([1, 2, 1, 1], np.uint8)
    _both(fast, general, Op.PUSH, 3, push, [steps, grads, counts], monkeypatch)
    _both(fast, general, Op.PULL, 2, dict(pull, seq=4), [steps], monkeypatch)
    assert [a is not None for a in answered] == [False, True, True]
    _check_same_shards(fast, general)
    if reader == "native":
        read = hot.read_natively(_request(Op.PULL, 5, dict(pull, seq=5), [steps], fast.nonce), fast.nonce, 1 << 30)
        assert read is not None and read[7] == first and read[6][0].dtype == steps.dtype


# -- any request: well formed, or not in one of many ways ----------------------------------------
_MUTATIONS = ("none", "extra_field", "lazy_int", "seq_bool", "seq_zero", "step_float", "nonce", "short_frame",
              "wrong_dim", "f8_grads", "unknown_table", "dynamic_table", "nan", "negative_count", "too_many_keys",
              "key_out_of_range", "again", "new_session", "op_sync", "deltas", "long_frame", "delta_coded", "overflow",
              "count_past_most", "other_shard", "negative_key", "key_past_int32", "counts_i4")


@st.composite
def _requests(draw, shards: int = 1, index: int = 0):
    """Requests to shard ``index`` of ``shards``, to either fixed table: their keys that shard's."""
    out = []
    for rid in range(1, draw(st.integers(2, 12)) + 1):
        op = draw(st.sampled_from((Op.PULL, Op.PUSH)))
        keys = np.array(draw(st.lists(st.integers(0, (ROWS - 1 - index) // shards), min_size=0, max_size=8)),
                        dtype=draw(st.sampled_from((np.int32, np.int64)))) * shards + index
        mutation = draw(st.sampled_from(_MUTATIONS)) if draw(st.booleans()) else "none"
        extra = {"lazy": draw(st.booleans())} if op == Op.PULL else {"step": draw(st.integers(1, 5))}
        counts = np.array(draw(st.lists(st.integers(0, 300), min_size=len(keys), max_size=len(keys))), np.int64)
        grads = np.array(draw(st.lists(st.floats(-2, 2, width=32), min_size=len(keys) * DIM,
                                       max_size=len(keys) * DIM)), np.float32).reshape(len(keys), DIM)
        extra["table"] = draw(st.sampled_from(FIXED))
        out.append((op, rid, keys, extra, counts, grads, mutation))
    return out


def _frames(op, rid, keys, extra, counts, grads, mutation, nonce, seq):
    meta = {"session": SESSION, "seq": seq, **extra}
    narrow = counts.astype(np.uint8) if counts.size and counts.max() < 256 else counts.astype(np.int16)
    arrays = [keys] if op == Op.PULL else [keys, grads, narrow]
    if mutation == "extra_field":
        meta["part"] = 1
    elif mutation == "lazy_int":
        meta["lazy"] = 1
    elif mutation == "seq_bool":
        meta["seq"] = True
    elif mutation == "seq_zero":
        meta["seq"] = 0
    elif mutation == "step_float":
        meta["step"] = 1.0
    elif mutation == "nonce":
        nonce = "0" * 32
    elif mutation == "wrong_dim" and op == Op.PUSH:
        arrays[1] = np.zeros((len(keys), DIM + 1), np.float32)
    elif mutation == "f8_grads" and op == Op.PUSH:
        arrays[1] = grads.astype(np.int64)
    elif mutation in ("unknown_table", "dynamic_table"):
        meta["table"] = "nope" if mutation == "unknown_table" else "d"
    elif mutation == "nan" and op == Op.PUSH and len(keys):
        arrays[1] = grads.copy()
        arrays[1][0, 0] = np.nan
    elif mutation == "negative_count" and op == Op.PUSH and len(keys):
        arrays[2] = -np.ones(len(keys), np.int16)
    elif mutation == "count_past_most" and op == Op.PUSH and len(keys):
        arrays[2] = np.full(len(keys), (1 << 31) + 1, np.int64)
    elif mutation == "overflow" and op == Op.PUSH and len(keys):  # finite gradients, a result that is not
        arrays[1] = np.full_like(grads, 3e38)
    elif mutation == "other_shard" and len(keys):
        arrays[0] = keys.copy()
        arrays[0][0] += 1
    elif mutation == "negative_key" and len(keys):
        arrays[0] = keys.copy()
        arrays[0][0] = -1
    elif mutation == "key_past_int32" and len(keys):
        arrays[0] = keys.astype(np.int64)
        arrays[0][-1] = (1 << 32) + int(keys[-1])
    elif mutation == "counts_i4" and op == Op.PUSH:
        arrays[2] = counts.astype(np.int32)
    elif mutation == "too_many_keys":
        arrays[0] = np.zeros(17, keys.dtype)
        if op == Op.PUSH:
            arrays[1:] = [np.zeros((17, DIM), np.float32), np.ones(17, np.uint8)]
    elif mutation == "key_out_of_range" and len(keys):
        arrays[0] = keys.copy()
        arrays[0][-1] = ROWS
    elif mutation == "again":
        meta["seq"] = 1
    elif mutation == "new_session":
        meta["session"] = "n" * 20 + str(seq).rjust(12, "0")
    elif mutation == "deltas" and len(keys) > 1:
        meta["deltas"] = {"0": 0}
    elif mutation == "delta_coded" and len(np.unique(keys)) == len(keys) > 1:  # as a client sends ascending keys
        arrays[0], first = delta_keys(np.sort(keys))
        meta["deltas"] = {"0": first}
    frames = encode(Message(Op.SYNC if mutation == "op_sync" else op, rid, {**_ordered(meta), "nonce": nonce}, arrays))
    if mutation == "short_frame" and len(frames) > 1 and len(frames[1]):
        frames[1] = bytes(memoryview(frames[1]))[:-1]
    elif mutation == "long_frame":
        frames[-1] = bytes(memoryview(frames[-1])) + b"\0"
    return frames


@pytest.mark.parametrize("index, shards", [(0, 1), (1, 2)])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_request_gets_the_general_paths_reply_and_leaves_the_same_tables(data, index, shards):
    requests = data.draw(_requests(shards, index))
    fast, general = _pair(index=index, num_shards=shards)
    with pytest.MonkeyPatch.context() as monkeypatch:
        seq = 1
        for shard in (fast, general):  # the session's first request: the general path's, on both
            shard.handle_frames(_request(Op.PULL, 99, {"table": "t", "lazy": True, "session": SESSION, "seq": 1},
                                         [np.array([0])], shard.nonce))
        for op, rid, keys, extra, counts, grads, mutation in requests:
            seq += 1
            a, b = (_frames(op, rid, keys, extra, counts, grads, mutation, s.nonce, seq) for s in (fast, general))
            _same(a, b, fast, general, monkeypatch)
        _check_same_shards(fast, general)


def test_a_request_past_the_shards_message_limit_is_left_to_the_general_path(monkeypatch):
    fast, general = _pair()  # max_keys 16: messages of about 64 KiB at most
    for shard in (fast, general):
        shard.handle_frames(_request(Op.PULL, 1, {"table": "t", "lazy": True, "session": SESSION, "seq": 1},
                                     [np.array([0])], shard.nonce))
    keys = np.zeros(20_000, dtype=np.int64)
    meta = {"table": "t", "lazy": True, "session": SESSION, "seq": 2}
    assert hot.answer(fast, _request(Op.PULL, 2, meta, [keys], fast.nonce)) is None
    reply = _both(fast, general, Op.PULL, 2, meta, [keys], monkeypatch)
    assert b"MessageTooLarge" in bytes(memoryview(reply[0]))
    assert hot.answer(fast, _request(Op.PULL, 3, dict(meta, seq=3), [keys[:2]], fast.nonce)) is not None


def test_a_signed_shard_answers_through_the_general_path_only(monkeypatch):
    cfg = ShardConfig(TABLES)
    shard = Shard(cfg, secret=b"k" * 32)
    called = []
    monkeypatch.setattr(hot, "answer", lambda shard, frames: called.append(1))
    shard.handle_frames(encode(Message(Op.INFO, 1), b"k" * 32))
    assert not called


_EDIT = st.tuples(st.integers(0, 200), st.integers(0, 3), st.text(alphabet='0123456789[]{}",:ftrueals -i8', max_size=3))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(op=st.sampled_from([Op.PULL, Op.PUSH]), n=st.integers(0, 6), key=st.sampled_from([np.int32, np.int64]),
       count=st.sampled_from([np.uint8, np.int16, np.int32, np.int64]), lazy=st.booleans(),
       step=st.integers(1, 1 << 62), seq=st.integers(1, 1 << 62), edit=st.one_of(st.none(), _EDIT),
       first=st.one_of(st.none(), st.integers(-(1 << 63), (1 << 63) - 1)))
def test_the_native_reader_reads_a_request_as_the_python_reader_or_leaves_it(reader, op, n, key, count, lazy, step,
                                                                             seq, edit, first):
    """Requests in the text het's client writes, and that text edited anywhere (its meta length
    kept true): the native reader reads the client's text, and reads nothing the Python reader
    does not read the same (else it leaves the request to it)."""
    if reader == "python":
        pytest.skip("the native reader against the Python one: once")
    shard = Shard(ShardConfig(TABLES))
    meta = {"table": "t", "session": SESSION, "seq": seq, **({"lazy": lazy} if op == Op.PULL else {"step": step})}
    keys = np.arange(n, dtype=key)
    if first is not None:  # delta-coded: the steps between the keys, from the first
        keys = np.minimum(keys, 1).astype({np.int32: np.int16, np.int64: np.uint8}[key])
        meta["deltas"] = {"0": first}
    arrays = [keys] if op == Op.PULL else [keys, np.ones((n, DIM), np.float32), np.arange(n, dtype=count)]
    frames = [bytes(memoryview(f)) for f in _request(op, 5, meta, arrays, shard.nonce)]
    if edit is not None:
        at, cut, text = edit
        head = frames[0][HEADER.size:].decode()
        head = (head[:at] + text + head[at + cut:]).encode()
        frames[0] = HEADER.pack(*HEADER.unpack_from(frames[0])[:6], len(head)) + head
    limit = shard.cfg.max_message_bytes
    got, want = hot.read_natively(frames, shard.nonce, limit), hot._read(shard, frames, limit)
    if edit is None:
        assert got is not None
    if got is None:
        return
    assert want is not None and got[:6] == want[:6] and type(got[5]) is type(want[5]) and got[7] == want[7]
    assert len(got[6]) == len(want[6])
    for a, b in zip(got[6], want[6]):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b) and a.flags.writeable


@pytest.mark.parametrize("shape", ["[1099511627776,1099511627776]", "[4,1099511627777]", "[9223372036854775807,2]"])
def test_a_spec_of_sizes_whose_product_passes_int64_is_left_to_the_general_path(reader, shape):
    """Sizes whose product would overflow: neither reader takes the request (no wrapped product
    may match a frame's size)."""
    shard = Shard(ShardConfig(TABLES))
    meta = {"table": "t", "session": SESSION, "seq": 2, "step": 1}
    frames = [bytes(memoryview(f)) for f in _request(Op.PUSH, 5, meta, [np.arange(4, dtype=np.int32),
                                                                       np.ones((4, DIM), np.float32),
                                                                       np.ones(4, np.uint8)], shard.nonce)]
    head = frames[0][HEADER.size:].decode().replace(f'["f4",[4,{DIM}]]', f'["f4",{shape}]').encode()
    frames[0] = HEADER.pack(*HEADER.unpack_from(frames[0])[:6], len(head)) + head
    limit = shard.cfg.max_message_bytes
    assert hot.read_natively(frames, shard.nonce, limit) is None and hot._read(shard, frames, limit) is None
