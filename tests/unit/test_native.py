"""het's native core (het/native) against its PyTorch reference: identical plans, rows, clocks
and pushes, bit for bit; and the reference path when there is no build."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import built
from het import native
from het.cache.cache import EmbeddingCache
from het.config import CacheConfig, OptimizerConfig, TableConfig

needs_build = pytest.mark.skipif(native.ops is None, reason="het's native core is not built (`make` builds it)")

SLOT_TENSORS = ("keys", "held", "rows", "pending", "clock", "updates", "last_use", "uses", "score", "soon", "acc", "sq")
# Under a local rule that follows Adagrad the native path sums a row's squares in double and
# the reference in torch's float order: those values agree to rounding, the rest bit for bit.
FOLLOWED = ("rows", "acc", "sq", "fill", "writeback.sq", "update.sq", "flush.sq")


def pair(table, cfg):
    """The same cache twice: one on the native path, one on the reference."""
    fast, ref = EmbeddingCache(table, cfg), EmbeddingCache(table, cfg, native=False)  # the reference index too
    assert fast.native and not ref.native
    return fast, ref


def same(a, b, what, rule="sgd"):
    if a is None or b is None:
        assert a is None and b is None, what
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, what
        if rule != "sgd" and what in FOLLOWED:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=what)
        else:
            assert torch.equal(a, b), what
    elif isinstance(a, dict):  # counters: drift is summed in double natively, in float in torch
        assert a.keys() == b.keys(), what
        for k in a:
            assert (a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-6)) if "drift" in k else a[k] == b[k], (what, k)
    else:
        assert a == b, what


def step_both(fast, ref, keys, gen, dim, announce=None):
    """One training step on both caches, the PS's reply and the gradients drawn from ``gen``."""
    if announce is not None:
        fast.announce(announce)
        ref.announce(announce)
    rule = fast.rule
    p, q = fast.lookup(keys), ref.lookup(keys)
    for name in ("keys", "slot", "hit", "clocks"):
        same(getattr(p, name), getattr(q, name), f"plan.{name}")
    for name in ("keys", "grads", "counts", "sq"):
        same(getattr(p.writeback, name), getattr(q.writeback, name), f"writeback.{name}", rule)
    # the PS sends every miss and a random part of the hits (stale ones), in a random order
    n = keys.numel()
    stale = torch.rand(n, generator=gen) < 0.3
    index = (~p.hit | stale).nonzero().flatten()
    index = index[torch.randperm(index.numel(), generator=gen)]
    rows = torch.randn(index.numel(), dim, generator=gen)
    clocks = torch.randint(0, 50, (index.numel(),), generator=gen)
    state = None if rule == "sgd" else torch.rand(index.numel(), fast.acc.shape[1], generator=gen)  # the rows' sums
    same(fast.fill(p, index, rows, clocks, state),
         ref.fill(q, index.clone(), rows.clone(), clocks.clone(), None if state is None else state.clone()), "fill", rule)
    grads = torch.randn(n, dim, generator=gen)
    a, b = fast.update(p, grads), ref.update(q, grads.clone())
    for name in ("keys", "grads", "counts", "sq"):
        same(getattr(a, name), getattr(b, name), f"update.{name}", rule)
    for name in SLOT_TENSORS:
        same(getattr(fast, name), getattr(ref, name), name, rule)
    same(dict(fast.counters), dict(ref.counters), "counters")


@needs_build
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), capacity=st.sampled_from([0, 1, 5, 33, 64, 200]),
       ways=st.sampled_from([1, 4, 8, 32]), policy=st.sampled_from(["lru", "lfu"]),
       bound=st.sampled_from([0, 1, 3, math.inf]), lookahead=st.sampled_from([0, 1, 3]),
       optimizer=st.sampled_from([("sgd", None), ("sgd", 0.05), ("adagrad", None), ("adagrad", "full"),
                                  ("adagrad", "sgd"), ("rowwise_adagrad", None), ("adam", None)]),
       dynamic=st.booleans(), key_space=st.sampled_from([50, 400, 1 << 62]))
