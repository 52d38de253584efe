"""The PS client, ps-lite style: ``pull`` / ``push`` / ``sync`` return handles, ``wait`` blocks.

Keys are split by shard (``key % S``, or ``mix(key) % S`` for a dynamic table: see
:mod:`het.ps.wire.requests`); one request goes to every shard that holds some of them, all are in flight at once, and ``wait`` merges the replies back
into the order of the keys given. Keys and rows may live on any device: they travel as CPU
arrays and come back on the device they were sent from.
"""

from __future__ import annotations

import itertools
import os
import secrets
import time

import torch

from het.config import ShardConfig, TableConfig
from het.ps.wire import checks
from het.ps.store import saves
from het.ps.wire.requests import (check_clocks, check_keys, check_push, check_sq, cut, push_arrays, push_sync_parts,
                                  route, wire_keys)
from het.ps.wire.auth import check_secret, curve_keys
from het.ps.wire.protocol import ERROR, AuthError, Message, Op, PSError, decode, delta_keys, encode
from het.ps.shard import Shard
from het.ps.wire.replies import Handle, merge
from het.ps.wire.transport import LocalChannel, LocalTransport, ZmqTransport
from het.staleness import bound_to_wire

# A wait polls its shard in slices this long, so that a stop request (PSClient.stop_waiting, made
# by a signal handler while the wait blocks) is seen within one slice: one poll of the whole
# timeout would sit it out, as pyzmq resumes its poll after a signal's handler has run.
WAIT_SLICE_S = 0.1

# A pull or push of many rows (a flush, a bulk read) travels in requests of about this many
# bytes of rows each, all in flight at once, so that a shard applies one while the next is on
# the wire and the client builds the one after: one message of the whole would run the three in
# turn. Steps' requests are smaller and go whole.
PART_BYTES = 4 << 20
# ... and in at most this many requests to one shard, bigger ones past that: they are all sent
# before any reply is read, and ZeroMQ's queues hold 1,000 messages each way
MAX_PARTS = 64


class WaitAbandoned(Exception):
    """A wait for a shard given up because a stop was asked for (:meth:`PSClient.stop_waiting`)
    and the shard stayed silent. Not a TimeoutError: the waits that catch one to probe a slow
    or restarted shard must let this through."""


