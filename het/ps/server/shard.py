"""A PS shard, with no sockets: wire requests in, the tables' stores (het.ps.server.store) answering.

A :class:`Shard` answers :class:`~het.ps.protocol.messages.Message` requests; :mod:`het.ps.server.server`
puts it behind a transport. Every request is checked once (:mod:`het.ps.protocol.checks`) before
anything changes, so a bad one is refused whole and the shard keeps serving. Each table is a
:class:`~het.ps.server.store.rowstore.RowStore`: the shard asks every table the same questions, never
which kind of table it is.
"""

from __future__ import annotations

import time
from collections import Counter

import numpy as np
import torch

from het.config import ShardConfig
from het.process import peak_rss_bytes, rss_bytes
from het.ps.protocol import checks, schema
from het.ps.protocol.auth import check_secret
from het.ps.protocol.integers import widen
from het.ps.protocol.limits import refused_push
from het.ps.server import hot, reads
from het.ps.server.budget import Budget
from het.ps.server.changes import Changes, page
from het.ps.server.parts import Checked, Parts
from het.ps.server.sessions import SessionExpired, Sessions
from het.ps.server.store.rowstore import RowStore, open_stores
from het.ps.server.store.state import StateDirectory
from het.ps.protocol.messages import (AuthError, Message, Op, ProtocolError, StaleError, check_size, decode, encode,
                                  error_reply, frame_bytes, peek_request_id)
from het.staleness import bound_from_wire

PAGE_IN_SYNCS = 2  # syncs whose rows wait to come off disk; older ones are dropped (their step came)


