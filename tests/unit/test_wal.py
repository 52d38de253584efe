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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from het.config import OptimizerConfig, ShardConfig, TableConfig
from het.ps.protocol.messages import ERROR, Message, Op
from het.ps.server.shard import Shard
from het.ps.server.store.wal import WriteAheadLog


def table(optimizer):
    return TableConfig("t", rows=40, dim=3, optimizer=OptimizerConfig(optimizer, lr=0.1))


def state(s: Shard) -> list[torch.Tensor]:
    t = s.tables["t"]
    t.build_all()  # every row as a save holds it (a shard builds rows on first touch)
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


RECORD = 16 + 100 + 12 * (8 + 12 + 8)  # a push's record: header, meta (about), keys, grads, counts


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_log_past_wal_max_becomes_a_base_and_a_kill_still_loses_nothing(tmp_path, optimizer):
    """Each base written in the background is waited for here, so the bound is exact."""
    rng = np.random.default_rng(1)
    cfg = ShardConfig((table(optimizer),), wal_max=5 * RECORD)
    first = Shard(cfg, state_dir=str(tmp_path), wal=True, fsync_s=10.0)
    sizes = []
    for step in range(1, 40):
        push(first, rng, step)
        first.state.settle()
        sizes.append(first.stats_dict()["wal_log_bytes"])
    assert max(sizes) <= 6 * RECORD and first.stats_dict()["wal_rebases"] >= 5
    assert not os.path.exists(tmp_path / "wal" / "log.old")
    expected = state(first)
    killed(first)
    second = Shard(cfg, state_dir=str(tmp_path), wal=True)
    assert same(state(second), expected) and second.stats["wal_replayed"] < 7  # the base held the rest
    killed(second)


def test_a_base_that_never_landed_leaves_its_log_aside_and_nothing_is_lost(tmp_path, monkeypatch):
    """The child writing a base dies (as when the shard is killed meanwhile): the log set aside
    stays, is replayed after the older base, and the next rebase is written whole."""
    from het.ps.server.store import state as state_module

    def dies(path, stores, header):
        pid = os.fork()
        if pid == 0:
            os._exit(1)
        return pid

    rng = np.random.default_rng(2)
    cfg = ShardConfig((table("adagrad"),), wal_max=5 * RECORD)
    first = Shard(cfg, state_dir=str(tmp_path), wal=True, fsync_s=10.0)
    monkeypatch.setattr(state_module, "_write_in_child", dies)
    for step in range(1, 8):
        push(first, rng, step)
        first.state.settle()
    assert os.path.exists(tmp_path / "wal" / "log.old") and first.stats_dict()["wal_rebases_failed"] == 1
    expected = state(first)
    killed(first)
    second = Shard(cfg, state_dir=str(tmp_path), wal=True)
    assert same(state(second), expected) and second.stats["wal_replayed"] == 7
    assert any("set aside" in note for note in second.state.notes)
    assert not os.path.exists(tmp_path / "wal" / "log.old")  # in a base at start
    monkeypatch.undo()
    for step in range(8, 30):  # and on, in the background again
        push(second, rng, step)
        second.state.settle()
    expected = state(second)
    killed(second)
    assert same(state(Shard(cfg, state_dir=str(tmp_path), wal=True)), expected)


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
    from het.ps.protocol.messages import decode, encode

    s = Shard(ShardConfig((table("sgd"),)), state_dir=str(tmp_path), wal=True)
    before = state(s)
    push = Message(Op.PUSH, 1, {"table": "t", "nonce": "0" * 32, "session": "c" * 16, "seq": 1},
                   [np.array([1], np.int64), np.ones((1, 3), np.float32), np.ones(1, np.int64)])
    reply = decode(s.handle_frames(encode(push)))
    assert reply.status == ERROR and reply.meta["kind"] == "StaleError" and same(state(s), before)
    assert s.stats["stale"] == 1


# -- a torn or damaged log -------------------------------------------------------------------

