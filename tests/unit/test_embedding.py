"""het.Embedding against torch.nn.Embedding, its shapes, pooling and bad input."""

import math
import time

import pytest
import torch

from het import CacheConfig, Embedding, OptimizerConfig, TableConfig
from het.ps.local import local_client
from reference import train_side_by_side


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "rowwise_adagrad", "adam", "ftrl"])
@pytest.mark.parametrize("num_shards", [1, 3])
def test_staleness_zero_matches_torch_embedding(cluster_factory, optimizer, num_shards):
    rows, lr = 60, 0.05
    table = TableConfig("embedding", rows=rows, dim=8, optimizer=OptimizerConfig(optimizer, lr=lr))
    cluster = cluster_factory([table], num_shards)
    emb = Embedding(tables=table, client=cluster.client(), cache=CacheConfig(capacity=24, staleness=0, ways=8))
    gap = train_side_by_side(emb, rows, optimizer, lr)
    assert gap <= 1e-5
    stats = emb.stats()["embedding"]
    assert stats["hits"] > 0 and stats["evictions"] > 0  # the cache was really in the loop


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "adam", "ftrl"])
@pytest.mark.parametrize("num_shards", [1, 3])
def test_a_dynamic_table_at_staleness_zero_matches_torch_embedding(cluster_factory, optimizer, num_shards):
    """Raw int64 ids (negative ones, int64's extremes, the cache's empty marker) through a dynamic
    table: training matches nn.Embedding on the same rows."""
    from het.cache.policy import EMPTY

    rows, lr = 60, 0.05
    table = TableConfig("embedding", rows=None, dim=8, optimizer=OptimizerConfig(optimizer, lr=lr))
    cluster = cluster_factory([table], num_shards)
    emb = Embedding(tables=table, client=cluster.client(), cache=CacheConfig(capacity=24, staleness=0, ways=8))
    g = torch.Generator().manual_seed(7)
    raw = torch.randint(-2 ** 62, 2 ** 62, (rows - 4,), generator=g) * 2
    ids = torch.cat([torch.tensor([EMPTY, -3, torch.iinfo(torch.int64).min, torch.iinfo(torch.int64).max]), raw])
    assert len(set(ids.tolist())) == rows
    gap = train_side_by_side(emb, rows, optimizer, lr, ids=ids)
    assert gap <= 1e-5
    g, touched = torch.Generator().manual_seed(1), set()  # train_side_by_side's draws, again
    for _ in range(50):
        touched |= set(torch.randint(0, rows, (16, 3), generator=g).flatten().tolist())
        torch.randn(16, 3, 8, generator=g)
    stored = sum(s["tables"]["embedding"]["rows"] for s in cluster.client().stats())
    assert stored == len(touched)  # a row for each key pushed, none for the others


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "adam"])
def test_a_dynamic_table_trains_bit_for_bit_as_a_fixed_one(optimizer):
    """admit_after 1, no expiry: the same batches through a fixed table and a dynamic one on the
    same keys, at staleness 0 through a small cache that evicts, two shards: the same rows, bit
    for bit, and the same clocks."""
    rows, dim = 80, 8
    embs = []
    for size in (rows, None):
        table = TableConfig("embedding", rows=size, dim=dim, optimizer=OptimizerConfig(optimizer, lr=0.05))
        embs.append(Embedding(tables=table, client=local_client([table], num_shards=2),
                              cache=CacheConfig(capacity=24, staleness=0, ways=8)))
    g = torch.Generator().manual_seed(3)
    for _ in range(40):
        keys = torch.randint(0, rows, (16, 3), generator=g)
        target = torch.randn(16, 3, dim, generator=g)
        for emb in embs:
            ((emb(keys) - target) ** 2).mean().backward()
    for emb in embs:
        emb.flush()
    keys = torch.arange(rows)
    (a, ca), (b, cb) = (emb.client.wait(emb.client.pull("embedding", keys)) for emb in embs)
    assert torch.equal(a, b) and torch.equal(ca, cb) and int(ca.sum()) > 0


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "adam"])
def test_before_admission_a_worker_reads_the_initial_row(optimizer):
    """admit_after 3: the first two steps' pushes of a key are dropped by the shard; the worker
    that made them reads the initial row again (not its own dropped updates), whatever the
    optimizer; the third step's push is applied."""
    table = TableConfig("embedding", rows=None, dim=4, optimizer=OptimizerConfig(optimizer, lr=0.1), admit_after=3)
    mine = TableConfig("embedding", rows=None, dim=4)  # what the user wrote: the shards' rule counts
    emb = Embedding(tables=mine, client=local_client([table]), cache=CacheConfig(capacity=8, staleness=0))
    assert emb.tables["embedding"] == table
    keys = torch.tensor([2 ** 40, -7])
    start = emb(keys).detach().clone()
    for step in range(2):
        emb(keys).sum().backward()  # staleness 0: pushed at the end of the step, and dropped
        assert torch.equal(emb(keys).detach(), start), step
    emb(keys).sum().backward()  # the third: admitted and applied
    assert not torch.equal(emb(keys).detach(), start)
    stats = emb.client.stats()[0]["tables"]["embedding"]
    assert stats["refused_updates"] == 4 and stats["rows"] == 2