class Shard:
    """The rows of every table on one PS shard, and the request handler over them.

    Args:
        cfg: the tables, this shard's index and the number of shards.
        secret: a shared secret (bytes). With one, :meth:`handle_frames` serves only requests
            signed with it, signs its replies, and counts the others (``unauthenticated``).
        state_dir: the directory SAVE and LOAD requests name files in, which the shard holds
            alone while it lives (:mod:`het.ps.server.store.state`); without one they are refused.
        wal: keep a write-ahead log in ``state_dir/wal`` (:mod:`het.ps.server.store.wal`): every push is
            logged before it is acknowledged; a shard started on a state directory holding a log
            recovers its last save and replays the pushes after it.
        fsync_s: with ``wal``, how often at most the log is forced to disk.
        wal_recover_prefix: with ``wal``, recover a damaged log (not only a write a crash cut
            short) up to the damage instead of refusing to start (what is dropped: ``notes``).

    Raises:
        DirectoryInUse: another shard holds ``state_dir``.
        ValueError: its log or base save is damaged (the message names what would be lost).

    Example:
        >>> from het.config import OptimizerConfig, TableConfig
        >>> from het.ps.protocol.initial import initial_rows
        >>> t = TableConfig("t", rows=8, dim=2, optimizer=OptimizerConfig("sgd", lr=0.5))
        >>> shard = Shard(ShardConfig((t,)))
        >>> push = [np.array([5]), np.ones((1, 2), np.float32), np.array([2])]  # keys, grads, counts
        >>> shard.handle(Message(Op.PUSH, 1, {"table": "t"}, push)).meta
        {'applied': 1}
        >>> reply = shard.handle(Message(Op.PULL, 2, {"table": "t"}, [np.array([5, 1])]))
        >>> reply.arrays[1].tolist()  # clocks: key 5 took the push's 2 updates
        [2, 0]
        >>> np.allclose(reply.arrays[0], initial_rows(t, np.array([5, 1])) - [[0.5, 0.5], [0, 0]])  # SGD step
        True
    """

    def __init__(self, cfg: ShardConfig, secret: bytes | None = None, state_dir: str | None = None,
                 wal: bool = False, fsync_s: float = 0.05, wal_recover_prefix: bool = False):
        self.cfg = cfg
        self.secret = check_secret(secret)
        self._page_in: list = []  # (table, rows) a sync named: brought into DRAM after its reply
        self.stats = Counter(unauthenticated=0, replays=0)
        self.last_op = "none"  # the op of the request answered last (its latency's label)
        self.started = time.time()
        self.stopping = False
        self.sessions = Sessions(self.secret, cfg.session_idle_s, max_sessions=cfg.max_sessions)
        self.nonce = self.sessions.nonce  # this run's: a request naming another was meant for an earlier one
        self._handlers = {Op.PULL: self._on_pull, Op.PUSH: self._on_push, Op.SYNC: self._on_sync,
                          Op.PUSH_SYNC: self._on_push_sync, Op.SAVE: self._on_save, Op.LOAD: self._on_load,
                          Op.STATS: self._on_stats, Op.INFO: self._on_info, Op.STOP: self._on_stop,
                          Op.CHANGED: self._on_changed}
        self.changes: dict[str, Changes] = {}  # per table, once a reader asked (het train --publish)
        self.parts = Parts()  # pushes in parts, held until their last part
        self.reported: dict[str, float] = {}  # the latest figures a job reported with STATS
        self.wal = None
        # held before any table touches it: a second shard there would empty the first's disk tier
        self.state = StateDirectory(state_dir, wal, fsync_s, wal_recover_prefix)
        self.state_dir = self.state.root
        self.budget = None if cfg.memory is None else Budget(cfg.memory, self.stats)  # het.ps.server.budget
        try:
            self.tables: dict[str, RowStore] = open_stores(cfg, self.state_dir)
            self._fit_memory()
            if wal:
                self._recover()
        except BaseException:  # refused to start: the directory is let go
            self.state.close()
            raise
        if self.budget is not None:
            self.budget.started()

    def _fit_memory(self, pushed_keys: int = 0) -> None:
        if self.budget is not None:
            self.budget.fit(self.tables, pushed_keys)

    @property
    def page_in_pending(self) -> bool:
        return bool(self._page_in)

    def page_in(self) -> int:
        """Bring the rows on disk that the syncs since the last call named into DRAM: the
        pushes and pulls of the step they were synced for find them there. Rows brought in."""
        pending, self._page_in = self._page_in, []
        brought = sum(t.page_in(rows) for t, rows in pending)
        self.stats["paged_in_rows"] += brought
        return brought

    # -- the wire ---------------------------------------------------------------------------
    def handle_frames(self, frames) -> list:
        """Frames in, frames out. Never raises: a bad request gets an error reply.

        With a secret, a request not signed with it is refused and counted in
        ``stats["unauthenticated"]``. A request that does not decode gets an unsigned error
        reply (its sender may not hold the secret); the replies to the others are signed.
        """
        start = time.perf_counter()
        out = (None if self.secret is not None else hot.answer(self, frames)) or self._general(frames)
        self.stats["bytes_in"] += frame_bytes(frames)
        self.stats["bytes_out"] += frame_bytes(out)
        if self.budget is not None:
            self.budget.keep()
        self.stats["busy_s"] += time.perf_counter() - start
        return out

    def _general(self, frames) -> list:
        """:meth:`handle_frames` of any message (:mod:`het.ps.server.hot` reads the hot ones)."""
        self.last_op = "undecoded"
        try:
            check_size(frames, self.cfg.max_message_bytes)  # before anything is read or allocated
            msg = decode(frames, self.secret)
        except ProtocolError as e:
            self.stats["unauthenticated" if isinstance(e, AuthError) else "errors"] += 1
            return encode(error_reply(peek_request_id(frames[0]) if frames else 0, 0, e))
        refusal = self.sessions.refusal(msg)
        if refusal is None:
            return encode(self.handle(msg), self.secret)
        if not isinstance(refusal, SessionExpired):
            self.stats["stale" if isinstance(refusal, StaleError) else "replays"] += 1
        return encode(error_reply(msg.request_id, msg.op, refusal), self.secret)

    def handle(self, msg: Message) -> Message:
        """Answer one decoded request; errors become error replies. Every field of the request
        is parsed and checked before anything changes."""
        self.last_op = msg.op.name.lower()
        self.stats[f"requests_{self.last_op}"] += 1
        try:
            checks.every_field(msg.op, msg.meta)
            schema.check_arrays(msg.op, msg.meta, msg.arrays)  # as many as its op declares
            meta, arrays = self._handlers[msg.op](msg.meta, msg.arrays)
        except (ValueError, KeyError, TypeError, OSError, RuntimeError, ArithmeticError) as e:
            self.stats["errors"] += 1
            return error_reply(msg.request_id, msg.op, e)
        return Message(msg.op, msg.request_id, meta, arrays)

    def _arrays(self, op: Op, meta: dict, arrays: list) -> list:
        """A request's arrays, its delta-coded keys decoded (see :func:`checks.undelta`)."""
        return checks.undelta(op.name, arrays, checks.deltas(meta), schema.key_positions(op, meta), self.cfg.max_keys)

    def _on_pull(self, meta: dict, arrays: list):
        keys, = self._arrays(Op.PULL, meta, arrays)
        return {}, self.pull(checks.table(meta), keys, lazy=checks.lazy(meta), as_of=checks.as_of(meta))

    def _on_push(self, meta: dict, arrays: list):
        a = self._arrays(Op.PUSH, meta, arrays)
        if not self.sessions.first_time(meta):  # re-sent after a restart, applied before it
            return {"applied": len(a[0]), "again": True}, []
        return self._push_request(meta, a), []

    def _on_sync(self, meta: dict, arrays: list):
        keys, clocks = self._arrays(Op.SYNC, meta, arrays)
        return {}, self.sync(checks.table(meta), keys, clocks, bound=meta.get("bound"), lazy=checks.lazy(meta),
                             state=checks.state(meta), as_of=checks.as_of(meta))

    def _on_push_sync(self, meta: dict, arrays: list):
        with_sq = checks.sq(meta)
        a = self._arrays(Op.PUSH_SYNC, meta, arrays)
        table = checks.table(meta)
        sync = self._check_sync(table, *a[3 + with_sq:], checks.state(meta))  # before the push changes anything
        pushed = self._push_request(meta, a[:3 + with_sq]) if self.sessions.first_time(meta) else {}
        return {k: v for k, v in pushed.items() if k == "staged"}, self._sync(*sync, bound=meta.get("bound"),
                                                                              lazy=checks.lazy(meta),
                                                                              as_of=checks.as_of(meta))

    def _push_request(self, meta: dict, a: list) -> dict:
        """A request's push applied (checked whole first), or held if a part (:mod:`het.ps.server.parts`): the reply's meta."""
        session, part = checks.session(meta), checks.part(meta)
        checked = self._check_push(checks.table(meta), *a[:3], checks.step(meta), checks.grads_as(meta),
                                   a[3] if len(a) > 3 else None, whole=part is None)
        if part is not None:
            checked = self.parts.add(session and session[0], part, checked)
            if checked is None:
                return {"applied": 0, "staged": part[0]}
        return {"applied": self._apply(checked, session)}

    def _on_save(self, meta: dict, arrays: list):  # names inside the state directory, checked before anything is written
        drop = self.state.resolve(checks.path(meta, "drop"), write=True) if "drop" in meta else None
        self.save(checks.not_same(self.state.resolve(checks.path(meta), write=True), drop), checks.rows_only(meta))
        self.state.drop(drop)  # an earlier save the new one replaces (a checkpoint kept by the shards)
        return {"path": meta["path"]}, []

    def _on_load(self, meta: dict, arrays: list):
        self.load(self.state.resolve(checks.path(meta), write=False))
        return {"path": meta["path"]}, []

    def _on_stats(self, meta: dict, arrays: list):  # with the job's own figures (a stream's AUC): the latest kept
        self.reported = checks.report(meta) or self.reported
        return {"stats": self.stats_dict()}, []

    def _on_info(self, meta: dict, arrays: list):
        return {"shard": {"index": self.cfg.index, "num_shards": self.cfg.num_shards, "nonce": self.nonce,
                          "state_dir": self.state_dir, "tables": [t.to_dict() for t in self.cfg.tables],
                          "max_keys": self.cfg.max_keys}}, []

    def _on_stop(self, meta: dict, arrays: list):
        self.stopping = True  # the serve loop ends after this reply
        return {}, []

    def _on_changed(self, meta: dict, arrays: list):  # keys changed since a reader took them (het.ps.server.changes)
        table = checks.table(meta)
        if self._store(table).optimizer.decay.active:
            raise ValueError(f"table {table!r} decays every row every step (l2): there is no record of the rows "
                             f"a step changed to follow; export its checkpoints instead")
        reply = page(self.changes, table, self._store(table), checks.limit(meta, self.cfg.max_keys))
        self.stats["rows_changed_out"] += len(reply[1][0])
        return reply

    # -- the verbs --------------------------------------------------------------------------
    def pull(self, table: str, keys: np.ndarray, lazy: bool = False, as_of: int | None = None) -> list:
        """Rows and clocks of ``keys``. Shape: (n,) -> (n, D), (n,). With ``lazy``: rows of the
        touched keys only (k, D), clocks (n,), built (n,) uint8 (see :meth:`RowStore.rows_to_send`).
        ``as_of``: the step a table whose rows decay brings them to (:func:`reads.rows_of`)."""
        t, keys = self._table_keys(table, keys)
        at = t.locate(keys)
        arrays, sent = reads.pull_arrays(t, at, lazy, as_of)
        self.count_rows(sent, len(at))
        return arrays

    def push(self, table, keys, grads, counts, step: int = 1, grads_as: str = "fp32", logged: bool = True,
             session: tuple[str, int] | None = None, sq: np.ndarray | None = None) -> int:
        """Apply the optimizer to ``grads`` and add ``counts`` to the clocks; duplicate keys are
        summed. All or nothing: a push refused (a value that would not be finite, a clock past
        MAX_CLOCK) changes nothing. Returns the rows applied. ``grads_as``: how the gradients
        travelled (``"bf16"``: as int16 bits). ``logged``: written to the write-ahead log first
        (not when it is the log's own, a replay). ``session``: the request's (session, seq),
        remembered so that the push is not applied again when re-sent. ``sq``: the sums of the
        squared gradients of the steps each row's gradient sums (Adagrad tables follow them:
        :class:`het.ps.server.store.optim.Pushed`), for every row, or as they travel for the rows of
        several steps only (``counts > 1``).
        Shape: (n,), (n, D), (n,), sq (n, 1) or (n, D), or (k, 1) or (k, D)."""
        return self._apply(self._check_push(table, keys, grads, counts, step, grads_as, sq), session, logged)

    def _check_push(self, table, keys, grads, counts, step, grads_as, sq, whole: bool = True) -> Checked:
        grads = checks.grads(grads, grads_as)
        step = checks.step({"step": step})
        counts = widen(counts, "counts")  # the narrowest integers that held them on the wire
        sq = checks.squares(sq, keys, grads, counts)
        t, key_tensor = self._table_keys(table, keys)
        # the gradients' pass is left to a table that refuses them itself (_apply), unless logged or held or squared
        spare = whole and sq is None and self.wal is None and t.refuses_non_finite_grads
        checks.push(t.cfg, len(keys), grads, counts, sq, finite=not spare)
        return Checked(table, step, key_tensor, grads, counts, sq)

    def _apply(self, c: Checked, session: tuple[str, int] | None, logged: bool = True) -> int:
        n = c.keys.shape[0]
        if n == 0:
            return 0
        t = self.tables[c.table]
        if self.wal is not None and logged:
            # logged before it is applied (applying may overwrite grads) and acknowledged: a push
            # the table refuses is refused again, the same way, when the log is replayed
            self.wal.append(c.table, c.keys.numpy(), c.grads, c.counts, c.step, session, c.sq)
        try:
            t.push(t.locate(c.keys), torch.from_numpy(c.grads), torch.from_numpy(c.counts), c.step,
                   None if c.sq is None else torch.from_numpy(c.sq))
        except ValueError as e:  # refused whole: the rows, clocks and state are as they were
            raise refused_push(self.stats, c.table, t.refuses_non_finite_grads, c.grads, e) from None
        if session is not None:
            self.sessions.applied[session[0]] = session[1]
        if c.table in self.changes:
            self.changes[c.table].add(c.keys)
        self.stats["rows_in"] += n
        self._fit_memory(n)
        if self.wal is not None and self.cfg.wal_max is not None:  # a disk tier's files change under a child
            self.state.bound_log(self.cfg.wal_max, self.tables, self._header, background=self.cfg.memory is None)
        return n

    def sync(self, table, keys, clocks, bound=None, lazy: bool = False, state: str | None = None,
             as_of: int | None = None) -> list:
        """Rows whose clock ran more than ``bound`` ahead of the sent ``clocks``, and every key
        sent with clock -1. Shape: (n,), (n,) -> index (m,), rows (m, D), clocks (m,); with
        ``state`` (``"row"`` or ``"full"``) then the optimizer state the worker's cache follows
        them with, (m, 1) or (m, D) float32 (:meth:`RowStore.local_state`); with ``lazy`` the
        rows of untouched keys stay behind: rows (k, D) and a last array, built (m,) uint8
        (see :meth:`RowStore.rows_to_send`); ``as_of``: as :meth:`pull`'s."""
        return self._sync(*self._check_sync(table, keys, clocks, state), bound=bound, lazy=lazy, as_of=as_of)

    def _check_sync(self, table, keys, clocks, state: str | None) -> tuple:
        t, key_tensor = self._table_keys(table, keys)
        checks.sync(t.cfg, t.optimizer.followed, len(keys), clocks, state)
        return t, key_tensor, clocks, state

    def _sync(self, t: RowStore, keys: torch.Tensor, clocks: np.ndarray, state: str | None, bound, lazy: bool,
              as_of: int | None = None) -> list:
        """:meth:`sync` of checked arguments; the keys are located now (after a push_sync's push)."""
        at = t.locate(keys)
        sent = torch.from_numpy(widen(clocks, "clocks"))
        arrays, index, n_sent = reads.sync_arrays(t, at, sent, bound_from_wire(bound), lazy, state, as_of)
        self.count_rows(n_sent, len(index))
        self.stats["stale_rows"] += int((sent[index] >= 0).sum())
        pageable = t.pageable(at) if self.cfg.page_in else None
        if pageable is not None:
            self._page_in = [*self._page_in[-PAGE_IN_SYNCS + 1:], (t, pageable)]
        return arrays

    def _store(self, table: str) -> RowStore:
        if table not in self.tables:
            raise KeyError(f"unknown table {table!r}: this shard holds {sorted(self.tables)}")
        return self.tables[table]

    def _table_keys(self, table, keys: np.ndarray) -> tuple[RowStore, torch.Tensor]:
        """The store of ``table`` and the request's keys, checked: an int64 tensor."""
        t = self._store(table)
        keys = checks.keys(keys, self.cfg.max_keys)
        problem = t.check_keys(keys)
        if problem:
            raise ValueError(problem)
        return t, keys

    def count_rows(self, sent: int, asked: int) -> None:
        """Rows a reply sent of those ``asked``: the rest the client builds."""
        self.stats["rows_out"] += sent
        self.stats["rows_built_by_client"] += asked - sent

    # -- saves and the log (het.ps.server.store.state) ----------------------------------------------
    def save(self, path: str, rows_only: bool = False) -> str:
        """Write rows, clocks, marks and optimizer state to ``path`` (atomically); with a log, it
        becomes its base. ``rows_only``: no fixed table's optimizer state, a save to read rows from."""
        self.state.save(path, self.tables, self._header(), rows_only)
        return path

    def _header(self) -> dict:
        return {"index": self.cfg.index, "num_shards": self.cfg.num_shards, "applied": dict(self.sessions.applied),
                "forgotten": torch.from_numpy(self.sessions.seen.forgotten())}

    def load(self, path: str) -> str:
        """Read a save of this shard's layout, checked whole before anything changes; with a
        write-ahead log it becomes the log's base."""
        self._loaded(self.state.load(path, self.tables, self.cfg.index, self.cfg.num_shards))
        return path

    def close(self) -> None:
        """A clean stop: the log on disk, the state directory and the tables' files let go."""
        self.state.close()
        self.wal = None
        for t in self.tables.values():
            t.close()

    def _recover(self) -> None:
        """The log's base save, then every logged push after it, applied again (not logged)."""
        header = self.state.read_base(self.tables, self.cfg.index, self.cfg.num_shards)
        if header is not None:
            self._loaded(header)
        self.stats["wal_replayed"] = self.state.replay(self.push)
        self.wal = self.state.log
        if self.state.old_log:  # what was set aside for a base that never landed: in one now
            self.state.rebase(self.tables, self._header())

    def _loaded(self, header: dict) -> None:
        """A save was loaded: the rows paging in were the tables' before it."""
        self._page_in = []
        self._fit_memory()
        forgotten = header.get("forgotten")
        self.sessions.restore(header.get("applied", {}), None if forgotten is None else forgotten.numpy())

    def stats_dict(self) -> dict:
        """Counters; per table its stored rows and bytes (``tables``); the serving process's (``het serve``'s,
        or the caller's for a shard in a thread) resident memory now and at its peak, CPU seconds of every
        thread (ZeroMQ's too: ``process_cpu_s``) and of the thread that answers requests (``thread_cpu_s``:
        the shard's own work, the rest is ZeroMQ's I/O), torch threads, and what a job last ``reported``."""
        return dict(self.stats, **self.sessions.counts, **self.state.stats(), uptime_s=time.time() - self.started,
                    index=self.cfg.index, process_cpu_s=time.process_time(), thread_cpu_s=time.thread_time(),
                    tables={name: t.stats() for name, t in self.tables.items()}, threads=torch.get_num_threads(),
                    rss_bytes=rss_bytes(), peak_rss_bytes=peak_rss_bytes(), sessions=len(self.sessions),
                    reported=dict(self.reported))
