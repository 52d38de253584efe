"""Lazy rows: a shard leaves out rows no push has touched and the client builds them from the
table's seed. Whatever a lazy client gets must equal, bit for bit, what an eager one gets."""

import math
import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from het import CacheConfig, Embedding, OptimizerConfig, TableConfig
from het.ps.protocol.initial import initial_rows
from het.ps.protocol.messages import Message, Op, PSError, decode, encode
from conftest import LocalCluster, ZmqCluster

T = TableConfig("t", rows=50, dim=4, optimizer=OptimizerConfig("adagrad", lr=0.1), seed=3)
# a table of any int64 id, its accumulators starting above 0: an untouched row's state is not zeros
ANY_ID = TableConfig("t", rows=None, dim=4, optimizer=OptimizerConfig("adagrad", lr=0.1, initial_accumulator=0.3),
                     seed=3)


def _clients(num_shards, table=T):
    cluster = LocalCluster([table], num_shards)
    return cluster, cluster.client(lazy_init=True), cluster.client(lazy_init=False)


@settings(max_examples=40, deadline=None)
@given(num_shards=st.integers(1, 3), table=st.sampled_from([T, ANY_ID]), state=st.sampled_from([None, "row", "full"]),
       pushes=st.lists(st.tuples(st.lists(st.integers(0, 49), min_size=1, max_size=8), st.integers(0, 2)),
                       max_size=6),
       asked=st.lists(st.integers(0, 49), min_size=1, max_size=20),
       clocks=st.lists(st.integers(-1, 3), min_size=20, max_size=20), bound=st.integers(0, 2))
