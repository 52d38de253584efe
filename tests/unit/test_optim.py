"""Row-wise Adagrad, and Adagrad's pushes of several steps (counts and squared gradients):
against torch references, against sequential steps, and what a shard refuses."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conftest import built
from het import CacheConfig, Embedding, OptimizerConfig, TableConfig
from het.adagrad import adagrad_factor
from het.ps.local import local_client
from het.ps.protocol.messages import PSError
from het.ps.server.store import wal
from het.ps.server.store.fixed import FixedRows
from het.ps.server.store.torch_optim import FTRLTorch, RowWiseAdagradTorch


def pushed_beside(table, make_opt, steps: int, seed: int, scale: float = 1.0):
    """The same batches' gradients pushed to ``table`` (a shard's) and stepped by the torch
    optimizer ``make_opt(params)`` on an nn.Embedding of the same rows; the reference and its
    optimizer."""
    ref = torch.nn.Embedding(table.cfg.rows, table.cfg.dim, sparse=True)
    with torch.no_grad():
        ref.weight.copy_(table.weight)
    opt = make_opt(ref.parameters())
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        keys = torch.randint(0, table.cfg.rows, (9,), generator=gen)  # duplicates on purpose
        target = torch.randn(9, table.cfg.dim, generator=gen) * scale
        opt.zero_grad()
        ((ref(keys) - target) ** 2).sum().backward()
        grad = ref.weight.grad.coalesce()
        table.push(grad.indices()[0], grad.values().clone(), torch.ones(len(grad.indices()[0]), dtype=torch.int64), 1)
        opt.step()
    return ref, opt


def test_rowwise_adagrad_on_the_ps_equals_its_torch_reference_on_nn_embedding():
    cfg = OptimizerConfig("rowwise_adagrad", lr=0.05)
    table = built(FixedRows(TableConfig("t", rows=20, dim=6, optimizer=cfg), 0, 1))
    ref, opt = pushed_beside(table, lambda params: RowWiseAdagradTorch(params, lr=0.05), 20, 3)
    assert torch.equal(table.weight, ref.weight.detach())
    assert table.optimizer.state["sum"].shape == (20, 1)  # one float a row
    assert torch.equal(table.optimizer.state["sum"], opt.state[ref.weight]["sum"])


@pytest.mark.parametrize("name", ["adagrad", "rowwise_adagrad"])
def test_pushes_of_single_steps_ignore_their_squares_and_are_plain_adagrad(name):
    """Every count 1 (staleness 0): the sums of squares change nothing, bit for bit."""
    cfg = TableConfig("t", rows=10, dim=4, optimizer=OptimizerConfig(name, lr=0.1))
    plain, told = built(FixedRows(cfg, 0, 1)), built(FixedRows(cfg, 0, 1))
    gen = torch.Generator().manual_seed(1)
    for _ in range(5):
        rows, grads = torch.randperm(10, generator=gen)[:6], torch.randn(6, 4, generator=gen)
        ones = torch.ones(6, dtype=torch.int64)
        plain.push(rows, grads.clone(), ones, 1)
        told.push(rows, grads.clone(), ones, 1, sq=torch.rand(6, 1, generator=gen))
    assert torch.equal(plain.weight, told.weight)
    assert torch.equal(plain.optimizer.state["sum"], told.optimizer.state["sum"])


@pytest.mark.parametrize("name,width", [("adagrad", 1), ("adagrad", 4), ("rowwise_adagrad", 1)])
def test_a_push_of_many_steps_moves_a_row_as_far_as_the_steps_would(name, width):
    """100 like steps pushed as one sum with their squares move a fresh row about as far as
    100 sequential Adagrad steps; the sum alone (HET's push) moves it 1/10 as far."""
    cfg = TableConfig("t", rows=1, dim=4, optimizer=OptimizerConfig(name, lr=0.1))
    g = torch.tensor([[0.01, -0.02, 0.03, 0.01]])
    sequential, summed, followed = (built(FixedRows(cfg, 0, 1)) for _ in range(3))
    start = sequential.weight.clone()
    for _ in range(100):
        sequential.push(torch.tensor([0]), g.clone(), torch.tensor([1]), 1)
    summed.push(torch.tensor([0]), 100 * g, torch.tensor([100]), 1)
    sq = 100 * g * g
    followed.push(torch.tensor([0]), 100 * g, torch.tensor([100]), 1, sq=sq.mean(1, keepdim=True) if width == 1 else sq)
    moved = {k: float((t.weight - start).norm()) for k, t in (("seq", sequential), ("sum", summed), ("follow", followed))}
    assert moved["follow"] == pytest.approx(moved["seq"], rel=0.05)
    assert moved["sum"] < 0.2 * moved["seq"]
    assert torch.allclose(followed.optimizer.state["sum"], sequential.optimizer.state["sum"], rtol=1e-4)


def test_the_factor_of_one_step_is_adagrads():
    acc, sq = torch.tensor([[0.5]]), torch.tensor([[0.25]])
    f = adagrad_factor(acc, sq, torch.tensor([[1]]), 1e-10)
    assert float(f) == pytest.approx(1 / (math.sqrt(0.75) + 1e-10))


def test_the_local_copy_under_rowwise_adagrad_is_the_row_the_server_then_holds():
    """One worker, staleness 3: after each push the cached copies equal the server's rows."""
    table = TableConfig("embedding", rows=30, dim=8, optimizer=OptimizerConfig("rowwise_adagrad", lr=0.05))
    client = local_client([table])
    emb = Embedding(tables=table, client=client, cache=CacheConfig(capacity=30, staleness=3, ways=8))
    gen = torch.Generator().manual_seed(2)
    for _ in range(12):
        keys = torch.randint(0, 6, (16,), generator=gen)
        (emb(keys) ** 2).sum().backward()
    cache = emb.caches["embedding"]
    emb.flush()
    held = cache.keys[cache.held]
    copies = cache.rows[cache.held]
    assert torch.allclose(copies, emb.read(held), rtol=1e-5, atol=1e-6)
    assert int(cache.updates.sum()) == 0


def test_a_shard_refuses_malformed_squares_and_keeps_serving(cluster_factory):
    table = TableConfig("t", rows=10, dim=4, optimizer=OptimizerConfig("adagrad", lr=0.1))
    client = cluster_factory([table], 1).client()
    keys, grads, counts = torch.tensor([1, 2]), torch.ones(2, 4), torch.tensor([3, 3])
    with pytest.raises(ValueError, match=r"sq must be a tensor of shape \(2, 1\) or \(2, 4\)"):
        client.push("t", keys, grads, counts, sq=torch.ones(2, 3))
    with pytest.raises(ValueError, match="finite and >= 0"):
        client.push("t", keys, grads, counts, sq=-torch.ones(2, 1))
    # past the client's checks: the shard names what it expected and changes nothing
    before = client.wait(client.pull("t", keys))[0]
    with pytest.raises(PSError, match=r"sq must be float32 of shape \(2, 1\) or \(2, 4\)"):
        client.link.send(0, 99, 2, {"table": "t", "sq": True, "step": 1},
                             [keys.numpy(), grads.numpy(), counts.numpy(), np.ones((2, 2), np.float32)])
        client.link.reply(0, 99)
    assert torch.equal(client.wait(client.pull("t", keys))[0], before)
    assert client.wait(client.push("t", keys, grads, counts, sq=torch.ones(2, 1))) == 2  # still serving


@pytest.mark.parametrize("name,width", [("adagrad", 1), ("adagrad", 4), ("rowwise_adagrad", 1)])
def test_squares_travel_only_for_rows_of_several_steps_and_land_as_if_all_had(name, width):
    """A push's rows of one step carry no square (their gradient's is theirs): the shard ends
    with the rows and state it would have from every row's square, bit for bit, with duplicate
    keys (whose steps add up) and without; the bytes saved are the left-out squares'."""
    cfg = TableConfig("t", rows=12, dim=4, optimizer=OptimizerConfig(name, lr=0.1))
    client, reference, plain = local_client([cfg], 2), local_client([cfg], 2), local_client([cfg], 2)
    gen = torch.Generator().manual_seed(5)
    for i in range(6):  # keys with duplicates, and without (their rows of one step then take no square)
        keys = torch.randint(0, 12, (9,), generator=gen) if i % 2 else torch.randperm(12, generator=gen)[:9]
        grads, counts = torch.randn(9, 4, generator=gen), torch.randint(1, 4, (9,), generator=gen)
        own = grads * grads if width > 1 else (grads * grads).mean(1, keepdim=True)
        sq = torch.where(counts[:, None] > 1, torch.rand(9, width, generator=gen) + own, own)
        handle = client.push("t", keys, grads, counts, sq=sq)
        assert handle.push_bytes - plain.push("t", keys, grads, counts).push_bytes == 4 * width * int((counts > 1).sum())
        client.wait(handle)
        for shard in reference.channels:  # every row's square, straight to the shard
            held = torch.nonzero(keys % 2 == int(shard.address[-1])).flatten()
            shard.shard.push("t", keys[held].numpy(), grads[held].numpy(), counts[held].numpy(), sq=sq[held].numpy())
    for a, b in zip(client.channels, reference.channels):
        rows_a, rows_b = a.shard.tables["t"], b.shard.tables["t"]
        assert torch.equal(rows_a.weight, rows_b.weight) and torch.equal(rows_a.clocks, rows_b.clocks)
        assert torch.equal(rows_a.optimizer.state["sum"], rows_b.optimizer.state["sum"])


def test_a_shard_refuses_squares_for_neither_every_row_nor_the_rows_of_several_steps():
    cfg = TableConfig("t", rows=10, dim=4, optimizer=OptimizerConfig("adagrad", lr=0.1))
    client = local_client([cfg], 1)
    keys, grads, counts = torch.tensor([1, 2, 3]), torch.ones(3, 4), torch.tensor([1, 3, 1])
    with pytest.raises(PSError, match=r"or of \(1, 1\|4\) for the 1 rows of several steps, got float32 \(2, 1\)"):
        client.link.send(0, 99, 2, {"table": "t", "sq": True, "step": 1},
                             [keys.numpy(), grads.numpy(), counts.numpy(), np.ones((2, 1), np.float32)])
        client.link.reply(0, 99)
    assert client.wait(client.pull("t", keys))[1].tolist() == [0, 0, 0]  # nothing applied
    assert client.wait(client.push("t", keys, grads, counts, sq=torch.ones(3, 1))) == 3  # still serving


def test_a_sync_asking_for_state_a_table_cannot_give_is_refused_by_name(cluster_factory):
    """SGD keeps no state; row-wise Adagrad keeps one float a row, not one a coordinate. The
    shard refuses, names what it expected, and the push sent with the sync is not applied."""
    sgd = TableConfig("s", rows=10, dim=4, optimizer=OptimizerConfig("sgd", lr=0.1))
    rowwise = TableConfig("r", rows=10, dim=4, optimizer=OptimizerConfig("rowwise_adagrad", lr=0.1))
    client = cluster_factory([sgd, rowwise], 1).client()
    keys, clocks = torch.tensor([1, 2]), torch.tensor([-1, -1])
    with pytest.raises(PSError, match="optimizer sgd has no state a cache follows"):
        client.wait(client.sync("s", keys, clocks, 0, state="row"))
    with pytest.raises(PSError, match="one float a row: expected state 'row', got 'full'"):
        client.wait(client.push_sync("r", keys, torch.ones(2, 4), torch.ones(2, dtype=torch.int64), keys, clocks, 0,
                                     state="full"))
    assert client.wait(client.pull("r", keys))[1].tolist() == [0, 0]  # the push was not applied
    reply = client.wait(client.sync("r", keys, clocks, 0, state="row"))
    # untouched rows are built by the client (lazy rows), their initial state too: nothing travelled
    assert reply.state.shape == (2, 1) and reply.state.tolist() == [[0.0], [0.0]] and reply.row_bytes == 0
    with pytest.raises(ValueError, match=r"meta\['state'\] must be one of"):
        client.sync("r", keys, clocks, 0, state="half")


def test_the_write_ahead_log_keeps_a_pushs_squares(tmp_path):
    log = wal.WriteAheadLog(str(tmp_path))
    sq = np.array([[0.5], [2.0]], np.float32)
    log.append("t", np.array([1, 2]), np.ones((2, 3), np.float32), np.array([4, 4]), 7, sq=sq)
    log.append("t", np.array([5]), np.ones((1, 3), np.float32), np.array([1]), 8)
    log.close()
    first, second = wal.read_log(str(tmp_path))
    assert np.array_equal(first["sq"], sq) and first["counts"].tolist() == [4, 4]
    assert second["sq"] is None


@pytest.mark.parametrize("start", [1, 500])
def test_an_adam_push_of_many_steps_with_their_squares_moves_the_row_as_those_steps_would(start):
    """100 steps pushed as one sum with their squares (HET's push at s = 99) move a row as 100
    sequential SparseAdam steps do, bias correction included (from step 1 and from step 500),
    and leave the same moments; without the squares the push is one Adam step of the sum, as
    it always was; a row of one step is exactly Adam's."""
    cfg = TableConfig("t", rows=2, dim=4, optimizer=OptimizerConfig("adam", lr=0.01))
    g = torch.tensor([[0.01, -0.02, 0.03, 0.001]])
    sequential, summed, plain, one_step = (built(FixedRows(cfg, 0, 1)) for _ in range(4))
    begin = sequential.weight.clone()
    for i in range(100):
        sequential.push(torch.tensor([0]), g.clone(), torch.tensor([1]), start + i)
    both, counts = torch.tensor([0, 1]), torch.tensor([100, 1])
    squares = torch.cat([100 * g * g, g * g]).mean(1, keepdim=True)
    summed.push(both, torch.cat([100 * g, g]), counts, start + 99, sq=squares)
    assert torch.allclose(summed.weight[0] - begin[0], sequential.weight[0] - begin[0], rtol=5e-3)  # within 0.5%
    for name in ("exp_avg", "exp_avg_sq"):
        assert torch.allclose(summed.optimizer.state[name][0], sequential.optimizer.state[name][0], rtol=1e-4)
    plain.push(both, torch.cat([100 * g, g]), counts, start + 99)
    assert float((plain.weight[0] - begin[0]).norm()) < 0.05 * float((sequential.weight[0] - begin[0]).norm())
    one_step.push(torch.tensor([1]), g.clone(), torch.tensor([1]), start + 99)
    assert torch.equal(summed.weight[1], one_step.weight[1]) and torch.equal(plain.weight[1], one_step.weight[1])


def test_an_adam_tables_cache_pushes_squares_and_lands_on_sparse_adams_rows():
    """One worker, staleness 100, a loss linear in the rows (so every step's gradient is the
    same whatever the copies hold): the cache pushes each row's 12 steps once, with their
    squares, and the shard's rows after the flush are SparseAdam's after 12 steps."""
    table = TableConfig("embedding", rows=20, dim=8, optimizer=OptimizerConfig("adam", lr=0.01))
    emb = Embedding(tables=table, client=local_client([table]), cache=CacheConfig(capacity=20, staleness=100, ways=4))
    reference = torch.nn.Embedding(20, 8, sparse=True)
    with torch.no_grad():
        reference.weight.copy_(emb.read(torch.arange(20)))
    adam = torch.optim.SparseAdam(reference.parameters(), lr=0.01)
    weights = torch.randn(6, 8, generator=torch.Generator().manual_seed(3))
    keys = torch.tensor([1, 4, 7, 9, 12, 15])
    for _ in range(12):
        (emb(keys) * weights).sum().backward()
        adam.zero_grad()
        (reference(keys) * weights).sum().backward()
        adam.step()
    cache = emb.caches["embedding"]
    assert cache.sq.shape == (cache.slots, 1)  # a float a row, pushed with it
    assert torch.allclose(emb.read(keys), reference.weight[keys].detach(), rtol=1e-4, atol=1e-6)


def test_an_adam_push_of_rows_of_few_and_many_steps_is_taken_whole():
    """Rows of 2 to 150 steps in one push, duplicates among them: every row moves, none is
    refused, and a row of u steps moves about u times a row of one."""
    cfg = TableConfig("t", rows=8, dim=4, optimizer=OptimizerConfig("adam", lr=0.01))
    t = built(FixedRows(cfg, 0, 1))
    begin = t.weight.clone()
    keys, counts = torch.tensor([0, 1, 2, 3, 3]), torch.tensor([2, 5, 9, 150, 1])
    grads = counts[:, None].float() * torch.tensor([[0.01, -0.02, 0.03, 0.001]])
    t.push(keys, grads, counts, 400, sq=(grads * grads / counts[:, None]).mean(1, keepdim=True))
    moved = (t.weight - begin).norm(dim=1)
    assert bool((moved[:4] > 0).all()) and float(moved[4:].sum()) == 0
    assert moved[3] / moved[0] == pytest.approx(151 / 2, rel=0.2)


@pytest.mark.parametrize("name, lr, betas, refused", [
    ("sgd", 3.4e38, (0.9, 0.999), False), ("sgd", 3.5e38, (0.9, 0.999), True), ("adagrad", 1e39, (0.9, 0.999), True),
    ("adam", 3.4e37, (0.9, 0.999), False), ("adam", 3.5e37, (0.9, 0.999), True), ("adam", 1e37, (0.99, 0.999), True),
])
def test_an_lr_whose_step_passes_float32s_largest_value_is_refused_by_name(name, lr, betas, refused):
    """Rows are float32: a step past its largest value (3.4e38) makes every row it touches inf,
    and Adam's first step takes lr / (1 - beta1)."""
    if not refused:
        assert OptimizerConfig(name, lr=lr, betas=betas).lr == lr
        return
    with pytest.raises(ValueError, match=r"^lr must be at most [0-9.e+]+ .*got [0-9.e+]+$"):
        OptimizerConfig(name, lr=lr, betas=betas)


def test_ftrl_on_the_ps_equals_its_torch_reference_with_l1_l2_and_beta():
    cfg = OptimizerConfig("ftrl", lr=0.05, l1=0.01, l2=0.1, beta=0.5)
    table = built(FixedRows(TableConfig("t", rows=20, dim=6, optimizer=cfg), 0, 1))
    ref, opt = pushed_beside(table, lambda params: FTRLTorch(params, lr=0.05, l1=0.01, l2=0.1, beta=0.5), 30, 5, 0.1)
    assert torch.equal(table.weight, ref.weight.detach())
    assert torch.equal(table.optimizer.state["z"], opt.state[ref.weight]["z"])
    touched = table.optimizer.state["n"] > 0
    assert (table.weight[touched] == 0).any()  # L1 gives exact zeros


def test_ftrl_applied_only_at_pushes_equals_applying_it_every_step():
    """The lazy identity: every row stepped every step (untouched rows with a zero gradient) ends
    where pushing only the touched rows leaves it, bit for bit, under L1 and L2."""
    from het.ps.server.store.optim import ftrl_step

    cfg = OptimizerConfig("ftrl", lr=0.1, l1=0.001, l2=0.5)
    gen = torch.Generator().manual_seed(2)
    weight = torch.rand(12, 4, generator=gen) - 0.5
    lazy = [weight.clone(), torch.zeros(12, 4), torch.zeros(12, 4)]
    eager = [weight.clone(), torch.zeros(12, 4), torch.zeros(12, 4)]
    everything = torch.arange(12)
    for _ in range(40):
        rows = torch.randperm(12, generator=gen)[:3]
        grads = torch.randn(3, 4, generator=gen)
        ftrl_step(*lazy, rows, grads.clone(), cfg)
        dense = torch.zeros(12, 4).index_copy_(0, rows, grads)
        ftrl_step(*eager, everything, dense, cfg)
    for a, b in zip(lazy, eager):
        assert torch.equal(a, b)


def test_l1_and_beta_belong_to_ftrl_and_l2_to_every_optimizer():
    with pytest.raises(ValueError, match="FTRL"):
        OptimizerConfig("adagrad", l1=0.1)
    with pytest.raises(ValueError, match="FTRL"):
        OptimizerConfig("sgd", beta=0.1)
    assert OptimizerConfig("adagrad", l2=0.1).decays and not OptimizerConfig("ftrl", l2=0.1).decays
    with pytest.raises(ValueError, match="1 - lr \\* l2"):
        OptimizerConfig("sgd", lr=2.0, l2=0.5)
    from het.train.config import TrainConfig

    with pytest.raises(ValueError, match="ftrl"):
        TrainConfig(row_l1=0.1)
    assert TrainConfig(optimizer="ftrl", row_l1=0.1).row_l1 == 0.1
    assert TrainConfig(optimizer="adam", row_l2=0.1).row_l2 == 0.1


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "adam"])
def test_a_schedule_at_staleness_zero_matches_torch_with_the_same_schedule(cluster_factory, optimizer):
    """Warmup then cosine decay: the shards scale the lr by the step each push carries, the
    caches' local updates by the worker's step; nn.Embedding under LambdaLR agrees."""
    from het.schedule import Schedule
    from reference import TORCH_OPTIMIZERS

    schedule = Schedule(warmup=4, decay="cosine", steps=30, floor=0.1)
    rows, dim, lr = 40, 6, 0.1
    table = TableConfig("embedding", rows=rows, dim=dim, optimizer=OptimizerConfig(optimizer, lr=lr, schedule=schedule))
    emb = Embedding(tables=table, client=cluster_factory([table], 2).client(),
                    cache=CacheConfig(capacity=16, staleness=0, ways=4))
    ref = torch.nn.Embedding(rows, dim, sparse=True)
    with torch.no_grad():
        ref.weight.copy_(emb.read(torch.arange(rows)))
    ref_opt = TORCH_OPTIMIZERS[optimizer](ref.parameters(), lr)
    lambda_lr = torch.optim.lr_scheduler.LambdaLR(ref_opt, lambda t: schedule.factor(t + 1))
    g = torch.Generator().manual_seed(4)
    for step in range(1, 31):
        emb.scale_lr(schedule.factor(step))
        keys = torch.randint(0, rows, (12, 2), generator=g)
        target = torch.randn(12, 2, dim, generator=g)
        ((emb(keys) - target) ** 2).mean().backward()
        ref_opt.zero_grad()
        ((ref(keys) - target) ** 2).mean().backward()
        ref_opt.step()
        lambda_lr.step()
    assert float((emb.read(torch.arange(rows)) - ref.weight.detach()).abs().max()) <= 1e-5


