"""Serving a shard: the loop behind a transport, in this process, a thread or a child process.

``het serve`` runs :func:`serve` in the foreground; :class:`ServerThread` starts one in a thread
(tests, benchmarks) on a free port of 127.0.0.1 and stops it again, and
:class:`het.ps.server.process.ServerProcess` one in a child process.

Each takes an optional shared ``secret`` (bytes): with one, only requests signed with it are
served (see :mod:`het.ps.protocol.auth`). Binding any address but loopback without one is a ValueError.
"""

from __future__ import annotations

import errno
import faulthandler
import logging
import shutil
import signal
import threading
import time

import zmq

from het.config import ShardConfig
from het.ps.protocol.auth import check_bind, check_secret, curve_keys
from het.ps.protocol.messages import MessageTooLarge, error_reply, encode, peek_request_id
from het.ps.protocol.transport import ZmqTransport
from het.ps.server.metrics import ShardMetrics
from het.ps.server.shard import Shard
from het.ps.server.store import saves

log = logging.getLogger("het.ps")


def serve(shard: Shard, endpoint, should_stop=lambda: False, poll_s: float = 0.1,
          metrics: ShardMetrics | None = None) -> None:
    """Answer requests until a STOP request or ``should_stop()``. A request that breaks the
    handler gets an error reply; the loop goes on. With ``metrics``, each answer's time is
    observed and the shard's STATS handed over as they come due."""
    while not shard.stopping and not should_stop():
        if metrics is not None:
            metrics.refresh(shard.stats_dict)
        # rows a sync named come off disk, and rows not built yet are built, only while no
        # request waits (Shard.page_in, FixedRows.build_next)
        due = shard.wal.sync_due_in() if shard.wal is not None else None
        unbuilt = next((t for t in shard.tables.values() if getattr(t, "unbuilt", 0)), None)
        try:
            got = endpoint.recv(0 if shard.page_in_pending or unbuilt else poll_s if due is None else min(poll_s, due))
        except MessageTooLarge as e:  # let go unread: an unsigned refusal, as for a request not authenticated
            shard.stats["oversized"] += 1
            endpoint.send(e.peer, encode(error_reply(peek_request_id(e.first), 0, e)))
            continue
        if shard.wal is not None:
            shard.wal.sync_if_due()
        if got is None:
            if shard.page_in_pending:
                try:
                    shard.page_in()
                except Exception:  # a page-in that failed changes no row: the shard goes on
                    log.exception("page-in failed")
                    shard.stats["errors"] += 1
            elif unbuilt is not None:
                unbuilt.build_next()
            continue
        peer, frames = got
        start = time.perf_counter()
        try:
            reply = shard.handle_frames(frames)
        except Exception as e:  # a bug must not take the shard down with the rows it holds
            log.exception("request failed")
            shard.stats["errors"] += 1
            reply = encode(error_reply(peek_request_id(frames[0]) if frames else 0, 0, e))
        endpoint.send(peer, reply)
        if metrics is not None:
            metrics.observe(shard.last_op, time.perf_counter() - start)


