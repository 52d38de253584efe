"""The commands behind het's emulated cluster network (:mod:`het.bench.netns`): ``ip``, network
namespaces and the processes in them, removed whole; what earlier runs left behind, found by the
creating process's pid and removed (:func:`cleanup_stale`); and one TCP stream's bandwidth
between two hosts (:func:`measure_bandwidth`)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time


class NetworkEmulationUnavailable(RuntimeError):
    """This machine cannot emulate a network (not root, no iproute2, no namespaces)."""


def run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise NetworkEmulationUnavailable(f"`{' '.join(argv)}` failed (exit code {done.returncode}): "
                                          f"{done.stderr.strip()}")
    return done


def ip(*args: str) -> None:
    run(["ip", *args])


def named(pattern: re.Pattern) -> list[str]:
    """Namespaces, and links of this process's namespace (as ``"link NAME"``), whose names
    start with a match of ``pattern``."""
    spaces = [line.split()[0] for line in run(["ip", "netns", "list"], check=False).stdout.splitlines() if line]
    links = [line.split(": ")[1].split("@")[0] for line in run(["ip", "-o", "link"], check=False).stdout.splitlines()
             if ": " in line]
    return [s for s in spaces if pattern.match(s)] + [f"link {name}" for name in links if pattern.match(name)]


def stop(procs: list[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM to each process group, SIGKILL to those still there after ``grace_s``; reap all.
    (What a process left running in its namespace is killed when the namespace is deleted.)"""
    running = [p for p in procs if p.poll() is None]  # a reaped pid may already be another's
    for p in running:
        signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in running:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            signal_group(p, signal.SIGKILL)
            p.wait()


def signal_group(p: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(p.pid, sig)  # its own session (popen's default), so its group is its pid
    except (ProcessLookupError, PermissionError):
        p.send_signal(sig)


def delete_namespace(ns: str) -> None:
    """Kill whatever still runs inside ``ns`` (a namespace outlives ``ip netns del`` while a
    process holds it), then delete it, and with it its links."""
    for _ in range(50):
        pids = [int(p) for p in run(["ip", "netns", "pids", ns], check=False).stdout.split()]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)
    run(["ip", "netns", "del", ns], check=False)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_stale(prefix_base: str = "het") -> list[str]:
    """Remove what earlier runs left behind: namespaces named ``<prefix_base><pid36>-<n>-...``
    whose creating process ``pid`` is no longer alive (their processes are killed first).
    Networks of live processes, parallel runs among them, are left alone. Returns the names
    removed."""
    if shutil.which("ip") is None or os.geteuid() != 0:
        return []
    pattern = re.compile(rf"{re.escape(prefix_base)}([0-9a-z]+)-\d+[-p]")
    removed = []
    for name in named(pattern):
        if not alive(int(pattern.match(name.removeprefix("link ")).group(1), 36)):
            if name.startswith("link "):  # nothing is made in our namespace, but check anyway
                run(["ip", "link", "del", name.removeprefix("link ")], check=False)
            else:
                delete_namespace(name)
            removed.append(name)
    return removed


def measure_bandwidth(net, a: str, b: str, seconds: float = 1.0) -> float:
    """Bytes per second that one TCP stream carries from host ``a`` to host ``b`` of ``net`` (an
    open :class:`het.bench.netns.EmulatedNetwork`),
    as the receiver counts them (two small Python socket programs, one in each namespace)."""
    receiver = net.popen(b, [sys.executable, "-c", _RECEIVER, net.address(b)], stdout=subprocess.PIPE, text=True)
    try:
        line = receiver.stdout.readline()
        if not line.strip().isdigit():
            raise RuntimeError(f"the receiver in host {b!r} did not start (exit code {receiver.poll()})")
        port = int(line)
        net.run(a, [sys.executable, "-c", _SENDER, net.address(b), str(port), str(seconds)],
                check=True, timeout=seconds + 30)
        out, _ = receiver.communicate(timeout=30)
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()
    got = json.loads(out)
    if not got["bytes"]:
        raise RuntimeError(f"no bytes went from host {a!r} to host {b!r}")
    return got["bytes"] / got["seconds"]


_RECEIVER = """
import json, socket, sys, time
srv = socket.create_server((sys.argv[1], 0))
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
buf, n, t0 = bytearray(1 << 20), 0, None
while True:
    k = conn.recv_into(buf)
    if not k:
        break
    t0 = t0 or time.perf_counter()
    n += k
print(json.dumps({"bytes": n, "seconds": time.perf_counter() - t0 if n else 0.0}))
"""

_SENDER = """
import socket, sys, time
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
chunk, end = bytes(1 << 16), time.perf_counter() + float(sys.argv[3])
while time.perf_counter() < end:
    sock.sendall(chunk)
sock.close()
"""
