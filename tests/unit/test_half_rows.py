"""Rows stored in half precision (``row_dtype`` fp16 / bf16): half the bytes on a shard, the
same training as float32 to the rounding half precision allows, rounding replayed the same way."""

import numpy as np
import pytest
import torch

from conftest import built
from het import CacheConfig, Embedding, OptimizerConfig, TableConfig, native
from het.ps.protocol import halves
from het.ps.protocol.initial import initial_rows
from het.ps.server.store.dynamic import DynamicRows
from het.ps.server.store.fixed import FixedRows
from reference import train_side_by_side

BITS = {"fp16": 11, "bf16": 8}  # significant bits: a value's step is |value| / 2^(bits - 1) at most


def ulp(values: torch.Tensor, row_dtype: str) -> float:
    """The largest gap between two neighbouring values of ``row_dtype`` below max |values|."""
    return float(values.abs().max()) / 2 ** (BITS[row_dtype] - 1)


@pytest.mark.parametrize("row_dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "adam"])
@pytest.mark.parametrize("dynamic", [False, True])
def test_staleness_zero_with_nearest_rounding_matches_torch_embedding_rounded_each_step(
        cluster_factory, row_dtype, optimizer, dynamic):
    """nn.Embedding whose rows are rounded to the dtype after every step is what a half table
    computes: the float32 update of the stored (rounded) row, rounded. The two agree to one step
    of the dtype at the rows' size (a sum that lands on either side of a rounding boundary in
    another order of additions rounds the other way, once)."""
    rows, lr = 60, 0.05
    table = TableConfig("embedding", rows=None if dynamic else rows, dim=8, row_dtype=row_dtype,
                        row_rounding="nearest", optimizer=OptimizerConfig(optimizer, lr=lr))
    cluster = cluster_factory([table], 2)
    emb = Embedding(tables=table, client=cluster.client(), cache=CacheConfig(capacity=24, staleness=0, ways=8))
    ids = torch.arange(rows) * (-7 if dynamic else 1)
    gap = train_side_by_side(emb, rows, optimizer, lr, ids=ids, round_to=halves.torch_dtype(row_dtype))
    assert gap <= ulp(emb.read(ids), row_dtype), gap


@pytest.mark.parametrize("row_dtype", ["fp16", "bf16"])
def test_staleness_zero_with_stochastic_rounding_stays_near_float32(cluster_factory, row_dtype):
    """Against plain float32 nn.Embedding: each step's rounding moves a row by less than one step
    of the dtype, unbiased, so 50 steps stay within a few steps of it (a random walk's sqrt(50))."""
    rows, lr = 60, 0.05
    table = TableConfig("embedding", rows=rows, dim=8, row_dtype=row_dtype, optimizer=OptimizerConfig("adagrad", lr=lr))
    cluster = cluster_factory([table], 1)
    emb = Embedding(tables=table, client=cluster.client(), cache=CacheConfig(capacity=24, staleness=0, ways=8))
    gap = train_side_by_side(emb, rows, "adagrad", lr)
    assert gap <= 8 * ulp(emb.read(torch.arange(rows)), row_dtype), gap


@pytest.mark.parametrize("row_dtype", ["fp16", "bf16"])
def test_a_half_table_holds_half_the_row_bytes_and_exact_initial_rows(row_dtype):
    opt = OptimizerConfig("sgd", lr=0.1)
    full = built(FixedRows(TableConfig("t", rows=1000, dim=16, optimizer=opt), 0, 1))
    half = built(FixedRows(TableConfig("t", rows=1000, dim=16, optimizer=opt, row_dtype=row_dtype), 0, 1))
    assert half.weight.dtype == halves.torch_dtype(row_dtype)
    assert full.stats()["bytes"] - half.stats()["bytes"] == 1000 * 16 * 2  # the rows' bytes halved
    # a client builds an untouched row as the shard holds it, bit for bit
    cfg = half.cfg
    start = torch.from_numpy(initial_rows(cfg, torch.arange(1000).numpy()))
    assert torch.equal(start, half.weight.float())
    assert float((start - full.weight).abs().max()) > 0  # rounded: not float32's values
    dyn = DynamicRows(TableConfig("ids", rows=None, dim=16, optimizer=opt, row_dtype=row_dtype), 0, 1)
    keys = torch.tensor([3, -5, 2 ** 60])
    dyn.push(dyn.locate(keys), torch.ones(3, 16), torch.ones(3, dtype=torch.int64), step=1)
    assert dyn.store.weight.dtype == halves.torch_dtype(row_dtype)
    assert dyn.stats()["bytes"] == 3 * 16 * 2 + dyn.index_bytes()


@pytest.mark.parametrize("native", [True, False])
def test_stochastic_rounding_is_the_same_when_a_push_is_replayed(native):
    """The rounding's random numbers come from (key, clock): the same pushes give the same bits
    on another table (a log replayed after a restart), whichever push path runs."""
    def run(native_path):
        cfg = TableConfig("t", rows=40, dim=8, row_dtype="bf16", optimizer=OptimizerConfig("adagrad", lr=0.3))
        t = built(FixedRows(cfg, 1, 2, native=native_path))
        g = torch.Generator().manual_seed(3)
        for step in range(1, 30):
            local = torch.randint(0, 20, (25,), generator=g)
            t.push(local, torch.randn(25, 8, generator=g), torch.ones(25, dtype=torch.int64), step)
        return t.weight.clone(), t.optimizer.state["sum"].clone(), t.clocks.clone()

    a, b = run(native), run(native)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert all(torch.equal(x, y) for x, y in zip(a, run(not native)))  # native and torch paths alike


def test_stochastic_rounding_keeps_updates_nearest_rounding_loses():
    """Many SGD updates each far below half a bf16 step of the row: nearest rounding never moves
    the row; stochastic rounding moves it by their sum on average."""
    updates, n = 400, 64
    moved = {}
    for rounding in ("nearest", "stochastic"):
        cfg = TableConfig("t", rows=n, dim=4, row_dtype="bf16", row_rounding=rounding, init_scale=0.0,
                          optimizer=OptimizerConfig("sgd", lr=1.0))
        t = built(FixedRows(cfg, 0, 1))
        t.weight.fill_(1.0)  # bf16's step at 1.0 is 2^-7; each update is 2^-12
        for step in range(1, updates + 1):
            t.push(torch.arange(n), torch.full((n, 4), -2.0 ** -12), torch.ones(n, dtype=torch.int64), step)
        moved[rounding] = float(t.weight.float().mean()) - 1.0
    assert moved["nearest"] == 0.0
    assert abs(moved["stochastic"] - updates * 2.0 ** -12) < 0.1 * updates * 2.0 ** -12, moved


def test_a_row_float16_cannot_hold_refuses_the_push_and_changes_nothing():
    cfg = TableConfig("t", rows=10, dim=2, row_dtype="fp16", optimizer=OptimizerConfig("sgd", lr=1.0))
    for t in (built(FixedRows(cfg, 0, 1)), DynamicRows(TableConfig("d", rows=None, dim=2, row_dtype="fp16",
                                                             optimizer=OptimizerConfig("sgd", lr=1.0)), 0, 1)):
        at = t.locate(torch.tensor([1, 2]))
        before = t.rows_to_send(at, False)[0][0].copy()
        with pytest.raises(ValueError, match=r"a row value 1000\d\d does not fit float16"):  # named
            t.push(at, torch.tensor([[-1e5, 0.0], [1.0, 1.0]]), torch.ones(2, dtype=torch.int64), step=1)
        assert (t.rows_to_send(t.locate(torch.tensor([1, 2])), False)[0][0] == before).all()
        assert t.clocks_of(t.locate(torch.tensor([1, 2]))).tolist() == [0, 0]


@pytest.mark.skipif(native.ops is None, reason="het's native core is not built")
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])  # computed aside; in place
@pytest.mark.parametrize("dynamic", [False, True])
def test_a_refused_half_push_names_the_value_of_the_least_key_as_the_reference(optimizer, dynamic):
    """Two rows pushed past float16's range: the value named is that of the least key, natively
    as by the reference, whatever slots the keys hold (a dynamic table's, in the order they came:
    key 9 before key 5)."""
    opt = OptimizerConfig(optimizer, lr=1.0 if optimizer == "sgd" else 1e5, initial_accumulator=1.0)
    cfg = TableConfig("t", rows=None if dynamic else 16, dim=2, row_dtype="fp16", optimizer=opt)
    fast = DynamicRows(cfg, 0, 1) if dynamic else built(FixedRows(cfg, 0, 1))
    ref = DynamicRows(cfg, 0, 1) if dynamic else built(FixedRows(cfg, 0, 1, native=False))
    ref.native = False
    messages = []
    for t in (fast, ref):
        for key in (9, 5):  # stored, unmoved
            t.push(t.locate(torch.tensor([key])), torch.zeros(1, 2), torch.ones(1, dtype=torch.int64), step=1)
        # key 5 to about 70,000 (SGD: 7e4; Adagrad: 1e5 / sqrt(2)), key 9 past 80,000
        grads = torch.tensor([[-7e4, 0.0], [-8e4, 0.0]]) if optimizer == "sgd" else torch.tensor([[-1.0, 0], [-3, 0]])
        with pytest.raises(ValueError, match="does not fit float16") as e:
            t.push(t.locate(torch.tensor([5, 9])), grads, torch.ones(2, dtype=torch.int64), step=2)
        messages.append(str(e.value))
    assert messages[0] == messages[1] and "a row value 70" in messages[0], messages


