"""The PS client, ps-lite style: ``pull`` / ``push`` / ``sync`` return handles, ``wait`` blocks.

A request's keys, gradients and clocks are checked once, here (:mod:`het.ps.client.requests`),
and split by shard (``key % S``, or ``mix(key) % S`` for a dynamic table); one request goes to
every shard that holds some of them, all are in flight at once (:mod:`het.ps.client.connection`),
and ``wait`` merges the replies back into the order of the keys given
(:mod:`het.ps.client.replies`). Keys and rows may live on any device: they travel as CPU arrays
and come back on the device they were sent from.
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch

from het.config import ShardConfig, TableConfig
from het.ps.client.connection import Connection, WaitAbandoned
from het.ps.client.hot import HotPath
from het.ps.client.replies import Handle, merge
from het.ps.protocol import layout
from het.ps.protocol import checks
from het.ps.protocol.auth import curve_keys
from het.ps.protocol.integers import delta_keys, widen
from het.ps.protocol.messages import Op, array_bytes
from het.ps.client.requests import (check_clocks, check_push, check_sq, cut, keys_to_send, push_arrays, push_sync_parts,
                                  route, rows_at, table_of)
from het.ps.protocol.transport import ZmqTransport
from het.staleness import bound_to_wire

__all__ = ["PSClient", "WaitAbandoned"]

# A pull or push of many rows (a flush, a bulk read) travels in requests of about this many
# bytes of rows each, all in flight at once, so that a shard applies one while the next is on
# the wire and the client builds the one after: one message of the whole would run the three in
# turn. Steps' requests are smaller and go whole.
PART_BYTES = 4 << 20
# ... and in at most this many requests to one shard, bigger ones past that: they are all sent
# before any reply is read, and ZeroMQ's queues hold 1,000 messages each way
MAX_PARTS = 64


class PSClient:
    """A connection to every shard of a PS.

    Args:
        channels: one channel per shard, in shard order (see :mod:`het.ps.protocol.transport`).
        timeout_s: how long ``wait`` waits for a shard before raising TimeoutError.
        secret: the shards' shared secret (bytes): every request is signed with it, and a reply
            not signed with it raises AuthError.
        lazy_init: ask the shards to leave out rows no push has touched yet and build them
            here from the table's seed (:func:`het.ps.protocol.initial.initial_rows`): the same values,
            without their bytes on the wire.

    Example:
        >>> from het.ps.local import local_client  # shards in this process, for the example
        >>> client = local_client([TableConfig("t", rows=10, dim=2)], num_shards=2)
        >>> keys = torch.tensor([3, 8, 1])
        >>> rows, clocks = client.wait(client.pull("t", keys))
        >>> client.wait(client.push("t", keys, torch.ones(3, 2), torch.ones(3, dtype=torch.int64)))
        3
        >>> client.wait(client.pull("t", keys))[1].tolist()
        [1, 1, 1]
    """

    def __init__(self, channels: list, timeout_s: float = 30.0, secret: bytes | None = None,
                 lazy_init: bool = True, reconnect_s: float = 0.0):
        # reconnect_s > 0: a shard that stops answering is probed; once it answers as a new
        # process (a restart on its write-ahead log), the requests it had not answered are sent
        # again (their pushes are applied at most once: the shard knows each session's last)
        self.link = Connection(channels, timeout_s, secret, reconnect_s)
        self.lazy_init = bool(lazy_init)
        self.tables = self._fetch_tables()
        # unsigned, no request kept to be sent again: the hot requests' short path
        self._hot = HotPath(self) if secret is None and not reconnect_s else None

    @property
    def channels(self) -> list:
        return self.link.channels

    @property
    def bytes(self) -> dict:
        """Bytes of every frame sent and received (``sent``, ``received``)."""
        return self.link.bytes

    @classmethod
    def connect(cls, addresses: list[str], timeout_s: float = 30.0, transport=None,
                secret: bytes | None = None, latency_ms: float | None = None,
                lazy_init: bool = True, reconnect_s: float = 0.0, encrypt: bool = False) -> "PSClient":
        """Connect over ZeroMQ to the shards at ``addresses`` (``host:port``, in shard order);
        give their shared ``secret`` if they hold one (see :func:`het.ps.protocol.auth.load_secret`).
        ``encrypt``: every frame under ZeroMQ's CURVE (shards started with it, same secret).
        ``latency_ms``: an emulated one-way delay each way (None: ``HET_PS_LATENCY_MS`` or 0;
        see :class:`het.ps.protocol.transport.DelayedChannel`); ignored when ``transport`` is given."""
        if encrypt and secret is None:
            raise ValueError("encryption needs the shards' shared secret: the CURVE keys derive from it")
        keys = curve_keys(secret) if encrypt else None
        transport = transport or ZmqTransport(latency_ms=latency_ms, curve_keys=keys)
        return cls([transport.connect(a) for a in addresses], timeout_s, secret, lazy_init, reconnect_s)

    @property
    def num_shards(self) -> int:
        return len(self.channels)

    # -- the verbs --------------------------------------------------------------------------
    def pull(self, table: str, keys: torch.Tensor, as_of: int | None = None) -> Handle:
        """Rows and server clocks of ``keys``; ``wait`` gives ``(rows (n, D), clocks (n,))``.
        ``as_of``: the step a table whose rows decay brings them to (:mod:`het.decay`; default:
        the last step a push to it named)."""
        cfg = table_of(self.tables, table)
        keys, wire = keys_to_send(cfg, keys)
        if cfg.optimizer.decays:
            return self._send(Op.PULL, table, keys, lambda p: [rows_at(wire, p)], {"lazy": False, **_as_of(as_of)})
        if type(self.lazy_init) is bool and self._hot_fits(table, keys):  # the meta as JSON writes it
            return self._hot_send(Op.PULL, table, keys, '"lazy":true,' if self.lazy_init else '"lazy":false,',
                                  lambda p: [rows_at(wire, p)])
        return self._send(Op.PULL, table, keys, lambda p: [rows_at(wire, p)], {"lazy": self.lazy_init})

    def push(self, table: str, keys: torch.Tensor, grads: torch.Tensor, counts: torch.Tensor,
             step: int = 1, grad_dtype: str = "fp32", sq: torch.Tensor | None = None) -> Handle:
        """Send gradients and update counts; ``wait`` gives the number of rows applied.
        ``grad_dtype``: ``"fp32"``, or ``"bf16"`` for half the bytes (rounded to nearest).
        ``sq``: the sums of the squared gradients of the steps each row's gradient sums, (n, 1)
        or (n, D), which an Adagrad table follows (:class:`het.ps.server.store.optim.Pushed`)."""
        cfg = table_of(self.tables, table)
        keys, wire = keys_to_send(cfg, keys)
        grads, counts = check_push(cfg, keys, grads, counts, grad_dtype)
        sq = check_sq(cfg, keys, sq, counts)
        if sq is None and self._hot_fits(table, keys):
            fields = f'"step":{int(step)},' + ("" if grad_dtype == "fp32" else f'"grads":"{grad_dtype}",')
            return self._hot_send(Op.PUSH, table, keys, fields, lambda p: push_arrays(wire, grads, counts, None, p))
        return self._send(Op.PUSH, table, keys,
                          lambda p: push_arrays(wire, grads, counts, sq, p),
                          {"step": int(step), **_grads_meta(grad_dtype), **({} if sq is None else {"sq": True})})

    def sync(self, table: str, keys: torch.Tensor, clocks: torch.Tensor, bound: float,
             state: str | None = None, as_of: int | None = None) -> Handle:
        """Send cached clocks (-1 for a miss); ``wait`` gives a :class:`SyncResult` with the rows
        that are more than ``bound`` updates behind, and every miss. ``state``: ``"row"`` or
        ``"full"`` to get the rows' optimizer state too (an Adagrad table's; see
        :meth:`het.ps.server.store.optim.SparseOptimizer.local_state`). ``as_of``: as :meth:`pull`'s."""
        cfg = table_of(self.tables, table)
        keys, wire = keys_to_send(cfg, keys)
        clocks = check_clocks(keys, clocks)
        handle = self._send(Op.SYNC, table, keys, lambda p: [rows_at(wire, p), rows_at(clocks, p)],
                            {"bound": bound_to_wire(bound), **self._lazy(cfg, as_of), **_state_meta(state)})
        handle.state = state
        return handle

    def push_sync(self, table: str, push_keys, grads, counts, sync_keys, clocks, bound: float,
                  step: int = 1, grad_dtype: str = "fp32", state: str | None = None,
                  sq: torch.Tensor | None = None, as_of: int | None = None) -> Handle:
        """A push and a sync in one message per shard (more past the shards' ``max_keys``, or
        a sync of more than :data:`PART_BYTES` of rows; the pushes first); the push is applied
        first. ``state``, ``as_of``: as :meth:`sync`'s; ``sq``: as :meth:`push`'s."""
        cfg = table_of(self.tables, table)
        (push_keys, push_wire), (sync_keys, sync_wire) = keys_to_send(cfg, push_keys), keys_to_send(cfg, sync_keys)
        grads, counts = check_push(cfg, push_keys, grads, counts, grad_dtype)
        sq = check_sq(cfg, push_keys, sq, counts)
        clocks = check_clocks(sync_keys, clocks)
        push_parts = route(cfg, push_keys, self.num_shards)
        meta = {"step": int(step), "bound": bound_to_wire(bound), **self._lazy(cfg, as_of), **_grads_meta(grad_dtype),
                **_state_meta(state), **({} if sq is None else {"sq": True})}
        handle = Handle(Op.PUSH_SYNC, table, len(sync_keys), sync_keys.device, keys=sync_keys, state=state)
        for shard, sync_part in enumerate(route(cfg, sync_keys, self.num_shards)):
            messages = push_sync_parts(push_parts[shard], sync_part, self.max_keys,
                                       sync_keys=self._part_keys(table, len(sync_part)))
            pushes = sum(1 for q, _ in messages if len(q))  # the push's parts come first
            for i, (q, p) in enumerate(messages):
                if len(p) or len(q):
                    part_meta = _part(meta, i + 1, pushes) if len(q) else meta
                    q = _ALL if len(q) == len(push_keys) else q
                    p_all = _ALL if len(p) == len(sync_keys) else p
                    pushed = push_arrays(push_wire, grads, counts, sq, q)
                    synced = [rows_at(sync_wire, p_all), rows_at(clocks, p_all)]
                    self._send_part(handle, shard, part_meta, [*pushed, *synced], p, keys_at=(0, len(pushed)))
        return handle

    def wait(self, handle: Handle):
        """Block until every shard answered ``handle``; return its merged result."""
        if handle.done:
            return handle.result
        try:
            if handle.hot:
                return self._hot.wait(handle)
            replies = [(positions, self.link.reply(shard, rid)) for shard, rid, positions in handle.parts]
        finally:  # the parts of a push in parts are kept to be sent again until its last is answered
            self.link.done([(shard, rid) for shard, rid, _ in handle.parts])
        handle.reply_bytes = sum(array_bytes(m.arrays) for _, m in replies)
        start = time.perf_counter()
        handle.result, handle.done = merge(handle, replies, self.tables[handle.table]), True
        handle.merge_s = time.perf_counter() - start
        return handle.result

    # -- whole-PS requests ------------------------------------------------------------------
    def save(self, directory: str, rows_only: bool = False) -> list[str]:
        """Every shard writes its rows, clocks and optimizer state (``rows_only``: the fixed
        tables' state left out, a save to read, not to load), and they are moved to
        ``directory/shard-<i>.pt``; the paths. The shards write into their own state
        directories (:mod:`het.ps.protocol.layout`), so this needs them on a filesystem this process sees
        (a local cluster, shared storage); else use :meth:`save_named`."""
        tag = self._tag("save")
        self.save_named(tag, rows_only=rows_only)
        return layout.collect(self._state_dirs(), tag, directory)

    def load(self, directory: str) -> list[str]:
        """Every shard loads ``directory/shard-<i>.pt`` (written by :meth:`save`), through a
        link in its state directory, removed afterwards."""
        tag = self._tag("load")
        with layout.lent(self._state_dirs(), tag, directory):
            self.load_named(tag)
        return [os.path.join(directory, layout.shard_name(i)) for i in range(self.num_shards)]

    def save_named(self, name: str, drop: str | None = None, rows_only: bool = False) -> list[str]:
        """Every shard saves into ``name/shard-<i>.pt`` inside its own state directory, then
        removes the save named ``drop`` there, if any (what the new one replaces)."""
        def meta(i: int) -> dict:
            return {"path": f"{name}/{layout.shard_name(i)}", **({"drop": f"{drop}/{layout.shard_name(i)}"} if drop else {}),
                    **({"rows_only": True} if rows_only else {})}

        return [m.meta["path"] for m in self.link.broadcast(Op.SAVE, meta, timeout_s=None)]  # a big table takes its time

    def load_named(self, name: str) -> list[str]:
        """Every shard loads ``name/shard-<i>.pt`` from its own state directory."""
        return [m.meta["path"] for m in self.link.broadcast(Op.LOAD, lambda i: {"path": f"{name}/{layout.shard_name(i)}"},
                                                        timeout_s=None)]

    def _tag(self, what: str) -> str:
        return f"{what}-{self.link.session[:12]}-{self.link.next_id()}"

    def sees_state_dirs(self) -> bool:
        """Whether every shard's state directory is on a filesystem this process sees."""
        return all(d is not None and os.path.isdir(d) for d in (m.meta["shard"].get("state_dir")
                                                                 for m in self.link.broadcast(Op.INFO)))

    def _state_dirs(self) -> list[str]:
        dirs = [m.meta["shard"].get("state_dir") for m in self.link.broadcast(Op.INFO)]
        for i, d in enumerate(dirs):
            if d is None or not os.path.isdir(d):
                raise ValueError(f"shard {i}'s state directory ({d}) is not on a filesystem this process sees: "
                                 f"save and load by name (save_named, load_named) instead")
        return dirs

    def changed(self, table: str, page_rows: int | None = None, started: list | None = None):
        """The rows of ``table`` changed since this was last asked, shard by shard, as pieces
        ``(keys (k,) int64, rows (k, D) float32, clocks (k,) int64)``; the first call starts every
        shard's record (:mod:`het.ps.server.changes`) and gives nothing. ``page_rows``: rows a request
        brings at most (default: about 4 MiB of them). ``started``: the index of each shard whose
        record started with this call is appended to it: a shard started again since the last
        call (its record is in memory) gives nothing of what changed before its restart."""
        dim = self.tables[table].dim
        limit = min(self.max_keys, page_rows or max(1, (4 << 20) // (4 * dim)))
        for shard in range(self.num_shards):
            more = True
            while more:
                rid = self.link.request(shard, Op.CHANGED, {"table": table, "limit": limit, **self.link.fresh(shard)}, [])
                reply = self.link.reply(shard, rid, timeout_s=None)
                more = bool(reply.meta.get("more"))
                if reply.meta.get("started") and started is not None:
                    started.append(shard)
                keys, rows, clocks = reply.arrays
                if len(keys):
                    yield np.asarray(keys, np.int64), np.asarray(rows, np.float32), widen(clocks, "clocks")

    def stats(self, report: dict[str, float] | None = None) -> list[dict]:
        """Every shard's STATS; ``report``: the job's figures, which each shard keeps (the latest)
        and serves among its Prometheus metrics as ``het_job_<name>``."""
        return [m.meta["stats"] for m in self.link.broadcast(Op.STATS, lambda i: {"report": report} if report else {})]

    def stop_servers(self) -> None:
        self.link.broadcast(Op.STOP)

    def close(self) -> None:
        self.link.close()

    def stop_waiting(self, grace_s: float = 1.0) -> None:
        """Stop waiting for silent shards (:meth:`het.ps.client.connection.Connection.stop_waiting`):
        a wait raises :class:`WaitAbandoned` once its shard has been silent for ``grace_s``.
        Safe in a signal handler."""
        self.link.stop_waiting(grace_s)

    # -- internals --------------------------------------------------------------------------
    def _fetch_tables(self) -> dict[str, TableConfig]:
        infos = [m.meta["shard"] for m in self.link.broadcast(Op.INFO)]
        for i, info in enumerate(infos):
            if (info["index"], info["num_shards"]) != (i, self.num_shards):
                raise ValueError(f"address {i} ({self.channels[i].address}) serves shard {info['index']} "
                                 f"of {info['num_shards']}: expected shard {i} of {self.num_shards}")
            if info["tables"] != infos[0]["tables"]:
                raise ValueError(f"shards 0 and {i} hold different tables")
        self.link.nonces = [info.get("nonce") for info in infos]
        self.max_keys = min(info.get("max_keys", ShardConfig.max_keys) for info in infos)
        return {t["name"]: TableConfig.from_dict(t) for t in infos[0]["tables"]}

    def _send(self, op, table, keys, arrays_of, meta) -> Handle:
        handle = Handle(op, table, len(keys), keys.device, keys=keys)
        meta = dict(meta, table=table)
        if self.num_shards == 1 and 0 < len(keys) <= self._part_keys(table, len(keys)):  # one request, every key in order
            self._send_part(handle, 0, meta, arrays_of(_ALL), torch.arange(len(keys), device=keys.device))
            return handle
        for shard, p in enumerate(route(self.tables[table], keys, self.num_shards)):
            pieces = cut(p, self._part_keys(table, len(p)))
            for i, part in enumerate(pieces):  # a push in pieces goes as one in parts, applied whole
                part_meta = _part(meta, i + 1, len(pieces)) if op is Op.PUSH else meta
                self._send_part(handle, shard, part_meta, arrays_of(_ALL if len(part) == len(keys) else part), part)
        return handle

    def _lazy(self, cfg: TableConfig, as_of: int | None) -> dict:
        """A sync's ``lazy`` (and ``as_of``): a table whose rows decay sends them all, brought to ``as_of``."""
        return {"lazy": False, **_as_of(as_of)} if cfg.optimizer.decays else {"lazy": self.lazy_init}

    def _hot_fits(self, table: str, keys: torch.Tensor) -> bool:
        """Whether a pull or push of ``keys`` goes by the short path: no shard's keys in more
        than one request (all of them fit one)."""
        n = keys.shape[0]
        return self._hot is not None and 0 < n <= self._part_keys(table, n)

    def _hot_send(self, op: Op, table: str, keys: torch.Tensor, fields: str, tensors_of) -> Handle:
        """:meth:`_send` of keys that go in one request to each shard, by the short path
        (:mod:`het.ps.client.hot`): the same requests, in the same order."""
        handle = Handle(op, table, keys.shape[0], keys.device, keys=keys, hot=True)
        if self.num_shards == 1:
            self._hot.request(handle, 0, fields, [_numpy(t) for t in tensors_of(_ALL)], None)
            return handle
        for shard, p in enumerate(route(self.tables[table], keys, self.num_shards)):
            if len(p):
                tensors = tensors_of(_ALL if len(p) == len(keys) else p)
                self._hot.request(handle, shard, fields, [_numpy(t) for t in tensors], p)
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
        arrays = [_numpy(t) for t in tensors]
        coded = {}
        for i in keys_at:
            delta = delta_keys(arrays[i])
            if delta is not None:
                arrays[i], coded[str(i)] = delta
        meta = dict(meta, table=handle.table, **self.link.fresh(shard), **({"deltas": coded} if coded else {}))
        handle.count_request(arrays, pushed=3 + bool(meta.get("sq")))
        handle.parts.append((shard, self.link.request(shard, handle.op, meta, arrays), positions))


def _numpy(t: torch.Tensor) -> np.ndarray:
    """A tensor as the numpy array that travels: itself on the CPU, else a copy there."""
    return t.numpy() if t.device.type == "cpu" and not t.requires_grad else t.detach().cpu().numpy()


_ALL = slice(None)  # "every key, in order": sent as is, without a gather


def _part(meta: dict, i: int, n: int) -> dict:
    """A request's meta as part ``i`` of ``n`` of a push (:mod:`het.ps.server.parts`); a push whole as it is."""
    return meta if n <= 1 else dict(meta, part=i, parts=n)


def _as_of(step: int | None) -> dict:
    return {} if step is None else {"as_of": checks.as_of({"as_of": step})}


def _state_meta(state: str | None) -> dict:
    if state is None:
        return {}
    return {"state": checks.state({"state": state})}  # a bad value fails here, before any request


def _grads_meta(grad_dtype: str) -> dict:
    return {"grads": grad_dtype} if grad_dtype != "fp32" else {}  # fp32, the default, goes unsaid