def run_foreground(cfg: ShardConfig, bind: str, secret: bytes | None = None, state_dir: str | None = None,
                   wal: bool = False, fsync_s: float = 0.05, encrypt: bool = False,
                   wal_recover_prefix: bool = False, metrics_port: int | None = None) -> None:
    """``het serve``: bind, print the address on one line, serve until STOP, SIGINT or SIGTERM.
    Only requests signed with ``secret`` are served when one is given; SAVE and LOAD name files
    in ``state_dir`` (created if missing; the shard holds it alone), and are refused without
    one; with ``wal``, every push is logged there before it is acknowledged, and the shard
    recovers from the log at start (``wal_recover_prefix``: up to damage, dropping what follows,
    instead of refusing to start); with ``encrypt``, every frame travels under ZeroMQ's CURVE,
    keyed by ``secret``; with ``metrics_port``, Prometheus' text at ``/metrics`` on that port of
    the bound host (0: a free one; the address is printed)."""
    check_bind(bind, secret)
    keys = _curve(secret, encrypt)
    shard = Shard(cfg, secret, state_dir, wal=wal, fsync_s=fsync_s, wal_recover_prefix=wal_recover_prefix)
    try:
        endpoint = _listen(bind, cfg, keys)
    except BaseException:
        shard.close()
        raise
    if shard.state.lock is not None:
        shard.state.lock.note(address=endpoint.address)
    # a list, not a threading.Event: a handler runs between two bytecodes of the main thread,
    # perhaps inside Event.set of another signal's handler, whose lock it would wait on forever
    stop: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _: stop.append(signum))
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1`: every thread's stack to stderr
    print(f"het serve: shard {cfg.index}/{cfg.num_shards} listening on {endpoint.address}", flush=True)
    if secret is not None:  # a line of its own: ServerProcess reads the address off the end of the first
        print("het serve: serving only requests signed with the shared secret"
              + (", encrypted (CURVE)" if keys else ""), flush=True)
    metrics = None
    if metrics_port is not None:
        metrics = ShardMetrics()
        host = endpoint.address.removeprefix("tcp://").rpartition(":")[0].replace("*", "0.0.0.0")
        port = metrics.serve(host, metrics_port)
        print(f"het serve: metrics at http://{host}:{port}/metrics", flush=True)
    for note in shard.state.notes:
        print(f"het serve: {note}", flush=True)
    if shard.stats.get("wal_replayed"):
        print(f"het serve: recovered {shard.stats['wal_replayed']} logged pushes", flush=True)
    try:
        serve(shard, endpoint, lambda: bool(stop), metrics=metrics)
    finally:
        if metrics is not None:
            metrics.close()
        endpoint.close()
        shard.close()
    print(f"het serve: shard {cfg.index} stopped", flush=True)


def _curve(secret: bytes | None, encrypt: bool):
    """The CURVE key pair to serve with (None: in the clear); encryption needs the secret."""
    if not encrypt:
        return None
    if secret is None:
        raise ValueError("encryption needs the shared secret (--secret-file PATH or HET_SECRET): the keys derive from it")
    return curve_keys(secret)


def _listen(bind: str, cfg: ShardConfig, keys=None):
    """The bound endpoint, holding requests to ``cfg``'s limits; OSError (one line from
    ``het serve``) if ``bind`` cannot be bound."""
    try:
        return ZmqTransport(curve_keys=keys).bind(bind, cfg.max_frame_bytes, cfg.max_message_bytes)
    except zmq.ZMQError as e:
        hint = ""
        if e.errno == errno.EADDRINUSE:
            hint = " (is another shard or program on that port?)"
        elif e.errno == errno.ENODEV and bind.startswith("["):  # ZeroMQ binds IPv4 only unless told otherwise
            hint = " (IPv6 addresses are not supported: bind an IPv4 one, e.g. 127.0.0.1:0)"
        elif e.errno in (errno.ENODEV, errno.EADDRNOTAVAIL):
            hint = " (no interface of this machine has that address)"
        raise OSError(f"cannot listen on {bind!r}: {zmq.strerror(e.errno)}{hint}") from None


class ServerThread:
    """A shard served over ZeroMQ from a thread of this process.

    Example:
        >>> import torch
        >>> from het.config import TableConfig
        >>> from het.ps.client.client import PSClient
        >>> with ServerThread(ShardConfig((TableConfig("t", rows=4, dim=2),))) as server:
        ...     client = PSClient.connect([server.address])
        ...     client.wait(client.push("t", torch.tensor([3]), torch.ones(1, 2), torch.tensor([1])))
        ...     client.wait(client.pull("t", torch.tensor([3, 0])))[1].tolist()  # clocks: key 3 took one update
        ...     client.close()
        1
        [1, 0]
    """

    def __init__(self, cfg: ShardConfig, bind: str = "127.0.0.1:0", secret: bytes | None = None,
                 state_dir: str | None = None, encrypt: bool = False):
        check_bind(bind, secret)
        keys = _curve(secret, encrypt)
        self._own_state = state_dir is None  # a temporary one, removed at stop
        self.shard = Shard(cfg, secret, saves.temporary() if state_dir is None else state_dir)
        self.endpoint = ZmqTransport(curve_keys=keys).bind(bind, cfg.max_frame_bytes, cfg.max_message_bytes)
        self.address = self.endpoint.address
        self._stop = threading.Event()
        self._thread = threading.Thread(target=serve, args=(self.shard, self.endpoint, self._stop.is_set),
                                        name=f"het-shard-{cfg.index}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.endpoint.close()
        self.shard.close()
        if self._own_state:
            shutil.rmtree(self.shard.state_dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
