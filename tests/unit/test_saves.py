"""What a shard writes it reads back only as written, and its state directory is its own: a save
or a disk-tier segment cut off or changed is refused, naming the file and the bytes, and never
becomes a row; saves are on disk before they take their name; a link planted at any name the
shard writes changes nothing outside the directory; one shard at a time holds a directory."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from het.config import OptimizerConfig, ShardConfig, TableConfig
from het.lock import DirectoryInUse
from het.ps.protocol.messages import ERROR, Message, Op
from het.ps.server.shard import Shard

FIXED = TableConfig("f", rows=40, dim=3, optimizer=OptimizerConfig("adagrad", lr=0.1))
DYNAMIC = TableConfig("d", rows=None, dim=8, optimizer=OptimizerConfig("adagrad", lr=0.1))
KEYS = np.arange(-600, 600, 3, dtype=np.int64)  # the dynamic table's
PROPERTY = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def shard(state_dir, memory=None, **kw) -> Shard:
    """A fixed and a dynamic table; under ``memory`` the dynamic one's rows mostly on disk."""
    return Shard(ShardConfig((FIXED, DYNAMIC), memory=memory), state_dir=str(state_dir), **kw)


def pushed(s: Shard, steps: int = 3) -> Shard:
    rng = np.random.default_rng(0)
    for step in range(1, steps + 1):
        for name, keys, dim in (("f", np.arange(40), 3), ("d", KEYS, 8)):
            grads = rng.normal(size=(len(keys), dim)).astype(np.float32)
            s.push(name, keys, grads, np.ones(len(keys), np.int64), step=step)
    return s


def rows(s: Shard) -> list:
    """Every row and clock, as pulls give them; a pull refused gives its error."""
    out = []
    for name, keys in (("f", np.arange(40)), ("d", KEYS)):
        reply = s.handle(Message(Op.PULL, 1, {"table": name}, [keys]))
        out += [reply.meta["error"]] if reply.status == ERROR else [a.copy() for a in reply.arrays]
    return out


def equal(a: list, b: list) -> bool:
    return len(a) == len(b) and all(isinstance(x, np.ndarray) and np.array_equal(x, y) for x, y in zip(a, b))


def damage(path, how: str, where: float, xor: int = 0x5A) -> None:
    data = bytearray(open(path, "rb").read())
    at = int(where * len(data))
    if how == "cut":
        del data[at:]
    else:
        data[at] ^= xor
    os.remove(path)  # a new file: a save's links elsewhere keep the bytes as written
    open(path, "wb").write(bytes(data))


# -- saves ---------------------------------------------------------------------------------

def test_a_changed_byte_in_a_save_is_refused_naming_the_bytes_and_changes_nothing(tmp_path):
    source = pushed(shard(tmp_path / "a"))
    source.save(str(tmp_path / "a" / "s.pt"))
    os.makedirs(tmp_path / "b")
    shutil.copy(tmp_path / "a" / "s.pt", tmp_path / "b" / "s.pt")
    size = os.path.getsize(tmp_path / "b" / "s.pt")
    damage(tmp_path / "b" / "s.pt", "flip", 0.5)
    target = shard(tmp_path / "b")
    before = rows(target)
    reply = target.handle(Message(Op.LOAD, 1, {"path": "s.pt"}))
    assert reply.status == ERROR and "s.pt" in reply.meta["error"] and "damaged" in reply.meta["error"]
    assert "bytes" in reply.meta["error"] and size > 1000
    assert equal(rows(target), before)


@PROPERTY
@given(st.sampled_from(["cut", "flip"]), st.floats(0, 1, exclude_max=True), st.integers(1, 255))
def test_no_damage_to_a_save_loads_a_wrong_row(tmp_path_factory, how, where, xor):
    tmp = tmp_path_factory.mktemp("save")
    source = pushed(shard(tmp / "a"))
    source.save(str(tmp / "a" / "s.pt"))
    expected = rows(source)
    os.makedirs(tmp / "b")
    shutil.copy(tmp / "a" / "s.pt", tmp / "b" / "s.pt")
    damage(tmp / "b" / "s.pt", how, where, xor)
    target = shard(tmp / "b")
    before = rows(target)
    reply = target.handle(Message(Op.LOAD, 1, {"path": "s.pt"}))
    assert equal(rows(target), before if reply.status == ERROR else expected)