def test_staleness_bound_changes_training_but_flush_keeps_every_update():
    rows = 40
    table = TableConfig("embedding", rows=rows, dim=4, optimizer=OptimizerConfig("sgd", lr=0.1))
    sync_emb = Embedding(tables=table, cache=CacheConfig(capacity=40, staleness=0))
    async_emb = Embedding(tables=table, cache=CacheConfig(capacity=40, staleness=math.inf))
    for emb in (sync_emb, async_emb):
        g = torch.Generator().manual_seed(0)
        for _ in range(20):
            keys = torch.randint(0, rows, (8,), generator=g)
            (emb(keys) ** 2).sum().backward()
    # one worker: SGD with local read-your-writes is the same sequence of updates either way
    assert torch.allclose(sync_emb.read(torch.arange(rows)), async_emb.read(torch.arange(rows)), atol=1e-6)
    assert async_emb.client.stats()[0]["requests_push_sync"] == 20  # every step synced, pushes deferred


def test_shapes_of_plain_and_pooled_lookups():
    emb = Embedding(50, 6, cache=CacheConfig(capacity=10))
    assert emb(torch.tensor(3)).shape == (6,)
    assert emb(torch.zeros(2, 3, 4, dtype=torch.int64)).shape == (2, 3, 4, 6)
    assert emb(torch.empty(0, dtype=torch.int64)).shape == (0, 6)
    keys = torch.tensor([[1, 2, 3], [4, 4, 0]])
    rows = emb(keys)
    for mode, expect in [("sum", rows.sum(1)), ("mean", rows.mean(1))]:
        pooled = Embedding(50, 6, mode=mode, client=emb.client)
        assert torch.allclose(pooled(keys), expect, atol=1e-7)
        flat = pooled(keys.reshape(-1), offsets=torch.tensor([0, 3]))
        assert torch.allclose(flat, expect, atol=1e-7)
    padded = Embedding(50, 6, mode="mean", padding_idx=0, client=emb.client)
    assert torch.allclose(padded(keys)[1], rows[1, :2].mean(0), atol=1e-7)


def test_pooled_gradients_reach_the_rows():
    emb = Embedding(10, 2, optimizer="sgd", lr=1.0, mode="sum", cache=CacheConfig(capacity=4))
    before = emb.read(torch.arange(10))
    emb(torch.tensor([[1, 1, 2]])).sum().backward()
    after = emb.read(torch.arange(10))
    expected = before.clone()
    expected[1] -= 2.0  # key 1 twice in the bag
    expected[2] -= 1.0
    assert torch.allclose(after, expected)


def test_several_named_tables():
    tables = [TableConfig("user", rows=10, dim=3), TableConfig("item", rows=20, dim=5)]
    emb = Embedding(tables=tables, cache={"user": CacheConfig(capacity=4), "item": CacheConfig(capacity=8)})
    assert emb(torch.tensor([9]), table="user").shape == (1, 3)
    assert emb(torch.tensor([19]), table="item").shape == (1, 5)
    with pytest.raises(ValueError, match=r"this module holds tables \['item', 'user'\]: name one"):
        emb(torch.tensor([1]))
    with pytest.raises(ValueError, match=r"unknown table 'movie': this module holds \['item', 'user'\]"):
        emb(torch.tensor([1]), table="movie")


