import math
import re

import numpy as np
import pytest
import torch

from het.config import OptimizerConfig, ShardConfig, TableConfig
from het.ps.local import local_client
from het.ps.protocol.initial import initial_rows
from het.ps.protocol.messages import Message, Op, PSError
from het.ps.server.shard import Shard

T = TableConfig("t", rows=20, dim=3, optimizer=OptimizerConfig("sgd", lr=1.0))


def test_initial_rows_do_not_depend_on_the_number_of_shards():
    keys = torch.arange(20)
    one = local_client([T], 1)
    three = local_client([T], 3)
    assert torch.equal(one.wait(one.pull("t", keys))[0], three.wait(three.pull("t", keys))[0])
    other_seed = local_client([TableConfig("t", rows=20, dim=3, seed=1)], 1)
    assert not torch.equal(one.wait(one.pull("t", keys))[0], other_seed.wait(other_seed.pull("t", keys))[0])


def test_initial_rows_are_pinned_bit_for_bit():
    """Clients build untouched rows themselves (lazy rows): the function must never drift
    between versions, or a client would build other values than its shard holds."""
    t = TableConfig("t", rows=1 << 40, dim=3, init_scale=0.5, seed=7)
    bits = initial_rows(t, np.array([0, 12345, (1 << 40) - 1])).view(np.uint32).tolist()
    assert bits == [[3199964842, 1044457932, 1007611456], [3203895612, 3179800648, 3181797632],
                    [3189853324, 1033799144, 1052180436]]


def test_push_sums_duplicate_keys_and_counts_clocks():
    client = local_client([T], 2)
    before = client.wait(client.pull("t", torch.tensor([4, 5])))[0]
    keys = torch.tensor([4, 5, 4])
    client.wait(client.push("t", keys, torch.tensor([[1.0] * 3, [2.0] * 3, [3.0] * 3]), torch.tensor([1, 2, 1])))
    rows, clocks = client.wait(client.pull("t", torch.tensor([4, 5])))
    assert torch.allclose(rows, before - torch.tensor([[4.0] * 3, [2.0] * 3]))
    assert clocks.tolist() == [2, 2]


@pytest.mark.parametrize("bound, expect", [(0, [0, 1, 2]), (1, [0, 2]), (math.inf, [0])])
def test_sync_returns_misses_and_rows_staler_than_the_bound(bound, expect):
    client = local_client([T], 3)
    keys = torch.tensor([7, 8, 9])
    client.wait(client.push("t", torch.tensor([8, 9, 9]), torch.zeros(3, 3), torch.tensor([1, 1, 1])))
    # key 7 is a miss (-1); key 8 is one update behind, key 9 two
    res = client.wait(client.sync("t", keys, torch.tensor([-1, 0, 0]), bound))
    assert res.index.tolist() == expect
    assert res.clocks.tolist() == [[0, 1, 2][i] for i in expect]


def test_push_sync_applies_the_push_first():
    client = local_client([T], 2)
    res = client.wait(client.push_sync("t", torch.tensor([3]), torch.ones(1, 3), torch.tensor([1]),
                                       torch.tensor([3, 4]), torch.tensor([0, 0]), 0))
    assert res.index.tolist() == [0] and res.clocks.tolist() == [1]


