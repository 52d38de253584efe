"""Dynamic tables on a shard: any int64 key, storage for pushed rows only, admission, expiry and
the row budget, against a fixed table and plain dictionaries."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from het import native
from het.config import OptimizerConfig, ShardConfig, TableConfig
from het.ps.protocol.initial import initial_rows
from het.ps.protocol.messages import Message, Op
from het.ps.server.shard import Shard
from het.ps.server.store.chunks import Chunks
from het.ps.server.store.index import KeyIndex, NativeKeyIndex

OPTIMIZERS = [OptimizerConfig("sgd", lr=0.5), OptimizerConfig("adagrad", lr=0.1, initial_accumulator=0.1),
              OptimizerConfig("adam", lr=0.01)]
INT64 = torch.iinfo(torch.int64)


def shard(rows, dim=4, optimizer=OPTIMIZERS[0], **dynamic):
    return Shard(ShardConfig((TableConfig("t", rows=rows, dim=dim, optimizer=optimizer, **dynamic),)))


def push(s, keys, grads, counts=None, step=1):
    keys = np.asarray(keys, dtype=np.int64)
    counts = np.ones(len(keys), np.int64) if counts is None else np.asarray(counts, np.int64)
    reply = s.handle(Message(Op.PUSH, 1, {"table": "t", "step": step}, [keys, grads.astype(np.float32), counts]))
    assert "error" not in reply.meta, reply.meta
    return reply


def pull(s, keys, lazy=False):
    reply = s.handle(Message(Op.PULL, 2, {"table": "t", "lazy": lazy}, [np.asarray(keys, dtype=np.int64)]))
    assert "error" not in reply.meta, reply.meta
    return reply.arrays


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=lambda o: o.name)
def test_a_dynamic_table_with_admit_after_1_is_bit_for_bit_a_fixed_one(opt):
    """The same pushes (duplicates, zero counts, many steps) on a fixed and a dynamic table:
    the same rows, clocks and replies, bit for bit."""
    rng = np.random.default_rng(0)
    fixed, dynamic = shard(500, optimizer=opt), shard(None, optimizer=opt)
    for step in range(1, 40):
        keys = rng.integers(0, 500, size=rng.integers(1, 60))
        grads = rng.normal(size=(len(keys), 4))
        counts = rng.integers(0, 3, size=len(keys))
        for s in (fixed, dynamic):
            push(s, keys, grads, counts, step)
        probe = rng.integers(0, 500, size=50)
        a, b = pull(fixed, probe), pull(dynamic, probe)
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
        la, lb = pull(fixed, probe, lazy=True), pull(dynamic, probe, lazy=True)
        assert all(np.array_equal(x, y) for x, y in zip(la, lb))
    assert dynamic.stats_dict()["tables"]["t"]["rows"] == int(fixed.tables["t"].touched.sum())


@pytest.mark.parametrize("row_dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("opt", OPTIMIZERS, ids=lambda o: o.name)
def test_the_native_push_over_many_chunks_and_a_refused_one_match_the_tensor_path(opt, row_dtype, monkeypatch):
    """Chunks of 8 slots (so a push spans a dozen of them): the native push and het's tensor
    push give the same rows (in half precision: the same bits, each rounded stochastically by
    its key), state and meta, and a push that would overflow leaves both as they were, its new
    keys unstored."""
    if native.ops is None:
        pytest.skip("the native core is not built")
    monkeypatch.setattr(Chunks.__init__, "__defaults__", (8, False))
    rng = np.random.default_rng(3)
    fast, slow = shard(None, optimizer=opt, row_dtype=row_dtype), shard(None, optimizer=opt, row_dtype=row_dtype)
    slow.tables["t"].native = False
    assert fast.tables["t"].native and len(fast.tables["t"].meta.parts) == 0
    for step in range(1, 30):
        keys = rng.integers(0, 300, size=rng.integers(1, 80))
        grads = rng.normal(size=(len(keys), 4))
        counts = rng.integers(0, 3, size=len(keys))
        for s in (fast, slow):
            push(s, keys, grads, counts, step)
    bad, keys = np.full((5, 4), 3e38, np.float32), np.array([7, 7, 7, 7, 10**12])  # key 7's sum overflows
    for s in (fast, slow):
        reply = s.handle(Message(Op.PUSH, 1, {"table": "t", "step": 30}, [keys, bad, np.ones(5, np.int64)]))
        assert "non-finite" in reply.meta["error"]
    a, b = fast.tables["t"], slow.tables["t"]
    assert len(a.meta.parts) > 5 and a.stats()["rows"] == b.stats()["rows"]
    keys = torch.from_numpy(np.sort(a.keys.items()[0].numpy()))
    assert torch.equal(keys, torch.from_numpy(np.sort(b.keys.items()[0].numpy()))) and 10**12 not in keys.tolist()
    sa, sb = a.locate(keys)[:, 1], b.locate(keys)[:, 1]
    wa, wb = a.store.weight.gather(sa), b.store.weight.gather(sb)
    assert wa.dtype == wb.dtype and torch.equal(wa.view(torch.int16 if wa.itemsize == 2 else torch.int32),
                                                wb.view(torch.int16 if wb.itemsize == 2 else torch.int32))
    assert torch.equal(a.meta.gather(sa), b.meta.gather(sb))
    if a.store.state is not None:
        assert torch.equal(a.store.state.gather(sa), b.store.state.gather(sb))


def test_any_int64_key_is_a_key_and_untouched_rows_are_not_stored():
    s = shard(None)
    keys = np.array([INT64.min, -1, 0, -(2 ** 63) + 1, INT64.max, 2 ** 40], dtype=np.int64)
    rows, clocks = pull(s, keys)
    assert np.array_equal(rows, initial_rows(s.cfg.tables[0], keys)) and not clocks.any()
    assert s.stats_dict()["tables"]["t"]["rows"] == 0
    push(s, keys[:2], np.ones((2, 4)))
    rows, clocks = pull(s, keys)
    assert clocks.tolist() == [1, 1, 0, 0, 0, 0]
    assert np.allclose(rows[:2], initial_rows(s.cfg.tables[0], keys[:2]) - 0.5)
    assert s.stats_dict()["tables"]["t"]["rows"] == 2


def test_keys_of_another_shard_are_refused_by_the_hashed_rule():
    s = Shard(ShardConfig((TableConfig("t", rows=None, dim=2),), index=0, num_shards=2))
    from het.ps.protocol.partition import shard_of

    keys = torch.arange(100)
    theirs = keys[shard_of(keys, 2, hashed=True) == 1][:1].numpy()
    reply = s.handle(Message(Op.PULL, 1, {"table": "t"}, [theirs]))
    assert "mix(key) % 2" in reply.meta["error"]


def test_admission_drops_the_gradients_of_keys_seen_in_fewer_steps():
    s = shard(None, admit_after=3)
    t = s.tables["t"]
    start = initial_rows(s.cfg.tables[0], np.array([5]))
    push(s, [5], np.ones((1, 4)), step=1)
    push(s, [5], np.ones((1, 4)), step=2)
    rows, clocks = pull(s, [5])
    assert np.array_equal(rows, start) and clocks.tolist() == [0]  # dropped: reads give the initial row
    assert t.stats()["refused_updates"] == 2 and t.stats()["rows"] == 0
    push(s, [5], np.ones((1, 4)), step=3)  # the third step's push admits it, and is applied
    rows, clocks = pull(s, [5])
    assert np.allclose(rows, start - 0.5) and clocks.tolist() == [1]
    assert t.stats()["admitted"] == 1
    push(s, [9], np.ones((1, 4)), counts=[3])  # one push carrying three worker-steps is three sightings
    assert t.stats()["rows"] == 2


def test_the_admission_sketch_never_undercounts():
    s = shard(None, admit_after=4)
    rng = np.random.default_rng(1)
    truth = {}
    for step in range(30):
        keys = np.unique(rng.integers(-10 ** 12, 10 ** 12, size=200) // 10 ** 9)
        push(s, keys, np.zeros((len(keys), 4)), step=step + 1)
        for k in keys.tolist():
            truth[k] = truth.get(k, 0) + 1
    stored = set(s.tables["t"].keys.items()[0].tolist())
    assert {k for k, n in truth.items() if n >= 4} <= stored  # never late


def test_an_aging_sketch_keeps_admitting_early_rarely_however_many_keys_pass():
    """A stream of 200,000 distinct keys, each seen once, through a sketch of 1,024 counters a
    row: without halving every counter fills and nearly every key reads as seen twice; with it
    the rate stays near the sketch's 2%, and a key seen every batch is still admitted."""
    from het.ps.server.store.admission import SightingSketch

    sketch = SightingSketch(counters=4096)
    early, steady = [], torch.tensor([-1])
    for i in range(800):
        keys = torch.arange(i * 250, (i + 1) * 250)
        after = sketch.add(torch.cat([keys, steady]), torch.ones(251, dtype=torch.int64))
        early.append(float((after[:-1] >= 2).float().mean()))
        assert i < 10 or int(after[-1]) >= 2
    assert sketch.agings > 300 and max(early[100:]) < 0.06 and sum(early[100:]) / 700 < 0.03
    unaged = SightingSketch(counters=4096)
    unaged.period = 1 << 62
    for i in range(40):
        after = unaged.add(torch.arange(i * 250, (i + 1) * 250), torch.ones(250, dtype=torch.int64))
    assert float((after >= 2).float().mean()) > 0.5  # what the halving prevents


