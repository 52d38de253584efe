"""A dynamic table under a DRAM budget with a disk tier is the same table, bit for bit, as one all
in memory: for every optimizer, both policies, with garbage compacted, across save and load."""

import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from het.config import OptimizerConfig, ShardConfig, TableConfig
from het.ps.protocol import layout
from het.ps.protocol.messages import Message, Op
from het.ps.server.shard import Shard
from het.ps.server.store import saves
from het.ps.server.store.disk import Segments
from het.ps.server.store.dynamic import DynamicRows
from het.ps.server.store.tiers import TieredRows

OPTIMIZERS = [OptimizerConfig("sgd", lr=0.5), OptimizerConfig("adagrad", lr=0.1), OptimizerConfig("adam", lr=0.01)]


def table(opt, dim=8):
    return TableConfig("emb", rows=None, dim=dim, optimizer=opt, seed=3)


def pushes(n_steps, universe=2000, batch=300, seed=0, dim=8):
    """A skewed stream of pushes (keys with duplicates, grads, counts), as workers send them."""
    g = torch.Generator().manual_seed(seed)
    pool = torch.randint(-2**62, 2**62, (universe,), generator=g)
    for step in range(1, n_steps + 1):
        ranks = (torch.rand(batch, generator=g) ** 3 * universe).long()  # hot keys first
        keys = pool[ranks]
        yield keys, torch.randn(batch, dim, generator=g), torch.randint(1, 3, (batch,), generator=g), step


def both(opt, tmp_path, capacity, policy="lru", segment_bytes=4096):
    plain = DynamicRows(table(opt), 0, 1)
    tiered = DynamicRows(table(opt), 0, 1, disk_dir=str(tmp_path / "tier"), policy=policy)
    tiered.store = TieredRows(8, plain.store.state.width if plain.store.state else 0, str(tmp_path / "tier"),
                              capacity=capacity, policy=policy, segment_bytes=segment_bytes)
    return plain, tiered


def assert_same(a: DynamicRows, b: DynamicRows, keys: torch.Tensor) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert torch.equal(sa["keys"], sb["keys"])
    assert torch.equal(sa["weight"], sb["weight"]) and torch.equal(sa["clocks"], sb["clocks"])
    for name in sa["optimizer"]:
        assert torch.equal(sa["optimizer"][name], sb["optimizer"][name])
    ra, _ = a.rows_to_send(a.locate(keys), lazy=False)
    rb, _ = b.rows_to_send(b.locate(keys), lazy=False)
    assert np.array_equal(ra[0], rb[0])


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=lambda o: o.name)
@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_a_tenth_in_memory_trains_bit_for_bit_like_all_in_memory(opt, policy, tmp_path):
    plain, tiered = both(opt, tmp_path, capacity=0, policy=policy)
    for keys, grads, counts, step in pushes(40):
        for t in (plain, tiered):
            t.push(t.locate(keys), grads.clone(), counts, step)
        if step == 5:  # a tenth of the rows touched by then
            tiered.store.set_capacity(len(plain.keys) // 10)
        if step % 7 == 0:  # pulls bring rows in too
            for t in (plain, tiered):
                t.rows_to_send(t.locate(keys[:50]), lazy=True)
    stats = tiered.stats()
    assert stats["rows_on_disk"] > 5 * stats["rows_in_memory"] > 0
    assert stats["disk_reads"] > 0 and stats["disk_writes"] > 0 and stats["compactions"] > 0
    assert stats["rows_in_memory"] + stats["rows_on_disk"] == stats["rows"] == plain.stats()["rows"]
    assert_same(plain, tiered, next(pushes(1, seed=9))[0])


def test_a_batch_larger_than_memory_is_served_from_disk(tmp_path):
    plain, tiered = both(OPTIMIZERS[1], tmp_path, capacity=7)
    for keys, grads, counts, step in pushes(10, batch=500):
        for t in (plain, tiered):
            t.push(t.locate(keys), grads.clone(), counts, step)
    assert tiered.stats()["rows_in_memory"] <= 7
    assert_same(plain, tiered, next(pushes(1, seed=4))[0])


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=lambda o: o.name)
def test_save_links_the_disk_tier_and_load_gives_the_same_table(opt, tmp_path):
    plain, tiered = both(opt, tmp_path, capacity=100)
    stream = list(pushes(30))
    for keys, grads, counts, step in stream[:20]:
        for t in (plain, tiered):
            t.push(t.locate(keys), grads.clone(), counts, step)
    saved = tiered.state_dict(str(tmp_path / "save"))
    assert "weight" not in saved and len(os.listdir(tmp_path / "save")) == len(tiered.store.disk.files)
    for name in os.listdir(tmp_path / "save"):  # linked, not copied
        assert os.stat(tmp_path / "save" / name).st_nlink == 2
    before = plain.state_dict()
    for keys, grads, counts, step in stream[20:]:  # the live tier moves on; the save does not
        for t in (plain, tiered):
            t.push(t.locate(keys), grads.clone(), counts, step)
    back = DynamicRows(table(opt), 0, 1, disk_dir=str(tmp_path / "other"))
    back.load_state_dict(saved, str(tmp_path / "save"))
    into_memory = DynamicRows(table(opt), 0, 1)
    into_memory.load_state_dict(saved, str(tmp_path / "save"))
    for loaded in (back, into_memory):
        got = loaded.state_dict()
        assert torch.equal(got["weight"], before["weight"]) and torch.equal(got["clocks"], before["clocks"])
        for name in before["optimizer"]:
            assert torch.equal(got["optimizer"][name], before["optimizer"][name])
    for t in (back, plain):  # and both train on alike
        for keys, grads, counts, step in stream[20:]:
            t.push(t.locate(keys), grads.clone(), counts, step)
    back_from_plain = DynamicRows(table(opt), 0, 1)
    back_from_plain.load_state_dict(before)
    for keys, grads, counts, step in stream[20:]:
        back_from_plain.push(back_from_plain.locate(keys), grads.clone(), counts, step)
    assert_same(back_from_plain, back, stream[0][0])