def logged_shard(tmp_path, pushes: int, seed: int = 4):
    """A shard with a log of ``pushes`` pushes, killed; its state after each push (0..pushes),
    and the byte where each record ends."""
    cfg = ShardConfig((table("adagrad"),))
    s = Shard(cfg, state_dir=str(tmp_path), wal=True, fsync_s=10.0)
    rng, states, ends = np.random.default_rng(seed), [state(s)], []
    for step in range(1, pushes + 1):
        push(s, rng, step)
        states.append(state(s))
        ends.append(os.path.getsize(tmp_path / "wal" / "log"))
    killed(s)
    return cfg, states, ends


def flip(path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x5A
    path.write_bytes(bytes(data))


def test_after_a_write_cut_short_new_pushes_follow_the_last_intact_record(tmp_path):
    cfg, states, ends = logged_shard(tmp_path, 4)
    log = tmp_path / "wal" / "log"
    with open(log, "r+b") as f:
        f.truncate(ends[-1] - 7)  # the last write cut short: its push was never acknowledged
    s = Shard(cfg, state_dir=str(tmp_path), wal=True)
    assert same(state(s), states[3]) and "a write cut short at byte " + str(ends[2]) in s.state.notes[-1]
    rng = np.random.default_rng(9)
    for step in range(5, 8):
        push(s, rng, step)
    expected = state(s)
    killed(s)
    again = Shard(cfg, state_dir=str(tmp_path), wal=True)
    assert same(state(again), expected) and again.stats["wal_replayed"] == 6


def test_a_damaged_record_with_intact_ones_after_it_refuses_the_start_naming_them(tmp_path):
    cfg, states, ends = logged_shard(tmp_path, 5)
    flip(tmp_path / "wal" / "log", ends[1] + 40)  # inside the third record
    with pytest.raises(ValueError, match=rf"at byte {ends[1]}, and 2 intact records follow \(pushes 4\.\.5\)"):
        Shard(cfg, state_dir=str(tmp_path), wal=True)
    s = Shard(cfg, state_dir=str(tmp_path), wal=True, wal_recover_prefix=True)  # the operator's choice
    assert same(state(s), states[2]) and "dropped the rest" in s.state.notes[-1]
    assert os.path.getsize(tmp_path / "wal" / "log") == ends[1]


def test_a_damaged_last_record_is_not_taken_for_a_write_cut_short(tmp_path):
    """Whole but not matching its checksum: its push was acknowledged, so the start is refused."""
    cfg, states, ends = logged_shard(tmp_path, 3)
    flip(tmp_path / "wal" / "log", ends[-1] - 3)
    with pytest.raises(ValueError, match="does not match its checksum at byte .*nothing intact follows"):
        Shard(cfg, state_dir=str(tmp_path), wal=True)


def test_a_log_missing_pushes_its_base_does_not_hold_is_refused(tmp_path):
    cfg = ShardConfig((table("sgd"),))
    s = Shard(cfg, state_dir=str(tmp_path), wal=True)
    rng = np.random.default_rng(5)
    push(s, rng, 1)
    s.save(str(tmp_path / "a.pt"))
    push(s, rng, 2)
    killed(s)
    os.remove(tmp_path / "wal" / "base.pt")  # the pushes before the log's first record are gone with it
    with pytest.raises(ValueError, match="holds push 2, expected push 1"):
        Shard(cfg, state_dir=str(tmp_path), wal=True)


@pytest.mark.parametrize("name", ["wal/log", "wal/base.pt", "wal/x.pt", "tier/seg.rows", "lock", "ckpt/a.pt.tmp-1",
                                  "a.pt.rows-00ff/table-74/seg-000000.rows"])
def test_the_shards_own_names_are_never_a_saves(tmp_path, name):
    s = Shard(ShardConfig((table("sgd"),)), state_dir=str(tmp_path), wal=True)
    push(s, np.random.default_rng(6), 1)
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    reply = s.handle(Message(Op.SAVE, 1, {"path": name}))
    assert reply.status == ERROR and "the shard's own files" in reply.meta["error"]
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["cut", "flip"]), st.floats(0, 1, exclude_max=True), st.integers(1, 255))
def test_no_damage_to_the_log_puts_a_wrong_row_in_the_shard(tmp_path_factory, how, where, xor):
    """Whatever is cut off or changed: the shard starts with exactly the pushes before the
    damage (the records wholly before it), or refuses to start naming the byte; started, it
    takes new pushes that survive the next kill."""
    tmp_path = tmp_path_factory.mktemp("wal")
    cfg, states, ends = logged_shard(tmp_path, 6)
    log, at = tmp_path / "wal" / "log", int(where * ends[-1])
    if how == "cut":
        with open(log, "r+b") as f:
            f.truncate(at)
    else:
        data = bytearray(log.read_bytes())
        data[at] ^= xor
        log.write_bytes(bytes(data))
    before = sum(end <= at for end in ends)  # records wholly before the damage
    try:
        s = Shard(cfg, state_dir=str(tmp_path), wal=True)
    except ValueError as e:
        assert how == "flip" and "at byte" in str(e) and "--wal-recover-prefix" in str(e)
        s = Shard(cfg, state_dir=str(tmp_path), wal=True, wal_recover_prefix=True)
    assert same(state(s), states[before])
    push(s, np.random.default_rng(7), 7)
    expected = state(s)
    killed(s)
    assert same(state(Shard(cfg, state_dir=str(tmp_path), wal=True)), expected)


