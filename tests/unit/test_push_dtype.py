"""Pushes in bfloat16: half the gradient bytes; the shard applies exactly the rounded values,
and the clocks count the same updates."""

import numpy as np
import pytest
import torch

from het import CacheConfig, Embedding, OptimizerConfig, TableConfig
from het.ps.local import local_client
from het.ps.protocol.messages import Message, Op

T = TableConfig("t", rows=40, dim=8, optimizer=OptimizerConfig("adagrad", lr=0.1))


@pytest.mark.parametrize("op", ["push", "push_sync"])
def test_the_shard_applies_exactly_the_rounded_gradients(op):
    keys = torch.tensor([1, 5, 9, 33])
    grads = torch.randn(4, 8, generator=torch.Generator().manual_seed(0)) * 1e-3
    counts = torch.ones(4, dtype=torch.int64)
    bf16, f32 = local_client([T], 2), local_client([T], 2)
    if op == "push":
        bf16.wait(bf16.push("t", keys, grads, counts, grad_dtype="bf16"))
    else:
        bf16.wait(bf16.push_sync("t", keys, grads, counts, keys, torch.full((4,), -1), 0, grad_dtype="bf16"))
    f32.wait(f32.push("t", keys, grads.to(torch.bfloat16).float(), counts))
    a, ca = bf16.wait(bf16.pull("t", torch.arange(40)))
    b, cb = f32.wait(f32.pull("t", torch.arange(40)))
    assert torch.equal(a, b) and torch.equal(ca, cb)
    assert not torch.equal(grads.to(torch.bfloat16).float(), grads)  # the rounding is real


def test_bf16_pushes_send_half_the_gradient_bytes():
    keys, grads, counts = torch.arange(32), torch.ones(32, 8), torch.ones(32, dtype=torch.int64)
    sent = {}
    for dtype in ("fp32", "bf16"):
        client = local_client([T], 1)
        before = client.bytes["sent"]
        client.wait(client.push("t", keys, grads, counts, grad_dtype=dtype))
        sent[dtype] = client.bytes["sent"] - before
    assert sent["fp32"] - sent["bf16"] == 32 * 8 * 2 - len(',"grads":"bf16"')  # half the rows' bytes, less the flag


def test_a_bad_gradient_format_is_refused_and_the_shard_keeps_serving():
    client = local_client([T], 1)
    shard = client.channels[0].shard
    bad = shard.handle(Message(Op.PUSH, 1, {"table": "t", "grads": "fp8"},
                               [np.array([1]), np.zeros((1, 8), np.int16), np.array([1])]))
    assert bad.status == 1 and "one of ('fp32', 'bf16'), got 'fp8'" in bad.meta["error"]
    wrong = shard.handle(Message(Op.PUSH, 2, {"table": "t", "grads": "bf16"},
                                 [np.array([1]), np.zeros((1, 8), np.float32), np.array([1])]))
    assert wrong.status == 1 and "int16 bits" in wrong.meta["error"]
    with pytest.raises(ValueError, match="grad_dtype must be one of"):
        client.push("t", torch.tensor([1]), torch.ones(1, 8), torch.ones(1), grad_dtype="f16")
    assert int(client.wait(client.pull("t", torch.tensor([1])))[1][0]) == 0  # nothing was applied
    with pytest.raises(ValueError, match="push_dtype must be one of"):
        Embedding(10, 2, push_dtype="fp16")


def test_training_with_bf16_pushes_stays_close_and_counts_every_update():
    results = []
    for dtype in ("fp32", "bf16"):
        emb = Embedding(tables=T, cache=CacheConfig(capacity=10, staleness=3, ways=5), push_dtype=dtype, num_shards=2)
        g = torch.Generator().manual_seed(2)
        for _ in range(40):
            keys = torch.randint(0, T.rows, (24,), generator=g)
            (emb(keys) ** 2).sum().backward()
        rows = emb.read(torch.arange(T.rows))
        clocks = emb.client.wait(emb.client.pull("t", torch.arange(T.rows)))[1]
        results.append((rows, clocks, emb.traffic["sparse_push"]))
    (rows32, clocks32, push32), (rows16, clocks16, push16) = results
    assert torch.equal(clocks32, clocks16) and int(clocks32.sum()) > 0  # no update lost or doubled
    assert torch.allclose(rows32, rows16, rtol=0, atol=2e-3) and not torch.equal(rows32, rows16)
    # per row: key and count (5 B: the key as int32, as a cache's pushes come in slot order,
    # the count as one byte), the gradient (8 floats: 32 B, or 16 B in bfloat16), and for a row
    # of several steps only, Adagrad's sum of its squares (4 B: the cache follows Adagrad)
    saved = push32 - push16
    assert saved > 0 and saved % 16 == 0
    rows = saved // 16
    assert 37 * rows < push32 < 41 * rows