class PSClient:
    """A connection to every shard of a PS.

    Args:
        channels: one channel per shard, in shard order (see :mod:`het.ps.wire.transport`).
        timeout_s: how long ``wait`` waits for a shard before raising TimeoutError.
        secret: the shards' shared secret (bytes): every request is signed with it, and a reply
            not signed with it raises AuthError.
        lazy_init: ask the shards to leave out rows no push has touched yet and build them
            here from the table's seed (:func:`het.ps.initial.initial_rows`): the same values,
            without their bytes on the wire.

    Example:
        >>> client = PSClient.local([TableConfig("t", rows=10, dim=2)], num_shards=2)
        >>> keys = torch.tensor([3, 8, 1])
        >>> rows, clocks = client.wait(client.pull("t", keys))
        >>> client.wait(client.push("t", keys, torch.ones(3, 2), torch.ones(3, dtype=torch.int64)))
        3
        >>> client.wait(client.pull("t", keys))[1].tolist()
        [1, 1, 1]
    """

    def __init__(self, channels: list, timeout_s: float = 30.0, secret: bytes | None = None,
                 lazy_init: bool = True, reconnect_s: float = 0.0):
        self.channels = list(channels)
        # > 0: a shard that stops answering is probed; once it answers as a new process (a
        # restart on its write-ahead log), the requests it had not answered are sent again
        # (their pushes are applied at most once: the shard knows each session's last)
        self.reconnect_s = reconnect_s
        self._inflight = [dict() for _ in self.channels]  # request id -> (op, meta, arrays) unanswered
        self.lazy_init = bool(lazy_init)
        self.timeout_s = timeout_s
        self.secret = check_secret(secret)
        self._ids = itertools.count(1)
        self._early = [dict() for _ in self.channels]  # replies that came before their wait
        self.bytes = {"sent": 0, "received": 0}
        # signed requests are fresh: each names its shard's nonce, this client's session and a
        # sequence number that grows with every request to that shard (see Shard._refusal)
        self._session = secrets.token_hex(16)
        self._seqs = [itertools.count(1) for _ in self.channels]
        self._nonces: list = [None] * len(self.channels)
        self._stop_at: float | None = None  # time.monotonic() of stop_waiting(); None: not asked
        self._stop_grace_s = 1.0
        self.tables = self._fetch_tables()

    @classmethod
    def connect(cls, addresses: list[str], timeout_s: float = 30.0, transport=None,
                secret: bytes | None = None, latency_ms: float | None = None,
                lazy_init: bool = True, reconnect_s: float = 0.0, encrypt: bool = False) -> "PSClient":
        """Connect over ZeroMQ to the shards at ``addresses`` (``host:port``, in shard order);
        give their shared ``secret`` if they hold one (see :func:`het.ps.wire.auth.load_secret`).
        ``encrypt``: every frame under ZeroMQ's CURVE (shards started with it, same secret).
        ``latency_ms``: an emulated one-way delay each way (None: ``HET_PS_LATENCY_MS`` or 0;
        see :class:`het.ps.wire.transport.DelayedChannel`); ignored when ``transport`` is given."""
        if encrypt and secret is None:
            raise ValueError("encryption needs the shards' shared secret: the CURVE keys derive from it")
        keys = curve_keys(secret) if encrypt else None
        transport = transport or ZmqTransport(latency_ms=latency_ms, curve_keys=keys)
        return cls([transport.connect(a) for a in addresses], timeout_s, secret, lazy_init, reconnect_s)

    @classmethod
    def local(cls, tables: list[TableConfig], num_shards: int = 1, lazy_init: bool = True) -> "PSClient":
        """Start ``num_shards`` in-process shards holding ``tables`` and connect to them."""
        transport = LocalTransport()
        names = [transport.bind(f"local-{i}", Shard(ShardConfig(tuple(tables), i, num_shards),
                                                   state_dir=saves.local(i)))
                 for i in range(num_shards)]
        return cls([transport.connect(n) for n in names], lazy_init=lazy_init)

    @property
    def num_shards(self) -> int:
        return len(self.channels)

    # -- the verbs --------------------------------------------------------------------------
    def pull(self, table: str, keys: torch.Tensor) -> Handle:
        """Rows and server clocks of ``keys``; ``wait`` gives ``(rows (n, D), clocks (n,))``."""
        keys = check_keys(self.tables, table, keys)
        wire = wire_keys(keys)
        return self._send(Op.PULL, table, keys, lambda p: [wire[p]], {"lazy": self.lazy_init})

    def push(self, table: str, keys: torch.Tensor, grads: torch.Tensor, counts: torch.Tensor,
             step: int = 1, grad_dtype: str = "f32", sq: torch.Tensor | None = None) -> Handle:
        """Send gradients and update counts; ``wait`` gives the number of rows applied.
        ``grad_dtype``: ``"f32"``, or ``"bf16"`` for half the bytes (rounded to nearest).
        ``sq``: the sums of the squared gradients of the steps each row's gradient sums, (n, 1)
        or (n, D), which an Adagrad table follows (:class:`het.ps.store.optim.Pushed`)."""
        keys = check_keys(self.tables, table, keys)
        grads, counts = check_push(self.tables[table], keys, grads, counts, grad_dtype)
        sq = check_sq(self.tables[table], keys, sq)
        wire = wire_keys(keys)
        return self._send(Op.PUSH, table, keys,
                          lambda p: push_arrays(wire, grads, counts, sq, p),
                          {"step": int(step), **_grads_meta(grad_dtype), **({} if sq is None else {"sq": True})})

    def sync(self, table: str, keys: torch.Tensor, clocks: torch.Tensor, bound: float,
             state: str | None = None) -> Handle:
        """Send cached clocks (-1 for a miss); ``wait`` gives a :class:`SyncResult` with the rows
        that are more than ``bound`` updates behind, and every miss. ``state``: ``"row"`` or
        ``"full"`` to get the rows' optimizer state too (an Adagrad table's; see
        :meth:`het.ps.store.optim.SparseOptimizer.local_state`)."""
        keys = check_keys(self.tables, table, keys)
        clocks = check_clocks(keys, clocks)
        wire = wire_keys(keys)
        handle = self._send(Op.SYNC, table, keys, lambda p: [wire[p], clocks[p]],
                            {"bound": bound_to_wire(bound), "lazy": self.lazy_init, **_state_meta(state)})
        handle.state = state
        return handle

    def push_sync(self, table: str, push_keys, grads, counts, sync_keys, clocks, bound: float,
                  step: int = 1, grad_dtype: str = "f32", state: str | None = None,
                  sq: torch.Tensor | None = None) -> Handle:
        """A push and a sync in one message per shard (more past the shards' ``max_keys``, the
        pushes first); the push is applied first. ``state``: as :meth:`sync`'s; ``sq``: as
        :meth:`push`'s."""
        push_keys, sync_keys = check_keys(self.tables, table, push_keys), check_keys(self.tables, table, sync_keys)
        cfg = self.tables[table]
        grads, counts = check_push(cfg, push_keys, grads, counts, grad_dtype)
        sq = check_sq(cfg, push_keys, sq)
        clocks = check_clocks(sync_keys, clocks)
        push_wire, sync_wire = wire_keys(push_keys), wire_keys(sync_keys)
        push_parts = route(cfg, push_keys, self.num_shards)
        meta = {"step": int(step), "bound": bound_to_wire(bound), "lazy": self.lazy_init, **_grads_meta(grad_dtype),
                **_state_meta(state), **({} if sq is None else {"sq": True})}
        handle = Handle(Op.PUSH_SYNC, table, len(sync_keys), sync_keys.device, keys=sync_keys, state=state)
        for shard, sync_part in enumerate(route(cfg, sync_keys, self.num_shards)):
            for q, p in push_sync_parts(push_parts[shard], sync_part, self.max_keys):
                if len(p) or len(q):
                    q = _ALL if len(q) == len(push_keys) else q
                    p_all = _ALL if len(p) == len(sync_keys) else p
                    pushed = push_arrays(push_wire, grads, counts, sq, q)
                    self._send_part(handle, shard, meta, [*pushed, sync_wire[p_all], clocks[p_all]], p,
                                    keys_at=(0, len(pushed)))
        return handle

    def wait(self, handle: Handle):
        """Block until every shard answered ``handle``; return its merged result."""
        if handle.done:
            return handle.result
        replies = [(positions, self._reply(shard, rid)) for shard, rid, positions in handle.parts]
        handle.reply_bytes = sum(a.nbytes for _, m in replies for a in m.arrays)
        start = time.perf_counter()
        handle.result, handle.done = merge(handle, replies, self.tables[handle.table]), True
        handle.merge_s = time.perf_counter() - start
        return handle.result

    # -- whole-PS requests ------------------------------------------------------------------
    def save(self, directory: str) -> list[str]:
        """Every shard writes its rows, clocks and optimizer state, and they are moved to
        ``directory/shard-<i>.pt``; the paths. The shards write into their own state
        directories (:mod:`het.ps.store.saves`), so this needs them on a filesystem this process sees
        (a local cluster, shared storage); else use :meth:`save_named`."""
        tag = self._tag("save")
        self.save_named(tag)
        return saves.collect(self._state_dirs(), tag, directory)

    def load(self, directory: str) -> list[str]:
        """Every shard loads ``directory/shard-<i>.pt`` (written by :meth:`save`), through a
        link in its state directory, removed afterwards."""
        tag = self._tag("load")
        with saves.lent(self._state_dirs(), tag, directory):
            self.load_named(tag)
        return [os.path.join(directory, saves.shard_name(i)) for i in range(self.num_shards)]

    def save_named(self, name: str) -> list[str]:
        """Every shard saves into ``name/shard-<i>.pt`` inside its own state directory."""
        return [m.meta["path"] for m in self._broadcast(Op.SAVE, lambda i: {"path": f"{name}/{saves.shard_name(i)}"},
                                                        timeout_s=None)]  # a big table takes its time

    def load_named(self, name: str) -> list[str]:
        """Every shard loads ``name/shard-<i>.pt`` from its own state directory."""
        return [m.meta["path"] for m in self._broadcast(Op.LOAD, lambda i: {"path": f"{name}/{saves.shard_name(i)}"},
                                                        timeout_s=None)]

    def _tag(self, what: str) -> str:
        return f"{what}-{self._session[:12]}-{next(self._ids)}"

    def _state_dirs(self) -> list[str]:
        dirs = [m.meta["shard"].get("state_dir") for m in self._broadcast(Op.INFO)]
        for i, d in enumerate(dirs):
            if d is None or not os.path.isdir(d):
                raise ValueError(f"shard {i}'s state directory ({d}) is not on a filesystem this process sees: "
                                 f"save and load by name (save_named, load_named) instead")
        return dirs

    def stats(self) -> list[dict]:
        return [m.meta["stats"] for m in self._broadcast(Op.STATS)]

    def stop_servers(self) -> None:
        self._broadcast(Op.STOP)

    def close(self) -> None:
        for c in self.channels:
            c.close()

    def stop_waiting(self, grace_s: float = 1.0) -> None:
        """Stop waiting for silent shards: from now on a wait raises :class:`WaitAbandoned` once
        its shard has been silent for ``grace_s`` since the later of the call and the wait's
        start, instead of after the full timeout. A shard that answers is still waited for, so a
        stopping worker flushes to a live PS. Safe in a signal handler (it sets two attributes)."""
        self._stop_grace_s = grace_s
        self._stop_at = time.monotonic()

    # -- internals --------------------------------------------------------------------------
    def _fetch_tables(self) -> dict[str, TableConfig]:
        infos = [m.meta["shard"] for m in self._broadcast(Op.INFO)]
        for i, info in enumerate(infos):
            if (info["index"], info["num_shards"]) != (i, self.num_shards):
                raise ValueError(f"address {i} ({self.channels[i].address}) serves shard {info['index']} "
                                 f"of {info['num_shards']}: expected shard {i} of {self.num_shards}")
            if info["tables"] != infos[0]["tables"]:
                raise ValueError(f"shards 0 and {i} hold different tables")
        self._nonces = [info.get("nonce") for info in infos]
        self.max_keys = min(info.get("max_keys", ShardConfig.max_keys) for info in infos)
        return {t["name"]: TableConfig.from_dict(t) for t in infos[0]["tables"]}

    def _broadcast(self, op: Op, meta=lambda i: {}, timeout_s: float | None | str = "default") -> list[Message]:
        rids = []
        for i, ch in enumerate(self.channels):
            rid = next(self._ids)
            ch.send(encode(Message(op, rid, {**meta(i), **(self._fresh(i) if op is not Op.INFO else {})}),
                           self.secret))
            rids.append(rid)
        return [self._reply(i, rid, timeout_s) for i, rid in enumerate(rids)]

    def _send(self, op, table, keys, arrays_of, meta) -> Handle:
        handle = Handle(op, table, len(keys), keys.device, keys=keys)
        meta = dict(meta, table=table)
        for shard, p in enumerate(route(self.tables[table], keys, self.num_shards)):
            for part in cut(p, self._part_keys(table, len(p))):
                self._send_part(handle, shard, meta, arrays_of(_ALL if len(part) == len(keys) else part), part)
        return handle

    def _part_keys(self, table: str, n: int) -> int:
        """The most keys of one request of ``_send`` carrying ``n`` keys to a shard: the shards'
        ``max_keys``, and about :data:`PART_BYTES` of rows (never under 1,024 keys) in at most
        :data:`MAX_PARTS` requests."""
        return min(self.max_keys, max(1024, PART_BYTES // (4 * self.tables[table].dim), -(-n // MAX_PARTS)))

    def _send_part(self, handle, shard, meta, tensors, positions, keys_at: tuple = (0,)) -> None:
        """One request of ``handle`` to ``shard``: ``tensors`` as arrays, the arrays of keys
        (at ``keys_at``) delta-coded where that takes fewer bytes; their bytes are counted on
        the handle, a push's apart from a sync's."""
        rid = next(self._ids)
        arrays = [t.detach().cpu().numpy() for t in tensors]
        coded = {}
        for i in keys_at:
            delta = delta_keys(arrays[i])
            if delta is not None:
                arrays[i], coded[str(i)] = delta
        meta = dict(meta, table=handle.table, session=self._session, seq=next(self._seqs[shard]),
                    **({"deltas": coded} if coded else {}))
        pushed = 3 + bool(meta.get("sq")) if handle.op in (Op.PUSH, Op.PUSH_SYNC) else 0  # keys, grads, counts, [sq]
        handle.request_bytes += sum(a.nbytes for a in arrays)
        handle.push_bytes += sum(a.nbytes for a in arrays[:pushed])
        if handle.op in (Op.SYNC, Op.PUSH_SYNC):
            handle.sync_bytes += sum(a.nbytes for a in arrays[pushed:])
        if self.reconnect_s:
            self._inflight[shard][rid] = (handle.op, meta, arrays)
        self._send_request(shard, rid, handle.op, meta, arrays)
        handle.parts.append((shard, rid, positions))

    def _send_request(self, shard: int, rid: int, op: Op, meta: dict, arrays: list) -> None:
        frames = encode(Message(op, rid, dict(meta, nonce=self._nonces[shard]), arrays), self.secret)
        self.bytes["sent"] += sum(memoryview(f).nbytes for f in frames)
        self.channels[shard].send(frames)

    def _fresh(self, shard: int) -> dict:
        """What makes a request to ``shard`` fresh when it is signed (see Shard._refusal), and
        names it for the shard's at-most-once pushes: this client's session and the next
        sequence number to that shard, and the shard's nonce."""
        return {"nonce": self._nonces[shard], "session": self._session, "seq": next(self._seqs[shard])}

    def _reply(self, shard: int, rid: int, timeout_s: float | None | str = "default") -> Message:
        early = self._early[shard]
        timeout_s = self.timeout_s if timeout_s == "default" else timeout_s
        while True:
            while rid not in early:
                try:
                    frames = self._recv(shard, timeout_s if not self._inflight[shard] else
                                        min(timeout_s or _PROBE_S, _PROBE_S))
                except TimeoutError:
                    if not self._inflight[shard]:
                        raise
                    self._probe(shard)  # gone, restarted, or only slow
                    continue
                self._take(shard, frames)
            msg = early.pop(rid)
            if not (msg.status == ERROR and msg.meta.get("kind") == "StaleError" and rid in self._inflight[shard]):
                break
            self._probe(shard)  # it reached a restarted shard: learn its nonce, send again
        self._inflight[shard].pop(rid, None)
        if msg.status == ERROR:
            raise PSError(f"PS shard {shard} ({self.channels[shard].address}) refused {msg.op.name}: "
                          f"{msg.meta.get('kind', 'Error')}: {msg.meta.get('error')}")
        return msg

    def _take(self, shard: int, frames) -> Message:
        """A reply off the wire, kept until its wait."""
        self.bytes["received"] += sum(memoryview(f.buffer if hasattr(f, "buffer") else f).nbytes for f in frames)
        msg = self._decode(shard, frames)
        self._early[shard][msg.request_id] = msg
        return msg

    def _probe(self, shard: int) -> None:
        """``shard`` has not answered for a while: ask who it is. The same process: wait on.
        A new one (another nonce: restarted on its write-ahead log): send it the requests it has
        not answered again, same ids and sequence numbers. No answer within ``reconnect_s``:
        TimeoutError."""
        deadline = time.monotonic() + self.reconnect_s
        while True:
            rid = next(self._ids)
            self.channels[shard].send(encode(Message(Op.INFO, rid), self.secret))
            try:
                while rid not in self._early[shard]:
                    self._take(shard, self._recv(shard, _PROBE_S))
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"PS shard {shard} ({self.channels[shard].address}) did not come back "
                                       f"within {self.reconnect_s:g} s") from None
                continue
            nonce = self._early[shard].pop(rid).meta["shard"]["nonce"]
            if nonce != self._nonces[shard]:
                self._nonces[shard] = nonce
                for old, (op, meta, arrays) in sorted(self._inflight[shard].items()):
                    self._early[shard].pop(old, None)  # a stale refusal from the new process, if any
                    self._send_request(shard, old, op, meta, arrays)
            return

    def _recv(self, shard: int, timeout_s: float | None):
        """The next reply of ``shard``, waited for in slices of :data:`WAIT_SLICE_S`; TimeoutError
        after ``timeout_s`` (None: no limit), WaitAbandoned soon after :meth:`stop_waiting`."""
        channel = self.channels[shard]
        if isinstance(channel, LocalChannel):  # answered inside send: a reply is there or never comes
            return channel.recv(timeout_s)
        start = time.monotonic()
        while True:
            now = time.monotonic()
            if self._stop_at is not None and now - max(start, self._stop_at) >= self._stop_grace_s:
                raise WaitAbandoned(f"gave up waiting for PS shard {shard} ({channel.address}): a stop was "
                                    f"asked for and it sent nothing for {now - max(start, self._stop_at):.1f} s")
            left = None if timeout_s is None else start + timeout_s - now
            if left is not None and left <= 0:
                raise TimeoutError(f"no reply from PS shard at {channel.address} within {timeout_s:g} s "
                                   f"(is `het serve` running there?)")
            try:
                return channel.recv(WAIT_SLICE_S if left is None else min(WAIT_SLICE_S, left))
            except TimeoutError:
                continue

    def _decode(self, shard: int, frames) -> Message:
        """A reply, checked against the secret. A shard that could not authenticate a request
        answers with an unsigned error reply: it is let through, as it can only raise PSError."""
        try:
            return decode(frames, self.secret, what="reply")
        except AuthError as e:
            msg = decode(frames)
            if msg.status != ERROR:
                raise AuthError(f"PS shard {shard} ({self.channels[shard].address}): {e} "
                                f"(does it hold the same shared secret?)") from None
            return msg


_ALL = slice(None)  # "every key, in order": sent as is, without a gather
_PROBE_S = 2.0  # with reconnect_s: silence after which a shard is asked whether it restarted


def _state_meta(state: str | None) -> dict:
    if state is None:
        return {}
    return {"state": checks.state({"state": state})}  # a bad value fails here, before any request


def _grads_meta(grad_dtype: str) -> dict:
    return {"grads": grad_dtype} if grad_dtype != "f32" else {}  # f32 messages are unchanged