def test_bad_keys_get_clear_errors():
    emb = Embedding(50, 4, cache=CacheConfig(capacity=8))
    with pytest.raises(ValueError, match="key 50 out of range for table 'embedding' with 50 rows"):
        emb(torch.tensor([1, 50]))
    with pytest.raises(ValueError, match="key -1 out of range"):
        emb(torch.tensor([-1, 3]))
    with pytest.raises(TypeError, match="keys must be int64 \\(or int32\\), as nn.Embedding takes them, got torch.float32"):
        emb(torch.tensor([1.0]))
    with pytest.raises(TypeError, match="keys must be a torch.Tensor of int64, got list"):
        emb([1, 2])
    assert emb.stats()["embedding"].get("lookups", 0) == 0  # refused before the cache saw them


def test_nan_gradients_are_refused_and_change_nothing():
    emb = Embedding(10, 2, optimizer="sgd", lr=1.0, cache=CacheConfig(capacity=4, staleness=0))
    before = emb.read(torch.arange(10))
    out = emb(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="grads for table 'embedding' hold NaN or inf: refused, nothing changed"):
        (out * torch.tensor([[math.nan], [1.0]])).sum().backward()
    assert torch.equal(emb.read(torch.arange(10)), before)
    assert int(emb.caches["embedding"].updates.sum()) == 0


def test_rows_live_on_the_requested_device():
    emb = Embedding(10, 2, cache=CacheConfig(capacity=4), device="cpu")
    assert emb(torch.tensor([1])).device.type == "cpu"
    assert emb.caches["embedding"].rows.device.type == "cpu"


def test_model_code_works_with_either_embedding():
    class Tiny(torch.nn.Module):
        def __init__(self, embedding):
            super().__init__()
            self.embedding, self.head = embedding, torch.nn.Linear(4, 1)

        def forward(self, keys):
            return self.head(self.embedding(keys).sum(1)).squeeze(1)

    for embedding in (torch.nn.Embedding(30, 4), Embedding(30, 4, cache=CacheConfig(capacity=8))):
        assert Tiny(embedding)(torch.tensor([[1, 2], [3, 4]])).shape == (2,)


def test_prefetched_lookups_keep_every_update():
    rows = 40
    table = TableConfig("embedding", rows=rows, dim=3, optimizer=OptimizerConfig("sgd", lr=1.0), init_scale=0.0)
    plain = Embedding(tables=table, cache=CacheConfig(capacity=8, staleness=2, ways=4))
    ahead = Embedding(tables=table, cache=CacheConfig(capacity=8, staleness=2, ways=4))
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, rows, (6,), generator=g) for _ in range(30)]
    scales = [torch.randint(-3, 4, (6, 1), generator=g).float() for _ in batches]
    ahead.prefetch(batches[0])
    for i, (keys, scale) in enumerate(zip(batches, scales)):
        (plain(keys) * scale).sum().backward()
        if i + 1 < len(batches):
            ahead.prefetch(batches[i + 1])      # sent before this step's rows are used
        (ahead(keys) * scale).sum().backward()
    # a linear loss: the gradients do not depend on the rows read, so early reads change nothing
    assert torch.equal(plain.read(torch.arange(rows)), ahead.read(torch.arange(rows)))
    assert ahead.stats()["embedding"]["lookups"] == plain.stats()["embedding"]["lookups"]


def test_a_prefetch_that_is_not_used_is_completed_and_flushed():
    emb = Embedding(20, 2, optimizer="sgd", lr=1.0, cache=CacheConfig(capacity=4, staleness=math.inf))
    before = emb.read(torch.arange(20))
    emb.prefetch(torch.tensor([1, 2]))
    emb(torch.tensor([3])).sum().backward()      # not the prefetched keys
    emb.prefetch(torch.tensor([5]))              # never used at all
    emb.flush()
    expected = before.clone()
    expected[3] -= 1.0
    assert torch.equal(emb.read(torch.arange(20)), expected)


def test_grad_scale_scales_what_reaches_the_ps():
    emb = Embedding(10, 2, optimizer="sgd", lr=1.0, cache=CacheConfig(capacity=4), grad_scale=0.25)
    before = emb.read(torch.arange(10))
    emb(torch.tensor([7])).sum().backward()
    emb.flush()
    assert torch.allclose(emb.read(torch.tensor([7])), before[7:8] - 0.25)