def test_the_native_step_equals_the_reference_bit_for_bit(seed, capacity, ways, policy, bound, lookahead,
                                                         optimizer, dynamic, key_space):
    """Random key streams (raw int64 ids included), capacities, ways, policies, bounds,
    lookahead windows and optimizers (SGD's exact local rule, the others', a dynamic table's
    admission): every plan, filled row, push, slot tensor and counter is identical."""
    gen = torch.Generator().manual_seed(seed)
    name, rule = optimizer  # the SGD table's second element: a local lr off the table's
    local_lr = rule if isinstance(rule, float) else None
    table = TableConfig("t", rows=None if dynamic or key_space > 1 << 31 else key_space, dim=8,
                        optimizer=OptimizerConfig(name, lr=0.1), admit_after=2 if dynamic else 1)
    fast, ref = pair(table, CacheConfig(capacity=capacity, policy=policy, staleness=bound, ways=ways,
                                        local_lr=local_lr, lookahead=lookahead,
                                        local_update=rule if isinstance(rule, str) else "row"))
    steps = []
    for _ in range(12):
        n = int(torch.randint(1, 80, (1,), generator=gen))
        if key_space > 1 << 31:  # any int64, negative ones too
            raw = torch.randint(-(1 << 62), 1 << 62, (n,), generator=gen)
            raw[: n // 2] = raw[: n // 2] % 97  # some repeat across steps
        else:
            raw = torch.randint(0, key_space, (n,), generator=gen)
        steps.append(torch.unique(raw))
    for keys in steps[:lookahead]:
        fast.announce(keys)
        ref.announce(keys)
    for i, keys in enumerate(steps):
        ahead = steps[i + lookahead] if lookahead and i + lookahead < len(steps) else None
        step_both(fast, ref, keys, gen, table.dim, ahead)
    a, b = fast.flush(), ref.flush()
    for name in ("keys", "grads", "counts", "sq"):
        same(getattr(a, name), getattr(b, name), f"flush.{name}", fast.rule)


@needs_build
def test_a_big_batch_through_the_thread_pool_equals_the_reference():
    """More keys than one task of the pool takes (4,096), with 2 threads."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        gen = torch.Generator().manual_seed(1)
        table = TableConfig("t", rows=200_000, dim=16, optimizer=OptimizerConfig("sgd", lr=0.1))
        fast, ref = pair(table, CacheConfig(capacity=12_000, policy="lfu", staleness=2, ways=32))
        for _ in range(4):
            step_both(fast, ref, torch.unique(torch.randint(0, 200_000, (30_000,), generator=gen)), gen, table.dim)
    finally:
        torch.set_num_threads(threads)


@needs_build
def test_native_operators_name_what_they_expected():
    with pytest.raises(RuntimeError, match="expected Long"):
        native.ops.cache_sets(torch.zeros(3, dtype=torch.int32), 4)


def test_without_a_build_het_warns_once_and_runs_the_reference_path(tmp_path):
    """A fresh clone before `make`: the module is missing. One RuntimeWarning, then the
    reference path; HET_NATIVE=0 chooses that path without a warning."""
    code = """
import warnings, torch
import het.native as native
native.ops, native._why_not = None, "it is not built (test)"
from het.cache.cache import EmbeddingCache
from het.config import CacheConfig, TableConfig
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    caches = [EmbeddingCache(TableConfig("t", rows=100, dim=2), CacheConfig(capacity=8)) for _ in range(3)]
    plan = caches[0].lookup(torch.tensor([1, 2, 3]))
print(sum(issubclass(w.category, RuntimeWarning) and "native core" in str(w.message) for w in caught),
      any(c.native for c in caches), plan.hit.tolist())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "HET_NATIVE": "1"})
    assert out.stdout.split() == ["1", "False", "[False,", "False,", "False]"]
    code0 = ("import warnings; warnings.simplefilter('error'); import torch; from het import native; "
             "print(native.ops is None, native.usable(torch.zeros(1)))")
    out = subprocess.run([sys.executable, "-c", code0], capture_output=True, text=True, check=True,
                         env={**os.environ, "HET_NATIVE": "0"})
    assert out.stdout.split() == ["True", "False"]


def test_a_build_for_another_cpu_is_not_loaded_and_says_why(tmp_path, monkeypatch):
    """A module built with -march=native on a CPU with instruction sets this one lacks could
    die on an illegal instruction: het does not import it, and the warning names what is
    missing. A record that cannot be read is not trusted either."""
    record = tmp_path / "_het_native.so.cpu"
    monkeypatch.setenv(native.ENV, "1")
    record.write_text(json.dumps({"march": "native", "flags": sorted(native.cpu_flags() | {"avx_of_the_future"})}))
    ops, why = native._load(str(record))
    assert ops is None and "built for a CPU with avx_of_the_future, which this one lacks" in why
    for bad in ("[]", "null", '{"flags": [1]}', '{"march": "nat'):
        record.write_text(bad)
        ops, why = native._load(str(record))
        assert ops is None and "cannot be read" in why, bad
    for target in ("native", "x86-64-v5", None):  # this CPU's own; a target het knows nothing of
        record.write_text(json.dumps({"march": target, "flags": native.built_flags(target)}))
        assert native.missing_cpu_flags(str(record)) == []
    assert native.missing_cpu_flags(str(tmp_path / "none")) == []  # a build from before records


def test_a_portable_target_records_its_level_and_the_loader_checks_it(tmp_path):
    assert set(native.built_flags("x86-64-v3")) >= {"avx2", "fma", "sse4_2"}
    assert set(native.built_flags("x86-64-v2")) < set(native.built_flags("x86-64-v3"))
    cpuinfo = tmp_path / "cpuinfo"  # a CPU of level v2 only
    cpuinfo.write_text("flags\t\t: " + " ".join(native.built_flags("x86-64-v2")) + " hypervisor\n")
    flags = native.cpu_flags(str(cpuinfo))
    assert set(native.built_flags("x86-64-v2")) <= flags and not set(native.built_flags("x86-64-v3")) <= flags


def test_cpu_flags_keep_the_instruction_sets_of_x86_and_arm(tmp_path):
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nflags\t\t: fpu sse sse2 avx2 fma hypervisor constant_tsc avx512f bmi2 "
                   "xsaves sha_ni\nbugs\t\t: spectre_v1\n")
    assert native.cpu_flags(str(x86)) == {"sse", "sse2", "avx2", "fma", "avx512f", "bmi2"}
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd sve atomics\n")
    assert native.cpu_flags(str(arm)) == {"fp", "asimd", "sve", "atomics"}
    assert native.cpu_flags(str(tmp_path / "none")) == frozenset()


@needs_build
@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 10_000), seed=st.integers(0, 2**32 - 1),
       bad=st.sampled_from([None, math.nan, math.inf, -math.inf, 3.4e38]))