@pytest.mark.parametrize("rule,counter", [({"expire_after": 3}, "expired"), ({"max_rows": 200}, "evicted")])
def test_expiry_and_the_row_budget_free_the_disk_tier_too(rule, counter, tmp_path):
    opt = OptimizerConfig("sgd", lr=0.5)
    cfg = TableConfig("emb", rows=None, dim=8, optimizer=opt, seed=3, **rule)
    plain = DynamicRows(cfg, 0, 1)
    tiered = DynamicRows(cfg, 0, 1, disk_dir=str(tmp_path / "tier"))
    tiered.store.set_capacity(50)
    for keys, grads, counts, step in pushes(30):
        for t in (plain, tiered):
            t.push(t.locate(keys), grads.clone(), counts, step)
    s = tiered.stats()
    assert s[counter] == plain.stats()[counter] > 0
    assert s["rows_in_memory"] + s["rows_on_disk"] == s["rows"] == plain.stats()["rows"]
    on_disk = tiered.store.place.gather(tiered.keys.items()[1])[:, 1] >= 0  # a current record there
    assert tiered.store.disk.live == int(on_disk.sum()) >= s["rows_on_disk"]
    assert_same(plain, tiered, next(pushes(1))[0])


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["append", "kill"]), st.integers(1, 9)), max_size=30))
def test_segments_hold_what_was_appended_and_count_the_garbage(tmp_path_factory, ops):
    d = tmp_path_factory.mktemp("seg")
    s = Segments(str(d), width=3, segment_bytes=64)  # 4 records (3 words and a check) per segment
    live: dict[int, np.ndarray] = {}
    for op, n in ops:
        if op == "append":
            rows = np.random.default_rng(len(live)).random((n, 3), dtype=np.float32)
            for r, row in zip(s.append(rows, torch.arange(n)).tolist(), rows):
                live[r] = row
        elif live:
            gone = sorted(live)[:n]
            s.kill(torch.tensor(gone))
            for r in gone:
                del live[r]
    assert s.live == len(live) and s.live + s.dead == s.next
    if live:
        recs = torch.tensor(sorted(live))
        assert np.array_equal(s.read(recs), np.stack([live[r] for r in recs.tolist()]))
    s.close()


def shard_pair(tmp_path, opt, memory):
    t = table(opt, dim=32)
    plain = Shard(ShardConfig((t,)))
    tiered = Shard(ShardConfig((t,), memory=memory), state_dir=str(tmp_path / "state"))
    return plain, tiered


def test_a_shard_keeps_its_budget_and_answers_like_one_without(tmp_path):
    plain, tiered = shard_pair(tmp_path, OPTIMIZERS[1], memory=2_000_000)
    rid = 0
    for keys, grads, counts, step in pushes(30, universe=20000, batch=2000, dim=32):
        rid += 1
        for s in (plain, tiered):
            m = Message(Op.PUSH_SYNC, rid, {"table": "emb", "step": step},
                        [keys.numpy(), grads.numpy(), counts.numpy(), keys[:500].numpy(),
                         np.full(500, -1, dtype=np.int64)])
            r = s.handle(m)
            assert r.op is Op.PUSH_SYNC, r.meta
        tiered.page_in()
        assert np.array_equal(plain.handle(m).arrays[1], tiered.handle(m).arrays[1])
    t = tiered.stats_dict()["tables"]["emb"]
    assert t["bytes"] <= 2_000_000 and t["rows_on_disk"] > t["rows_in_memory"] > 0
    assert tiered.stats["paged_in_rows"] > 0
    path = str(tmp_path / "state" / "ckpt" / "shard-0.pt")
    tiered.save(path)
    assert len(layout.rows_dirs(path)) == 1
    tiered.save(path)  # again: the old rows directory goes
    assert len(layout.rows_dirs(path)) == 1
    again = Shard(ShardConfig((table(OPTIMIZERS[1], dim=32),), memory=2_000_000), state_dir=str(tmp_path / "state2"))
    again.load(path)
    q = Message(Op.PULL, 1, {"table": "emb"}, [keys.numpy()])
    assert np.array_equal(plain.handle(q).arrays[0], again.handle(q).arrays[0])
    tiered.close()
    assert not os.listdir(os.path.join(tmp_path, "state", "tier", saves.table_dir("emb")))