def test_saves_keep_half_rows_and_a_float32_save_loads_rounded(tmp_path):
    opt = OptimizerConfig("adagrad", lr=0.1)
    half_cfg = TableConfig("t", rows=50, dim=4, row_dtype="fp16", optimizer=opt)
    t = built(FixedRows(half_cfg, 0, 1))
    t.push(torch.arange(10), torch.randn(10, 4), torch.ones(10, dtype=torch.int64), step=1)
    torch.save(t.state_dict(), tmp_path / "half.pt")
    again = built(FixedRows(half_cfg, 0, 1))
    again.load_state_dict(torch.load(tmp_path / "half.pt", weights_only=True))
    assert torch.equal(again.weight, t.weight) and again.weight.dtype == torch.float16
    full = built(FixedRows(TableConfig("t", rows=50, dim=4, optimizer=opt), 0, 1))
    full.push(torch.arange(10), torch.randn(10, 4), torch.ones(10, dtype=torch.int64), step=1)
    again.load_state_dict(full.state_dict())
    assert torch.equal(again.weight, full.weight.half())


def test_half_rows_refuse_a_memory_budget():
    from het.train.config import TrainConfig

    with pytest.raises(ValueError, match="row_dtype bf16 with shard.memory"):
        TrainConfig(table={"row_dtype": "bf16"}, shard={"memory": "1GiB"})
    with pytest.raises(ValueError, match="disk tier stores float32"):
        DynamicRows(TableConfig("d", rows=None, dim=4, row_dtype="fp16"), 0, 1, disk_dir="/nonexistent")
    with pytest.raises(ValueError, match="row_dtype must be one of"):
        TableConfig("t", rows=4, dim=4, row_dtype="fp8")


