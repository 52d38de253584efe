"""L2 on embedding rows as a lazy decay (het.decay), under every optimizer: the same rows as
decaying every row every step, at staleness 0 against nn.Embedding, under the staleness bound,
through saves, the write-ahead log and a read of rows no push touched."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from het.config import CacheConfig, OptimizerConfig, ShardConfig, TableConfig
from het.decay import RowDecay, state_of, steps_of
from het.nn.embedding import Embedding
from het.ps.protocol.initial import initial_rows
from het.ps.server import hot
from het.ps.server.shard import Shard
from het.schedule import Schedule
from reference import TORCH_OPTIMIZERS

SCHEDULE = Schedule(warmup=4, decay="cosine", steps=24, floor=0.2)


def test_the_lazy_product_is_the_product_of_every_steps_decay():
    """Any stretch of steps, inside the schedule and past where it settles, against the product
    taken a step at a time (float64)."""
    opt = OptimizerConfig("adam", lr=0.05, l2=0.3, schedule=SCHEDULE)
    decay = RowDecay(opt)
    kept = np.cumprod([1.0] + [1 - opt.lr_at(t) * opt.l2 for t in range(1, 60)])
    since = torch.tensor([0, 0, 3, 10, 23, 24, 30, 40])
    to = torch.tensor([1, 59, 20, 10, 25, 59, 31, 12])  # 40 -> 12: never brought back
    got = decay.factor(since, to)
    want = [kept[max(a, b)] / kept[a] for a, b in zip(since.tolist(), to.tolist())]
    assert torch.allclose(got, torch.tensor(want, dtype=torch.float64), rtol=1e-12)
    assert got[3] == 1 and got[7] == 1
    assert not RowDecay(OptimizerConfig("ftrl", lr=0.1, l2=0.3)).active  # FTRL's L2 is its own
    steps = torch.tensor([0, 1, (1 << 24) - 1, 1 << 24, (1 << 24) + 1, (1 << 40) + 12345])  # float32 holds 2^24 exactly
    assert torch.equal(steps_of(state_of(steps)), steps)


def train_beside_torch(emb, optimizer: str, lr: float, l2: float, steps: int = 24, schedule=None, ids=None,
                       prefetch: bool = False):
    """The same batches through ``emb`` and nn.Embedding(sparse=True) decayed by ``1 - lr_t *
    l2`` every step (after the gradient, before the optimizer's step, as AdamW); the largest gap
    of a forward's rows over the steps, and of the rows at the end (``emb``'s own l2 may differ).
    ``prefetch``: each step's keys looked up during the step before, as training does."""
    table = emb.tables["embedding"]
    rows, dim = 40, table.dim
    ids = torch.arange(rows) if ids is None else ids
    ref = torch.nn.Embedding(rows, dim, sparse=True)
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(initial_rows(table, ids.numpy())))
    opt = TORCH_OPTIMIZERS[optimizer](ref.parameters(), lr)
    g, gap = torch.Generator().manual_seed(3), 0.0
    batches = [(torch.randint(0, rows, (12, 2), generator=g), torch.randn(12, 2, dim, generator=g))
               for _ in range(steps + 1)]
    for step in range(1, steps + 1):
        factor = schedule.factor(step) if schedule is not None else 1.0
        emb.scale_lr(factor)
        for group in opt.param_groups:
            group["lr"] = lr * factor
        keys, target = batches[step - 1]
        out = emb(ids[keys])
        if prefetch:
            emb.prefetch(ids[batches[step][0]])
        ((out - target) ** 2).sum().backward()
        opt.zero_grad()
        ref_out = ref(keys)
        ((ref_out - target) ** 2).sum().backward()
        with torch.no_grad():
            ref.weight.mul_(1 - lr * factor * l2)
        opt.step()
        gap = max(gap, float((out.detach() - ref_out.detach()).abs().max()))
    emb.upcoming.complete()  # the last prefetch, unused
    return gap, float((emb.read(ids) - ref.weight.detach()).abs().max())