def test_bad_pushes_are_refused_and_change_nothing():
    client = local_client([T], 1)
    rows0, clocks0 = client.wait(client.pull("t", torch.arange(20)))
    shard = client.channels[0].shard
    with pytest.raises(ValueError, match="NaN or inf"):
        client.push("t", torch.tensor([1]), torch.tensor([[math.nan, 0, 0]]), torch.tensor([1]))
    with pytest.raises(ValueError, match=r"grads must be a tensor of shape \(1, 3\)"):
        client.push("t", torch.tensor([1]), torch.zeros(1, 4), torch.tensor([1]))
    with pytest.raises(ValueError, match="key 20 out of range for table 't' with 20 rows"):
        client.push("t", torch.tensor([20]), torch.zeros(1, 3), torch.tensor([1]))
    with pytest.raises(KeyError, match="unknown table 'nope'"):
        client.pull("nope", torch.tensor([1]))
    with pytest.raises(TypeError, match=r"keys must be int64 \(or int32\), as nn.Embedding takes them, got torch.float32"):
        client.pull("t", torch.tensor([1.0]))
    # the shard checks too, whatever a client sends
    bad = shard.handle(Message(Op.PUSH, 1, {"table": "t"}, [np.array([1]), np.array([[np.inf, 0, 0]], np.float32),
                                                      np.array([1])]))
    assert bad.status == 1 and "NaN or inf" in bad.meta["error"]
    other_shard = Shard(ShardConfig((T,), 1, 2)).handle(Message(Op.PULL, 2, {"table": "t"}, [np.array([2])]))
    assert other_shard.status == 1 and "another shard" in other_shard.meta["error"]
    # keys travel as int64 or int32 (a narrowed request): any other width is refused, by name
    for keys in (np.array([1], np.int16), np.array([1.0], np.float32), np.array([[1]], np.int32)):
        bad = shard.handle(Message(Op.PUSH, 3, {"table": "t"}, [keys, np.zeros((1, 3), np.float32), np.array([1])]))
        assert bad.status == 1 and "keys must be a 1-D int64 or int32 array, got " + str(keys.dtype) in bad.meta["error"]
    narrow = shard.handle(Message(Op.PULL, 4, {"table": "t"}, [np.array([19, 0], np.int32)]))
    assert narrow.status == 0 and torch.equal(torch.from_numpy(narrow.arrays[0]), rows0[[19, 0]])
    rows1, clocks1 = client.wait(client.pull("t", torch.arange(20)))
    assert torch.equal(rows0, rows1) and torch.equal(clocks0, clocks1)


def test_counts_and_clocks_of_any_wire_width_apply_alike_and_others_are_refused():
    """Counts and clocks travel as narrow as they fit: a shard takes uint8 to int64 alike, and
    refuses floats and unsigned 16-bit integers by name, changing nothing."""
    results = []
    for dtype in (np.uint8, np.int16, np.int32, np.int64):
        shard = Shard(ShardConfig((T,)))
        keys, grads = np.array([3, 7, 3]), np.ones((3, 3), np.float32)
        pushed = shard.handle(Message(Op.PUSH, 1, {"table": "t"}, [keys, grads, np.array([2, 200, 1], dtype)]))
        assert pushed.status == 0 and pushed.meta["applied"] == 3
        synced = shard.handle(Message(Op.SYNC, 2, {"table": "t", "bound": 0},
                                      [np.array([3, 7, 9]), np.array([0, 200, 0], dtype)]))
        assert synced.status == 0
        results.append((shard.tables["t"].clocks.tolist(), synced.arrays[0].tolist(), synced.arrays[2].tolist()))
    assert all(r == results[0] for r in results)
    assert results[0][1:] == ([0], [3])  # only key 3 (clock 3 > sent 0) is stale; key 7 is not, key 9 untouched
    shard = Shard(ShardConfig((T,)))
    for bad in (np.array([1.0], np.float32), np.array([1], np.uint16)):
        refused = shard.handle(Message(Op.PUSH, 3, {"table": "t"}, [np.array([1]), np.zeros((1, 3), np.float32), bad]))
        assert refused.status == 1 and f"counts must be integers (uint8, int16, int32, int64), got {bad.dtype}" \
            in refused.meta["error"]
        refused = shard.handle(Message(Op.SYNC, 4, {"table": "t"}, [np.array([1]), bad]))
        assert refused.status == 1 and f"clocks must be integers (uint8, int16, int32, int64) of shape (1,), got " \
            f"{bad.dtype}" in refused.meta["error"]
    assert int(shard.tables["t"].clocks.sum()) == 0 and shard.stats["rows_in"] == 0


