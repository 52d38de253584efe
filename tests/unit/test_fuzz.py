"""A fuzz run of mutated messages against a shard: whatever arrives (bytes flipped, frames cut,
dropped, duplicated, grown, split into many, or thousands of frames more), the shard answers
with a reply that decodes, keeps serving, and every refusal leaves its rows, clocks, marks and
optimizer state unchanged. 10,000 messages in ``make test-slow``; 500 in ``make test``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from het.config import OptimizerConfig, ShardConfig, TableConfig
from het.ps.protocol.messages import ERROR, Message, Op, decode, encode
from het.ps.server.shard import Shard

from conftest import built

SECRET = b"fuzz-secret"


def snapshot(s: Shard) -> list[torch.Tensor]:
    t = built(s.tables["t"])  # every row as a save holds it: rows not yet built are not values
    return [t.weight.clone(), t.clocks.clone(), t.touched.clone(), *(v.clone() for v in t.optimizer.state.values())]


def valid_requests(s: Shard, seq: list) -> list:
    """One well-formed request of each kind, signed and fresh (the next sequence number) when
    the shard holds the secret."""
    secret = s.secret
    keys, n = np.array([1, 5, 9], np.int64), 3

    def fresh():
        seq[0] += 1
        return {"table": "t", "nonce": s.nonce, "session": "f" * 16, "seq": seq[0]}

    push = [keys, np.full((n, 4), 0.1, np.float32), np.ones(n, np.int64)]
    sync = [keys, np.array([-1, 0, 3], np.int64)]
    return [encode(Message(Op.PULL, 1, {**fresh(), "lazy": True}, [keys]), secret),
            encode(Message(Op.PUSH, 2, {**fresh(), "step": 3}, push), secret),
            encode(Message(Op.SYNC, 3, {**fresh(), "bound": 1}, sync), secret),
            encode(Message(Op.PUSH_SYNC, 4, {**fresh(), "step": 3, "bound": 0}, push + sync), secret),
            encode(Message(Op.STATS, 5, {k: v for k, v in fresh().items() if k != "table"}), secret)]


def mutate(frames: list, rng: np.random.Generator) -> list:
    frames = [bytearray(memoryview(f)) for f in frames]
    for _ in range(rng.integers(1, 4)):
        kind = rng.integers(0, 8)
        i = int(rng.integers(0, len(frames)))
        f = frames[i]
        if kind == 0 and f:    # flip bytes
            for j in rng.integers(0, len(f), size=rng.integers(1, 4)):
                f[j] ^= int(rng.integers(1, 256))
        elif kind == 1 and f:  # truncate
            del f[int(rng.integers(0, len(f))):]
        elif kind == 2:        # drop a frame
            frames.pop(i)
            if not frames:
                frames = [bytearray()]
        elif kind == 3:        # duplicate a frame
            frames.insert(i, bytearray(f))
        elif kind == 4:        # grow a frame
            f.extend(rng.bytes(int(rng.integers(1, 64))))
        elif kind == 5 and len(f) > 1:  # split a frame into many
            cuts = sorted(set(rng.integers(1, len(f), size=int(rng.integers(1, 40))).tolist()))
            frames[i:i + 1] = [f[a:b] for a, b in zip([0, *cuts], [*cuts, len(f)])]
        elif kind == 6:        # thousands of frames more, each far under any limit
            frames.extend(bytearray(rng.bytes(int(rng.integers(0, 256)))) for _ in range(int(rng.integers(1, 3000))))
        else:                  # replay as is (sequence numbers make it stale)
            pass
    return [bytes(f) for f in frames]


def fuzz(count: int, seed: int = 0, secret: bytes | None = SECRET) -> dict:
    """Without a secret the mutations reach the request parser; with one, mostly the MAC."""
    rng = np.random.default_rng(seed)
    table = TableConfig("t", rows=16, dim=4, optimizer=OptimizerConfig("adam", lr=0.01))
    s, seq, outcomes = Shard(ShardConfig((table,)), secret=secret), [0], {"refused": 0, "served": 0}
    for _ in range(count):
        frames = mutate(valid_requests(s, seq)[int(rng.integers(0, 5))], rng)
        before = snapshot(s)
        reply = decode(s.handle_frames(frames))  # every answer is a well-formed message
        if reply.status == ERROR:
            outcomes["refused"] += 1
            assert all(torch.equal(a, b) for a, b in zip(before, snapshot(s))), f"a refusal changed state: {reply.meta}"
        else:
            outcomes["served"] += 1
    assert not s.stopping
    for frames in valid_requests(s, seq):  # it keeps serving
        assert decode(s.handle_frames(frames), secret, what="reply").status != ERROR
    assert all(bool(torch.isfinite(v).all()) for v in snapshot(s) if v.is_floating_point())
    return outcomes


@pytest.mark.parametrize("secret", [SECRET, None])
def test_a_short_fuzz_run(secret):
    outcomes = fuzz(500, secret=secret)
    assert outcomes["refused"] > 100 and outcomes["refused"] + outcomes["served"] == 500


@pytest.mark.slow
@pytest.mark.parametrize("secret", [SECRET, None])
def test_ten_thousand_mutated_frames(secret):
    outcomes = fuzz(10_000, seed=1, secret=secret)
    assert outcomes["refused"] + outcomes["served"] == 10_000 and outcomes["refused"] > 2_000