def test_rows_not_updated_for_expire_after_steps_return_to_their_initial_value():
    s = shard(None, expire_after=10)
    push(s, [1, 2], np.ones((2, 4)), step=1)
    for step in range(2, 25):
        push(s, [2], np.ones((1, 4)), step=step)
    rows, clocks = pull(s, [1, 2])
    assert np.array_equal(rows[0], initial_rows(s.cfg.tables[0], np.array([1]))[0]) and clocks.tolist() == [0, 24]
    stats = s.tables["t"].stats()
    assert stats["expired"] == 1 and stats["rows"] == 1


def test_the_row_budget_evicts_the_least_recently_updated_and_reuses_their_slots():
    s = shard(None, max_rows=64)
    for step in range(1, 11):
        push(s, np.arange(step * 100, step * 100 + 20), np.ones((20, 4)), step=step)
    t = s.tables["t"]
    stats = t.stats()
    assert stats["rows"] <= 64 and stats["evicted"] == 200 - stats["rows"]
    held = set(t.keys.items()[0].tolist())
    assert set(range(1000, 1020)) <= held and not held & set(range(100, 120))  # the newest stay
    assert t.used <= 64 + 20  # freed slots were reused


def test_a_refused_push_stores_no_new_key():
    s = shard(None, optimizer=OPTIMIZERS[1])
    push(s, [1], np.ones((1, 4)))
    bad = np.full((2, 4), 3e38, np.float32)
    reply = s.handle(Message(Op.PUSH, 1, {"table": "t"}, [np.array([1, 2]), bad, np.ones(2, np.int64)]))
    assert "non-finite" in reply.meta["error"]
    assert s.tables["t"].stats()["rows"] == 1 and pull(s, [2])[1].tolist() == [0]


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=lambda o: o.name)
def test_save_and_load_carry_keys_rows_state_and_admission_counts(tmp_path, opt):
    s = Shard(ShardConfig((TableConfig("t", rows=None, dim=4, optimizer=opt, admit_after=2),)),
              state_dir=str(tmp_path))
    rng = np.random.default_rng(2)
    for step in range(1, 20):
        keys = rng.integers(-50, 50, size=30)
        push(s, keys, rng.normal(size=(30, 4)), step=step)
    s.save(str(tmp_path / "a.pt"))
    probe = np.arange(-60, 60)
    before = pull(s, probe)
    other = Shard(ShardConfig((TableConfig("t", rows=None, dim=4, optimizer=opt, admit_after=2),)))
    other.load(str(tmp_path / "a.pt"))
    assert all(np.array_equal(x, y) for x, y in zip(before, pull(other, probe)))
    assert other.tables["t"].stats() == s.tables["t"].stats()
    for x in (s, other):  # the same future: rows, state, sketch and step came back
        push(x, [70, 71, 3], np.ones((3, 4)), step=20)
    assert all(np.array_equal(x, y) for x, y in zip(pull(s, probe), pull(other, probe)))