def test_delta_coded_keys_reach_the_same_rows_as_plain_ones_and_bad_codes_change_nothing():
    """A client sends ascending keys as the steps between them (a byte each here): the shard
    applies and answers them as the plain keys; a code naming another array, or steps that do
    not step up, is refused whole."""
    plain, coded = local_client([T], 1), local_client([T], 1)
    keys = torch.tensor([2, 3, 9, 17])
    for client in (plain, coded):
        client.wait(client.push("t", keys, torch.ones(4, 3), torch.tensor([1, 2, 1, 1])))
    handle = coded.push_sync("t", keys, torch.ones(4, 3), torch.ones(4, dtype=torch.int64), keys,
                             torch.tensor([-1, 0, 2, -1]), 0)
    assert handle.push_bytes == 4 * 1 + 4 * 12 + 4 * 1 and handle.sync_bytes == 4 * 1 + 4 * 2  # keys as u1 steps
    got = coded.wait(handle)
    plain.wait(plain.push("t", keys, torch.ones(4, 3), torch.ones(4, dtype=torch.int64)))
    want = plain.wait(plain.sync("t", keys, torch.tensor([-1, 0, 2, -1]), 0))
    assert torch.equal(got.index, want.index) and torch.equal(got.rows, want.rows)
    assert torch.equal(got.clocks, want.clocks) and got.index.tolist() == [0, 1, 3]
    shard = coded.channels[0].shard
    before = shard.tables["t"].clocks.clone()
    grads, counts = np.ones((2, 3), np.float32), np.ones(2, np.uint8)
    for deltas, steps, match in (({"1": 2}, np.array([0, 1], np.uint8), r"names arrays \[1\]: PUSH's keys are arrays \[0\]"),
                                 ({"0": 2}, np.array([0, 0], np.uint8), "steps of at least 1"),
                                 ({"x": 2}, np.array([0, 1], np.uint8), "must map array positions")):
        bad = shard.handle(Message(Op.PUSH, 9, {"table": "t", "deltas": deltas}, [steps, grads, counts]))
        assert bad.status == 1 and re.search(match, bad.meta["error"]), bad.meta
    assert torch.equal(shard.tables["t"].clocks, before)


def test_a_push_in_any_order_lands_as_the_same_push_in_key_order():
    """Ascending push keys travel as steps (a byte each here), others as int32; the rows and
    clocks the shard ends with are the same either way, duplicates included."""
    keys = torch.tensor([17, 2, 9, 3, 9])
    grads, counts = torch.arange(15.0).reshape(5, 3), torch.tensor([1, 2, 1, 3, 1])
    shuffled, ordered = local_client([T], 1), local_client([T], 1)
    order = torch.sort(keys, stable=True).indices
    for client, at in ((shuffled, torch.arange(5)), (ordered, order)):
        client.wait(client.push("t", keys[at], grads[at], counts[at]))
    unique = torch.tensor([2, 3, 9, 17])
    assert shuffled.push("t", unique.flip(0), grads[:4], counts[:4]).push_bytes == 4 * 4 + 4 * 12 + 4 * 1
    assert ordered.push("t", unique, grads[:4].flip(0), counts[:4].flip(0)).push_bytes == 4 * 1 + 4 * 12 + 4 * 1
    everything = torch.arange(T.rows)
    (rows_a, clocks_a), (rows_b, clocks_b) = (c.wait(c.pull("t", everything)) for c in (shuffled, ordered))
    assert torch.equal(rows_a, rows_b) and torch.equal(clocks_a, clocks_b)
    assert clocks_a[[2, 3, 9, 17]].tolist() == [5, 4, 4, 2]


def test_error_replies_raise_ps_error_naming_the_shard():
    client = local_client([T], 1)
    with pytest.raises(PSError, match=r"PS shard 0 \(local-0\) refused LOAD: ValueError: no saved shard"):
        client.load_named("nonexistent")
    with pytest.raises(ValueError, match="no saved shard at /nonexistent/dir/shard-0.pt"):
        client.load("/nonexistent/dir")


@pytest.mark.parametrize("opt", ["sgd", "adagrad", "adam"])
def test_save_and_load_restore_rows_clocks_and_optimizer_state(tmp_path, opt):
    table = TableConfig("t", rows=10, dim=2, optimizer=OptimizerConfig(opt, lr=0.1))
    client = local_client([table], 2)
    keys = torch.tensor([1, 2, 3])
    push = lambda: client.wait(client.push("t", keys, torch.ones(3, 2), torch.ones(3, dtype=torch.int64), step=1))
    push()
    client.save(str(tmp_path))
    push()
    expected = client.wait(client.pull("t", torch.arange(10)))
    client.load(str(tmp_path))
    push()  # the same second step again: equal only if the optimizer state came back too
    rows, clocks = client.wait(client.pull("t", torch.arange(10)))
    assert torch.equal(rows, expected[0]) and torch.equal(clocks, expected[1])