@pytest.mark.skipif(native.ops is None, reason="het's native core is not built")
@pytest.mark.parametrize("rounding", ["stochastic", "nearest"])
@pytest.mark.parametrize("dim", [64, 61, 3])  # whole vectors, a tail past them, a tail only
def test_the_native_rounding_gives_the_references_bits(rounding, dim, monkeypatch):
    """Values over 11 orders of magnitude (float16's subnormals, bfloat16's full range), zeros of
    both signs, values far past a float16 step, the largest float16 holds, infinities:
    the same 16 bits either way; a value past float16's largest refused with the same message."""
    g = torch.Generator().manual_seed(5)
    values = torch.randn(2000, dim, generator=g) * torch.logspace(-8, 3, dim)
    values[0, :3] = torch.tensor([0.0, -0.0, 65519.0])[:dim]  # 65519: rounds to 65504 (nearest)
    values[1, -2:] = torch.tensor([float("inf"), float("-inf")])[-dim:]  # NaN's bits: torch's kernel's choice
    salts = torch.randint(-2 ** 62, 2 ** 62, (2000,), generator=g)

    def both(x, dtype):
        try:
            fast = halves.round_rows(x, dtype, rounding, salts)
        except ValueError as e:
            fast = str(e)
        with monkeypatch.context() as m:
            m.setattr(native, "ops", None)
            try:
                slow = halves.round_rows(x, dtype, rounding, salts)
            except ValueError as e:
                slow = str(e)
        return fast, slow

    for dtype in (torch.float16, torch.bfloat16):
        x = values.clone()
        if dtype == torch.float16 and rounding == "stochastic":
            x[0, 2] = 65500.0  # 65519 could round up past the largest float16
        fast, slow = both(x, dtype)
        assert fast.dtype == slow.dtype == dtype
        assert torch.equal(fast.view(torch.int16), slow.view(torch.int16))
    unfit = values.clone()
    unfit[0, 2], unfit[7, dim - 1] = 65500.0, -70000.0
    fast, slow = both(unfit, torch.float16)
    assert fast == slow and fast.startswith("a row value -70000 does not fit float16")