def test_a_flush_between_steps_does_not_break_prefetching():
    emb = Embedding(1000, 4, cache=CacheConfig(capacity=64, staleness=2))
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 1000, (16,), generator=g) for _ in range(8)]
    emb.prefetch(batches[0])
    for i, keys in enumerate(batches[:-1]):
        emb.prefetch(batches[i + 1])
        emb(keys).sum().backward()
        if i == 2:
            emb.flush()  # completes the queued prefetch: the next forward looks up afresh
            emb.prefetch(batches[i + 1])
        assert emb.prefetching()
    unique = sum(torch.unique(b).numel() for b in batches)
    # every batch looked up once; batch 3 twice (its prefetch was flushed away and redone)
    assert emb.stats()["embedding"]["lookups"] == unique + torch.unique(batches[3]).numel()


def test_fresh_lookups_read_the_rows_other_workers_changed(cluster_factory):
    """Two workers at s = inf: B's pushed update never reaches A's cached copy, except inside
    ``fresh()``, which reads what the PS holds (and keeps A's own unpushed update on top)."""
    table = TableConfig("embedding", rows=8, dim=2, optimizer=OptimizerConfig("sgd", lr=1.0))
    cluster = cluster_factory([table])
    a, b = (Embedding(tables=table, client=cluster.client(), cache=CacheConfig(capacity=8, staleness=math.inf))
            for _ in range(2))
    keys = torch.tensor([3])
    before = a(keys).detach().clone()       # A caches row 3
    b(keys).sum().backward()
    b.flush()                                # the PS's row 3 moved by -1 in each column
    assert torch.equal(a(keys).detach(), before)  # A's copy is stale, as s = inf allows
    with torch.no_grad(), a.fresh():
        assert torch.allclose(a(keys), before - 1)
    a(keys).sum().backward()                 # A's own update, not pushed (s = inf)
    with torch.no_grad(), a.fresh():
        assert torch.allclose(a(keys), before - 2)
    assert a.caches["embedding"].bound == math.inf


def test_wait_s_counts_the_time_blocked_on_the_ps_not_the_merging_of_its_replies(monkeypatch):
    """The time split's PS wait: an in-process shard answers at once, so a merge made slow
    (0.2 s a reply) must not show in ``wait_s``; it is the worker's own work. Two shards: every
    reply goes through a merge (one shard's pull or push of every key is its reply as it is)."""
    import het.ps.client.client as client_module
    import het.ps.client.hot as hot_module

    merge = client_module.merge

    def slow_merge(*args):
        time.sleep(0.2)
        return merge(*args)

    monkeypatch.setattr(client_module, "merge", slow_merge)
    monkeypatch.setattr(hot_module, "merge", slow_merge)  # the short path's replies of several shards
    emb = Embedding(100, 4, cache=CacheConfig(capacity=10, staleness=2), client=local_client(
        [TableConfig("embedding", rows=100, dim=4)], num_shards=2))
    start = time.perf_counter()
    emb(torch.tensor([1, 2, 3])).sum().backward()
    emb.flush()
    assert time.perf_counter() - start >= 0.4  # a sync's merge and a push's, at least
    assert 0 <= emb.wait_s < 0.1



def test_mode_ps_dense_wait_counts_the_time_blocked_on_the_ps_not_the_merging(monkeypatch):
    """Mode ps's dense pull and push: as the embedding's, a slow merge (0.2 s a reply) is the
    worker's own work, not PS wait. Two shards, as there."""
    import het.ps.client.client as client_module
    import het.ps.client.hot as hot_module
    from het.dist.dense import PSDense, dense_table

    merge = client_module.merge

    def slow_merge(*args):
        time.sleep(0.2)
        return merge(*args)

    model = torch.nn.Linear(3, 1)
    dense = PSDense(model, local_client([dense_table(4, 0.1)], num_shards=2), world=1, rank=0)
    monkeypatch.setattr(client_module, "merge", slow_merge)
    monkeypatch.setattr(hot_module, "merge", slow_merge)  # the short path's replies of several shards
    start = time.perf_counter()
    dense.before_forward()
    model(torch.zeros(2, 3)).sum().backward()
    dense.after_backward()
    assert time.perf_counter() - start >= 0.4 and 0 <= dense.wait_s < 0.1


@pytest.mark.parametrize("optimizer, local_update, refreshed", [
    ("sgd", "row", False), ("rowwise_adagrad", "row", False), ("adagrad", "full", False), ("adagrad", "row", True)])