def test_load_refuses_a_file_of_another_layout(tmp_path):
    client = local_client([T], 1)
    client.save(str(tmp_path))
    other = local_client([TableConfig("t", rows=21, dim=3)], 1)
    with pytest.raises(PSError, match="has shape"):
        other.load(str(tmp_path))


def test_stats_count_requests_rows_and_bytes():
    client = local_client([T], 1, lazy_init=False)
    client.wait(client.pull("t", torch.arange(5)))
    stats = client.stats()[0]
    assert stats["requests_pull"] == 1 and stats["rows_out"] == 5
    assert stats["bytes_out"] > 5 * 3 * 4 and stats["bytes_in"] > 5 * 8


def test_stats_count_rows_left_for_a_lazy_client_to_build():
    client = local_client([T], 1)  # lazy_init by default
    client.wait(client.push("t", torch.tensor([1, 3]), torch.ones(2, 3), torch.ones(2, dtype=torch.int64)))
    client.wait(client.pull("t", torch.arange(5)))
    stats = client.stats()[0]
    assert stats["rows_out"] == 2 and stats["rows_built_by_client"] == 3


def test_load_of_another_optimizers_state_changes_nothing(tmp_path):
    sgd = local_client([TableConfig("t", rows=10, dim=2, optimizer=OptimizerConfig("sgd", lr=0.1))], 1)
    sgd.save(str(tmp_path))
    adam = local_client([TableConfig("t", rows=10, dim=2, optimizer=OptimizerConfig("adam", lr=0.1))], 1)
    adam.wait(adam.push("t", torch.tensor([1]), torch.ones(1, 2), torch.tensor([1])))
    before = adam.wait(adam.pull("t", torch.arange(10)))
    with pytest.raises(PSError, match=r"optimizer state \[\], this shard's adam needs \['exp_avg', 'exp_avg_sq'\]"):
        adam.load(str(tmp_path))
    after = adam.wait(adam.pull("t", torch.arange(10)))
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])


def test_keys_past_int32_travel_as_int64_and_either_width_reaches_the_same_rows():
    dyn = TableConfig("ids", rows=None, dim=3, optimizer=OptimizerConfig("sgd", lr=0.5))
    client = local_client([dyn], 2)
    narrow, wide = torch.tensor([7, -3, 2**31 - 1]), torch.tensor([7, -3, 2**40])
    for keys, key_bytes in ((narrow, 4), (wide, 8)):
        assert client.sync("ids", keys, torch.full_like(keys, -1), 0).sync_bytes == 3 * key_bytes + 3 * 2  # int16 clocks
        client.wait(client.push("ids", keys, torch.ones(3, 3), torch.ones(3, dtype=torch.int64)))
    keys = torch.tensor([7, -3, 2**31 - 1, 2**40])
    rows, clocks = client.wait(client.pull("ids", keys))
    assert clocks.tolist() == [2, 2, 1, 1]
    assert torch.allclose(rows, torch.from_numpy(initial_rows(dyn, keys.numpy())) - 0.5 * clocks[:, None].float())