def test_a_fixed_save_is_refused_by_a_dynamic_shard(tmp_path):
    fixed = shard(10)
    fixed.save(str(tmp_path / "f.pt"))
    with pytest.raises(ValueError, match="saved as a fixed table"):
        shard(None).load(str(tmp_path / "f.pt"))


def test_the_write_ahead_log_replays_a_dynamic_table(tmp_path):
    cfg = ShardConfig((TableConfig("t", rows=None, dim=4, admit_after=2, expire_after=5),))
    s = Shard(cfg, state_dir=str(tmp_path), wal=True)
    rng = np.random.default_rng(3)
    for step in range(1, 30):
        keys = rng.integers(0, 40, size=10) * 2 ** 50
        push(s, keys, rng.normal(size=(10, 4)), step=step)
    probe = np.arange(0, 40) * 2 ** 50
    before = pull(s, probe)
    s.close()
    again = Shard(cfg, state_dir=str(tmp_path), wal=True)
    assert all(np.array_equal(x, y) for x, y in zip(before, pull(again, probe)))
    assert again.tables["t"].stats() == s.tables["t"].stats()


INDEXES = [pytest.param(KeyIndex, id="reference"),
           pytest.param(NativeKeyIndex, id="native",
                        marks=pytest.mark.skipif(native.ops is None, reason="the native core is not built"))]