def test_native_all_finite_says_what_torch_says(n, seed, bad):
    from het.ps.protocol.limits import all_finite

    x = torch.randn(n, generator=torch.Generator().manual_seed(seed)) * 1e30
    if bad is not None and n:
        x[seed % n] = bad
    expect = bool(torch.isfinite(x).all())
    assert native.ops.all_finite(x) is expect and all_finite(x) is expect
    assert all_finite(x.reshape(-1, 1).expand(-1, 2)) is expect  # not contiguous: torch's path


@needs_build
def test_the_build_is_the_source_in_the_tree():
    assert native.ops.SOURCE_HASH == native.source_hash()


@needs_build
@settings(max_examples=25, deadline=None)
@given(dim=st.integers(1, 70), scale=st.sampled_from([0.01, 0.5, 3.0]), seed=st.integers(0, 2**32 - 1),
       name=st.sampled_from(["t", "user_id", "C14.a-b"]),
       keys=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=40))
def test_native_initial_rows_equal_numpys_bit_for_bit(dim, scale, seed, name, keys):
    """Every key (negative and huge ones take the mixed counter), dim, scale and seed."""
    from het.ps.protocol.initial import hash_rows, initial_counters, initial_rows

    table = TableConfig(name, rows=None, dim=dim, seed=seed, init_scale=scale)
    keys = np.array(keys + [0, 1, 2**63 - 1, -(2**63)], dtype=np.int64)
    fast = initial_rows(table, keys)
    counters, salt = initial_counters(table, keys)
    ref = hash_rows(counters, dim, salt, scale)
    assert fast.dtype == ref.dtype == np.float32 and fast.shape == ref.shape == (len(keys), dim)
    assert np.array_equal(fast.view(np.int32), ref.view(np.int32))


@needs_build
@settings(max_examples=60, deadline=None)
@given(dim=st.integers(1, 40), seed=st.integers(0, 2**32 - 1), marks=st.lists(st.booleans(), max_size=60),
       width=st.sampled_from([None, 1, "full"]), accumulator=st.sampled_from([0.0, 0.3]), keys=st.data())
def test_native_lazy_reply_equals_the_reference(dim, seed, marks, width, accumulator, keys):
    """One shard's lazy reply: the rows, clocks and optimizer state sent, and those of the rows
    built here (any keys: negative and huge ones take the mixed counter; an initial state that is
    not zeros), natively in one pass as the reference puts them together, bit for bit."""
    from het.ps.client.replies import Handle, NativeParts, TorchParts
    from het.ps.protocol.messages import Op

    table = TableConfig("t", rows=None, dim=dim, seed=seed, init_scale=0.3,
                        optimizer=OptimizerConfig("adagrad", lr=0.1, initial_accumulator=accumulator))
    width = dim if width == "full" else width
    n = len(marks)
    ids = keys.draw(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=n, max_size=n, unique=True))
    handle = Handle(Op.SYNC, "t", n, torch.device("cpu"), keys=torch.tensor(ids, dtype=torch.int64))
    k = n - sum(marks)
    rng = np.random.default_rng(seed)
    sent = rng.standard_normal((k, dim)).astype(np.float32)
    clocks = rng.integers(0, 1 << 40, k).astype(np.int64)
    state = None if width is None else rng.random((k, width)).astype(np.float32)
    bits = [np.packbits(np.array(marks, dtype=bool), bitorder="little")] if n else []
    positions = torch.arange(n)
    fast = NativeParts()(handle, table, positions, sent, clocks, state, bits, width)
    ref = TorchParts()(handle, table, positions, sent, clocks, state, bits, width)
    assert fast[0].dtype == ref[0].dtype == torch.float32 and fast[0].shape == ref[0].shape == (n, dim)
    assert torch.equal(fast[0].view(torch.int32), ref[0].view(torch.int32))
    assert torch.equal(fast[1], ref[1]) and fast[1].dtype == torch.int64
    assert (fast[2] is None and ref[2] is None) if width is None else torch.equal(fast[2], ref[2])


@needs_build
def test_native_lazy_reply_refuses_marks_that_do_not_match():
    sent, keys, clocks = torch.zeros(2, 3), torch.arange(4), torch.zeros(2, dtype=torch.int64)
    none = torch.empty(0)
    bits = torch.tensor([0b0011], dtype=torch.uint8)  # rows 0 and 1 built
    with pytest.raises(RuntimeError, match="built bits: expected 2 bytes for 9 rows, got 1"):
        native.ops.lazy_reply(sent, bits, torch.arange(9), clocks, none, none, 0, 1.0)
    with pytest.raises(RuntimeError, match="built bits: expected 2 rows marked, got 1"):
        native.ops.lazy_reply(sent, torch.tensor([0b0100], dtype=torch.uint8), keys, clocks, none, none, 0, 1.0)
    with pytest.raises(RuntimeError, match="clocks: expected one for each of the 2 rows sent, got 1"):
        native.ops.lazy_reply(sent, bits, keys, clocks[:1], none, none, 0, 1.0)
    with pytest.raises(RuntimeError, match=r"state: expected \(2, 1\)"):
        native.ops.lazy_reply(sent, bits, keys, clocks, torch.zeros(3, 1), torch.zeros(1), 0, 1.0)
    rows, got_clocks, state = native.ops.lazy_reply(sent + 1, bits, keys, clocks + 7, none, none, 0, 1.0)
    assert torch.equal(rows[2:], torch.ones(2, 3)) and got_clocks.tolist() == [0, 0, 7, 7] and state.shape == (4, 0)