def test_a_base_that_cannot_be_started_fails_no_push(tmp_path, monkeypatch):
    """fork refused (no memory, say): the push that crossed the bound is still acknowledged, the
    failure counted, and the log set aside is replayed as ever."""
    from het.ps.server.store import state as state_module

    def refused(path, stores, header):
        raise OSError(12, "Cannot allocate memory")

    rng = np.random.default_rng(3)
    cfg = ShardConfig((table("sgd"),), wal_max=5 * RECORD)
    first = Shard(cfg, state_dir=str(tmp_path), wal=True, fsync_s=10.0)
    monkeypatch.setattr(state_module, "_write_in_child", refused)
    for step in range(1, 10):
        push(first, rng, step)  # asserts each is acknowledged
    assert first.stats_dict()["wal_rebases_failed"] >= 1 and any("could not be written" in n for n in first.state.notes)
    expected = state(first)
    killed(first)
    assert same(state(Shard(cfg, state_dir=str(tmp_path), wal=True)), expected)


def _record(log: WriteAheadLog, step: int) -> int:
    return log.append("t", np.array([step]), np.ones((1, 2), np.float32), np.array([1]), step=step)


@pytest.mark.parametrize("how", ["short", "refused"])
def test_a_failed_write_leaves_no_fragment_and_no_gap(tmp_path, monkeypatch, how):
    from het.ps.server.store import wal

    log = WriteAheadLog(str(tmp_path), fsync_s=0)
    assert _record(log, 1) == 1
    real = os.write

    def failing(fd, data):
        if how == "short":
            return real(fd, bytes(data)[:len(data) // 2])  # a disk filling up part way
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(wal.os, "write", failing)
    with pytest.raises(OSError):
        _record(log, 2)
    monkeypatch.setattr(wal.os, "write", real)
    assert _record(log, 3) == 2  # the refused push's number goes to the next record
    log.close()
    found = wal.scan(str(tmp_path))
    assert found.problem is None and found.records == 2
    assert [(r["lsn"], int(r["keys"][0])) for r in wal.read_log(str(tmp_path))] == [(1, 1), (2, 3)]


def test_a_failed_write_that_cannot_be_cut_off_refuses_every_later_record(tmp_path, monkeypatch):
    from het.ps.server.store import wal

    log = WriteAheadLog(str(tmp_path), fsync_s=0)
    real = os.write
    monkeypatch.setattr(wal.os, "write", lambda fd, data: real(fd, bytes(data)[:5]))

    def cannot(fd, size):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(wal.os, "ftruncate", cannot)
    with pytest.raises(OSError):
        _record(log, 1)
    monkeypatch.undo()
    with pytest.raises(OSError, match="could not be cut off"):
        _record(log, 2)


def test_an_idle_log_is_forced_to_disk_within_fsync_s(tmp_path):
    import time

    log = WriteAheadLog(str(tmp_path), fsync_s=0.2)
    assert log.sync_due_in() is None  # nothing written: nothing due
    _record(log, 1)  # the first record after a sync waits for the next one, or for the loop
    syncs = log.stats["wal_fsyncs"]
    assert 0 < log.sync_due_in() <= 0.2
    log.sync_if_due()
    assert log.stats["wal_fsyncs"] == syncs
    time.sleep(0.25)
    assert log.sync_due_in() == 0.0
    log.sync_if_due()
    assert log.stats["wal_fsyncs"] == syncs + 1 and log.sync_due_in() is None
    log.close()


def test_the_shards_loop_forces_an_idle_log_to_disk(tmp_path):
    import time

    from het.ps.server.server import serve

    s = Shard(ShardConfig((table("sgd"),)), state_dir=str(tmp_path), wal=True, fsync_s=0.3)
    push(s, np.random.default_rng(0), 1)
    s.wal._synced = time.monotonic()  # as if forced just before this push's record
    s.wal._unsynced = True
    syncs, waits = s.wal.stats["wal_fsyncs"], []

    class Idle:  # no request comes
        def recv(self, timeout_s):
            waits.append(timeout_s)
            time.sleep(timeout_s)

    serve(s, Idle(), should_stop=lambda: len(waits) >= 8, poll_s=0.1)
    assert s.wal.stats["wal_fsyncs"] == syncs + 1 and s.wal.sync_due_in() is None
    assert max(waits) <= 0.1


def test_a_rows_only_save_leaves_the_log_alone_and_is_never_loaded(tmp_path):
    """A publication's snapshot (SAVE with rows_only) holds the rows without the optimizer
    state: half an Adagrad table's bytes. No log rests on it (a kill after it still replays every
    push), and a LOAD of it is refused, naming why, with nothing changed."""
    rng = np.random.default_rng(3)
    cfg = ShardConfig((table("adagrad"),))
    s = Shard(cfg, state_dir=str(tmp_path), wal=True, fsync_s=10.0)
    for step in range(1, 5):
        push(s, rng, step)
    assert s.handle(Message(Op.SAVE, 90, {"path": "full.pt"})).status != ERROR
    assert s.handle(Message(Op.SAVE, 91, {"path": "rows.pt", "rows_only": True})).status != ERROR
    refused = s.handle(Message(Op.SAVE, 92, {"path": "r2.pt", "rows_only": 1}))
    assert refused.status == ERROR and "rows_only" in refused.meta["error"]
    full, rows = (torch.load(tmp_path / n, weights_only=False) for n in ("full.pt", "rows.pt"))
    assert rows["rows_only"] and "optimizer" not in rows["tables"]["t"] and "rows_only" not in full
    assert torch.equal(rows["tables"]["t"]["weight"], full["tables"]["t"]["weight"])
    assert full["tables"]["t"]["optimizer"]["sum"].shape == full["tables"]["t"]["weight"].shape  # what is left out
    for step in range(5, 9):
        push(s, rng, step)
    expected = state(s)
    reply = s.handle(Message(Op.LOAD, 93, {"path": "rows.pt"}))
    assert reply.status == ERROR and "holds rows only" in reply.meta["error"]
    assert same(state(s), expected)
    killed(s)
    again = Shard(cfg, state_dir=str(tmp_path), wal=True)
    assert same(state(again), expected) and again.stats["wal_replayed"] == 4
