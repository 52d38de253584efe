"""The client's native routing of keys to shards and placing of reply rows (het/native/routes.cpp)
against their PyTorch reference: the same positions, the same results, bit for bit."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from het import native
from het.config import TableConfig
from het.ps.client import replies
from het.ps.protocol import partition
from het.ps.protocol.messages import Op, PSError

needs_build = pytest.mark.skipif(native.ops is None, reason="het's native core is not built (`make` builds it)")


def reference_split(keys: torch.Tensor, shards: int, hashed: bool) -> list[torch.Tensor]:
    """partition.split by torch's ops alone (the path CUDA keys and a machine without a build take)."""
    of = partition.shard_of(keys, shards, hashed)
    order = torch.sort(of, stable=True).indices
    return list(torch.split(order, torch.bincount(of, minlength=shards).tolist()))


@needs_build
@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.sampled_from([0, 1, 2, 7, 300, 4096]),
       shards=st.integers(2, 9), hashed=st.booleans(), span=st.sampled_from([3, 1000, None]))
def test_native_routing_is_the_stable_sorts(seed, n, shards, hashed, span):
    """Every key's position goes to the shard of its rule (``key % S``, or ``mix(key) % S``),
    in the keys' order within each shard: raw ids of any sign and int64's extremes too."""
    gen = torch.Generator().manual_seed(seed)
    keys = (torch.randint(-(1 << 62), 1 << 62, (n,), generator=gen) if span is None
            else torch.randint(0, span, (n,), generator=gen))
    if span is None and n >= 3:
        keys[:3] = torch.tensor([-(2**63), 2**63 - 1, -1])
    got, expected = partition.split(keys, shards, hashed), reference_split(keys, shards, hashed)
    assert len(got) == shards
    assert all(a.dtype == torch.int64 and torch.equal(a, b) for a, b in zip(got, expected))
    strided = keys[::2]  # a view, not contiguous
    assert all(torch.equal(a, b) for a, b in zip(partition.split(strided, shards, hashed),
                                                   reference_split(strided, shards, hashed)))


@needs_build
def test_native_routing_takes_int64_values_only():
    order, counts = native.ops.shard_order(torch.tensor([5, -1, 4, 0]), 3)
    assert order.tolist() == [3, 2, 0, 1] and counts.tolist() == [1, 1, 2]  # -1 % 3 == 2, as torch's
    with pytest.raises(RuntimeError, match="values: expected Long, got Int"):
        native.ops.shard_order(torch.tensor([1], dtype=torch.int32), 2)
    with pytest.raises(RuntimeError, match="shards: expected at least 1, got 0"):
        native.ops.shard_order(torch.tensor([1]), 0)
    assert [p.tolist() for p in partition.split(torch.tensor([4, 3, 7, 0], dtype=torch.int32), 2)] == [[0, 3], [1, 2]]