@needs_build
@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.sampled_from([0, 1, 2, 255, 256, 3000]),
       span=st.sampled_from([1, 7, 300, 1 << 24, 1 << 40, None]), extremes=st.booleans())
def test_native_unique_equals_torchs(seed, n, span, extremes):
    """The radix sort's distinct keys and inverse are torch.unique's: few and many keys, ids that
    share high digits (skipped passes) or not, negative ones and int64's extremes."""
    gen = torch.Generator().manual_seed(seed)
    keys = (torch.randint(-(1 << 62), 1 << 62, (n,), generator=gen) if span is None
            else torch.randint(0, span, (n,), generator=gen))
    if extremes and n >= 3:
        keys[:3] = torch.tensor([-(2**63), 2**63 - 1, -1])
    unique, inverse = native.unique_inverse(keys)
    expected, expected_inverse = torch.unique(keys, return_inverse=True)
    assert torch.equal(unique, expected) and torch.equal(inverse, expected_inverse)
    assert unique.dtype == inverse.dtype == torch.int64


def test_native_unique_refuses_what_it_cannot_take():
    """Not int64: torch's own (any dtype); a strided view is made contiguous first."""
    floats = torch.tensor([2.0, 1.0, 2.0])
    assert torch.equal(native.unique_inverse(floats)[1], torch.tensor([1, 0, 1]))
    strided = torch.tensor([5, 0, 3, 0, 5, 0])[::2]
    unique, inverse = native.unique_inverse(strided)
    assert unique.tolist() == [3, 5] and inverse.tolist() == [1, 0, 1]
    if native.ops is not None:
        with pytest.raises(RuntimeError, match="keys: expected Long, got Int"):
            native.ops.unique_inverse(torch.tensor([1, 2], dtype=torch.int32))


@needs_build
@settings(max_examples=300, deadline=None)
@given(keys=st.lists(st.integers(-(1 << 63), (1 << 63) - 1) | st.integers(-3, 40), max_size=12),
       wide=st.booleans(), rows=st.integers(1, 40), layout=st.sampled_from([(0, 1), (0, 2), (1, 2), (2, 3)]))
def test_native_wire_rows_take_exactly_the_keys_the_checks_take(keys, wide, rows, layout):
    """A request's keys as they travel (int32 or int64) located natively: the local rows of
    het.ps.protocol.partition for keys in range and on the shard, else None, as the checked path refuses
    them (out_of_range, the shard rule)."""
    from het.ps.protocol import partition
    from het.ps.protocol.limits import out_of_range

    index, shards = layout
    dtype = np.int64 if wide else np.int32
    keys = [k for k in keys if np.iinfo(dtype).min <= k <= np.iinfo(dtype).max]
    got = native.ops.wire_rows(torch.from_numpy(np.array(keys, dtype)), rows, shards, index)
    t, wanted = TableConfig("t", rows=rows, dim=1), torch.tensor(keys, dtype=torch.int64)
    accepted = not out_of_range(t, wanted) and bool((partition.shard_of(wanted, shards) == index).all())
    assert (got is not None) == accepted
    if accepted:
        assert got.dtype == torch.int64 and torch.equal(got, partition.local_rows(wanted, shards))


@needs_build
@settings(max_examples=300, deadline=None)
@given(counts=st.lists(st.integers(-(1 << 63), (1 << 63) - 1) | st.integers(-2, 300), max_size=12),
       dtype=st.sampled_from([np.uint8, np.int16, np.int32, np.int64]))
def test_native_wire_counts_take_exactly_the_counts_the_checks_take(counts, dtype):
    """A push's counts as they travel widened natively: int64, where every one lies in [0, MAX_COUNT]
    as checks.push holds them; else None. Another dtype: None."""
    from het.ps.protocol.limits import MAX_COUNT

    counts = [c for c in counts if np.iinfo(dtype).min <= c <= np.iinfo(dtype).max]
    got = native.ops.wire_counts(torch.from_numpy(np.array(counts, dtype)), MAX_COUNT)
    if all(0 <= c <= MAX_COUNT for c in counts):
        assert got is not None and got.dtype == torch.int64 and got.tolist() == counts
    else:
        assert got is None
    assert native.ops.wire_counts(torch.ones(2), MAX_COUNT) is None
    assert native.ops.wire_rows(torch.ones(2), 5, 1, 0) is None


@needs_build
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), optimizer=st.sampled_from(["sgd", "adagrad", "adam"]),
       dim=st.sampled_from([1, 3, 8, 13, 16, 64, 130]), rows=st.sampled_from([5, 40, 300]),
       shards=st.sampled_from([1, 3]), blow_up=st.sampled_from([None, "grad", "clock"]))