def test_a_lazy_client_gets_exactly_what_an_eager_one_gets(num_shards, table, state, pushes, asked, clocks, bound):
    """Rows, clocks and (asked for) optimizer state: a lazy reply leaves all three out for an
    untouched row, and the client makes them (its initial row, clock 0, initial state)."""
    cluster, lazy, eager = _clients(num_shards, table)
    for keys, count in pushes:  # zero counts too: a row changed without a clock tick (ps mode's dense table)
        keys = torch.tensor(keys)
        eager.wait(eager.push("t", keys, torch.randn(len(keys), 4), torch.full((len(keys),), count)))
    keys = torch.tensor(sorted(set(asked)))
    (rows_l, clocks_l), (rows_e, clocks_e) = (c.wait(c.pull("t", keys)) for c in (lazy, eager))
    assert torch.equal(rows_l, rows_e) and torch.equal(clocks_l, clocks_e)
    sent = torch.tensor(clocks[:len(keys)])
    a, b = (c.wait(c.sync("t", keys, sent, bound, state=state)) for c in (lazy, eager))
    assert torch.equal(a.index, b.index) and torch.equal(a.rows, b.rows) and torch.equal(a.clocks, b.clocks)
    assert (a.state is None and b.state is None) if state is None else torch.equal(a.state, b.state)
    assert a.row_bytes <= b.row_bytes and a.sync_bytes <= b.sync_bytes + num_shards * ((len(a.index) + 7) // 8)  # built bits
    touched = set().union(*(set(k) for k, _ in pushes)) if pushes else set()
    asked_rows = [int(keys[i]) for i in b.index]
    width = {None: 0, "row": 1, "full": 4}[state]
    # only touched rows travelled, with their state
    assert a.row_bytes == sum(k in touched for k in asked_rows) * 4 * (4 + width)
    cluster.close()


def test_untouched_rows_are_built_not_sent_and_equal_the_shards_initial_rows():
    cluster, lazy, eager = _clients(2)
    keys = torch.arange(10)
    reply = lazy.wait(lazy.sync("t", keys, torch.full((10,), -1), 0))
    assert reply.row_bytes == 0 and reply.rows.shape == (10, 4)
    assert torch.equal(reply.rows, torch.from_numpy(initial_rows(T, keys.numpy())))
    assert sum(s.stats["rows_built_by_client"] for s in cluster.shards) == 10
    lazy.wait(lazy.push("t", torch.tensor([2]), torch.ones(1, 4), torch.tensor([1])))
    reply = lazy.wait(lazy.sync("t", keys, torch.full((10,), -1), 0))
    assert reply.row_bytes == 4 * 4  # the one pushed row travels
    assert torch.equal(reply.rows, eager.wait(eager.pull("t", keys))[0])


def test_a_zero_count_push_still_marks_its_rows_touched():
    """ps mode installs the dense model with pushes of count 0: the clock stays 0, the row changes."""
    cluster, lazy, _ = _clients(1)
    lazy.wait(lazy.push("t", torch.tensor([4]), torch.ones(1, 4), torch.tensor([0])))
    rows, clocks = lazy.wait(lazy.pull("t", torch.tensor([4])))
    assert clocks.tolist() == [0]
    assert not torch.equal(rows, torch.from_numpy(initial_rows(T, np.array([4]))))


def test_save_and_load_keep_which_rows_were_touched(tmp_path):
    cluster, lazy, _ = _clients(1)
    lazy.wait(lazy.push("t", torch.tensor([1]), torch.ones(1, 4), torch.tensor([1])))
    lazy.save(str(tmp_path))
    fresh_cluster, fresh, _ = _clients(1)
    fresh.load(str(tmp_path))
    assert fresh_cluster.shards[0].tables["t"].touched.nonzero().flatten().tolist() == [1]
    # a save from before rows were marked: every row counts as touched, so all are sent
    path = tmp_path / "shard-0.pt"
    state = torch.load(path, weights_only=True)
    del state["tables"]["t"]["touched"]
    torch.save(state, path)
    fresh.load(str(tmp_path))
    assert bool(fresh_cluster.shards[0].tables["t"].touched.all())
    assert fresh.wait(fresh.sync("t", torch.arange(3), torch.full((3,), -1), 0)).row_bytes == 3 * 4 * 4


def test_a_malformed_lazy_flag_is_refused_and_the_shard_keeps_serving():
    cluster, lazy, _ = _clients(1)
    shard = cluster.shards[0]
    reply = shard.handle(Message(Op.PULL, 1, {"table": "t", "lazy": "yes"}, [np.array([1])]))
    assert reply.status == 1 and "lazy" in reply.meta["error"] and "'yes'" in reply.meta["error"]
    assert lazy.wait(lazy.pull("t", torch.tensor([1])))[0].shape == (1, 4)


def test_a_client_refuses_a_lazy_reply_that_does_not_add_up():
    cluster, lazy, _ = _clients(1)
    channel = lazy.channels[0]
    send = channel.send

    def lying_send(frames):  # the shard claims one row built but sends every row anyway
        send(frames)
        reply = channel.replies.pop()
        reply[-1][0] = 1 if reply[-1][0] == 0 else reply[-1][0]
        channel.replies.append(reply)

    lazy.wait(lazy.push("t", torch.tensor([0, 1]), torch.ones(2, 4), torch.tensor([1, 1])))
    channel.send = lying_send
    with pytest.raises(PSError, match="marks 1 of 2 rows built and sends 2"):
        lazy.wait(lazy.pull("t", torch.tensor([0, 1])))


@pytest.mark.parametrize("arrays, match", [
    (lambda rows, clocks, built: [rows, clocks, built | 0x80], "bits set past its 2 rows"),  # a mark for no row
    (lambda rows, clocks, built: [rows, clocks[:0], built], "expected one for each of the 2 rows sent, got 0"),
    (lambda rows, clocks, built: [rows[:, :3].copy(), clocks, built], r"rows: expected \(k, 4\) for table 't', got shape \(2, 3\)"),
])
def test_a_client_refuses_marks_or_clocks_that_do_not_match_the_rows(arrays, match):
    cluster, lazy, _ = _clients(1)
    channel = lazy.channels[0]
    lazy.wait(lazy.push("t", torch.tensor([0, 1]), torch.ones(2, 4), torch.tensor([1, 1])))
    send = channel.send

    def lying_send(frames):  # a well-formed reply whose arrays do not add up
        send(frames)
        reply = decode(channel.replies.pop(), what="reply")
        channel.replies.append(encode(Message(reply.op, reply.request_id, {}, arrays(*reply.arrays))))

    channel.send = lying_send
    with pytest.raises(PSError, match=match):
        lazy.wait(lazy.pull("t", torch.tensor([0, 1])))


def test_training_with_lazy_rows_equals_training_without_and_pulls_fewer_bytes():
    """The same het job, lazy and eager: identical rows at the end, fewer row bytes pulled."""
    results = []
    for lazy_init in (True, False):
        cluster = LocalCluster([T], 2)
        emb = Embedding(tables=T, client=cluster.client(lazy_init=lazy_init),
                        cache=CacheConfig(capacity=12, staleness=2, ways=4))
        g = torch.Generator().manual_seed(1)
        for _ in range(30):
            keys = torch.randint(0, T.rows, (16,), generator=g)
            (emb(keys) ** 2).sum().backward()
        results.append((emb.read(torch.arange(T.rows)), emb.traffic["sparse_pull"]))
    (rows_lazy, pulled_lazy), (rows_eager, pulled_eager) = results
    assert torch.equal(rows_lazy, rows_eager)
    assert pulled_lazy < pulled_eager and not math.isclose(pulled_lazy, pulled_eager)


@settings(max_examples=30, deadline=None)
@given(optimizer=st.sampled_from(["sgd", "adagrad", "rowwise_adagrad", "adam", "ftrl"]),
       row_dtype=st.sampled_from(["fp32", "fp16", "bf16"]), native=st.booleans(), shards=st.integers(1, 3),
       ops=st.lists(st.tuples(st.sampled_from(["push", "pull", "state"]),
                              st.lists(st.integers(0, 59), min_size=1, max_size=12)), max_size=8))
def test_a_table_built_on_first_touch_equals_one_built_at_start(optimizer, row_dtype, native, shards, ops):
    """A shard builds a fixed table's rows on first touch (a push, or a read of rows that may be
    untouched): every reply and, at the end, every row, clock and optimizer state equal, bit for
    bit, those of the same table with every row built at start; only the rows reached are built."""
    from het.ps.server.store.fixed import FixedRows

    cfg = TableConfig("t", rows=60 * shards, dim=5, seed=4, row_dtype=row_dtype,
                      optimizer=OptimizerConfig(optimizer, lr=0.05, initial_accumulator=0.2))
    lazy, eager = FixedRows(cfg, shards - 1, shards, native=native), FixedRows(cfg, shards - 1, shards, native=native)
    eager.build_all()
    assert lazy.unbuilt == 60 and lazy.stats()["bytes"] < eager.stats()["bytes"]
    gen, reached = torch.Generator().manual_seed(len(ops)), set()
    for step, (op, rows) in enumerate(ops, 1):
        local = torch.tensor(rows)
        if op == "push":
            grads, counts = torch.randn(len(rows), 5, generator=gen), torch.randint(0, 3, (len(rows),), generator=gen)
            for t in (lazy, eager):
                t.push(local.clone(), grads.clone(), counts.clone(), step)
        elif op == "pull":
            for lazy_reply in (True, False):
                a, b = lazy.rows_to_send(local, lazy_reply), eager.rows_to_send(local, lazy_reply)
                assert a[1] == b[1] and all(torch.equal(torch.as_tensor(x), torch.as_tensor(y))
                                            for x, y in zip(a[0], b[0]))
        elif lazy.optimizer.followed:  # the state a worker's cache follows
            assert np.array_equal(lazy.local_state(local, True), eager.local_state(local, True))
        else:
            continue
        reached |= set(rows)  # a push, an eager read or a state's read builds its rows (a lazy read none)
        assert lazy.unbuilt == 60 - len(reached)
    saved, expected = lazy.state_dict(), eager.state_dict()
    assert lazy.unbuilt == 0
    for name in ("weight", "clocks", "touched"):
        assert torch.equal(saved[name], expected[name]), name
    assert all(torch.equal(saved["optimizer"][n], expected["optimizer"][n]) for n in expected["optimizer"])
    assert lazy.stats() == eager.stats()


def test_a_shard_starts_without_building_its_rows_and_serves_initial_rows_to_an_eager_client():
    cluster, lazy, eager = _clients(2)
    stats = cluster.shards[0].stats_dict()["tables"]["t"]
    assert stats["rows_built"] == 0 and stats["rows"] == 25
    lazy.wait(lazy.sync("t", torch.arange(50), torch.full((50,), -1), 0))  # leaves untouched rows to the client
    assert sum(s.stats_dict()["tables"]["t"]["rows_built"] for s in cluster.shards) == 0
    rows, clocks = eager.wait(eager.pull("t", torch.arange(50)))
    assert torch.equal(rows, torch.from_numpy(initial_rows(T, np.arange(50)))) and not clocks.any()
    assert sum(s.stats_dict()["tables"]["t"]["rows_built"] for s in cluster.shards) == 50


def test_a_serving_shard_builds_its_rows_while_idle_and_a_push_in_between_is_kept():
    """Rows no request reached are built while no request waits, in chunks; a push that came
    first keeps its update (the idle build skips rows already built)."""
    table = TableConfig("t", rows=100_000, dim=8, optimizer=OptimizerConfig("adagrad", lr=0.1), seed=3)
    cluster = ZmqCluster([table], 1)
    try:
        client = cluster.client()
        key = torch.tensor([99_999])  # the table's last row: the idle build reaches it last
        client.wait(client.push("t", key, torch.ones(1, 8), torch.tensor([1])))
        shard = cluster.shards[0]
        deadline = time.monotonic() + 60
        while shard.tables["t"].unbuilt and time.monotonic() < deadline:
            time.sleep(0.05)
        assert shard.tables["t"].unbuilt == 0
        rows, _ = client.wait(client.pull("t", torch.tensor([0, 99_999])))
        assert torch.equal(rows[0], torch.from_numpy(initial_rows(table, np.array([0])))[0])
        assert not torch.equal(rows[1], torch.from_numpy(initial_rows(table, np.array([99_999])))[0])
    finally:
        cluster.close()