def test_a_save_is_on_disk_before_it_takes_its_name(tmp_path, monkeypatch):
    """The save's file is forced to disk under its temporary name, then its directory after
    the rename; a disk tier's linked segments before the file names them."""
    synced = []
    real = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    s = pushed(shard(tmp_path, memory=1 << 16))
    monkeypatch.setattr(os, "fsync", fsync)
    s.save(str(tmp_path / "ckpt" / "shard-0.pt"))
    temp = [i for i, p in enumerate(synced) if os.path.basename(p).startswith(".shard-0.pt.tmp-")]
    segments = [i for i, p in enumerate(synced) if ".rows-" in p and p.endswith(".rows")]
    directory = [i for i, p in enumerate(synced) if p == str(tmp_path / "ckpt")]
    assert temp and segments and directory and max(segments) < temp[0] < directory[-1], synced


# -- the disk tier ---------------------------------------------------------------------------

DAMAGE = (st.sampled_from(["cut", "flip"]), st.floats(0, 1, exclude_max=True), st.integers(0, 7))


@settings(PROPERTY, max_examples=10)
@given(*DAMAGE)
def test_no_damage_to_a_segment_file_serves_a_wrong_row(tmp_path_factory, how, where, which):
    """A save's segments damaged: its load is refused or loads every row as saved. The live
    tier's damaged: each pull is refused or answers every row as pushed."""
    segment_damaged(tmp_path_factory.mktemp("tier"), how, where, which)


@pytest.mark.slow
@settings(PROPERTY, max_examples=100)
@given(*DAMAGE)
def test_no_damage_to_a_segment_file_serves_a_wrong_row_in_many_places(tmp_path_factory, how, where, which):
    segment_damaged(tmp_path_factory.mktemp("tier"), how, where, which)


def segment_damaged(tmp, how: str, where: float, which: int) -> None:
    """A disk tier's save and live segments damaged ``how`` at fraction ``where`` of segment
    ``which``: every load and pull refused or right."""
    source = pushed(shard(tmp / "a", memory=1 << 16))
    source.save(str(tmp / "a" / "s.pt"))
    expected = rows(source)
    os.makedirs(tmp / "b")
    shutil.copy(tmp / "a" / "s.pt", tmp / "b" / "s.pt")
    for d in (tmp / "a").glob("s.pt.rows-*"):
        shutil.copytree(d, tmp / "b" / d.name)  # copies: the damage stays in this save
    saved = sorted((tmp / "b").rglob("seg-*.rows"))
    damage(saved[which % len(saved)], how, where)
    target = shard(tmp / "b", memory=1 << 16)
    before = rows(target)
    loaded = target.handle(Message(Op.LOAD, 1, {"path": "s.pt"})).status != ERROR
    assert equal(rows(target), expected if loaded else before)
    live = sorted((tmp / "a" / "tier").rglob("seg-*.rows"))
    with open(live[which % len(live)], "r+b") as f:  # in place: the shard has it mapped
        size = os.fstat(f.fileno()).st_size
        f.seek(int(where * size))
        byte = f.read(1)
        f.seek(int(where * size))
        f.write(bytes([byte[0] ^ 0x5A]))
    for got, want in zip(rows(source), expected):
        assert isinstance(got, str) and "does not match its check" in got or np.array_equal(got, want)


# -- the state directory -------------------------------------------------------------------