def test_a_budget_needs_a_dynamic_table_and_a_state_directory(tmp_path):
    fixed = TableConfig("t", rows=10, dim=4)
    with pytest.raises(ValueError, match="needs a dynamic table"):
        ShardConfig((fixed,), memory=1 << 20)
    with pytest.raises(ValueError, match="needs a state directory"):
        Shard(ShardConfig((table(OPTIMIZERS[0]),), memory=1 << 20))


def test_reshard_reads_the_disk_tier_of_every_shard(tmp_path):
    from het.ps.protocol import partition
    from het.ps.reshard import reshard
    cfg = table(OPTIMIZERS[2], dim=32)
    shards = [Shard(ShardConfig((cfg,), i, 2, memory=1_000_000), state_dir=str(tmp_path / f"s{i}")) for i in range(2)]
    one = Shard(ShardConfig((cfg,)))
    for keys, grads, counts, step in pushes(15, universe=20000, batch=2000, dim=32):
        keys = torch.unique(keys)
        grads, counts = grads[:len(keys)], counts[:len(keys)]
        one.push("emb", keys.numpy(), grads.numpy(), counts.numpy(), step)
        owner = partition.shard_of(keys, 2, hashed=True)
        for i, s in enumerate(shards):
            mine = owner == i
            s.push("emb", keys[mine].numpy(), grads[mine].numpy(), counts[mine].numpy(), step)
    assert all(s.stats_dict()["tables"]["emb"]["rows_on_disk"] > 0 for s in shards)
    for i, s in enumerate(shards):
        s.save(str(tmp_path / "save" / f"shard-{i}.pt"))
    reshard(str(tmp_path / "save"), str(tmp_path / "one"), 1)
    back = Shard(ShardConfig((cfg,)), state_dir=str(tmp_path / "back"))
    back.load(str(tmp_path / "one" / "shard-0.pt"))
    a, b = one.tables["emb"].state_dict(), back.tables["emb"].state_dict()
    order_a, order_b = torch.argsort(a["keys"]), torch.argsort(b["keys"])
    assert torch.equal(a["keys"][order_a], b["keys"][order_b])
    assert torch.equal(a["weight"][order_a], b["weight"][order_b])
    for name in a["optimizer"]:
        assert torch.equal(a["optimizer"][name][order_a], b["optimizer"][name][order_b])


@pytest.mark.parametrize("reader", ["native", "mapped"])
def test_segment_reads_in_parallel_match_the_map_and_refuse_damage(tmp_path, reader, monkeypatch):
    """Thousands of records over several segments read back as written, in any order, by the
    native parallel reads and by the map; a record changed on disk is refused naming its file."""
    from het import native
    from het.files import DamagedFile

    if reader == "mapped":
        monkeypatch.setattr(native, "ops", None)
    elif native.ops is None:
        pytest.skip("het's native core is not built")
    s = Segments(str(tmp_path / "seg"), width=5, segment_bytes=24 * 1000)  # 1,000 records a segment
    rows = np.random.default_rng(0).random((5000, 5), dtype=np.float32)
    recs = s.append(rows, torch.arange(5000))
    order = torch.randperm(5000)
    assert np.array_equal(s.read(recs[order]), rows[order.numpy()])
    victim = s.files[3]  # record 3,456 = segment 3, offset 456
    os.pwrite(victim.fd, np.float32([9.0]).tobytes(), 456 * 24 + 4)
    with pytest.raises(DamagedFile, match=r"seg-000003\.rows: record 456 "):
        s.read(recs[order])
    assert np.array_equal(s.read(recs[:3000]), rows[:3000])  # the others still read
    s.close()


