"""A shard trusts nothing in a request (issue 11): every field is checked before anything
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
from het.ps import limits
from het.ps.wire.protocol import ERROR, Message, Op, decode, encode
from het.ps.shard import Shard

DIM = 4


def shard(optimizer: str = "adagrad") -> Shard:
    table = TableConfig("t", rows=32, dim=DIM, optimizer=OptimizerConfig(optimizer, lr=0.1))
    s = Shard(ShardConfig((table,)))
    keys = np.arange(0, 32, 3, dtype=np.int64)  # some history, so state is not all zeros
    s.push("t", keys, np.full((len(keys), DIM), 0.5, np.float32), np.ones(len(keys), np.int64))
    return s


def state(s: Shard) -> dict:
    t = s.tables["t"]
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
    reply = s.handle(request(op, {"step": step, "bound": 0}, arrays))
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


@pytest.mark.parametrize("meta, message", [({"lazy": 1}, "meta['lazy']"), ({"table": 5}, "meta['table']"),
                                           ({"grads": "fp8"}, "meta['grads']")])
def test_other_fields_of_another_type_are_refused(meta, message):
    s = shard()
    before = state(s)
    reply = s.handle(Message(Op.PUSH, 1, {"table": "t", **meta}, push_arrays()))
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
    from het.ps.wire.transport import tcp_address

    with pytest.raises(ValueError, match="expected an address 'host:port'"):
        tcp_address(address)
