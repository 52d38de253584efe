"""Shards in their own processes (`het serve`), spoken to over TCP on 127.0.0.1."""

import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch
import conftest

from het import CacheConfig, Embedding, OptimizerConfig, PSClient, ServerProcess, ShardConfig, TableConfig
from het.ps.client.connection import WaitAbandoned
from het.ps.protocol.messages import ERROR, VERSION, Message, Op, HEADER, MAGIC, decode, encode

pytestmark = pytest.mark.cluster

TABLE = TableConfig("t", rows=64, dim=4, optimizer=OptimizerConfig("sgd", lr=1.0), init_scale=0.0)


@pytest.fixture
def shards(tmp_path):
    started = []

    def start(tables=(TABLE,), num_shards=1):
        for i in range(num_shards):
            started.append(ServerProcess(ShardConfig(tuple(tables), i, num_shards),
                                         log_path=str(tmp_path / f"shard-{i}.log")))
        return [s.address for s in started[-num_shards:]]

    yield start
    for s in started:
        s.stop()
    assert all(not s.alive() for s in started)


def raw_request(address, frames):
    return decode(conftest.raw_request(address, frames))


def test_malformed_and_wrong_version_requests_get_errors_and_the_shard_keeps_serving(shards):
    (address,) = shards()
    garbage = raw_request(address, [b"\x00\x01garbage"])
    assert garbage.status == ERROR and "header frame" in garbage.meta["error"]
    future = HEADER.pack(MAGIC, VERSION + 1, int(Op.PULL), 0, 0, 5, 2) + b"{}"
    wrong = raw_request(address, [future])
    assert wrong.status == ERROR and f"protocol version {VERSION + 1}" in wrong.meta["error"]
    assert wrong.request_id == 5
    lying = encode(Message(Op.PULL, 6, {"table": "t"}, [np.arange(3)]))
    lying[1] = b"short"  # array frame that does not match its spec
    assert raw_request(address, lying).status == ERROR
    ok = raw_request(address, encode(Message(Op.PULL, 7, {"table": "t"}, [np.array([1, 63])])))
    assert ok.status == 0 and ok.arrays[0].shape == (2, 4)
    client = PSClient.connect([address])
    assert client.stats()[0]["errors"] == 3


def test_unreachable_shard_times_out_naming_its_address():
    with socket.socket() as s:  # a free port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(TimeoutError, match=f"no reply from PS shard at tcp://127.0.0.1:{port} within 0.5 s"):
        PSClient.connect([f"127.0.0.1:{port}"], timeout_s=0.5)


def test_a_stop_request_in_a_signal_handler_ends_a_wait_for_a_silent_shard():
    """A worker blocked on a dead shard acts on SIGTERM: its handler calls
    stop_waiting, and the wait, which pyzmq would otherwise resume for the whole timeout, gives
    up within the grace. A live shard is still waited for after the request (the flush)."""
    server = ServerProcess(ShardConfig((TABLE,)))
    client = PSClient.connect([server.address], timeout_s=60)
    try:
        previous = signal.signal(signal.SIGALRM, lambda *_: client.stop_waiting(0.5))
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        time.sleep(0.5)
        assert client.wait(client.pull("t", torch.tensor([1, 2])))[0].shape == (2, 4)  # answered: kept
        server.proc.kill()
        server.proc.wait()
        signal.setitimer(signal.ITIMER_REAL, 0.2)  # the signal comes while the wait blocks
        start = time.monotonic()
        with pytest.raises(WaitAbandoned, match=r"gave up waiting for PS shard 0 \(tcp://127.0.0.1:\d+\): a stop"):
            client.wait(client.pull("t", torch.tensor([3])))
        took = time.monotonic() - start
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        client.close()
        server.stop()
    assert 0.6 <= took < 2.0, took


def test_client_refuses_shards_given_in_the_wrong_order(shards):
    a, b = shards(num_shards=2)
    with pytest.raises(ValueError, match="serves shard 1 of 2: expected shard 0 of 2"):
        PSClient.connect([b, a])