@pytest.mark.parametrize("make", INDEXES)
@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["insert", "remove", "lookup"]),
                              st.lists(st.integers(INT64.min, INT64.max) | st.integers(-5, 5), max_size=30)),
                    max_size=40))
def test_the_key_index_is_a_dictionary(make, ops):
    """Inserts, removes and lookups, freed slots reused as a table reuses them: each index
    answers as a dictionary does, key -> slot and slot -> key."""
    index, truth, free, used = make(), {}, [], 0
    import het.ps.server.store.index as module

    old = module.MIN_RECENT
    module.MIN_RECENT = 4  # merge often
    try:
        for op, keys in ops:
            keys = list(dict.fromkeys(keys))
            if op == "insert":
                new = [k for k in keys if k not in truth]
                slots = [free.pop() if free else (used := used + 1) - 1 for _ in new]
                index.insert(torch.tensor(new, dtype=torch.int64), torch.tensor(slots, dtype=torch.int64))
                truth.update(zip(new, slots))
            elif op == "remove":
                held = [k for k in keys if k in truth]
                index.remove(torch.tensor(held, dtype=torch.int64))
                free += [truth.pop(k) for k in held]
            got = index.lookup(torch.tensor(keys, dtype=torch.int64)).tolist()
            assert got == [truth.get(k, -1) for k in keys]
            assert len(index) == len(truth)
            slots = list(truth.values())
            assert index.keys_of(torch.tensor(slots, dtype=torch.int64)).tolist() == list(truth)
    finally:
        module.MIN_RECENT = old
    keys, slots = index.items()
    assert dict(zip(keys.tolist(), slots.tolist())) == truth
    assert keys.tolist() == sorted(truth)


