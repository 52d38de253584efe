"""A shard's write-ahead log: a shard dropped without a save (as kill -9 leaves it) and started
again on its state directory holds exactly what it acknowledged: its last save, and every push
after it, replayed once. A log cut short by a crash is recovered to its last intact record and
new records follow that; a damaged one is refused, naming what would be lost, unless the
operator chooses to recover its prefix; and no damage ever puts a wrong row in the shard."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from het.config import OptimizerConfig, ShardConfig, TableConfig
from het.ps.wire.protocol import ERROR, Message, Op
from het.ps.shard import Shard


def table(optimizer):
    return TableConfig("t", rows=40, dim=3, optimizer=OptimizerConfig(optimizer, lr=0.1))


def state(s: Shard) -> list[torch.Tensor]:
    t = s.tables["t"]
    return [t.weight.clone(), t.clocks.clone(), t.touched.clone(), *(v.clone() for v in t.optimizer.state.values())]


def same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def killed(s: Shard) -> None:
    """What kill -9 leaves of a shard: its files as they are, its claim on the directory let go."""
    s.state.abandon()


def push(s: Shard, rng: np.random.Generator, step: int, bf16: bool = False) -> None:
    keys = rng.integers(0, 40, size=12)  # duplicates included
    grads = rng.normal(size=(12, 3)).astype(np.float32)
    meta = {"table": "t", "step": step}
    if bf16:
        grads, meta["grads"] = torch.from_numpy(grads).bfloat16().view(torch.int16).numpy(), "bf16"
    reply = s.handle(Message(Op.PUSH, step, meta, [keys.astype(np.int64), grads, np.ones(12, np.int64)]))
    assert reply.status != ERROR, reply.meta


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "adam"])
def test_a_shard_dropped_without_a_save_recovers_every_acknowledged_push(tmp_path, optimizer):
    rng = np.random.default_rng(0)
    cfg = ShardConfig((table(optimizer),))
    first = Shard(cfg, state_dir=str(tmp_path), wal=True, fsync_s=10.0)  # no fsync: a kill keeps the page cache
    for step in range(1, 8):
        push(first, rng, step, bf16=step % 3 == 0)
    assert first.handle(Message(Op.SAVE, 90, {"path": "ckpt/shard-0.pt"})).status != ERROR
    for step in range(8, 15):
        push(first, rng, step)
    expected = state(first)  # then the process dies: no close, no save
    killed(first)
    second = Shard(cfg, state_dir=str(tmp_path), wal=True)
    assert same(state(second), expected) and second.stats["wal_replayed"] == 7
    killed(second)  # and a third start replays the same log again, once
    third = Shard(cfg, state_dir=str(tmp_path), wal=True)
    assert same(state(third), expected)


def test_a_torn_record_at_the_end_was_never_acknowledged_and_is_skipped(tmp_path):
    rng = np.random.default_rng(1)
    cfg = ShardConfig((table("adagrad"),))
    s = Shard(cfg, state_dir=str(tmp_path), wal=True)
    for step in range(1, 5):
        push(s, rng, step)
    expected = state(s)
    killed(s)
    with open(tmp_path / "wal" / "log", "ab") as f:
        f.write(b"HWL2\x10\x00\x00\x00\xff\xff")  # a crash in the middle of a write
    again = Shard(cfg, state_dir=str(tmp_path), wal=True)
    assert same(state(again), expected) and "a write cut short at byte" in again.state.notes[-1]


def test_a_load_becomes_the_logs_base(tmp_path):
    rng = np.random.default_rng(2)
    cfg = ShardConfig((table("sgd"),))
    other = Shard(cfg, state_dir=str(tmp_path / "other"))
    push(other, rng, 1)
    other.handle(Message(Op.SAVE, 1, {"path": "s.pt"}))
    os.link(tmp_path / "other" / "s.pt", tmp_path / "given.pt")
    s = Shard(cfg, state_dir=str(tmp_path / "mine"), wal=True)
    push(s, rng, 1)
    os.makedirs(tmp_path / "mine" / "in")
    os.link(tmp_path / "given.pt", tmp_path / "mine" / "in" / "s.pt")
    assert s.handle(Message(Op.LOAD, 2, {"path": "in/s.pt"})).status != ERROR
    push(s, rng, 2)
    expected = state(s)
    killed(s)
    assert same(state(Shard(cfg, state_dir=str(tmp_path / "mine"), wal=True)), expected)


def test_a_log_needs_a_state_directory():
    with pytest.raises(ValueError, match="needs a state directory"):
        Shard(ShardConfig((table("sgd"),)), wal=True)


def test_a_push_sent_again_is_applied_once_across_a_restart(tmp_path):
    cfg = ShardConfig((table("adagrad"),))
    s = Shard(cfg, state_dir=str(tmp_path), wal=True)
    rng = np.random.default_rng(3)

    def request(seq, nonce):
        keys = rng.integers(0, 40, size=5).astype(np.int64)
        grads = rng.normal(size=(5, 3)).astype(np.float32)
        meta = {"table": "t", "step": 1, "session": "c" * 16, "seq": seq, "nonce": nonce}
        return Message(Op.PUSH, seq, meta, [keys, grads, np.ones(5, np.int64)])

    first, second = request(5, s.nonce), request(6, s.nonce)
    assert s.handle(first).status != ERROR
    applied_once = state(s)
    again = s.handle(first)
    assert again.meta == {"applied": 5, "again": True} and same(state(s), applied_once)
    assert s.handle(second).status != ERROR
    expected = state(s)
    killed(s)
    restarted = Shard(cfg, state_dir=str(tmp_path), wal=True)  # the log remembers the session's last push
    for old in (first, second):
        old.meta["nonce"] = restarted.nonce  # the client re-sends with the new run's nonce
        assert restarted.handle(old).meta.get("again") is True
    assert same(state(restarted), expected)


def test_a_request_for_an_earlier_run_of_the_shard_is_refused_unread(tmp_path):
    from het.ps.wire.protocol import decode, encode

    s = Shard(ShardConfig((table("sgd"),)), state_dir=str(tmp_path), wal=True)
    before = state(s)
    push = Message(Op.PUSH, 1, {"table": "t", "nonce": "0" * 32, "session": "c" * 16, "seq": 1},
                   [np.array([1], np.int64), np.ones((1, 3), np.float32), np.ones(1, np.int64)])
    reply = decode(s.handle_frames(encode(push)))
    assert reply.status == ERROR and reply.meta["kind"] == "StaleError" and same(state(s), before)
    assert s.stats["stale"] == 1
