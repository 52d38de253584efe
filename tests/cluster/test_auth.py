"""A shard process bound with a shared secret, spoken to over TCP on 127.0.0.1 only: requests with
a wrong or missing secret are refused and counted, and the shard keeps serving the others."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import raw_request

from het import PSClient, ServerProcess, ShardConfig, TableConfig
from het.ps.protocol.auth import SECRET_ENV
from het.ps.protocol.messages import ERROR, AuthError, Message, Op, PSError, decode, encode

pytestmark = pytest.mark.cluster

SECRET = b"shared secret of this test"
TABLE = TableConfig("t", rows=32, dim=4)


@pytest.fixture
def shard(tmp_path):
    server = ServerProcess(ShardConfig((TABLE,)), secret=SECRET, log_path=str(tmp_path / "shard.log"))
    assert server.address.startswith("tcp://127.0.0.1:")
    yield server.address
    server.stop()
    assert not server.alive()


def test_wrong_or_missing_secret_is_refused_and_the_shard_keeps_serving(shard):
    good = PSClient.connect([shard], timeout_s=10, secret=SECRET)
    keys = torch.tensor([3, 7, 30])
    good.wait(good.push("t", keys, torch.ones(3, 4), torch.ones(3, dtype=torch.int64)))

    with pytest.raises(PSError, match="AuthError: bad signature: wrong shared secret"):
        PSClient.connect([shard], timeout_s=5, secret=b"not the secret")
    with pytest.raises(PSError, match="AuthError: request is not signed: this shard requires a shared secret"):
        PSClient.connect([shard], timeout_s=5)
    stop = decode(raw_request(shard, encode(Message(Op.STOP, 9))))  # unsigned, so unverifiable here
    assert stop.status == ERROR and stop.meta["kind"] == "AuthError"

    rows, clocks = good.wait(good.pull("t", keys))  # still serving, and the STOP was not obeyed
    assert clocks.tolist() == [1, 1, 1] and rows.shape == (3, 4)
    stats = good.stats()[0]
    assert stats["unauthenticated"] == 3 and stats.get("errors", 0) == 0
    good.close()


def test_replies_are_signed(shard):
    nonce = decode(raw_request(shard, encode(Message(Op.INFO, 4), SECRET)), SECRET).meta["shard"]["nonce"]
    fresh = {"nonce": nonce, "session": "s" * 16, "seq": 1}
    frames = raw_request(shard, encode(Message(Op.PULL, 5, {"table": "t", **fresh}, [np.array([1, 2])]), SECRET))
    assert decode(frames, SECRET, what="reply").arrays[0].shape == (2, 4)
    with pytest.raises(AuthError, match="bad signature"):
        decode(frames, b"not the secret", what="reply")


def test_het_serve_refuses_to_bind_beyond_loopback_without_a_secret():
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    done = subprocess.run([sys.executable, "-m", "het", "serve", "--bind", "0.0.0.0:0", "--table", "t:8:2"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2, done.stderr
    assert "0.0.0.0:0" in done.stderr and "--secret-file" in done.stderr and SECRET_ENV in done.stderr
    assert "listening" not in done.stdout


def test_het_serve_reads_the_secret_file(tmp_path):
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(SECRET + b"\n")
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    proc = subprocess.Popen([sys.executable, "-m", "het", "serve", "--bind", "127.0.0.1:0", "--table", "t:8:2",
                             "--secret-file", str(secret_file)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        address = proc.stdout.readline().rsplit(" ", 1)[1].strip()
        client = PSClient.connect([address], timeout_s=10, secret=SECRET)
        assert client.tables["t"].dim == 2
        client.stop_servers()
        client.close()
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_encrypted_shards_serve_only_curve_clients_of_the_same_secret():
    """`het serve --encrypt` / `PSClient.connect(encrypt=True)`: CURVE keyed by the secret."""
    import zmq

    from het.ps.server.server import ServerThread

    with ServerThread(ShardConfig((TableConfig("t", rows=8, dim=2),)), secret=SECRET, encrypt=True) as server:
        assert server.endpoint.socket.mechanism == zmq.CURVE
        client = PSClient.connect([server.address], secret=SECRET, encrypt=True, timeout_s=10)
        client.wait(client.push("t", torch.tensor([3]), torch.ones(1, 2), torch.tensor([1])))
        assert client.wait(client.pull("t", torch.tensor([3])))[1].tolist() == [1]
        client.close()
        with pytest.raises(TimeoutError):  # in the clear, or under another secret's keys: no answer
            PSClient.connect([server.address], secret=SECRET, timeout_s=2)
        with pytest.raises(TimeoutError):
            PSClient.connect([server.address], secret=b"another secret", encrypt=True, timeout_s=2)


def test_a_local_job_trains_encrypted(tmp_path):
    out = subprocess.run([sys.executable, "-m", "het", "train", "--ps-encrypt", "--steps", "20", "--dim", "8",
                          "--batch", "64", "--synthetic-cap", "2000", "--eval-samples", "2048", "--json", "--quiet",
                          "--log-dir", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1])["steps"] == 20
    assert "encrypted (CURVE)" in (tmp_path / "server-0.log").read_text()
