"""A shard trusts nothing in a request: every field is checked before anything
changes, values out of range are refused, types are strict, and a refusal leaves the rows,
clocks, marks and optimizer state exactly as they were."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from het.config import OptimizerConfig, ShardConfig, TableConfig
from het.ps.local import local_client
from het.ps.protocol import limits
from het.ps.protocol.messages import ERROR, Message, Op, decode, encode
from het.ps.server.shard import Shard

DIM = 4


def shard(optimizer: str = "adagrad") -> Shard:
    table = TableConfig("t", rows=32, dim=DIM, optimizer=OptimizerConfig(optimizer, lr=0.1))
    s = Shard(ShardConfig((table,)))
    keys = np.arange(0, 32, 3, dtype=np.int64)  # some history, so state is not all zeros
    s.push("t", keys, np.full((len(keys), DIM), 0.5, np.float32), np.ones(len(keys), np.int64))
    return s


def state(s: Shard) -> dict:
    t = s.tables["t"]
    t.build_all()  # every row as a save holds it (a shard builds rows on first touch)
    return {"weight": t.weight.clone(), "clocks": t.clocks.clone(), "touched": t.touched.clone(),
            **{n: v.clone() for n, v in t.optimizer.state.items()}}


def assert_unchanged(before: dict, after: dict) -> None:
    for name in before:
        assert torch.equal(before[name], after[name]), f"{name} changed by a refused request"


def push_arrays(n=3, value=0.1):
    return [np.arange(n, dtype=np.int64), np.full((n, DIM), value, np.float32), np.ones(n, np.int64)]


def sync_arrays(n=3):
    return [np.arange(n, dtype=np.int64), np.zeros(n, np.int64)]


def request(op: Op, meta: dict, arrays: list) -> Message:
    return Message(op, 1, {"table": "t", **meta}, arrays)


# -- item 3: a refused request changes nothing ------------------------------------------------

@pytest.mark.parametrize("step", ["1", None, [1], float("inf"), float("nan"), 1.5, -5, 0, True])
@pytest.mark.parametrize("op", [Op.PUSH, Op.PUSH_SYNC])
def test_a_bad_step_is_refused_and_no_clock_moves(op, step):
    s = shard()
    before = state(s)
    arrays = push_arrays() + (sync_arrays() if op is Op.PUSH_SYNC else [])
    reply = s.handle(request(op, {"step": step, **({"bound": 0} if op is Op.PUSH_SYNC else {})}, arrays))
    assert reply.status == ERROR and "meta['step']" in reply.meta["error"]
    assert_unchanged(before, state(s))


@pytest.mark.parametrize("bound", [-1, 1.5, True, "0", [0]])
def test_a_push_sync_with_a_bad_bound_applies_no_push(bound):
    s = shard()
    before = state(s)
    reply = s.handle(request(Op.PUSH_SYNC, {"step": 1, "bound": bound}, push_arrays() + sync_arrays()))
    assert reply.status == ERROR and "meta['bound']" in reply.meta["error"]
    assert_unchanged(before, state(s))


@pytest.mark.parametrize("bound", [-1, 1.5, True])
def test_a_sync_with_a_bad_bound_is_refused(bound):
    reply = shard().handle(request(Op.SYNC, {"bound": bound}, sync_arrays()))
    assert reply.status == ERROR and "meta['bound']" in reply.meta["error"]


# -- item 5: values out of range ---------------------------------------------------------------

@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "adam"])
def test_huge_gradients_on_duplicated_keys_are_refused_not_applied_as_inf(optimizer):
    s = shard(optimizer)
    before = state(s)
    keys = np.full(20, 1, dtype=np.int64)  # 20 x 3e38 (x lr 0.1) overflows float32
    reply = s.handle(request(Op.PUSH, {"step": 1}, [keys, np.full((20, DIM), 3e38, np.float32),
                                                      np.ones(20, np.int64)]))
    assert reply.status == ERROR and "non-finite" in reply.meta["error"]
    assert_unchanged(before, state(s))
    assert bool(torch.isfinite(s.tables["t"].weight).all()) and s.stats["refused_pushes"] == 1


def test_counts_near_2_63_are_refused_and_clocks_never_wrap():
    s = shard("sgd")
    before = state(s)
    huge = np.array([(1 << 63) - 10], dtype=np.int64)
    reply = s.handle(request(Op.PUSH, {}, [np.array([1], np.int64), np.zeros((1, DIM), np.float32), huge]))
    assert reply.status == ERROR and "counts must lie in" in reply.meta["error"]
    assert_unchanged(before, state(s))
    # many pushes of the largest count still stop before the clock limit, and nothing wraps
    s.tables["t"].clocks[1] = limits.MAX_CLOCK - 5
    one = [np.array([1], np.int64), np.zeros((1, DIM), np.float32)]
    assert s.handle(request(Op.PUSH, {}, one + [np.array([5], np.int64)])).status != ERROR
    reply = s.handle(request(Op.PUSH, {}, one + [np.array([1], np.int64)]))
    assert reply.status == ERROR and "clock would pass" in reply.meta["error"]
    assert int(s.tables["t"].clocks[1]) == limits.MAX_CLOCK


def test_clocks_sent_below_minus_one_are_refused():
    reply = shard().handle(request(Op.SYNC, {"bound": 0}, [np.arange(2, dtype=np.int64),
                                                          np.array([-7, 0], np.int64)]))
    assert reply.status == ERROR and "clocks must lie in [-1" in reply.meta["error"]


# -- item 6: strict types on the wire ----------------------------------------------------------

@pytest.mark.parametrize("shape", [[3.0], ["3"], [True], 3, [3, None]])
def test_shapes_of_another_type_than_integers_are_refused(shape):
    frames = encode(Message(Op.PULL, 1, {"table": "t"}, [np.arange(3, dtype=np.int64)]))
    head = bytes(frames[0])
    meta = json.loads(head[20:])
    meta["arrays"][0][1] = shape
    body = json.dumps(meta).encode()
    header = head[:16] + len(body).to_bytes(4, "little")
    reply = decode(shard().handle_frames([header + body, frames[1]]), what="reply")
    assert reply.status == ERROR and "is not [" in reply.meta["error"]


@pytest.mark.parametrize("op, meta", [(Op.PUSH, {"bound": 0}), (Op.PUSH, {"lazy": True}), (Op.PUSH, {"hint": 1})])
def test_a_field_its_op_does_not_declare_is_refused_naming_it(op, meta):
    """A field a PUSH does not take (a sync's bound, a read's lazy, one of no op) would be
    ignored by a shard that reads only its own: refused whole, nothing changed."""
    s = shard()
    before = state(s)
    reply = s.handle(request(op, meta, push_arrays()))
    name = next(iter(meta))
    assert reply.status == ERROR and f"a PUSH request has no field {name!r}" in reply.meta["error"]
    assert_unchanged(before, state(s))


@pytest.mark.parametrize("meta, message", [({"lazy": 1}, "meta['lazy']"), ({"table": 5}, "meta['table']"),
                                           ({"grads": "fp8"}, "meta['grads']")])
def test_other_fields_of_another_type_are_refused(meta, message):
    s = shard()
    before = state(s)
    reply = s.handle(Message(Op.PUSH_SYNC, 1, {"table": "t", "bound": 0, **meta}, push_arrays() + sync_arrays()))
    assert reply.status == ERROR and message in reply.meta["error"]
    assert_unchanged(before, state(s))


# -- the property: whatever is mutated, a refusal changes nothing -------------------------------

BAD_VALUES = st.sampled_from([None, True, -1, 1.5, float("nan"), "x", [1], {"a": 1}, 1 << 70, -(1 << 40)])
FIELDS = st.sampled_from(["table", "step", "bound", "lazy", "grads"])


def mutated_array(draw, a: np.ndarray) -> np.ndarray:
    kind = draw(st.sampled_from(["dtype", "shape", "value", "none"]))
    if kind == "dtype":
        return a.astype(draw(st.sampled_from([np.int32, np.float32, np.int16, np.uint8, np.int64])))
    if kind == "shape":
        return a.reshape(-1)[: max(0, a.size - draw(st.integers(1, 2)))] if a.size else np.zeros(2, a.dtype)
    if kind == "value" and a.size:
        out = a.copy()
        flat = out.reshape(-1)
        flat[draw(st.integers(0, flat.size - 1))] = draw(st.sampled_from(
            [-2, 1 << 40, 31, 32, -(1 << 62)] if np.issubdtype(a.dtype, np.integer) else [np.inf, np.nan, 3e38]))
        return out
    return a


@st.composite
def mutated_requests(draw):
    op = draw(st.sampled_from([Op.PULL, Op.PUSH, Op.SYNC, Op.PUSH_SYNC]))
    arrays = {Op.PULL: [np.arange(4, dtype=np.int64)], Op.PUSH: push_arrays(4),
              Op.SYNC: sync_arrays(4), Op.PUSH_SYNC: push_arrays(4) + sync_arrays(4)}[op]
    meta = {"table": "t", "step": 2, "bound": 1, "lazy": draw(st.booleans())}
    for field in draw(st.lists(FIELDS, max_size=2)):
        meta[field] = draw(BAD_VALUES)
    arrays = [mutated_array(draw, a) if draw(st.booleans()) else a for a in arrays]
    if draw(st.booleans()) and arrays:
        arrays = arrays[:-1] if draw(st.booleans()) else arrays + [arrays[0]]
    return op, meta, arrays, draw(st.sampled_from(["sgd", "adagrad", "adam"]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_requests())
def test_every_refusal_leaves_rows_clocks_and_state_unchanged(case):
    op, meta, arrays, optimizer = case
    s = shard(optimizer)
    before = state(s)
    reply = decode(s.handle_frames(encode(Message(op, 9, meta, arrays))), what="reply")
    if reply.status == ERROR:
        assert_unchanged(before, state(s))
    assert all(bool(torch.isfinite(v).all()) for v in state(s).values() if v.is_floating_point())
    # and the shard keeps serving
    ok = s.handle(Message(Op.PULL, 10, {"table": "t"}, [np.arange(2, dtype=np.int64)]))
    assert ok.status != ERROR


# -- item 1: SAVE and LOAD stay inside the shard's state directory ------------------------------

def names_refused(s: Shard, op: Op, name: str) -> str:
    reply = s.handle(Message(op, 1, {"path": name}))
    assert reply.status == ERROR
    return reply.meta["error"]


@pytest.mark.parametrize("op", [Op.SAVE, Op.LOAD])
def test_paths_out_of_the_state_directory_are_refused_and_create_nothing(tmp_path, op):
    root, outside = tmp_path / "state", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret.pt").write_bytes(b"x")
    (root / "out").symlink_to(outside)
    s = Shard(ShardConfig((TableConfig("t", rows=8, dim=2),)), state_dir=str(root))
    for name in (str(outside / "new.pt"), "../outside/new.pt", "a/../../outside/new.pt", "out/new.pt",
                 "out/secret.pt", "./x.pt"):
        error = names_refused(s, op, name)
        assert "refused path" in error
    assert "expected a file path" in names_refused(s, op, "")
    assert sorted(p.name for p in outside.iterdir()) == ["secret.pt"]  # nothing written out there
    assert sorted(p.name for p in root.iterdir()) == ["lock", "out"]    # nor a directory made here
    # what exists outside is not told apart from what does not
    assert names_refused(s, op, "../outside/secret.pt") == names_refused(s, op, "../outside/none.pt").replace(
        "none.pt", "secret.pt")


def test_load_takes_regular_files_only_and_a_fifo_cannot_hang_the_shard(tmp_path):
    s = Shard(ShardConfig((TableConfig("t", rows=8, dim=2),)), state_dir=str(tmp_path))
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "dir").mkdir()
    assert "not a regular file" in names_refused(s, Op.LOAD, "pipe")
    assert "not a regular file" in names_refused(s, Op.LOAD, "dir")
    assert "not a regular file" in names_refused(s, Op.SAVE, "pipe")
    assert "no saved shard" in names_refused(s, Op.LOAD, "missing.pt")
    assert s.handle(Message(Op.SAVE, 2, {"path": "ckpt/shard-0.pt"})).status != ERROR
    assert (tmp_path / "ckpt" / "shard-0.pt").is_file()
    assert s.handle(Message(Op.LOAD, 3, {"path": "ckpt/shard-0.pt"})).status != ERROR


def test_a_shard_without_a_state_directory_saves_and_loads_nothing(tmp_path):
    s = Shard(ShardConfig((TableConfig("t", rows=8, dim=2),)))
    assert "without a state directory" in names_refused(s, Op.SAVE, "x.pt")
    assert "without a state directory" in names_refused(s, Op.LOAD, "x.pt")


@pytest.mark.parametrize("address", ["127.0.0.1:99999", "127.0.0.1:", "127.0.0.1:-1", "nohost"])
def test_a_bind_address_out_of_range_is_refused(address):
    from het.ps.protocol.transport import tcp_address

    with pytest.raises(ValueError, match="expected an address 'host:port'"):
        tcp_address(address)


# -- a message's limits, not only a frame's --------------------------------------------------

def test_a_message_of_many_small_frames_or_too_many_bytes_is_refused_unread():
    s = shard()
    before = state(s)
    frames = encode(Message(Op.PUSH, 7, {"table": "t"}, push_arrays()))
    reply = decode(s.handle_frames(frames + [b"x" * 100] * 2000), what="reply")  # each frame far under the limit
    assert reply.status == ERROR and reply.request_id == 7 and "at most 18 frames" in reply.meta["error"]
    small = Shard(ShardConfig((TableConfig("t", rows=32, dim=DIM),), max_keys=16))
    too_big = [frames[0], *(np.zeros(6000, np.uint8) for _ in range(12))]  # 72 KB in frames of 6 KB
    reply = decode(small.handle_frames(too_big), what="reply")
    assert reply.status == ERROR and f"and {small.cfg.max_message_bytes} bytes" in reply.meta["error"]
    assert_unchanged(before, state(s))
    assert s.handle(Message(Op.PULL, 8, {"table": "t"}, [np.arange(2, dtype=np.int64)])).status != ERROR


# -- a refusal changes nothing, for a push in parts too ----------------------------------------

def overflowing(s: Shard, key: int) -> None:
    """Row ``key`` at 3e38: one more push of -3e38 (x lr 0.1 x 20 duplicates) makes it inf."""
    s.tables["t"].weight[key] = 3e38


@pytest.mark.parametrize("op", [Op.PUSH, Op.PUSH_SYNC])
def test_a_push_in_parts_refused_at_its_last_part_leaves_its_first_unapplied(op):
    s = shard("sgd")
    overflowing(s, 30)
    before = state(s)
    parts = [(np.arange(0, 10, dtype=np.int64), 0.5), (np.full(20, 30, dtype=np.int64), -3e38)]
    replies = []
    for i, (keys, value) in enumerate(parts, 1):
        arrays = [keys, np.full((len(keys), DIM), value, np.float32), np.ones(len(keys), np.int64)]
        meta = {"step": 1, "part": i, "parts": 2, "session": "p" * 16, "seq": i}
        replies.append(s.handle(request(op, meta, arrays + (sync_arrays() if op is Op.PUSH_SYNC else []))))
    assert replies[0].status != ERROR and replies[0].meta.get("staged") == 1
    assert replies[1].status == ERROR and "nothing changed" in replies[1].meta["error"]
    assert_unchanged(before, state(s))


def test_a_client_push_split_at_max_keys_is_applied_whole_or_not_at_all():
    from het.ps.client.client import PSClient
    from het.ps.protocol.messages import PSError
    from het.ps.protocol.transport import LocalTransport

    s = Shard(ShardConfig((TableConfig("t", rows=64, dim=DIM, optimizer=OptimizerConfig("sgd", lr=0.1)),),
                          max_keys=8))
    transport = LocalTransport()
    client = PSClient([transport.connect(transport.bind("s", s))])
    overflowing(s, 63)
    before = state(s)
    keys = torch.cat([torch.arange(20), torch.full((20,), 63)])  # in five parts, the overflow in the last
    grads = torch.cat([torch.full((20, DIM), 0.5), torch.full((20, DIM), -3e38)])
    with pytest.raises(PSError, match="nothing changed"):
        client.wait(client.push("t", keys, grads, torch.ones(40, dtype=torch.int64)))
    assert_unchanged(before, state(s))
    assert client.wait(client.push("t", torch.arange(20), torch.ones(20, DIM), torch.ones(20, dtype=torch.int64))) == 20
    assert s.tables["t"].clocks[:20].tolist() == [1] * 20 and s.parts.held == 0


def test_a_push_refused_counts_no_sighting_for_admission():
    table = TableConfig("t", rows=None, dim=DIM, optimizer=OptimizerConfig("sgd", lr=0.1), admit_after=2)
    s = Shard(ShardConfig((table,)))
    one = np.ones((1, DIM), np.float32)
    for _ in range(2):  # key 5 stored, then its row set to overflow
        s.push("t", np.array([5]), one, np.ones(1, np.int64))
    slot = s.tables["t"].locate(torch.tensor([5]))[0, 1]
    s.tables["t"].store.scatter(slot.reshape(1), torch.full((1, DIM), 3e38), None)
    keys = np.array([5] * 20 + [9])  # key 9 new: a sighting, were the push applied
    reply = s.handle(request(Op.PUSH, {}, [keys, np.vstack([np.full((20, DIM), -3e38, np.float32), one]),
                                          np.ones(21, np.int64)]))
    assert reply.status == ERROR and "nothing changed" in reply.meta["error"]
    s.push("t", np.array([9]), one, np.ones(1, np.int64))  # its first sighting: not admitted yet
    # dropped: key 5's first push and key 9's, not the refused push's
    assert s.tables["t"].stats()["rows"] == 1 and s.tables["t"].counters["refused_updates"] == 2


def test_counts_and_clocks_must_be_integers_not_truncated():
    from het.ps.client.client import PSClient

    client = local_client([TableConfig("t", rows=8, dim=DIM)])
    with pytest.raises(TypeError, match="counts must be integers, got torch.float32"):
        client.push("t", torch.tensor([1]), torch.ones(1, DIM), torch.tensor([1.5]))
    with pytest.raises(TypeError, match="clocks must be integers, got torch.float64"):
        client.sync("t", torch.tensor([1]), torch.tensor([0.5], dtype=torch.float64), bound=0)
    assert client.wait(client.pull("t", torch.tensor([1])))[1].tolist() == [0]


def test_a_refused_push_records_no_key_as_changed():
    from het.ps.client.client import PSClient
    from het.ps.protocol.messages import PSError
    from het.ps.protocol.transport import LocalTransport

    s = shard("sgd")
    transport = LocalTransport()
    client = PSClient([transport.connect(transport.bind("s", s))])
    assert list(client.changed("t")) == []  # the record starts
    overflowing(s, 30)
    with pytest.raises(PSError, match="nothing changed"):
        client.wait(client.push("t", torch.tensor([1, 2] + [30] * 20), torch.cat(
            [torch.ones(2, DIM), torch.full((20, DIM), -3e38)]), torch.ones(22, dtype=torch.int64)))
    assert list(client.changed("t")) == []
    client.wait(client.push("t", torch.tensor([4]), torch.ones(1, DIM), torch.ones(1, dtype=torch.int64)))
    assert [keys.tolist() for keys, _, _ in client.changed("t")] == [[4]]
