"""An emulated cluster network on one machine: one network namespace per host, joined by a bridge,
every host link shaped to a rate with ``tc ... tbf`` (iproute2; needs root).

::

    namespace <prefix>-h0            namespace <prefix>-sw                namespace <prefix>-h1
    eth0 192.0.2.10/24 [tbf] ==veth== <prefix>p0 [tbf] --br0-- <prefix>p1 [tbf] ==veth== eth0 192.0.2.11/24

The bridge lives in a "switch" namespace of its own and every veth is created there, so nothing
is ever added to the host's own namespace: no interface, no address, no route. The 192.0.2.0/24
addresses (the documentation range) exist only inside the namespaces, which have no route
anywhere else. Reach the hosts only from inside (:meth:`EmulatedNetwork.popen`, ``run``): this
process's own namespace is not connected to them, and on a machine whose real network also
uses 192.0.2.0/24 a connection from here to ``net.address(h)`` would leave by the real
interface. Each link is shaped in both directions (the host's eth0 for what it sends, the
bridge port for what it receives). ``netem`` is not available on these kernels: latency, where
wanted, belongs in the transport (``HET_PS_LATENCY_MS``, or ``het bench e2e --latency-ms``; see
:class:`het.ps.protocol.transport.DelayedChannel`).

Everything made here is removed on exit from the ``with`` block, after an exception or Ctrl-C
inside it, at interpreter exit (atexit) and on SIGTERM; what a killed run (SIGKILL) leaves
behind is removed by :func:`cleanup_stale`. Names carry the creating process's pid, in base 36
to fit Linux's 15 characters of a link name (``het<pid36>-<n>``: ``het2ilkw-0-h1``,
``het2ilkw-0p1``), so parallel runs never collide and a leftover's owner can be told dead.
"""

from __future__ import annotations

import atexit
import itertools
import os
import re
import shutil
import signal
import subprocess
import threading
import warnings

from het.bench import namespaces
from het.bench.namespaces import NetworkEmulationUnavailable, cleanup_stale, measure_bandwidth  # noqa: F401
from het.process import die_with_parent

SUBNET = "192.0.2"  # RFC 5737 TEST-NET-1: never routed, used only inside the namespaces
FIRST_HOST = 10  # host i is 192.0.2.(10 + i)
IFNAMSIZ = 15  # the longest Linux interface name
_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
               "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12}  # tc's SI units, in bits
_counter = itertools.count()


def parse_rate(rate: str) -> float:
    """Bytes per second of a tc rate (``"100mbit"``, ``"1gbit"``, ``"10gbit"``, ``"125mbps"``).

    Example:
        >>> parse_rate("100mbit"), parse_rate("1gbit"), parse_rate("2mbps")
        (12500000.0, 125000000.0, 2000000.0)
    """
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([a-z]+)", str(rate).strip().lower())
    if not m or m.group(2) not in _RATE_UNITS or float(m.group(1)) <= 0:
        raise ValueError(f"bandwidth {rate!r} is not a rate tc understands: expected a positive number "
                         f"and one of {', '.join(_RATE_UNITS)} (e.g. '1gbit'), or 'none'")
    return float(m.group(1)) * _RATE_UNITS[m.group(2)] / 8


def unavailable_reason() -> str | None:
    """Why network namespaces cannot be made here, or None when they can (tries one: as root,
    it makes and deletes a namespace, so it has no doctest; tests/cluster/test_netns.py checks it)."""
    if os.geteuid() != 0:
        return "the emulated network needs root (network namespaces, veth, tc): run as root"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"the emulated network needs iproute2: {' and '.join(missing)} not found on PATH"
    probe = f"{_new_prefix()}-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed here (an unprivileged container?): {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