def test_an_ftrl_push_of_several_steps_moves_as_its_steps_and_leaves_untouched_coordinates_alone():
    """Without L1, several like FTRL steps pushed as one sum with their squares move a row about
    as far as the steps one by one; a coordinate no gradient reached keeps its value and z = 0."""
    opt = OptimizerConfig("ftrl", lr=0.1, l2=0.5)
    cfg = TableConfig("t", rows=1, dim=4, optimizer=opt)
    g = torch.tensor([[0.01, -0.02, 0.0, 0.03]])
    sequential, followed, summed = built(FixedRows(cfg, 0, 1)), built(FixedRows(cfg, 0, 1)), built(FixedRows(cfg, 0, 1))
    start = sequential.weight.clone()
    for _ in range(50):
        sequential.push(torch.tensor([0]), g.clone(), torch.tensor([1]), 1)
    followed.push(torch.tensor([0]), 50 * g, torch.tensor([50]), 1, sq=50 * g * g)
    summed.push(torch.tensor([0]), 50 * g, torch.tensor([1]), 1)  # one step of the sum
    moved = {k: float((t.weight - start).norm()) for k, t in (("seq", sequential), ("follow", followed),
                                                              ("sum", summed))}
    assert moved["follow"] == pytest.approx(moved["seq"], rel=0.08) and moved["sum"] < 0.3 * moved["seq"]
    for t in (sequential, followed):
        assert torch.isfinite(t.optimizer.state["z"]).all() and t.optimizer.state["z"][0, 2] == 0
        assert t.weight[0, 2] == start[0, 2]