def test_a_native_push_equals_the_reference_bit_for_bit(seed, optimizer, dim, rows, shards, blow_up):
    """Pushes with duplicate keys, several steps, each optimizer and dims off the vector width;
    a push that would overflow a value or a clock is refused whole, with the same message, on
    both paths."""
    from het.ps.protocol.limits import MAX_CLOCK
    from het.ps.server.store.fixed import FixedRows

    gen = torch.Generator().manual_seed(seed)
    cfg = TableConfig("t", rows=rows, dim=dim, optimizer=OptimizerConfig(optimizer, lr=0.05))
    fast, ref = built(FixedRows(cfg, shards - 1, shards)), built(FixedRows(cfg, shards - 1, shards, native=False))
    assert fast.native
    local_rows = len(fast.weight)
    for step in range(1, 6):
        n = int(torch.randint(1, 2 * local_rows + 2, (1,), generator=gen))
        local = torch.randint(0, local_rows, (n,), generator=gen)
        grads = torch.randn(n, dim, generator=gen)
        counts = torch.randint(0, 3, (n,), generator=gen)
        if blow_up == "grad" and step == 4:
            grads[0, 0] = 3e38 if optimizer == "sgd" else float("inf")
            grads[-1] = 3e38
            if optimizer == "sgd":  # a row overflows part way through (SGD's pass is in place)
                row = local[int(torch.randint(0, n, (1,), generator=gen))]
                fast.weight[row] = ref.weight[row] = 3.4e38
                grads[local == row] = -3e38
        if blow_up == "clock" and step == 4:
            fast.clocks[local[0]] = ref.clocks[local[0]] = MAX_CLOCK - 1
            counts[0] = 5
        errors = []
        for table in (fast, ref):
            try:
                table.push(local.clone(), grads.clone(), counts.clone(), step)
                errors.append(None)
            except ValueError as e:
                errors.append(str(e))
        assert errors[0] == errors[1]
        if blow_up is None or step == 4:  # (a clock left at the edge may refuse a later push too)
            assert (errors[0] is not None) == (blow_up is not None), (errors, step)
        for name in ("weight", "clocks", "touched"):
            assert torch.equal(getattr(fast, name), getattr(ref, name)), (name, step)
        for name in fast.optimizer.state:
            assert torch.equal(fast.optimizer.state[name], ref.optimizer.state[name]), (name, step)


def native_and_reference_shards(table: str, optimizer: OptimizerConfig, seed: int):
    """Two in-process shards of a 64-key table of dim 16 (``table``: "fixed" or "dynamic", then
    the rows' dtype if not fp32), one pushing natively, one by the torch reference, and the 64
    keys in a random order (a dynamic table's spread over a wide range)."""
    from het.config import ShardConfig
    from het.ps.server.shard import Shard
    from het.ps.server.store.fixed import FixedRows

    dynamic, dtype = table.startswith("dynamic"), table.split()[-1] if " " in table else "fp32"
    cfg = TableConfig("t", rows=None if dynamic else 64, dim=16, optimizer=optimizer, row_dtype=dtype)
    fast, ref = Shard(ShardConfig((cfg,))), Shard(ShardConfig((cfg,)))
    if dynamic:
        ref.tables["t"].native = False
    else:
        ref.tables["t"] = FixedRows(cfg, 0, 1, native=False)
    assert fast.tables["t"].native and not ref.tables["t"].native
    keys = torch.randperm(64, generator=torch.Generator().manual_seed(seed)).numpy() * (7919 if dynamic else 1)
    return fast, ref, keys


@needs_build
# fp16 holds no row near 3e38 to overflow; its own failure is a finite value past 65504 ("unfit")
@pytest.mark.parametrize("several", [False, True], ids=["one step", "several steps"])
@pytest.mark.parametrize("table, fails", [(table, fails)
                                          for table in ("fixed", "dynamic", "fixed bf16", "fixed fp16", "dynamic bf16",
                                                        "dynamic fp16")
                                          for fails in (None, "sum", "clock", "unfit" if "fp16" in table else "row")])
def test_an_adagrad_push_refused_part_way_puts_everything_back(table, fails, several):
    """An Adagrad push moves the sums and the rows in place: one refused after others moved (a
    row that overflows, a sum that overflows, a clock past its maximum, a half row past what
    fp16 holds) leaves every row, sum, clock, mark and stored key as it was, with the reference's
    message (fp16's names the same value); one that passes equals the reference bit for bit.
    Pushes of several steps (their squares sent along) too: equal to the reference to float
    rounding (their square roots IEEE's, the reference's torch's). A quarter of the keys are new
    to the push."""
    from het.ps.protocol.limits import MAX_CLOCK, MAX_COUNT

    dynamic = table.startswith("dynamic")
    lr = {"row": 3e38, "unfit": 6e4 if several else 4e4}.get(fails, 0.05)  # a step moves a row by about lr
    fast, ref, keys = native_and_reference_shards(table, OptimizerConfig("adagrad", lr=lr), seed=1)

    def held(s):  # every key's row, clock and sums (a sync that asks for them all), marks or meta, rows stored
        index, rows, clocks, sums = s.sync("t", keys, np.full(64, -1), bound=0, state="full")
        assert np.array_equal(index, np.arange(64))
        t = s.tables["t"]
        if dynamic:
            slots = t.locate(torch.from_numpy(keys))[:, 1]
            marks = t.meta.gather(slots[slots >= 0]).numpy()  # the stored keys' clocks and last steps
        else:
            marks = t.touched.numpy().copy()
        return rows, clocks, sums, marks, np.array(t.stats()["rows"])

    def squares(grads, counts):  # a push of `counts` steps of these gradients: their squares' row means
        return ((grads.astype(np.float64) ** 2).mean(1, keepdims=True) * counts[:, None]).astype(np.float32)

    grads = np.ones((64, 16), np.float32)
    counts = np.full(64, 3 if several else 1, np.int64)
    first = squares(grads[:48], counts[:48]) if several else None
    if several and fails == "sum":
        first[40] = 3e38  # its sums near float32's largest: the next push's pass it
    for s in (fast, ref):  # 48 rows about -lr from their first value
        s.push("t", keys[:48], grads[:48], counts[:48], 1, sq=first)
    grads[:32] = -1  # the first half moves back; keys 32-47 would pass -3.4e38 (lr 3e38), -65504 (lr 4e4, 6e4)
    if fails == "sum" and not several:
        grads[40, 3] = 2e19  # its square does not fit a float
    if fails == "clock" and dynamic:  # past its 32-bit meta: refused inside, widened, pushed again whole
        counts[45] = MAX_COUNT - 1
    elif fails == "clock":
        for s in (fast, ref):
            s.tables["t"].clocks[keys[45]] = MAX_CLOCK - 1
        counts[45] = 5
    sq = squares(grads, counts) if several else None
    if several and fails == "sum":
        sq[40] = 3e38
    refused = fails is not None and not (fails == "clock" and dynamic)
    before = held(fast)
    errors = []
    for s in (fast, ref):
        try:
            s.push("t", keys, grads.copy(), counts, 2, sq=sq)
            errors.append(None)
        except ValueError as e:
            errors.append(str(e))
    assert [e is not None for e in errors] == [refused, refused], errors
    if fails == "unfit":
        assert all(re.search(r"a row value -[0-9.e+]+ does not fit float16", e) for e in errors), errors
    if not (several and fails == "unfit"):  # the value named: the same bits, or the same to rounding
        assert errors[0] == errors[1]
    for a, b in zip(held(fast), held(ref)):
        if several and a.dtype == np.float32:
            np.testing.assert_allclose(a, b, rtol=1e-2 if " " in table else 1e-5, atol=1e-6)
        else:
            assert np.array_equal(a, b)
    if refused:
        for a, b in zip(held(fast), before):
            assert np.array_equal(a, b)
    else:
        assert not np.array_equal(held(fast)[0], before[0])