@pytest.mark.parametrize("optimizer, dynamic, capacity, schedule", [
    ("sgd", False, 16, None),
    ("adagrad", True, 16, SCHEDULE),
    ("rowwise_adagrad", False, 16, None),
    ("adam", False, 0, SCHEDULE),   # no cache: every row read from the PS
])
def test_at_staleness_zero_het_embedding_equals_nn_embedding_decayed_every_step(cluster_factory, optimizer, dynamic,
                                                                                 capacity, schedule):
    lr, l2 = 0.1, 0.5  # 5% a step: a decay missed or taken twice shows at once
    opt = OptimizerConfig(optimizer, lr=lr, l2=l2, schedule=schedule or Schedule())
    table = TableConfig("embedding", rows=None if dynamic else 40, dim=6, optimizer=opt)
    emb = Embedding(tables=table, client=cluster_factory([table], 2).client(),
                    cache=CacheConfig(capacity=capacity, staleness=0, ways=4))
    ids = torch.arange(40) * 7919 - 2**40 if dynamic else None  # raw int64 ids, negative too
    forward_gap, rows_gap = train_beside_torch(emb, optimizer, lr, l2, schedule=schedule, ids=ids)
    assert forward_gap <= 1e-5 and rows_gap <= 1e-5


def test_under_the_staleness_bound_sgd_stays_exact():
    """At s = 4 a push sums several steps: the cache brings the pending sum along with its row
    (an evicted one too, from its slot's step), so under SGD the PS applies each step's gradient
    decayed since: one worker's rows stay those of the reference."""
    lr, l2 = 0.1, 0.5
    cache = CacheConfig(capacity=16, staleness=4, ways=4)  # 40 keys: evictions write back
    table = TableConfig("embedding", rows=40, dim=6, optimizer=OptimizerConfig("sgd", lr=lr, l2=l2))
    gap, rows_gap = train_beside_torch(Embedding(tables=table, cache=cache, num_shards=2), "sgd", lr, l2)
    assert gap <= 1e-5 and rows_gap <= 1e-5


@pytest.mark.parametrize("optimizer", ["adagrad", "adam"])
def test_under_the_staleness_bound_the_decay_adds_no_error_of_its_own(optimizer):
    """Adagrad and Adam take a push of several steps as their steps' worth, an approximation at
    s = 4 with or without L2: with it the rows are no farther from the reference that decays
    every step than they are without it from the plain reference, and nearer it than the plain."""
    lr, cache = 0.1, CacheConfig(capacity=16, staleness=4, ways=4)
    gaps = {}
    for l2, ref_l2 in ((0.0, 0.0), (0.5, 0.5), (0.5, 0.0)):  # the same batches each time
        table = TableConfig("embedding", rows=40, dim=6, optimizer=OptimizerConfig(optimizer, lr=lr, l2=l2))
        gaps[l2, ref_l2] = train_beside_torch(Embedding(tables=table, cache=cache, num_shards=2), optimizer, lr,
                                              ref_l2)[1]
    assert gaps[0.5, 0.5] <= gaps[0.0, 0.0] and gaps[0.5, 0.5] < 0.6 * gaps[0.5, 0.0]


def test_a_prefetched_lookup_is_filled_at_the_steps_trained_since():
    """Training prefetches the next step's rows before its backward: its lookup reads a step
    behind, and its fill brings the rows a step further. Prefetching is approximate with or without
    L2 (a row may miss this worker's update of the step between); with it the rows are no farther
    from the reference that decays every step than without it from the plain one, and far nearer
    it than the plain reference."""
    lr, cache = 0.03, CacheConfig(capacity=16, staleness=4, ways=4)
    gaps = {}
    for l2, ref_l2 in ((0.0, 0.0), (2.0, 2.0), (2.0, 0.0)):  # 6% a step
        table = TableConfig("embedding", rows=40, dim=6, optimizer=OptimizerConfig("sgd", lr=lr, l2=l2))
        emb = Embedding(tables=table, cache=cache, num_shards=2)
        gaps[l2, ref_l2] = train_beside_torch(emb, "sgd", lr, ref_l2, prefetch=True)[1]
    assert gaps[2.0, 2.0] <= gaps[0.0, 0.0] and gaps[2.0, 2.0] < 0.3 * gaps[2.0, 0.0]


def decaying_shard(**kwargs) -> tuple[Shard, TableConfig]:
    opt = OptimizerConfig("adagrad", lr=0.1, l2=0.5)
    table = TableConfig("t", rows=16, dim=4, optimizer=opt)
    return Shard(ShardConfig((table,)), **kwargs), table


def push(shard: Shard, keys: list[int], step: int) -> None:
    n = len(keys)
    shard.push("t", np.array(keys), np.full((n, 4), 0.5, np.float32), np.ones(n, np.int64), step=step)