@pytest.mark.skipif(native.ops is None, reason="the native core is not built")
def test_the_native_index_answers_as_the_reference_through_rebuilds():
    """200,000 keys in batches, half removed, their slots given to new keys: several rebuilds
    (growth, tombstones, shrinking) on the way, and the two indexes agree on every call."""
    rng = np.random.default_rng(1)
    ref, nat = KeyIndex(), NativeKeyIndex()
    keys = torch.from_numpy(np.unique(rng.integers(INT64.min, INT64.max, 250_000)))[:200_000]
    keys = keys[torch.from_numpy(rng.permutation(len(keys)))]
    for part in torch.split(torch.arange(len(keys)), 7_000):
        for index in (ref, nat):
            index.insert(keys[part], part)
    gone = torch.from_numpy(rng.choice(len(keys), 100_000, replace=False))
    for index in (ref, nat):
        index.remove(keys[gone])
    fresh = torch.from_numpy(np.setdiff1d(rng.integers(INT64.min, INT64.max, 60_000), keys.numpy()))
    for index in (ref, nat):
        index.insert(fresh, gone[:len(fresh)])
    probe = torch.cat([keys, fresh, torch.tensor([0, -1, INT64.min, INT64.max])])
    assert torch.equal(ref.lookup(probe), nat.lookup(probe))
    assert len(ref) == len(nat) == 100_000 + len(fresh)
    held = ref.lookup(probe)
    held = held[held >= 0]
    assert torch.equal(ref.keys_of(held), nat.keys_of(held))
    assert all(torch.equal(a, b) for a, b in zip(ref.items(), nat.items()))
    assert nat.merges >= 3 and 0.25 <= nat.load <= 0.875
    with pytest.raises(RuntimeError, match="is held already"):
        nat.insert(fresh[:1], torch.tensor([999_999]))
    with pytest.raises(RuntimeError, match="is not held"):
        nat.remove(keys[gone[:1]])


def test_clocks_past_32_bits_widen_the_meta_and_survive_a_save(tmp_path):
    """Clock and last step are held in 32 bits until one outgrows them: then in 64, exact."""
    s = shard(None)
    push(s, [5, 6], np.ones((2, 4)), counts=[3, 1], step=7)
    assert s.tables["t"].meta.dtype == torch.int32
    push(s, [5, 5], np.ones((2, 4)), counts=[2**31, 2**31], step=2**31 + 5)
    table = s.tables["t"]
    assert table.meta.dtype == torch.int64
    assert table.clocks_of(table.locate(torch.tensor([5, 6, 7]))).tolist() == [2**32 + 3, 1, 0]
    saved = table.state_dict()
    assert saved["last_step"].tolist() == [2**31 + 5, 7]
    again = shard(None).tables["t"]
    again.load_state_dict(saved)
    assert again.meta.dtype == torch.int64
    assert again.clocks_of(again.locate(torch.tensor([5, 6]))).tolist() == [2**32 + 3, 1]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 3000), min_size=1, max_size=200, unique=True), st.integers(1, 64),
       st.sampled_from([torch.float32, torch.int32, torch.int64, torch.float16, torch.bfloat16]), st.integers(1, 5), st.booleans(),
       st.integers(0, 3))
def test_chunks_are_one_array(slots, first, dtype, width, fixed, absent):
    """Doubling or fixed-size chunks of any width and type read and write as one array: by het's
    native pass where chunks hold 2^k slots, by per-chunk numpy elsewhere; a slot of -1 reads as
    zeros only when asked for (``missing``)."""
    chunks, truth = Chunks(width, dtype, first=first, fixed=fixed), torch.zeros(3001, width, dtype=dtype)
    chunks.grow_to(3001)
    if not fixed:
        assert chunks.capacity >= 3001 and chunks.capacity < 2 * max(first, 3001)  # doubling: log2 chunks
    slots = torch.tensor(slots)
    rows = (torch.randn(len(slots), width) * 1000).to(dtype)
    chunks.scatter(slots, rows)
    truth[slots] = rows
    assert torch.equal(chunks.gather(slots), truth[slots])
    asked = torch.cat([slots, torch.full((absent,), -1)])[torch.randperm(len(slots) + absent)]
    expected = torch.where((asked >= 0)[:, None], truth[asked.clamp(min=0)], torch.zeros((), dtype=dtype))
    assert torch.equal(chunks.gather(asked, missing=True), expected)
    out = torch.empty(len(asked), width, dtype=dtype)
    assert chunks.gather(asked, missing=True, out=out) is out and torch.equal(out, expected)