@needs_build
@pytest.mark.parametrize("table, fails", [(table, fails) for table in ("fixed", "dynamic", "fixed bf16", "dynamic fp16")
                                          for fails in (None, "moment") + (("unfit",) if "fp16" in table else ())])
def test_an_adam_push_refused_part_way_puts_everything_back(table, fails):
    """Adam's push moves both moments, then the rows, in place: one refused after others moved (a
    second moment that overflows, a half row past what fp16 holds; a float32 row cannot overflow
    in two steps under the largest lr Adam takes, and the Adagrad test above puts rows back
    through the same code) leaves every row, moment, clock, mark and stored key as it was, with
    the reference's message; one that passes equals the reference bit for bit. A quarter of the
    keys are new to the push."""
    dynamic = table.startswith("dynamic")
    lr = 4e4 if fails == "unfit" else 0.05  # Adam's first step moves a row by lr
    fast, ref, keys = native_and_reference_shards(table, OptimizerConfig("adam", lr=lr), seed=2)

    def held(s):  # every key's row and clock, its moments, marks or meta, rows stored
        _, rows, clocks = s.sync("t", keys, np.full(64, -1), bound=0)
        t = s.tables["t"]
        if dynamic:
            slots = t.locate(torch.from_numpy(keys))[:, 1]
            moments, marks = t.store.state.gather(slots[slots >= 0]).numpy(), t.meta.gather(slots[slots >= 0]).numpy()
        else:
            local = torch.from_numpy(keys)
            moments = torch.cat([t.optimizer.state[n][local] for n in t.optimizer.state_names], 1).numpy()
            marks = t.touched.numpy().copy()
        return rows, clocks, moments, marks, np.array(t.stats()["rows"])

    grads = np.ones((64, 16), np.float32)
    for s in (fast, ref):
        s.push("t", keys[:48], grads[:48], np.ones(48, np.int64), 1)
    grads[:32] = -1  # the first half moves back a little; keys 32-47 by lr again: past -65504
    if fails == "moment":
        grads[40, 3] = 2e19  # its square does not fit a float
    before = held(fast)
    errors = []
    for s in (fast, ref):
        try:
            s.push("t", keys, grads.copy(), np.ones(64, np.int64), 2)
            errors.append(None)
        except ValueError as e:
            errors.append(str(e))
    assert [e is not None for e in errors] == [fails is not None] * 2, errors
    assert errors[0] == errors[1]
    for a, b in zip(held(fast), held(ref)):
        assert np.array_equal(a, b)
    if fails is not None:
        for a, b in zip(held(fast), before):
            assert np.array_equal(a, b)
    else:
        assert not np.array_equal(held(fast)[0], before[0])


@needs_build
@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), dim=st.sampled_from([1, 3, 16, 130]), rows=st.sampled_from([1, 7, 300]),
       lazy=st.booleans())
def test_a_native_reply_sends_the_rows_the_reference_sends(seed, dim, rows, lazy):
    """A pull's or sync's rows (``rows_to_send``), gathered natively (rows prefetched ahead, the
    lazy reply's marks in the same pass), equal numpy's take and torch's masks bit for bit:
    duplicate keys, no key, every row touched or none."""
    from het.ps.server.store.fixed import FixedRows

    gen = torch.Generator().manual_seed(seed)
    cfg = TableConfig("t", rows=rows, dim=dim)
    table, reference = built(FixedRows(cfg, 0, 1)), built(FixedRows(cfg, 0, 1, native=False))
    table.weight.copy_(torch.randn(rows, dim, generator=gen))
    table.touched.copy_(torch.rand(rows, generator=gen) < float(torch.rand(1, generator=gen)))
    reference.weight.copy_(table.weight)
    reference.touched.copy_(table.touched)
    local = torch.randint(0, rows, (int(torch.randint(0, 3 * rows + 1, (1,), generator=gen)),), generator=gen)
    fast = table.rows_to_send(local, lazy)
    ref = reference.rows_to_send(local, lazy)
    assert fast[1] == ref[1] and len(fast[0]) == len(ref[0])
    for a, b in zip(fast[0], ref[0]):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8))