def scenario(state_dir) -> set[str]:
    """What a shard writes in its directory: a log, a disk tier, a save, a load of it; the
    names there before it stops (its disk tier goes then)."""
    s = pushed(shard(state_dir, memory=1 << 16, wal=True), steps=2)
    for op in (Op.SAVE, Op.LOAD):
        reply = s.handle(Message(op, 1, {"path": "ckpt/shard-0.pt"}))
        assert reply.status != ERROR or "refused" in reply.meta["error"] or "link" in reply.meta["error"]
    pushed(s, steps=1)
    names = {str(p.relative_to(state_dir)) for p in state_dir.rglob("*")}
    s.close()
    return names


def snapshot(root) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


def test_a_link_planted_at_any_name_the_shard_writes_changes_nothing_outside(tmp_path):
    clean = tmp_path / "clean"
    names = sorted(scenario(clean))
    assert "lock" in names and "wal/log" in names and "wal/base.pt" in names
    assert any(n.startswith("tier/") and n.endswith(".rows") for n in names)
    for i, name in enumerate(names):
        root, outside = tmp_path / f"s{i}", tmp_path / f"outside{i}"
        (outside / "dir").mkdir(parents=True)
        (outside / "victim").write_bytes(b"theirs")
        target = outside / ("dir" if (clean / name).is_dir() or name.startswith("tier") and not name.endswith(".rows")
                            else "victim")
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, root / name)
        before = snapshot(outside)
        try:
            scenario(root)
        except (OSError, ValueError):  # refused: a link where a file of its own belongs
            pass
        assert snapshot(outside) == before, name


def test_a_second_shard_on_a_held_directory_refuses_to_start(tmp_path):
    first = pushed(shard(tmp_path, memory=1 << 16))
    tier = sorted(p.name for p in (tmp_path / "tier").rglob("*"))
    with pytest.raises(DirectoryInUse) as refused:
        shard(tmp_path, memory=1 << 16)
    message = str(refused.value)
    assert "\n" not in message and f"pid {os.getpid()}" in message and "in use by another shard" in message
    assert sorted(p.name for p in (tmp_path / "tier").rglob("*")) == tier  # the first's tier untouched
    first.save(str(tmp_path / "s.pt"))
    first.close()
    again = shard(tmp_path)  # a clean stop lets it go: nothing to take over
    assert again.state.notes == []
    again.state.abandon()  # as kill -9 leaves it
    third = shard(tmp_path)
    assert third.state.notes == [f"took over {tmp_path} from pid {os.getpid()}, which ended without a clean stop"]
    third.close()


def test_a_shard_refused_at_start_lets_its_directory_go(tmp_path):
    (tmp_path / "wal").mkdir()
    (tmp_path / "wal" / "log").write_bytes(b"HWL2" + bytes(range(60)))  # damage, not a write cut short
    with pytest.raises(ValueError, match="refuses to start"):
        shard(tmp_path, wal=True)
    shard(tmp_path).close()  # not held by the one refused


def test_a_load_of_another_hets_save_is_refused_whole(tmp_path):
    s = pushed(shard(tmp_path))
    torch.save({"format": 99, "tables": {}}, tmp_path / "odd.pt")
    reply = s.handle(Message(Op.LOAD, 1, {"path": "odd.pt"}))
    assert reply.status == ERROR and "save format 99" in reply.meta["error"]


def test_a_load_of_a_foreign_pickle_is_refused_as_a_load_and_runs_nothing(tmp_path):
    s = pushed(shard(tmp_path))
    s.tables["f"].build_all()  # every row's value (a shard builds rows on first touch)
    before = [t.clone() for t in (s.tables["f"].weight, s.tables["f"].clocks)]
    ran = tmp_path.parent / "foreign-ran"

    class Planted:
        def __reduce__(self):
            return (os.mkdir, (str(ran),))

    torch.save({"format": 1, "tables": Planted()}, tmp_path / "foreign.pt")
    reply = s.handle(Message(Op.LOAD, 7, {"path": "foreign.pt"}))
    assert reply.status == ERROR and reply.op == Op.LOAD and reply.request_id == 7
    assert "foreign.pt: not a save het wrote" in reply.meta["error"] and not ran.exists()
    assert all(torch.equal(a, b) for a, b in zip(before, (s.tables["f"].weight, s.tables["f"].clocks)))