def test_sync_clocks_and_indices_travel_as_narrow_as_they_fit():
    client = local_client([T], 1)
    keys = torch.tensor([1, 2])
    small = client.sync("t", keys, torch.tensor([-1, 0]), 0)
    assert small.sync_bytes == 2 * 1 + 2 * 2                     # keys 1, 2 as steps 0, 1; int16 clocks (-1: a miss)
    res = client.wait(small)
    assert res.clocks.dtype == torch.int64 and res.index.dtype == torch.int64  # widened for the cache
    assert res.sync_bytes == 1 + 1                               # one miss: uint8 index, built mark (no clock:
    assert res.clocks.tolist() == [0]                             # an untouched row's is 0)
    assert res.row_bytes == 0                                     # untouched: built by the client
    # a clock past 2^31 (a long-lived hot row) goes as int64, both ways, and compares exactly
    big = (1 << 31) + 5
    for count in (1 << 31, 5):  # one push counts at most 2^31 updates of a key
        client.wait(client.push("t", torch.tensor([2]), torch.zeros(1, 3), torch.tensor([count])))
    wide = client.sync("t", keys, torch.tensor([-1, big - 1]), 0)
    assert wide.sync_bytes == 2 * 1 + 2 * 8  # keys as steps, clocks as int64
    res = client.wait(wide)
    assert res.index.tolist() == [0, 1] and res.clocks.tolist() == [0, big]


def test_a_save_removes_the_one_it_replaces_and_a_bad_name_to_drop_changes_nothing(tmp_path):
    """SAVE with ``drop``: the new save is written, then the named earlier one (and its folder)
    removed; a ``drop`` out of the state directory, or of the shard's own files, is refused before
    anything is written; a name to drop that holds nothing is no error."""
    shard = Shard(ShardConfig((TableConfig("t", rows=8, dim=2),)), state_dir=str(tmp_path))
    save = lambda meta: shard.handle(Message(Op.SAVE, 1, meta))  # noqa: E731
    assert save({"path": "a/shard-0.pt"}).status == 0 and save({"path": "b/shard-0.pt", "drop": "a/shard-0.pt"}).status == 0
    assert not (tmp_path / "a").exists() and (tmp_path / "b" / "shard-0.pt").is_file()
    for bad in ("../b/shard-0.pt", "wal/base.pt", "/etc/passwd"):
        reply = save({"path": "c/shard-0.pt", "drop": bad})
        assert reply.status != 0 and "refused path" in reply.meta["error"] and not (tmp_path / "c").exists()
    assert save({"path": "c/shard-0.pt", "drop": "gone/shard-0.pt"}).status == 0 and (tmp_path / "b").exists()
    same = save({"path": "c/shard-0.pt", "drop": "c/shard-0.pt"})
    assert same.status != 0 and "cannot drop the file it writes" in same.meta["error"]
    assert (tmp_path / "c" / "shard-0.pt").is_file()
    shard.close()


@pytest.mark.parametrize("shards", [1, 3])
def test_a_request_of_no_keys_sends_nothing_and_gives_empty_results(shards):
    client = local_client([T], shards)
    before = [s.get("requests_pull", 0) + s.get("requests_push", 0) for s in client.stats()]
    rows, clocks = client.wait(client.pull("t", torch.tensor([], dtype=torch.int64)))
    assert rows.shape == (0, 3) and clocks.shape == (0,)
    assert client.wait(client.push("t", torch.tensor([], dtype=torch.int64), torch.zeros(0, 3),
                                   torch.zeros(0, dtype=torch.int64))) == 0
    assert [s.get("requests_pull", 0) + s.get("requests_push", 0) for s in client.stats()] == before