def test_a_row_no_push_touched_is_read_as_its_initial_row_decayed_and_sent_whole():
    shard, table = decaying_shard()
    push(shard, [1], step=10)
    initial = initial_rows(table, np.array([0, 3]))
    for reply in (shard.pull("t", np.array([0, 3]), lazy=True, as_of=10),  # lazy is ignored: every row is sent
                  shard.pull("t", np.array([0, 3]), lazy=True),          # as of the last step a push named
                  hot._pull(shard, "t", np.array([0, 3]), True)):       # the short path takes the same one
        assert len(reply) == 2  # rows and clocks: no row left for the client to build
        np.testing.assert_allclose(reply[0], initial * 0.95 ** 10, rtol=1e-6)
    np.testing.assert_allclose(shard.pull("t", np.array([0]), as_of=12)[0], initial[:1] * 0.95 ** 12, rtol=1e-6)
    assert shard.tables["t"].decayed_to(torch.tensor([1, 0])).tolist() == [10, 0]  # a push brings its rows to its step


def test_a_save_and_the_write_ahead_log_keep_each_rows_step(tmp_path):
    shard, _ = decaying_shard(state_dir=str(tmp_path / "a"), wal=True)
    for step in range(1, 6):
        push(shard, [step % 3, 5], step)
    shard.save(str(tmp_path / "a" / "mid.pt"))
    for step in range(6, 9):  # logged after the log's base: replayed at their steps
        push(shard, [step % 4], step)
    want = shard.pull("t", np.arange(16), as_of=9)[0]
    shard.close()
    recovered, _ = decaying_shard(state_dir=str(tmp_path / "a"), wal=True)
    assert recovered.stats["wal_replayed"] == 3
    np.testing.assert_array_equal(recovered.pull("t", np.arange(16), as_of=9)[0], want)
    recovered.close()
    loaded, _ = decaying_shard(state_dir=str(tmp_path / "b"))
    loaded.load(str(tmp_path / "a" / "mid.pt"))
    for step in range(6, 9):
        push(loaded, [step % 4], step)
    np.testing.assert_array_equal(loaded.pull("t", np.arange(16), as_of=9)[0], want)
    loaded.close()


def test_wire_refusals_and_publishing_name_what_l2_needs():
    shard, _ = decaying_shard()
    from het.ps.protocol.messages import Message, Op

    reply = shard.handle(Message(Op.PULL, 1, {"table": "t", "as_of": -1}, [np.array([0])]))
    assert reply.status == 1 and "as_of" in reply.meta["error"]
    from het.train.config import TrainConfig

    with pytest.raises(ValueError, match="row_l2"):
        TrainConfig(optimizer="adagrad", row_l2=0.1, publish={"dir": "somewhere"})
    with pytest.raises(ValueError, match="1 - lr \\* row_l2"):
        TrainConfig(optimizer="sgd", lr=2.0, row_l2=0.5)


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "rowwise_adagrad", "adam"])
def test_the_native_push_of_rows_that_decay_equals_the_reference(optimizer):
    """A float32 fixed table's native push brings its rows to the push's step first, then pushes
    with the optimizer's own state: the torch reference's rows and state."""
    from het import native as het_native
    from het.ps.server.store.fixed import FixedRows
    from het.ps.server.store.kernels import NATIVE_OPTIMIZERS, BroughtPush

    cfg = TableConfig("t", rows=30, dim=5, optimizer=OptimizerConfig(optimizer, lr=0.05, l2=0.4))
    native, reference = FixedRows(cfg, 0, 1), FixedRows(cfg, 0, 1, native=False)
    assert isinstance(native._push, BroughtPush) == (het_native.ops is not None and optimizer in NATIVE_OPTIMIZERS)
    g = torch.Generator().manual_seed(1)
    for step in range(1, 15):
        keys = torch.randint(0, 30, (12,), generator=g)  # duplicates too
        grads = torch.randn(12, 5, generator=g)
        for t in (native, reference):
            t.push(keys, grads.clone(), torch.ones(12, dtype=torch.int64), step)
    every = torch.arange(30)
    assert torch.equal(native.decayed_to(every), reference.decayed_to(every))
    torch.testing.assert_close(native.weight, reference.weight, rtol=1e-6, atol=1e-6)
    for name, value in reference.optimizer.state.items():
        torch.testing.assert_close(native.optimizer.state[name], value, rtol=1e-6, atol=1e-6)
