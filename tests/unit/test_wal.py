"""A shard's write-ahead log (issue 11, item 11, the shard's part): a shard dropped without a
save (as kill -9 leaves it) and started again on its state directory holds exactly what it
acknowledged: its last save, and every push after it, replayed once."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from het.config import OptimizerConfig, ShardConfig, TableConfig
from het.ps.protocol import ERROR, Message, Op
from het.ps.shard import Shard


def table(optimizer):
    return TableConfig("t", rows=40, dim=3, optimizer=OptimizerConfig(optimizer, lr=0.1))


def state(s: Shard) -> list[torch.Tensor]:
    t = s.tables["t"]
    return [t.weight.clone(), t.clocks.clone(), t.touched.clone(), *(v.clone() for v in t.optimizer.state.values())]


def same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


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
    second = Shard(cfg, state_dir=str(tmp_path), wal=True)
    assert same(state(second), expected) and second.stats["wal_replayed"] == 7
    # and a third start replays the same log again, once
    third = Shard(cfg, state_dir=str(tmp_path), wal=True)
    assert same(state(third), expected)


def test_a_torn_record_at_the_end_was_never_acknowledged_and_is_skipped(tmp_path):
    rng = np.random.default_rng(1)
    cfg = ShardConfig((table("adagrad"),))
    s = Shard(cfg, state_dir=str(tmp_path), wal=True)
    for step in range(1, 5):
        push(s, rng, step)
    expected = state(s)
    with open(tmp_path / "wal" / "log", "ab") as f:
        f.write(b"HWAL\x10\x00\x00\x00\xff\xff")  # a crash in the middle of a write
    assert same(state(Shard(cfg, state_dir=str(tmp_path), wal=True)), expected)


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
    assert same(state(Shard(cfg, state_dir=str(tmp_path / "mine"), wal=True)), expected)


def test_a_log_needs_a_state_directory():
    with pytest.raises(ValueError, match="needs a state directory"):
        Shard(ShardConfig((table("sgd"),)), wal=True)