def same_state(a, b) -> bool:
    """Whether two state dicts of a table hold the same values, tensor for tensor."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    return a == b


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "adam"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("lr", [1.0, 1e-30])
@pytest.mark.parametrize("size", [20, None], ids=["fixed", "dynamic"])
def test_a_table_that_refuses_non_finite_gradients_itself_names_them_as_the_check_would(monkeypatch, optimizer,
                                                                                        bad, lr, size):
    """A native push of float32 rows, fixed or dynamic, refuses any non-finite result: the shard
    spares the gradients' pass before it, and when the push is refused says what the pass would
    have said, counts it an error (not a refused update) and changes nothing, a new key of a
    dynamic table left unstored. A push that overflows is refused as the table names it."""
    from het import native
    from het.ps.protocol import checks

    if native.ops is None:
        pytest.skip("het's native core is not built")
    table = TableConfig("t", rows=size, dim=3, optimizer=OptimizerConfig(optimizer, lr=lr))
    shard = Shard(ShardConfig((table,)))
    assert shard.tables["t"].refuses_non_finite_grads
    passes = []
    monkeypatch.setattr(checks, "check_finite", lambda *a: passes.append(a))
    keys, counts = np.array([1, 4, 1]), np.array([1, 1, 1])
    assert shard.push("t", keys, np.ones((3, 3), np.float32), counts) == 3 and not passes  # no pass when taken
    rows, saved = shard.pull("t", np.arange(20))[0].copy(), shard.tables["t"].state_dict()
    grads = np.ones((4, 3), np.float32)
    grads[2, 1] = bad
    with pytest.raises(ValueError, match=r"^grads for table 't' hold NaN or inf: refused, nothing changed$"):
        shard.push("t", np.array([1, 4, 1, 9]), grads, np.array([1, 1, 1, 1]))  # key 9 new to a dynamic table
    assert shard.stats["refused_pushes"] == 0 and np.array_equal(shard.pull("t", np.arange(20))[0], rows)
    assert same_state(shard.tables["t"].state_dict(), saved)  # keys, rows, clocks, last steps, optimizer state
    if optimizer == "sgd" and lr == 1.0:  # key 1 twice: -6e38 is past float32's range
        with pytest.raises(ValueError, match=r"refused, nothing changed: the update would make rows non-finite"):
            shard.push("t", keys, np.full((3, 3), 3e38, np.float32), counts)
        assert shard.stats["refused_pushes"] == 1 and np.array_equal(shard.pull("t", np.arange(20))[0], rows)


@pytest.mark.parametrize("table", [dict(admit_after=2), dict(row_dtype="bf16")], ids=["admitting", "bf16"])
def test_a_dynamic_table_that_may_not_see_every_gradient_keeps_the_pass(monkeypatch, table):
    """A dynamic table that admits keys after several sightings drops the gradients of keys not
    yet admitted unseen, so its push cannot be the gradients' check: the shard's pass runs and
    refuses a NaN for such a key, counting nothing. Half rows keep the pass too, as a fixed
    table's."""
    from het.ps.protocol import checks

    passes = []
    check = checks.check_finite
    monkeypatch.setattr(checks, "check_finite", lambda *a: passes.append(a[1:]) or check(*a))
    shard = Shard(ShardConfig((TableConfig("t", rows=None, dim=3, optimizer=OptimizerConfig("sgd", lr=0.1),
                                           **table),)))
    assert not shard.tables["t"].refuses_non_finite_grads
    assert shard.push("t", np.array([5]), np.ones((1, 3), np.float32), np.array([1])) == 1
    assert passes == [("grads", "t")]  # the pass ran on a push the table took
    grads = np.array([[math.nan, 0, 0]], np.float32)
    with pytest.raises(ValueError, match=r"^grads for table 't' hold NaN or inf: refused, nothing changed$"):
        shard.push("t", np.array([7]), grads, np.array([1]))
    assert len(passes) == 2 and shard.stats["refused_pushes"] == 0
    assert shard.tables["t"].stats()["rows"] == (0 if "admit_after" in table else 1)  # key 7 never stored


@pytest.mark.parametrize("logged", [False, True])
def test_a_push_wrong_twice_is_refused_for_its_counts_whether_or_not_the_gradients_pass_is_spared(tmp_path,
                                                                                                  logged):
    """Gradients not finite and a count out of range: the counts are named, by a shard that
    spares the gradients' pass (the table refuses them itself) and by one that runs it (a log)."""
    from het import native

    shard = Shard(ShardConfig((T,)), state_dir=str(tmp_path), wal=logged)
    assert shard.tables["t"].refuses_non_finite_grads == (native.ops is not None)
    rows, clocks = (a.copy() for a in shard.pull("t", np.arange(T.rows))[:2])
    grads = np.array([[math.nan, 0, 0], [0, 0, 0]], np.float32)
    with pytest.raises(ValueError, match=r"^counts must lie in \[0, 2147483648\], got -1$"):
        shard.push("t", np.array([1, 2]), grads, np.array([1, -1]))
    after = shard.pull("t", np.arange(T.rows))
    assert np.array_equal(after[0], rows) and after[1].tolist() == clocks.tolist()  # nothing changed
    shard.close()
    if logged:  # nothing was logged: a shard started on the log replays no push
        again = Shard(ShardConfig((T,)), state_dir=str(tmp_path), wal=True)
        assert again.stats["wal_replayed"] == 0
        again.close()