@pytest.mark.parametrize("row_dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("rows", [400, None])  # fixed, dynamic
def test_pulls_and_syncs_carry_half_rows_in_half_the_bytes(cluster_factory, row_dtype, rows):
    """A half table's rows travel as their 16 bits and arrive as the float32 values the shard
    holds; a follower's read of changed rows (CHANGED) still gets float32."""
    received = {}
    for dtype in ("fp32", row_dtype):
        table = TableConfig("t", rows=rows, dim=32, row_dtype=dtype, optimizer=OptimizerConfig("adagrad", lr=0.1))
        client = cluster_factory([table], 1).client()
        keys = torch.arange(300) * (1 if rows else -3)
        client.wait(client.push("t", keys, torch.randn(300, 32), torch.ones(300, dtype=torch.int64)))
        before = client.bytes["received"]
        pulled, clocks = client.wait(client.pull("t", keys))
        received[dtype] = client.bytes["received"] - before
        assert pulled.dtype == torch.float32 and clocks.tolist() == [1] * 300
        if dtype != "fp32":
            stored = halves.round_rows(pulled, halves.torch_dtype(dtype), "nearest")
            assert torch.equal(stored.float(), pulled)  # values the dtype holds, exactly
            synced = client.wait(client.sync("t", keys, torch.zeros(300, dtype=torch.int64), bound=0))
            assert torch.equal(synced.rows, pulled)
            list(client.changed("t"))  # starts the shard's record of changes
            client.wait(client.push("t", keys[:5], torch.randn(5, 32), torch.ones(5, dtype=torch.int64)))
            (changed_keys, changed, _), = list(client.changed("t"))
            after, _ = client.wait(client.pull("t", torch.from_numpy(changed_keys)))
            assert changed.dtype == np.float32 and np.array_equal(changed, after.numpy())
    assert received[row_dtype] < 0.55 * received["fp32"], received


@pytest.mark.skipif(native.ops is None, reason="het's native core is not built")
@pytest.mark.parametrize("row_dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "adam"])
@pytest.mark.parametrize("rounding", ["stochastic", "nearest"])
def test_the_native_half_push_gives_the_float32_push_rounded_bit_for_bit(row_dtype, optimizer, rounding):
    """The native push on half rows (each widened as read, rounded as written) against the
    reference: torch's push on float32 copies of the rows, rounded back; duplicates, several
    shards' keys and a refused push included."""
    from het.ps.server.store.kernels import HalfPush, NativeHalfPush, TorchPush

    def table():
        cfg = TableConfig("t", rows=90, dim=8, row_dtype=row_dtype, row_rounding=rounding,
                          optimizer=OptimizerConfig(optimizer, lr=0.2))
        return built(FixedRows(cfg, 2, 3))

    fast, slow = table(), table()
    assert isinstance(fast._push, NativeHalfPush)
    slow._push = HalfPush(TorchPush())
    g = torch.Generator().manual_seed(11)
    for step in range(1, 25):
        local = torch.randint(0, 30, (40,), generator=g)
        grads, counts = torch.randn(40, 8, generator=g), torch.randint(1, 3, (40,), generator=g)
        for t in (fast, slow):
            t.push(local, grads.clone(), counts, step)
    for t in (fast, slow):  # refused: a value past float16's range, or infinite
        with pytest.raises(ValueError):
            t.push(torch.tensor([1, 2]), torch.tensor([[-1e38] * 8, [1.0] * 8]) * 1e3, torch.ones(2, dtype=torch.int64), 30)
    assert torch.equal(fast.weight.view(torch.int16), slow.weight.view(torch.int16))
    assert torch.equal(fast.clocks, slow.clocks) and torch.equal(fast.touched, slow.touched)
    for n in fast.optimizer.state_names:
        assert torch.equal(fast.optimizer.state[n], slow.optimizer.state[n])


@pytest.mark.parametrize("lazy", [True, False])
def test_a_half_dynamic_tables_reply_with_keys_not_stored_arrives_exact(cluster_factory, lazy):
    """Keys never pushed beside stored ones, lazy or not: the client gets the shard's rows and the
    initial rows as the shard would hold them, from 16-bit replies."""
    table = TableConfig("t", rows=None, dim=8, row_dtype="bf16", optimizer=OptimizerConfig("sgd", lr=0.5))
    client = cluster_factory([table], 1).client()
    client.lazy_init = lazy
    stored = torch.tensor([3, -9, 2 ** 40])
    client.wait(client.push("t", stored, torch.ones(3, 8), torch.ones(3, dtype=torch.int64)))
    keys = torch.cat([stored, torch.tensor([11, -12])])
    rows, clocks = client.wait(client.pull("t", keys))
    assert clocks.tolist() == [1, 1, 1, 0, 0]
    initial = torch.from_numpy(initial_rows(table, keys.numpy()))
    assert torch.equal(rows[3:], initial[3:])
    expected = halves.round_rows(initial[:3] - 0.5, torch.bfloat16, "stochastic",
                                 halves.salts(stored, torch.ones(3, dtype=torch.int64))).float()
    assert torch.equal(rows[:3], expected)