class EmulatedNetwork:
    """One network namespace per host, joined by a bridge, each link shaped to ``bandwidth``.

    Args:
        hosts: host names (unique), e.g. ``["ps0", "worker0", "worker1"]``; host ``i`` gets the
            address ``192.0.2.(10 + i)``.
        bandwidth: the rate of every host link in each direction, as tc writes it (``"1gbit"``,
            ``"10gbit"``, ``"100mbit"``); None or ``"none"`` leaves the links unshaped.
        prefix: the name prefix of every namespace and link (default ``het<pid36>-<n>``).
        grace_s: on exit, how long processes get between SIGTERM and SIGKILL.

    Entering raises :class:`NetworkEmulationUnavailable` (with the reason) where this machine
    cannot do it; whatever was made before a failure is removed first.

    Example:
        >>> with EmulatedNetwork(["a", "b"], bandwidth="100mbit") as net:  # doctest: +SKIP
        ...     server = net.popen("a", [sys.executable, "-m", "http.server", "--bind", net.address("a")])
        ...     net.run("b", ["curl", "-s", f"http://{net.address('a')}:8000/"]).returncode
        0
    """

    def __init__(self, hosts: list[str], bandwidth: str | None = "1gbit", prefix: str | None = None,
                 grace_s: float = 5.0):
        hosts = list(hosts)
        if not hosts or len(set(hosts)) != len(hosts) or not all(isinstance(h, str) and h for h in hosts):
            raise ValueError(f"hosts must be distinct non-empty names, got {hosts!r}")
        if len(hosts) > 254 - FIRST_HOST:
            raise ValueError(f"at most {254 - FIRST_HOST} hosts fit in {SUBNET}.0/24, got {len(hosts)}")
        self.bandwidth = None if bandwidth is None or str(bandwidth).lower() == "none" else str(bandwidth)
        self.rate = parse_rate(self.bandwidth) if self.bandwidth else None  # bytes/s
        self.prefix = prefix or _new_prefix()
        longest = self._port(len(hosts) - 1)
        if not re.fullmatch(r"[a-z][a-z0-9-]*", self.prefix) or len(longest) > IFNAMSIZ:
            raise ValueError(f"prefix {self.prefix!r} must be lower-case letters, digits and '-', short enough "
                             f"for the link name {longest!r} to fit Linux's {IFNAMSIZ} characters")
        self.hosts, self.grace_s = hosts, grace_s
        self.switch = f"{self.prefix}-sw"
        self.namespaces = {h: f"{self.prefix}-h{i}" for i, h in enumerate(hosts)}
        self.procs: list[subprocess.Popen] = []
        self._made: list[str] = []  # namespaces that exist, in the order made
        self._open = False
        self._prev_sigterm = None  # the SIGTERM handler ours replaced, while ours is installed

    # -- the public verbs ---------------------------------------------------------------------
    def address(self, host: str) -> str:
        """The IPv4 address of ``host``'s eth0, e.g. ``"192.0.2.10"``.

        Example (the plan only: nothing is made before ``with``):
            >>> net = EmulatedNetwork(["ps0", "worker0", "worker1"], bandwidth="100mbit", prefix="hetdoc-0")
            >>> [net.address(h) for h in net.hosts], net.namespaces["worker1"], net.switch, net.rate
            (['192.0.2.10', '192.0.2.11', '192.0.2.12'], 'hetdoc-0-h2', 'hetdoc-0-sw', 12500000.0)
            >>> net.address("ps1")
            Traceback (most recent call last):
            ...
            ValueError: no host 'ps1' in this network; its hosts are ['ps0', 'worker0', 'worker1']
        """
        return f"{SUBNET}.{FIRST_HOST + self._index(host)}"

    def popen(self, host: str, cmd: list[str], **kwargs) -> subprocess.Popen:
        """Start ``cmd`` inside ``host``'s namespace (``ip netns exec``); it is stopped on exit.

        It runs in a session of its own (Ctrl-C reaches only this process, which then stops it)
        and gets SIGTERM if this process dies. ``kwargs`` go to :class:`subprocess.Popen`.
        """
        argv = self._exec_argv(host, cmd)
        kwargs.setdefault("start_new_session", True)
        kwargs.setdefault("preexec_fn", die_with_parent)
        proc = subprocess.Popen(argv, **kwargs)
        self.procs.append(proc)
        return proc

    def run(self, host: str, cmd: list[str], timeout: float | None = 60.0, **kwargs) -> subprocess.CompletedProcess:
        """Run ``cmd`` inside ``host``'s namespace to its end (``subprocess.run``; killed on
        timeout or exception). ``kwargs`` go to :func:`subprocess.run`."""
        kwargs.setdefault("preexec_fn", die_with_parent)
        return subprocess.run(self._exec_argv(host, cmd), timeout=timeout, **kwargs)

    def leftovers(self) -> list[str]:
        """Namespaces and host-namespace links whose names start with this network's prefix."""
        return namespaces.named(re.compile(re.escape(self.prefix) + "[-p]"))  # not het1-10's names for het1-1

    # -- set-up ---------------------------------------------------------------------------------
    def __enter__(self) -> "EmulatedNetwork":
        if self._open:
            raise RuntimeError(f"the emulated network {self.prefix!r} is already set up")
        reason = unavailable_reason()
        if reason:
            raise NetworkEmulationUnavailable(reason)
        self.procs = []
        atexit.register(self.close)
        self._install_sigterm()
        self._open = True
        try:
            self._build()
        except BaseException:  # Ctrl-C too: nothing made may outlive a failed start
            self.close()
            raise
        return self

    def _build(self) -> None:
        sw = self.switch
        self._add_namespace(sw)
        namespaces.ip("-n", sw, "link", "add", "br0", "type", "bridge")
        namespaces.ip("-n", sw, "link", "set", "br0", "addrgenmode", "none", "up")  # no IPv6 chatter
        for i, host in enumerate(self.hosts):
            ns, port = self.namespaces[host], self._port(i)
            self._add_namespace(ns)
            # Made in the switch namespace with its peer straight in the host's: never in ours.
            namespaces.ip("-n", sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
            namespaces.ip("-n", sw, "link", "set", port, "addrgenmode", "none", "master", "br0", "up")
            namespaces.ip("-n", ns, "link", "set", "lo", "up")
            namespaces.ip("-n", ns, "link", "set", "eth0", "addrgenmode", "none")
            namespaces.ip("-n", ns, "addr", "add", f"{self.address(host)}/24", "dev", "eth0")
            namespaces.ip("-n", ns, "link", "set", "eth0", "up")
            if self.bandwidth:
                self._shape(ns, "eth0")  # what the host sends
                self._shape(sw, port)  # what the host receives

    def _shape(self, ns: str, dev: str) -> None:
        # tbf's bucket must hold a whole (GSO) packet of 64 KiB, or such packets never leave;
        # past that, 1 ms of traffic keeps it from starving a fast link between timer ticks.
        burst = max(int(self.rate * 1e-3), 64 * 1024)
        namespaces.run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", self.bandwidth,
              "burst", str(burst), "latency", "50ms"])

    def _add_namespace(self, ns: str) -> None:
        namespaces.ip("netns", "add", ns)
        self._made.append(ns)

    # -- tear-down ------------------------------------------------------------------------------
    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(raise_on_leftovers=exc_type is None)

    def close(self, raise_on_leftovers: bool = False) -> None:
        """Stop every process started here, delete every namespace (and so every link), check
        that nothing named with the prefix remains. Safe to call more than once."""
        if not self._open:
            return
        main = threading.current_thread() is threading.main_thread()
        # Neither Ctrl-C nor SIGTERM may cut the clean-up short: they arrive once it is done.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM}) if main else None
        try:
            namespaces.stop(self.procs, self.grace_s)
            for ns in reversed(self._made):  # hosts first, the switch last
                namespaces.delete_namespace(ns)
            self._made.clear()
            self._open = False
            atexit.unregister(self.close)
            self._restore_sigterm()
        finally:
            if mask is not None:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        left = self.leftovers()
        if left:
            msg = f"the emulated network {self.prefix!r} left {left} behind; remove with cleanup_stale()"
            if raise_on_leftovers:
                raise RuntimeError(msg)
            warnings.warn(msg, RuntimeWarning)

    def _install_sigterm(self) -> None:
        if threading.current_thread() is threading.main_thread():  # Python sets handlers only there
            prev = signal.signal(signal.SIGTERM, self._on_sigterm)
            self._prev_sigterm = signal.SIG_DFL if prev is None else prev  # None: not set from Python

    def _restore_sigterm(self) -> None:
        if self._prev_sigterm is not None and signal.getsignal(signal.SIGTERM) == self._on_sigterm:
            signal.signal(signal.SIGTERM, self._prev_sigterm)
        self._prev_sigterm = None

    def _on_sigterm(self, signum, frame) -> None:
        prev = self._prev_sigterm
        self.close()  # puts prev back
        if callable(prev):
            prev(signum, frame)
        elif prev == signal.SIG_DFL:  # end as SIGTERM would have ended this process without us
            os.kill(os.getpid(), signal.SIGTERM)

    # -- helpers --------------------------------------------------------------------------------
    def _index(self, host: str) -> int:
        try:
            return self.hosts.index(host)
        except ValueError:
            raise ValueError(f"no host {host!r} in this network; its hosts are {self.hosts}") from None

    def _port(self, i: int) -> str:
        return f"{self.prefix}p{i}"

    def _exec_argv(self, host: str, cmd: list[str]) -> list[str]:
        if isinstance(cmd, (str, bytes)):
            raise TypeError(f"cmd must be a list of arguments, got the string {cmd!r}")
        if not self._open:
            raise RuntimeError(f"the emulated network {self.prefix!r} is not set up: use it inside `with`")
        self._index(host)  # a ValueError naming the hosts, for a host not in this network
        return ["ip", "netns", "exec", self.namespaces[host], *map(str, cmd)]

    def __repr__(self) -> str:
        return f"EmulatedNetwork({self.hosts!r}, bandwidth={self.bandwidth!r}, prefix={self.prefix!r})"


def _new_prefix() -> str:
    """``het<pid in base 36>-<n>``: at most 3 + 5 + 1 + 3 characters for the pids Linux gives."""
    pid, digits = os.getpid(), ""
    while pid:
        pid, d = divmod(pid, 36)
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"[d] + digits
    return f"het{digits}-{next(_counter)}"