def test_with_a_log_the_gradients_are_checked_before_they_are_logged(tmp_path):
    shard = Shard(ShardConfig((T,)), state_dir=str(tmp_path), wal=True)
    grads = np.array([[math.nan, 0, 0]], np.float32)
    with pytest.raises(ValueError, match=r"^grads for table 't' hold NaN or inf: refused, nothing changed$"):
        shard.push("t", np.array([1]), grads, np.array([1]))
    shard.close()
    again = Shard(ShardConfig((T,)), state_dir=str(tmp_path), wal=True)
    assert again.stats["wal_replayed"] == 0
    again.close()


def _adam_past_float32() -> TableConfig:
    """An Adam table whose lr takes steps past float32's range: OptimizerConfig refuses such an
    lr, so it is set here behind its back; torch's ops raise part way through a push of it."""
    optimizer = OptimizerConfig("adam", lr=1.0)
    object.__setattr__(optimizer, "lr", 1e40)
    return TableConfig("t", rows=8, dim=2, optimizer=optimizer)


def test_a_non_finite_gradient_is_refused_as_before_where_the_pass_is_not_spared():
    """Adam's pushes of several steps (squares sent: torch's ops), a part held for later, and a
    request through the wire: the gradients' pass runs where it ran, the request counts as an
    error and not as a refused update, and nothing changes."""
    from het import native

    shard = Shard(ShardConfig((_adam_past_float32(),)))  # torch's ops raise mid-push
    assert shard.tables["t"].refuses_non_finite_grads == (native.ops is not None)
    before = shard.pull("t", np.arange(8))[0].copy()
    grads = np.array([[math.nan, 1], [1, 1]], np.float32)
    with pytest.raises(ValueError, match=r"^grads for table 't' hold NaN or inf: refused, nothing changed$"):
        shard.push("t", np.array([1, 2]), grads, np.array([2, 1]), sq=np.ones((2, 2), np.float32))
    assert np.array_equal(shard.pull("t", np.arange(8))[0], before)
    assert shard.pull("t", np.arange(8))[1].tolist() == [0] * 8

    wire = Shard(ShardConfig((T,)))
    bad = [np.array([1]), np.array([[math.inf, 0, 0]], np.float32), np.array([1])]
    held = wire.handle(Message(Op.PUSH, 1, {"table": "t", "part": 1, "parts": 2, "session": "p" * 16, "seq": 1},
                               bad))
    assert held.status == 1 and "grads for table 't' hold NaN or inf" in held.meta["error"]  # at its part
    whole = wire.handle(Message(Op.PUSH, 2, {"table": "t"}, bad))
    assert whole.status == 1 and "grads for table 't' hold NaN or inf" in whole.meta["error"]
    assert wire.stats["errors"] == 2 and wire.stats["refused_pushes"] == 0


def test_a_reference_push_that_fails_part_way_changes_nothing():
    """Adam's steps taken apart by torch's ops with an lr past float32's range: torch raises
    while it writes; the rows, clocks, marks and state written are put back."""
    from het.ps.server.store.fixed import FixedRows

    cfg = _adam_past_float32()
    shard = Shard(ShardConfig((cfg,)))
    shard.tables["t"] = FixedRows(cfg, 0, 1, native=False)  # the reference (the native pass refuses such a push whole)
    rows, clocks = (a.copy() for a in shard.pull("t", np.arange(8)))
    state = {n: v.clone() for n, v in shard.tables["t"].optimizer.state.items()}
    with pytest.raises(RuntimeError):
        shard.push("t", np.array([1, 2]), np.ones((2, 2), np.float32), np.array([2, 1]),
                   sq=np.ones((2, 2), np.float32))
    after_rows, after_clocks = shard.pull("t", np.arange(8))
    assert np.array_equal(after_rows, rows) and np.array_equal(after_clocks, clocks)
    assert not shard.tables["t"].touched.any()
    assert all(torch.equal(v, state[n]) for n, v in shard.tables["t"].optimizer.state.items())