def test_staleness_zero_matches_torch_over_shard_processes(shards):
    table = TableConfig("embedding", rows=50, dim=8, optimizer=OptimizerConfig("adam", lr=0.05))
    addresses = shards((table,), num_shards=3)
    emb = Embedding(tables=table, client=PSClient.connect(addresses), cache=CacheConfig(capacity=20, staleness=0))
    ref = torch.nn.Embedding(50, 8, sparse=True)
    with torch.no_grad():
        ref.weight.copy_(emb.read(torch.arange(50)))
    opt = torch.optim.SparseAdam(ref.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(3)
    for _ in range(50):
        keys, target = torch.randint(0, 50, (12, 2), generator=g), torch.randn(12, 2, 8, generator=g)
        ((emb(keys) - target) ** 2).mean().backward()
        opt.zero_grad()
        ((ref(keys) - target) ** 2).mean().backward()
        opt.step()
    assert float((emb.read(torch.arange(50)) - ref.weight.detach()).abs().max()) <= 1e-5


def test_concurrent_clients_lose_no_update_and_apply_none_twice(shards):
    """Four threads, each with its own client and cache (staleness 0, 2, 5, inf), train the same
    rows at once: every thread ends, none raises, and the shards hold exactly every update."""
    addresses = shards(num_shards=2)
    expected = torch.zeros(64, 4)
    expected_clocks = torch.zeros(64, dtype=torch.int64)
    lock, errors, finished = threading.Lock(), [], []

    def worker(seed, staleness):
        try:
            client = PSClient.connect(addresses)
            emb = Embedding(tables=TABLE, client=client, cache=CacheConfig(capacity=16, staleness=staleness, ways=4))
            g = torch.Generator().manual_seed(seed)
            for _ in range(60):
                keys = torch.randint(0, 64, (10,), generator=g)
                grads = torch.randint(-2, 3, (10, 4), generator=g).float()
                (emb(keys) * grads).sum().backward()
                with lock:
                    expected.index_add_(0, keys, -grads)
                    expected_clocks[torch.unique(keys)] += 1
            emb.flush()
            client.close()
            finished.append(seed)
        except BaseException as e:  # surfaced below
            errors.append(e)

    # daemon threads: one that hangs fails the test below instead of keeping pytest from exiting
    threads = [threading.Thread(target=worker, args=(seed, s), daemon=True)
               for seed, s in enumerate([0, 2, 5, float("inf")])]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert [t.name for t in threads if t.is_alive()] == [], "threads still running after 120 s"
    assert not errors, errors
    assert sorted(finished) == [0, 1, 2, 3]
    client = PSClient.connect(addresses)
    rows, clocks = client.wait(client.pull("t", torch.arange(64)))
    client.close()
    assert torch.equal(rows, expected) and torch.equal(clocks, expected_clocks)


def test_save_and_load_through_shard_processes(shards, tmp_path):
    addresses = shards(num_shards=2)
    client = PSClient.connect(addresses)
    keys = torch.arange(10)
    client.wait(client.push("t", keys, torch.ones(10, 4), torch.ones(10, dtype=torch.int64)))
    paths = client.save(str(tmp_path / "ckpt"))
    assert [p.rsplit("/", 1)[1] for p in paths] == ["shard-0.pt", "shard-1.pt"]
    saved = client.wait(client.pull("t", keys))
    client.wait(client.push("t", keys, torch.ones(10, 4), torch.ones(10, dtype=torch.int64)))
    client.load(str(tmp_path / "ckpt"))
    rows, clocks = client.wait(client.pull("t", keys))
    assert torch.equal(rows, saved[0]) and torch.equal(clocks, saved[1])


def test_het_serve_command_line(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "het", "serve", "--bind", "127.0.0.1:0", "--table", "user:100:8",
                             "--table", "item:50:4", "--optimizer", "adagrad", "--lr", "0.1"],
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "listening on tcp://127.0.0.1:" in line
        client = PSClient.connect([line.rsplit(" ", 1)[1].strip()])
        assert {n: (t.rows, t.dim, t.optimizer.name) for n, t in client.tables.items()} == {
            "user": (100, 8, "adagrad"), "item": (50, 4, "adagrad")}
        client.stop_servers()
        assert proc.wait(30) == 0
    finally:
        proc.kill()


def test_het_serve_rejects_a_bad_table_flag():
    out = subprocess.run([sys.executable, "-m", "het", "serve", "--table", "user:lots:8"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "expected NAME:ROWS:DIM" in out.stderr


def test_het_serve_on_a_port_in_use_is_one_line_and_exit_code_2():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "het", "serve", "--table", "t:10:2", "--bind", f"127.0.0.1:{port}"],
                             capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip() == (f"het serve: error: cannot listen on '127.0.0.1:{port}': Address already in use "
                                  f"(is another shard or program on that port?)")


def test_het_serve_on_an_ipv6_address_is_one_line_and_exit_code_2():
    out = subprocess.run([sys.executable, "-m", "het", "serve", "--table", "t:10:2", "--bind", "[::1]:0"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().startswith("het serve: error: cannot listen on '[::1]:0': ")
    assert "IPv6 addresses are not supported: bind an IPv4 one, e.g. 127.0.0.1:0" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_a_shard_runs_one_torch_thread_unless_told_otherwise(tmp_path, monkeypatch):
    """Idle pool threads spin on the cores ZeroMQ's I/O threads need (het bench ps measured half
    the shard's CPU in OpenMP's wait loop with two threads on two cores): one thread by default,
    OMP_NUM_THREADS or --threads otherwise."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    with ServerProcess(ShardConfig((TABLE,)), log_path=str(tmp_path / "default.log")) as server:
        client = PSClient.connect([server.address])
        assert client.stats()[0]["threads"] == 1
        client.close()
    with ServerProcess(ShardConfig((TABLE,)), env={"OMP_NUM_THREADS": "2"}, log_path=str(tmp_path / "two.log")) as server:
        client = PSClient.connect([server.address])
        assert client.stats()[0]["threads"] == 2
        client.close()
    bad = subprocess.run([sys.executable, "-m", "het", "serve", "--table", "t:4:2", "--threads", "0"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert bad.returncode == 2 and "--threads must be >= 1, got 0" in bad.stderr


@pytest.mark.slow  # about 8 s: ten thousand sessions
def test_ten_thousand_sessions_left_idle_give_their_memory_back(tmp_path):
    """Sessions opened and left (each a signed push, as a worker's) are forgotten past the
    timeout: the shard's RSS comes back to within 50 MB of where it started."""
    import zmq

    secret = b"correct horse battery staple"
    cfg = ShardConfig((TableConfig("t", rows=64, dim=4),), session_idle_s=3)
    with ServerProcess(cfg, secret=secret, log_path=str(tmp_path / "shard.log")) as server:
        watcher = PSClient.connect([server.address], secret=secret)
        start = watcher.stats()[0]
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(server.address)
        push = [np.array([1]), np.ones((1, 4), np.float32), np.array([1])]
        for batch in range(100):  # 100 requests in flight at a time
            for i in range(batch * 100, batch * 100 + 100):
                meta = {"table": "t", "nonce": watcher.link.nonces[0], "session": f"{i:032x}", "seq": 1}
                sock.send_multipart(encode(Message(Op.PUSH, i + 1, meta, push), secret))
            for _ in range(100):
                assert decode(sock.recv_multipart(), secret, what="reply").status == 0
        sock.close()
        full = watcher.stats()[0]
        assert full["sessions"] >= 10_000
        deadline = time.monotonic() + 30
        while (now := watcher.stats()[0])["sessions"] > 1 and time.monotonic() < deadline:
            time.sleep(0.5)  # the watcher's own session stays: it asks every half second
        assert now["sessions"] == 1 and now["sessions_forgotten"] >= 10_000
        assert now["rss_bytes"] - start["rss_bytes"] < 50 << 20, (start["rss_bytes"], full["rss_bytes"], now["rss_bytes"])
        watcher.close()