@needs_build
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), dim=st.sampled_from([1, 3, 130]), rows=st.sampled_from([1, 7, 300]),
       clock=st.sampled_from([1, 300, 40_000, 2**31 + 5]))
def test_a_native_pull_reply_is_the_references_arrays(seed, dim, rows, clock):
    """A lazy pull's reply in one native pass (``FixedRows.pull_reply``: rows, clocks narrowed,
    marks packed) equals what the shard makes of the reference's ``rows_to_send`` and
    ``clocks_of``, byte for byte and dtype for dtype, whatever the clocks' width."""
    from het.ps.protocol.integers import narrow
    from het.ps.protocol.messages import pack_marks
    from het.ps.server.store.fixed import FixedRows
    from het.ps.server.store.rowstore import sent_of

    gen = torch.Generator().manual_seed(seed)
    cfg = TableConfig("t", rows=rows, dim=dim)
    table, reference = built(FixedRows(cfg, 0, 1)), built(FixedRows(cfg, 0, 1, native=False))
    table.weight.copy_(torch.randn(rows, dim, generator=gen))
    table.touched.copy_(torch.rand(rows, generator=gen) < float(torch.rand(1, generator=gen)))
    table.clocks.copy_(torch.randint(0, clock + 1, (rows,), generator=gen))
    for name in ("weight", "touched", "clocks"):
        getattr(reference, name).copy_(getattr(table, name))
    local = torch.randint(0, rows, (int(torch.randint(0, 3 * rows + 1, (1,), generator=gen)),), generator=gen)
    fast, sent = table.pull_reply(local, lazy=True)
    assert reference.pull_reply(local, lazy=True) is None and table.pull_reply(local, lazy=False) is None
    rows_sent, n = reference.rows_to_send(local, lazy=True)
    ref = [rows_sent[0], narrow(reference.clocks_of(sent_of(local, rows_sent, n))).numpy(), *pack_marks(rows_sent[1:])]
    assert sent == n and len(fast) == len(ref)
    for a, b in zip(fast, ref):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8))


@needs_build
def test_a_native_gather_refuses_a_row_out_of_range():
    with pytest.raises(RuntimeError, match=r"row 5 out of range \[0, 5\)"):
        native.ops.gather_rows(torch.zeros(5, 2), torch.tensor([0, 5]), torch.empty(2, 2))
    with pytest.raises(RuntimeError, match=r"row -1 out of range \[0, 5\)"):
        native.ops.gather_touched(torch.zeros(5, 2), torch.zeros(5, dtype=torch.bool), torch.tensor([-1]),
                                  torch.empty(0))
    with pytest.raises(RuntimeError, match=r"out: expected at least \(2, 2\), got \[1, 2\]"):
        native.ops.gather_touched(torch.zeros(5, 2), torch.ones(5, dtype=torch.bool), torch.tensor([0, 1]),
                                  torch.empty(1, 2))


@needs_build
def test_a_reply_buffer_is_reused_only_once_nothing_holds_its_rows():
    """Replies' rows go out in reused buffers: a buffer whose rows a frame, a view or a tensor
    still holds is never written again; once they are gone, it is."""
    from het.ps.server.store.fixed import FixedRows

    table = FixedRows(TableConfig("t", rows=1000, dim=4), 0, 1)
    first, _ = table.rows_to_send(torch.tensor([1, 2, 3]), lazy=False)
    held = torch.from_numpy(first[0])[1:]  # what a client keeps: a tensor of a view
    expected = held.clone()
    base = first[0].ctypes.data
    del first
    for lazy in (False, True, False):
        table.touched[:] = True
        rows, _ = table.rows_to_send(torch.tensor([7, 8, 9]), lazy)
        assert rows[0].ctypes.data != base and torch.equal(held, expected)
        del rows
    del held
    again, _ = table.rows_to_send(torch.tensor([4, 5]), lazy=False)
    assert again[0].ctypes.data == base  # free again: reused
    assert np.array_equal(again[0], table.weight[[4, 5]].numpy())
    assert len(table._replies.buffers.buffers) == 2
    table._replies.buffers.max_rows = 10  # a bulk read: a buffer of its own, not kept
    bulk, _ = table.rows_to_send(torch.arange(20), lazy=False)
    assert np.array_equal(bulk[0], table.weight[:20].numpy()) and len(table._replies.buffers.buffers) == 2


def test_reply_buffers_of_varying_sizes_hold_what_is_in_use():
    """Replies of every size, each dropped before the next: a free buffer too small makes way
    for a bigger one, so the pool does not grow to its limit."""
    from het.ps.server.store.kernels import ReplyBuffers

    pool = ReplyBuffers(dim=8)
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        rows = int(torch.randint(1, 5000, (1,), generator=gen))
        lent = pool.lend(pool.take(rows).numpy())
        assert lent.shape == (rows, 8)
        del lent
    assert len(pool.buffers) == 1 and pool.buffers[0][0].shape[0] <= 8192
    assert pool.take(0).shape == (0, 8) and len(pool.buffers) == 1  # nothing pooled for no rows


