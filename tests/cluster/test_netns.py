"""The emulated cluster network (het/bench/netns.py): namespaces joined by a bridge, links shaped
with tc, everything removed at the end. Needs root and network namespaces; skipped otherwise.
Traffic goes only between the 192.0.2.x addresses inside the namespaces made here."""

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from het.bench.netns import (EmulatedNetwork, NetworkEmulationUnavailable, cleanup_stale, measure_bandwidth,
                            parse_rate, unavailable_reason)

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def netns():
    reason = unavailable_reason()  # tries to make and delete one namespace
    if reason:
        pytest.skip(f"cannot emulate a network here: {reason}")
    cleanup_stale()  # only what dead runs left behind


def ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout


def assert_gone(net: EmulatedNetwork, procs) -> None:
    assert net.prefix + "-" not in ip("netns", "list")
    assert net.prefix not in ip("-o", "link")
    assert net.leftovers() == []
    for p in procs:
        assert p.returncode is not None and not os.path.exists(f"/proc/{p.pid}")


def test_refuses_without_root_and_checks_its_arguments(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(NetworkEmulationUnavailable, match="needs root"):
        with EmulatedNetwork(["a", "b"]):
            pass
    assert parse_rate("100mbit") == 12.5e6
    with pytest.raises(ValueError, match="not a rate tc understands"):
        EmulatedNetwork(["a"], bandwidth="fast")
    with pytest.raises(ValueError, match="distinct"):
        EmulatedNetwork(["a", "a"])


def test_the_probe_makes_one_namespace_and_deletes_it(monkeypatch):
    """unavailable_reason() as root: it adds one namespace and deletes it (None: namespaces
    work), or says that `ip netns add` failed; either way the probe is gone. Without tc it says so."""
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        pytest.skip("needs root and iproute2")
    calls, real_run = [], subprocess.run

    def spy(argv, *args, **kwargs):
        calls.append(list(argv))
        return real_run(argv, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", spy)
    reason = unavailable_reason()
    monkeypatch.undo()
    probe = calls[0][3]
    assert calls[0] == ["ip", "netns", "add", probe] and probe.endswith("-probe")
    if reason is None:
        assert calls[1:] == [["ip", "netns", "del", probe]]
    else:
        assert reason.startswith("`ip netns add` failed") and len(calls) == 1
    assert probe not in ip("netns", "list").split()
    monkeypatch.setattr(shutil, "which", lambda tool: None if tool == "tc" else "/usr/sbin/ip")
    assert unavailable_reason() == "the emulated network needs iproute2: tc not found on PATH"


def test_setup_and_teardown_leave_nothing_even_after_an_exception(netns):
    routes = ip("route")
    with EmulatedNetwork(["a", "b"], bandwidth="1gbit") as net:
        assert sorted(net.leftovers()) == sorted([f"{net.prefix}-sw", f"{net.prefix}-h0", f"{net.prefix}-h1"])
        assert "tbf" in subprocess.run(["tc", "-n", net.namespaces["a"], "qdisc", "show", "dev", "eth0"],
                                       capture_output=True, text=True).stdout
        procs = [net.popen(h, ["sleep", "60"]) for h in net.hosts]
    assert_gone(net, procs)

    with pytest.raises(ZeroDivisionError):
        with EmulatedNetwork(["a", "b"], bandwidth=None) as net:
            procs = [net.popen("a", ["sleep", "60"])]
            1 / 0
    assert_gone(net, procs)
    assert ip("route") == routes  # the host's own routing is untouched


def test_a_failed_setup_removes_what_it_made(netns, monkeypatch):
    from het.bench import namespaces

    real_run = namespaces.run

    def run_but_tc_fails(argv, check=True):
        if argv[0] == "tc":  # after the switch and the first host's namespace and link were made
            raise NetworkEmulationUnavailable("tc refused (in this test)")
        return real_run(argv, check)

    monkeypatch.setattr(namespaces, "run", run_but_tc_fails)
    net = EmulatedNetwork(["a", "b"], bandwidth="1gbit")
    with pytest.raises(NetworkEmulationUnavailable, match="in this test"):
        with net:
            pass
    monkeypatch.undo()
    assert_gone(net, [])


HOLDER = """
import time
from het.bench.netns import EmulatedNetwork
with EmulatedNetwork(["a", "b"]) as net:
    print(net.prefix, net.popen("a", ["sleep", "60"]).pid, flush=True)
    time.sleep(60)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=["TERM", "INT", "KILL"])
def test_a_signalled_run_cleans_up_or_cleanup_stale_does(netns, sig):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        line = holder.stdout.readline()
    finally:
        holder.send_signal(sig)
        holder.wait(120)  # its tear-down runs ip many times: slow when the machine is loaded
    assert line, f"the holder did not start: {holder.stderr.read()}"
    assert holder.returncode == -sig
    prefix, child = line.split()
    left = [n for n in ip("netns", "list").split() if n.startswith(prefix + "-")]
    if sig == signal.SIGKILL:  # nothing runs on SIGKILL: the next run's cleanup_stale removes it
        assert len(left) == 3
        assert sorted(cleanup_stale()) == sorted(left)
        left = [n for n in ip("netns", "list").split() if n.startswith(prefix + "-")]
    assert left == []
    state = open(f"/proc/{child}/stat").read().split(")")[1].split()[0] if os.path.exists(f"/proc/{child}") else "gone"
    assert state in ("gone", "Z")  # a zombie only where pid 1 of this container is slow to reap


ECHO = """
import socket, sys
srv = socket.create_server((sys.argv[1], 7000))
print("ready", flush=True)
conn, _ = srv.accept()
conn.sendall(conn.recv(100).replace(b"ping", b"pong"))
"""

PING = """
import socket, sys
with socket.create_connection((sys.argv[1], 7000), timeout=10) as s:
    s.sendall(b"ping from " + s.getsockname()[0].encode())
    print(s.recv(100).decode())
"""


def test_two_hosts_reach_each_other_over_the_bridge_and_only_there(netns):
    # This machine's own network may use 192.0.2.0/24 too (it does where this was written):
    # the emulated hosts are then only reachable from inside their namespaces, never from here.
    host_addresses = ip("-o", "addr")
    with EmulatedNetwork(["a", "b"], bandwidth=None) as net:
        server = net.popen("a", [sys.executable, "-c", ECHO, net.address("a")], stdout=subprocess.PIPE, text=True)
        assert server.stdout.readline() == "ready\n"
        reply = net.run("b", [sys.executable, "-c", PING, net.address("a")], capture_output=True, text=True,
                        check=True, timeout=20)
        assert reply.stdout.strip() == f"pong from {net.address('b')}" == "pong from 192.0.2.11"
        assert server.wait(10) == 0
        # The addresses and the only route exist inside the namespaces, not in the host's: any
        # other destination is unreachable there (asked of the routing table; nothing is sent).
        routes = net.run("b", ["ip", "route"], capture_output=True, text=True).stdout
        assert routes.split()[:4] == ["192.0.2.0/24", "dev", "eth0", "proto"] and len(routes.splitlines()) == 1
        outside = net.run("b", ["ip", "route", "get", "198.51.100.1"], capture_output=True, text=True)
        assert outside.returncode != 0 and "unreachable" in outside.stderr
        assert ip("-o", "addr") == host_addresses
        assert f" {net.address('a')}/" not in host_addresses and f" {net.address('b')}/" not in host_addresses
    assert_gone(net, [server])
    assert ip("-o", "addr") == host_addresses


def test_links_are_shaped_to_the_rate(netns):
    with EmulatedNetwork(["a", "b"], bandwidth="100mbit") as net:
        shaped = measure_bandwidth(net, "a", "b", seconds=1.0)
    with EmulatedNetwork(["a", "b"], bandwidth="none") as net:
        free = measure_bandwidth(net, "a", "b", seconds=1.0)
    print(f"100mbit: {shaped / 1e6:.2f} MB/s, unshaped: {free / 1e6:.1f} MB/s")
    assert 0.5 * 12.5e6 <= shaped <= 1.1 * 12.5e6
    assert free > 4 * shaped


WORKER = """
import sys, torch, het
secret = open(sys.argv[2], "rb").read().rstrip(b"\\n")
client = het.PSClient.connect([sys.argv[1]], timeout_s=30, secret=secret)
rows, clocks = client.wait(client.pull("t", torch.arange(0, 1000, 100)))
print(tuple(rows.shape), tuple(clocks.shape))
client.close()
"""


def test_a_shard_in_one_namespace_serves_a_worker_in_another(netns, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("secret of test_netns\n")
    secret.chmod(0o600)
    with EmulatedNetwork(["ps0", "worker0"], bandwidth="1gbit") as net:
        shard = f"{net.address('ps0')}:5555"
        server = net.popen("ps0", [sys.executable, "-m", "het", "serve", "--table", "t:1000:8", "--bind", shard,
                                   "--secret-file", str(secret)], stdout=subprocess.PIPE, text=True)
        assert f"listening on tcp://{shard}" in server.stdout.readline()
        worker = net.run("worker0", [sys.executable, "-c", WORKER, shard, str(secret)],
                         capture_output=True, text=True, timeout=60)
        assert worker.returncode == 0, worker.stderr
        assert worker.stdout.strip() == "(10, 8) (10,)"
    assert server.returncode == 0  # SIGTERM on exit: the shard stopped cleanly
    assert_gone(net, [server])


@pytest.mark.slow  # about 19 s
def test_bench_e2e_runs_two_modes_on_a_shaped_network(netns, tmp_path):
    before = set(ip("netns", "list").split())  # another test's, still being torn down
    out = subprocess.run([sys.executable, "-m", "het", "bench", "e2e", "--bandwidths", "100mbit", "--modes",
                          "hybrid,het:100", "--steps", "12", "--dim", "8", "--batch", "128", "--log-dir",
                          str(tmp_path), "--json"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout.strip().splitlines()[-1])["results"]
    assert [(r["mode"], r["staleness"], r["bandwidth"]) for r in results] == [("hybrid", 0, "100mbit"),
                                                                              ("het", 100, "100mbit")]
    for r in results:
        assert r["workers"] == 2 and r["samples_per_s"] > 0 and r["dense_bytes_per_sample"] > 0
        assert set(r["time_split"]) == {"compute", "wait_ps", "allreduce"}
    assert results[1]["speed_vs_het100"] == 1.0
    assert results[1]["sparse_bytes_per_sample"] < results[0]["sparse_bytes_per_sample"]
    assert not [n for n in ip("netns", "list").split() if n.startswith("het") and n not in before]
