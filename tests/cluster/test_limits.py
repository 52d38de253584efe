"""A shard's memory is bounded before authentication: a frame larger than any request of its
``max_keys`` needs drops its sender as it arrives, a message of more frames or more bytes than
a request has is let go frame by frame as it is read and refused, and a request of more keys is
refused; a client splits its requests to fit."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
import zmq

from het.config import ShardConfig, TableConfig
from het.ps.client.client import PSClient
from het.ps.protocol.messages import Message, Op, decode, encode
from het.ps.server.process import ServerProcess
from het.ps.server.server import ServerThread
from conftest import raw_request

pytestmark = pytest.mark.cluster
TABLE = TableConfig("t", rows=10_000, dim=8)


def peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        line = next(x for x in f if x.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def test_a_huge_frame_is_dropped_before_the_shard_holds_it():
    cfg = ShardConfig((TABLE,), max_keys=1000)  # frames of at most 1000 * 8 * 4 + 64 KiB
    with ServerProcess(cfg, secret=b"s3cret") as server:
        client = PSClient.connect([server.address], secret=b"s3cret")
        client.wait(client.pull("t", torch.arange(10)))
        before = peak_rss_mb(server.proc.pid)
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 2000)
        sock.connect(server.address)
        sock.send_multipart([b"x" * 64, np.zeros(200 << 20, np.uint8)])  # 200 MB, unsigned
        sock.close()  # lingers until it is sent
        time.sleep(1.0)
        grew = peak_rss_mb(server.proc.pid) - before
        assert grew < 50, f"the shard's peak RSS grew by {grew:.0f} MB for one refused frame"
        rows, _ = client.wait(client.pull("t", torch.arange(5)))  # it keeps serving
        assert rows.shape == (5, 8)
        client.close()


def test_a_request_of_too_many_keys_is_refused_and_the_client_splits_its_own():
    cfg = ShardConfig((TABLE,), max_keys=100)
    with ServerThread(cfg) as server:
        keys = np.arange(101, dtype=np.int64)
        reply = raw_request(server.address, encode(Message(Op.PULL, 1, {"table": "t"}, [keys])))
        msg = decode(reply, what="reply")
        assert msg.status == 1 and "at most 100 keys" in msg.meta["error"]
        client = PSClient.connect([server.address])
        assert client.max_keys == 100
        many = torch.arange(250)
        client.wait(client.push("t", many, torch.ones(250, 8), torch.ones(250, dtype=torch.int64)))
        rows, clocks = client.wait(client.pull("t", many))
        assert clocks.tolist() == [1] * 250 and rows.shape == (250, 8)
        client.close()


def test_a_message_of_many_frames_each_under_the_limit_is_refused_and_the_shard_serves_on():
    cfg = ShardConfig((TABLE,), max_keys=1000)
    with ServerThread(cfg, secret=b"s3cret") as server:
        head = encode(Message(Op.PULL, 77, {"table": "t"}, [np.arange(3, dtype=np.int64)]))
        many = [head[0], *(np.zeros(4096, np.uint8) for _ in range(5000))]  # 20 MB, no frame over 4 KB
        reply = decode(raw_request(server.address, many), what="reply")
        assert reply.status == 1 and reply.request_id == 77 and "at most 18 frames" in reply.meta["error"]
        wide = [head[0], *(np.zeros(cfg.max_frame_bytes - 1, np.uint8) for _ in range(5))]  # each frame fits
        reply = decode(raw_request(server.address, wide), what="reply")
        assert reply.status == 1 and f"and {cfg.max_message_bytes} bytes" in reply.meta["error"]
        assert server.shard.stats["oversized"] == 2
        client = PSClient.connect([server.address], secret=b"s3cret")
        assert client.wait(client.pull("t", torch.arange(5)))[0].shape == (5, 8)
        client.close()