@needs_build
def test_a_fill_with_a_position_out_of_range_is_refused_and_changes_nothing():
    table = TableConfig("t", rows=100, dim=4)
    cache = EmbeddingCache(table, CacheConfig(capacity=8, ways=4))
    plan = cache.lookup(torch.tensor([1, 2, 3]))
    before = cache.rows.clone(), cache.clock.clone()
    with pytest.raises(RuntimeError, match=r"index: expected positions in \[0, 3\), got 7"):
        cache.fill(plan, torch.tensor([0, 7]), torch.ones(2, 4), torch.tensor([1, 1]))
    assert torch.equal(cache.rows, before[0]) and torch.equal(cache.clock, before[1])


@needs_build
@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), dim=st.sampled_from([1, 3, 16, 130]), width=st.sampled_from(["row", "full"]),
       rows=st.sampled_from([5, 300]))
def test_a_native_push_of_several_adagrad_steps_equals_the_reference_to_rounding(seed, dim, width, rows):
    """Pushes whose rows sum several steps, with their squares (duplicates too, some single
    steps among them): the same rows, accumulators and clocks as the reference, to float
    rounding (the native square roots are IEEE's, torch's vectorised ones are not)."""
    from het.ps.server.store.fixed import FixedRows

    gen = torch.Generator().manual_seed(seed)
    cfg = TableConfig("t", rows=rows, dim=dim, optimizer=OptimizerConfig("adagrad", lr=0.05))
    fast, ref = built(FixedRows(cfg, 0, 1)), built(FixedRows(cfg, 0, 1, native=False))
    for step in range(1, 6):
        local, grads, counts, sq = _push_of_steps(gen, rows, dim, width, lambda n: torch.randint(1, 40, (n,), generator=gen))
        for table in (fast, ref):
            table.push(local.clone(), grads.clone(), counts.clone(), step, sq=sq.clone())
        torch.testing.assert_close(fast.weight, ref.weight, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(fast.optimizer.state["sum"], ref.optimizer.state["sum"], rtol=1e-5, atol=1e-6)
        assert torch.equal(fast.clocks, ref.clocks) and torch.equal(fast.touched, ref.touched)


@needs_build
@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), dim=st.sampled_from([1, 3, 16, 130]), width=st.sampled_from(["row", "full"]),
       rows=st.sampled_from([5, 300]), blow_up=st.sampled_from([None, "grad", "clock"]))
def test_a_native_adam_push_of_several_steps_equals_the_reference_bit_for_bit(seed, dim, width, rows, blow_up):
    """Adam pushes whose rows sum several steps with their squares (duplicates, and rows of one
    step or none among them): the rows of one step go through the native pass, the others are
    taken apart aside; the same bits as the reference, and a push refused alike changes nothing."""
    from het.ps.protocol.limits import MAX_CLOCK
    from het.ps.server.store.fixed import FixedRows

    gen = torch.Generator().manual_seed(seed)
    cfg = TableConfig("t", rows=rows, dim=dim, optimizer=OptimizerConfig("adam", lr=0.05))
    fast, ref = built(FixedRows(cfg, 0, 1)), built(FixedRows(cfg, 0, 1, native=False))
    def counts_of(n):  # many rows of one step or none, and some row of several
        counts = torch.randint(0, 12, (n,), generator=gen) * (torch.rand(n, generator=gen) < 0.6)
        counts[0] = 5
        return counts

    for step in range(1, 7):
        local, grads, counts, sq = _push_of_steps(gen, rows, dim, width, counts_of)
        if blow_up == "grad" and step == 4:
            grads[-1] = float("inf")
        if blow_up == "clock" and step == 4:
            fast.clocks[local[0]] = ref.clocks[local[0]] = MAX_CLOCK - 1
        errors = []
        for table in (fast, ref):
            try:
                table.push(local.clone(), grads.clone(), counts.clone(), step, sq=sq.clone())
                errors.append(None)
            except ValueError as e:
                errors.append(str(e))
        assert errors[0] == errors[1]
        if step == 4:
            assert (errors[0] is not None) == (blow_up is not None), errors
        for name in ("weight", "clocks", "touched"):
            assert torch.equal(getattr(fast, name), getattr(ref, name)), (name, step)
        for name in ref.optimizer.state:
            assert torch.equal(fast.optimizer.state[name], ref.optimizer.state[name]), (name, step)


def _push_of_steps(gen, rows: int, dim: int, width: str, counts_of):
    """A push of up to ``2 * rows`` gradients of random rows (duplicates too): the rows, the
    gradients, their steps (``counts_of(n)``) and the sums of their squares, one a row
    (``width`` "row") or one a coordinate."""
    n = int(torch.randint(1, 2 * rows, (1,), generator=gen))
    local = torch.randint(0, rows, (n,), generator=gen)
    grads = torch.randn(n, dim, generator=gen)
    counts = counts_of(n)
    return local, grads, counts, torch.rand(n, 1 if width == "row" else dim, generator=gen) * counts[:, None]


def test_make_builds_the_native_core_only_when_no_module_of_these_sources_loads(monkeypatch, capsys):
    from het.native import build

    built = []
    monkeypatch.setattr(build, "build", lambda verbose=False: built.append(1) or "het/native/_het_native.so")
    monkeypatch.setattr(build, "current", lambda: True)
    assert build.main(["--if-stale"]) == 0 and built == []
    assert "built from these sources" in capsys.readouterr().out
    monkeypatch.setattr(build, "current", lambda: False)
    assert build.main(["--if-stale"]) == 0 and built == [1]
    assert build.main([]) == 0 and built == [1, 1]  # asked without --if-stale: always built
    if native.ops is not None:  # the module this checkout loads is current
        monkeypatch.undo()
        assert build.current()