@needs_build
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.sampled_from([1, 5, 300]), dim=st.sampled_from([1, 3, 64, 130]))
def test_native_placing_is_indexed_assignment(seed, n, dim):
    gen = torch.Generator().manual_seed(seed)
    positions = torch.randperm(n, generator=gen)[:max(1, n // 2)]
    part = torch.randn(len(positions), dim, generator=gen)
    got, expected = torch.zeros(n, dim), torch.zeros(n, dim)
    replies._place(got, positions, part)
    expected[positions] = part
    assert torch.equal(got, expected)


@needs_build
def test_native_placing_refuses_a_position_out_of_range_and_writes_nothing():
    out = torch.zeros(4, 2)
    with pytest.raises(RuntimeError, match=r"row 4 out of range \[0, 4\)"):
        native.ops.scatter_rows(torch.ones(2, 2), torch.tensor([0, 4]), out)
    with pytest.raises(RuntimeError, match=r"src: expected \(2, 2\), got \[2, 3\]"):
        native.ops.scatter_rows(torch.ones(2, 3), torch.tensor([0, 1]), out)
    assert not out.any()


PULL_OVER_SHARDS = """
import sys, torch
from het.config import OptimizerConfig, ShardConfig, TableConfig
from het.ps.client.client import PSClient
from het.ps.protocol.transport import LocalChannel
from het.ps.server.shard import Shard
out = {}
for dynamic in (False, True):
    table = TableConfig("t", rows=None if dynamic else 500, dim=6, optimizer=OptimizerConfig("adagrad", lr=0.1))
    gen = torch.Generator().manual_seed(1)
    keys = torch.randint(0, 500, (300,), generator=gen)
    client = PSClient([LocalChannel(Shard(ShardConfig((table,), i, 3)), f"shard-{i}") for i in range(3)])
    client.wait(client.push("t", keys, torch.randn(300, 6, generator=gen), torch.ones(300, dtype=torch.int64)))
    more = torch.cat([keys, torch.randint(0, 500, (100,), generator=gen)])
    out[dynamic] = client.wait(client.pull("t", more))
    synced = client.wait(client.sync("t", more.unique(), torch.full((len(more.unique()),), -1), 0, state="full"))
    out[(dynamic, "sync")] = (synced.index, synced.rows, synced.clocks, synced.state)
torch.save(out, sys.argv[1])
"""


@needs_build
def test_a_pull_over_shards_is_the_same_with_and_without_the_native_core(tmp_path):
    """A push, a pull and a sync (with the rows' Adagrad state) over three shards, fixed and
    dynamic tables, some rows never pushed (built by the client): the same rows, clocks and state
    on the reference path (``HET_NATIVE=0``)."""
    results = {}
    for setting in ("1", "0"):
        path = tmp_path / f"native-{setting}.pt"
        subprocess.run([sys.executable, "-c", PULL_OVER_SHARDS, str(path)], check=True,
                       env={**os.environ, native.ENV: setting})
        results[setting] = torch.load(path)
    assert results["1"].keys() == results["0"].keys() and len(results["1"]) == 4
    for what, fast in results["1"].items():
        assert all(torch.equal(a, b) for a, b in zip(fast, results["0"][what])), what


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.sampled_from([1, 9, 300]), shards=st.integers(1, 4),
       width=st.sampled_from([None, 1, 5]), share=st.floats(0.0, 1.0))
def test_replies_in_key_order_are_the_sorted_concatenation(seed, n, shards, width, share):
    """Several shards' sync replies laid out in key order by their ranks: what concatenating them
    and sorting by position gives (the rows answered a ``share`` of the keys, spread at random)."""
    gen = torch.Generator().manual_seed(seed)
    answered = torch.randperm(n, generator=gen)[:int(share * n)]
    owner = torch.randint(0, shards, (len(answered),), generator=gen)
    index = [answered[owner == s].sort().values for s in range(shards)]
    parts = [(torch.randn(len(i), 4, generator=gen), torch.randint(0, 99, (len(i),), generator=gen),
              None if width is None else torch.randn(len(i), width, generator=gen)) for i in index]
    got = replies._in_key_order(n, index, parts)
    order = torch.argsort(torch.cat(index))
    expected = (torch.cat(index)[order], torch.cat([r for r, _, _ in parts])[order],
                torch.cat([c for _, c, _ in parts])[order],
                None if width is None else torch.cat([s for _, _, s in parts])[order])
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1]) and torch.equal(got[2], expected[2])
    assert (got[3] is None) == (width is None) and (width is None or torch.equal(got[3], expected[3]))


def test_replies_that_answer_a_key_twice_are_refused():
    index = [torch.tensor([0, 2]), torch.tensor([2])]
    parts = [(torch.zeros(2, 3), torch.zeros(2, dtype=torch.int64), None),
             (torch.zeros(1, 3), torch.zeros(1, dtype=torch.int64), None)]
    with pytest.raises(PSError, match="the replies name 3 rows for 2 keys: a key answered twice"):
        replies._in_key_order(4, index, parts)


def test_one_reply_out_of_key_order_is_put_in_order_and_one_naming_a_key_twice_refused():
    """A sync's one reply (one shard) in key order is the result as it came; out of order it is
    put in order, and one naming a key twice is refused."""
    table, handle = TableConfig("t", rows=3, dim=1), replies.Handle(Op.SYNC, "t", 3, torch.device("cpu"))

    def merged(index: list, clocks: list):
        arrays = [np.array(index), np.array([[float(i)] for i in index], np.float32), np.array(clocks)]
        return replies.merge(handle, [(torch.arange(3), SimpleNamespace(arrays=arrays, meta={}))], table)

    got = merged([2, 0], [5, 7])
    assert got.index.tolist() == [0, 2] and got.rows.flatten().tolist() == [0.0, 2.0] and got.clocks.tolist() == [7, 5]
    assert merged([0, 2], [7, 5]).clocks.tolist() == [7, 5]
    with pytest.raises(PSError, match="a key answered twice"):
        merged([1, 1], [0, 0])