@pytest.mark.parametrize("first", [8, 6])  # the native pass, the reference
def test_chunks_refuse_slots_out_of_range(first):
    chunks = Chunks(2, torch.int32, first=first)
    chunks.grow_to(20)
    for bad in ([-1], [chunks.capacity], [0, 2**40]):
        with pytest.raises((IndexError, RuntimeError), match="out of"):
            chunks.gather(torch.tensor(bad))
        with pytest.raises((IndexError, RuntimeError), match="out of"):
            chunks.scatter(torch.tensor(bad), torch.zeros(len(bad), 2, dtype=torch.int32))


def test_reshard_moves_a_dynamic_table_with_its_state(tmp_path):
    from het.ps.protocol.partition import shard_of
    from het.ps.reshard import reshard

    table = TableConfig("t", rows=None, dim=4, optimizer=OPTIMIZERS[1], admit_after=2)
    old = [Shard(ShardConfig((table,), index=i, num_shards=2)) for i in range(2)]
    rng = np.random.default_rng(4)
    for step in range(1, 15):
        keys = torch.from_numpy(rng.integers(-10 ** 15, 10 ** 15, size=40) // 10 ** 13)
        grads = rng.normal(size=(40, 4))
        for i, s in enumerate(old):
            mine = (shard_of(keys, 2, hashed=True) == i).numpy()
            push(s, keys.numpy()[mine], grads[mine], step=step)
    for i, s in enumerate(old):
        s.save(str(tmp_path / "src" / f"shard-{i}.pt"))
    reshard(str(tmp_path / "src"), str(tmp_path / "dst"), 3)
    new = [Shard(ShardConfig((table,), index=j, num_shards=3)) for j in range(3)]
    for j, s in enumerate(new):
        s.load(str(tmp_path / "dst" / f"shard-{j}.pt"))
    probe = torch.arange(-120, 120)
    for shards, S in ((old, 2), (new, 3)):
        where = shard_of(probe, S, hashed=True)
        got = [pull(shards[i], probe[where == i].numpy()) for i in range(S)]
        rows = torch.empty(len(probe), 4)
        clocks = torch.empty(len(probe), dtype=torch.int64)
        for i in range(S):
            rows[where == i] = torch.from_numpy(got[i][0])
            clocks[where == i] = torch.from_numpy(got[i][1]).long()  # as narrow as they fit
        if S == 2:
            want = (rows, clocks)
    assert torch.equal(rows, want[0]) and torch.equal(clocks, want[1])
    assert sum(s.tables["t"].stats()["rows"] for s in new) == sum(s.tables["t"].stats()["rows"] for s in old)


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=lambda o: o.name)
def test_the_shards_account_of_its_bytes_follows_the_rows_pushed(opt):
    """200k distinct keys from the whole int64 range: rows, state, index and meta stay under 1.3x
    the rows plus their optimizer state (the RSS of a shard process is measured by
    tests/cluster/test_dynamic_memory.py)."""
    from het.bench.memory import distinct_keys

    n, dim = 200_000, 64
    s = shard(None, dim=dim, optimizer=opt)
    keys = distinct_keys(n, seed=5)
    grads, counts = np.full((8192, dim), 1e-3, np.float32), np.ones(8192, np.int64)
    for lo in range(0, n, 8192):
        k = keys[lo:lo + 8192]
        s.push("t", k, grads[:len(k)].copy(), counts[:len(k)])
    ideal = n * dim * 4 * (1 + len(s.tables["t"].state_names))
    stats = s.tables["t"].stats()
    assert stats["rows"] == n and ideal < stats["bytes"] <= 1.3 * ideal, stats["bytes"] / ideal


def test_the_admission_sketch_has_the_size_asked_for_and_reports_it():
    s = shard(None, admit_after=2, admit_counters=1 << 12)
    assert s.tables["t"].stats()["admission_bytes"] == 1 << 12
    assert shard(None).tables["t"].stats()["admission_bytes"] == 0  # admit_after 1 keeps no sketch
    with pytest.raises(ValueError, match="admit_counters apply only to dynamic tables"):
        TableConfig("t", rows=10, dim=2, admit_counters=1 << 12)