def test_compaction_inside_a_request_is_bounded_and_finishes_over_the_next_ones(tmp_path, monkeypatch):
    """Garbage across many segments: a request's compaction moves at most COMPACT_RECORDS live
    records (past one part of WRITE_RECORDS), a segment may be left part moved, the next requests go
    on, and every row reads as written."""
    from het.ps.server.store import tiers
    from het.ps.server.store.tiers import TieredRows

    monkeypatch.setattr(tiers, "COMPACT_RECORDS", 40)
    monkeypatch.setattr(tiers, "WRITE_RECORDS", 8)  # a segment holds 32: moved in parts, one part partly
    t = TieredRows(dim=3, state_width=0, directory=str(tmp_path / "tier"), capacity=8, segment_bytes=16 * 32)
    t.grow_to(400)
    truth = torch.zeros(400, 3)
    g = torch.Generator().manual_seed(2)
    moved = []
    for step in range(60):  # rows written again and again: their old records become garbage
        slots = torch.randperm(400, generator=g)[:50]
        rows = torch.randn(50, 3, generator=g)
        reads = t.disk.reads  # a write reads nothing: what is read here, compaction moved
        t.scatter(slots, rows, None)
        truth[slots] = rows
        moved.append(t.disk.reads - reads)
        assert moved[-1] <= 40 + 8 - 1  # the bound, past one part at most: never a whole segment at once
        assert t.disk.dead <= 2 * max(t.disk.live, t.disk.per_segment) + 400  # kept in check, a bit a request
    assert sum(m > 0 for m in moved) > 5 and max(moved) > 40  # many requests compacted, some up to the bound
    assert torch.equal(t.gather_weight(torch.arange(400)), truth)
    t.close()


def test_places_are_32_bit_until_a_record_number_outgrows_them(tmp_path, monkeypatch):
    """A slot's place (position, record) costs 8 bytes; past NARROW records the pair widens to
    64 bits once, every place kept, and rows read as written on both sides of it."""
    from het.ps.server.store import tiers

    monkeypatch.setattr(tiers, "NARROW", 300)
    t = TieredRows(dim=3, state_width=0, directory=str(tmp_path / "tier"), capacity=8, segment_bytes=16 * 32)
    t.grow_to(100)
    assert t.place.dtype == torch.int32 and t.fixed_bytes(100) == 8 * 100 + t.disk.memory_bytes
    truth = torch.zeros(100, 3)
    t.scatter(torch.arange(100), truth, None)  # every slot stored
    g = torch.Generator().manual_seed(5)
    widths = []
    for _ in range(40):
        slots = torch.randperm(100, generator=g)[:30]
        rows = torch.randn(30, 3, generator=g)
        t.scatter(slots, rows, None)
        truth[slots] = rows
        widths.append(t.place.dtype)
        assert torch.equal(t.gather_weight(torch.arange(100)), truth)
    assert widths[0] == torch.int32 and widths[-1] == torch.int64  # records passed 300 on the way
    assert int(t._place(torch.arange(100))[:, tiers.REC].max()) > 300
    t.close()


def test_full_segments_keep_their_owners_on_disk_and_a_damaged_side_file_is_refused(tmp_path):
    """DRAM holds the owners of the segment being written only; a full one's are in its checked
    side file, which compaction reads back (a record live where its owner's place names it). A
    damaged side file refuses compaction of its segment, which is not offered again; every row
    reads as written."""
    from het import files

    t = TieredRows(dim=3, state_width=0, directory=str(tmp_path / "tier"), capacity=8, segment_bytes=16 * 32)
    t.grow_to(400)
    truth = torch.randn(400, 3)
    t.scatter(torch.arange(400), truth, None)
    g = torch.Generator().manual_seed(3)
    for _ in range(30):
        slots = torch.randperm(400, generator=g)[:50]
        truth[slots] = torch.randn(50, 3, generator=g)
        t.scatter(slots, truth[slots], None)
    current = t.disk.next // t.disk.per_segment
    assert t.counters["compactions"] > 0 and len(t.disk.files) > 3
    assert t.disk.memory_bytes <= 4 * 2 * t.disk.per_segment  # the open segment's owners, nothing a stored row
    for s, f in t.disk.files.items():
        assert os.path.exists(f.owners_path) == (s != current)
    assert torch.equal(t.gather_weight(torch.arange(400)), truth)

    t.disk.dead += 10_000  # garbage enough that any segment with some is offered
    victim = t.disk.sparse_segments(1)[0]
    path = t.disk.files[victim].owners_path
    with open(path, "r+b") as f:  # one byte of the owners changed
        f.seek(70)
        b = f.read(1)
        f.seek(70)
        f.write(bytes([b[0] ^ 0xFF]))
    with pytest.raises(files.DamagedFile, match="owners"):
        t.compact()
    assert victim not in t.disk.sparse_segments(10 ** 9) and victim in t.disk.files
    t.disk.dead -= 10_000
    assert torch.equal(t.gather_weight(torch.arange(400)), truth)
    t.close()