def test_a_copy_that_follows_the_server_exactly_is_not_made_stale_by_its_own_pushes(optimizer, local_update, refreshed):
    """One worker, s = 2: its hot rows are pushed every third step. Where the copy's own steps
    are the server's (SGD, row-wise Adagrad, Adagrad followed in full), the pushed updates
    count as seen and the copy stays; per-coordinate Adagrad followed from a float a row is
    only close, so the copy is refreshed after each push. Either way it stays the server's row."""
    table = TableConfig("embedding", rows=10, dim=4, optimizer=OptimizerConfig(optimizer, lr=0.1))
    emb = Embedding(tables=table, cache=CacheConfig(capacity=10, staleness=2, ways=10, local_update=local_update))
    keys = torch.tensor([1, 2, 5])
    for step in range(12):
        (emb(keys) * torch.arange(1.0, 5.0)).sum().backward()
    stats = emb.stats()["embedding"]
    assert stats["pushed_rows"] >= 9 and (stats["stale_refreshes"] > 0) == refreshed, stats
    with torch.no_grad():
        cached = emb(keys)
    assert torch.allclose(cached, emb.read(keys), rtol=0, atol=1e-6 if not refreshed else 1e-2)


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_a_flush_in_pieces_leaves_the_rows_a_whole_one_does(optimizer, monkeypatch):
    """A flush of more than FLUSH_KEYS rows goes as several pushes, a key's entries in one: the
    shard's rows, bit for bit, and its clocks as one push leaves them."""
    import het.nn.embedding as module

    out = []
    for most in (1 << 14, 5):
        monkeypatch.setattr(module, "FLUSH_KEYS", most)
        table = TableConfig("embedding", rows=64, dim=4, optimizer=OptimizerConfig(optimizer, lr=0.05))
        client = local_client([table])
        emb = Embedding(tables=table, client=client, cache=CacheConfig(capacity=48, staleness=1000))
        g = torch.Generator().manual_seed(3)
        for _ in range(6):
            emb(torch.randint(0, 64, (10, 3), generator=g)).pow(2).sum().backward()
        pushes = client.stats()[0].get("requests_push", 0)
        emb.flush()
        keys = torch.arange(64)
        rows, clocks = client.wait(client.pull("embedding", keys))
        out.append((rows, clocks, client.stats()[0].get("requests_push", 0) - pushes))
    assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1])
    assert out[0][2] == 1 and out[1][2] > 3  # whole, and in pieces


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.int8, torch.bool, torch.float32])
def test_keys_of_a_type_nn_embedding_refuses_are_refused(dtype):
    table = TableConfig("t", rows=10, dim=2)
    client = local_client([table])
    keys = torch.tensor([1, 0, 1]).to(dtype)
    with pytest.raises(TypeError, match=f"keys must be int64 \\(or int32\\), as nn.Embedding takes them, got {dtype}"):
        client.wait(client.push("t", keys, torch.ones(3, 2), torch.ones(3, dtype=torch.int64)))
    with pytest.raises(TypeError, match="keys must be int64"):
        Embedding(tables=table, client=client, cache=CacheConfig(capacity=8, staleness=0))(keys)
    assert client.wait(client.pull("t", torch.tensor([1, 0], dtype=torch.int32)))[0].shape == (2, 2)


def test_a_copy_follows_ftrl_with_l2_and_beta_as_the_server_steps():
    """FTRL without L1 steps as Adagrad with eps = beta + lr * l2 (its closed form moved by one
    step): a copy that follows it in full stays the server's row, pushes and all, at s = 2."""
    opt = OptimizerConfig("ftrl", lr=0.1, l2=0.5, beta=0.3)
    table = TableConfig("embedding", rows=10, dim=4, optimizer=opt)
    emb = Embedding(tables=table, cache=CacheConfig(capacity=10, staleness=2, ways=10, local_update="full"))
    keys = torch.tensor([1, 2, 5])
    for step in range(12):
        (emb(keys) * torch.arange(1.0, 5.0)).sum().backward()
    assert emb.stats()["embedding"]["pushed_rows"] >= 9
    with torch.no_grad():
        cached = emb(keys)
    assert torch.allclose(cached, emb.read(keys), rtol=0, atol=1e-5)
