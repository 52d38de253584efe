"""A PS shard's state and request handling, with no sockets: rows, clocks, optimizer state.

A :class:`Shard` answers :class:`~het.ps.wire.protocol.Message` requests; :mod:`het.ps.server`
puts it behind a transport. Every request is checked before anything changes, so a bad one is
refused whole and the shard keeps serving.
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
import warnings
from collections import Counter

import numpy as np
import torch

from het.config import ShardConfig
from het.process import peak_rss_bytes, rss_bytes
from het.ps.wire import checks
from het.ps import limits
from het.ps.store import saves, wal
from het.ps.store.dynamic import DynamicRows
from het.ps.store.fixed import TableRows
from het.ps.store.wal import WriteAheadLog
from het.staleness import bound_from_wire, must_refresh
from het.ps.wire.auth import check_secret
from het.ps.wire.protocol import (AuthError, StaleError, Message, Op, ProtocolError, decode, encode, error_reply,
                                  WIRE_INTS, narrow, peek_request_id, undelta_keys, widen)

SAVE_FORMAT = 1
PREFETCH_SYNCS = 2  # syncs whose rows wait to come off disk; older ones are dropped (their step came)

# A request's arrays are views of the frames ZeroMQ received (flagged read-only), made tensors
# without a copy. The buffers are the request's own: nothing else reads them once it is handled
# (a push's gradients may be scaled in place there, after the log has its copy), so torch's
# warning that they are not writable says nothing here.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning,
                        module=r"het\.ps\.")


class Shard:
    """The rows of every table on one PS shard, and the request handler over them.

    Args:
        cfg: the tables, this shard's index and the number of shards.
        secret: a shared secret (bytes). With one, :meth:`handle_frames` serves only requests
            signed with it, signs its replies, and counts the others in
            ``stats["unauthenticated"]``.
        state_dir: the directory SAVE and LOAD requests name files in (see
            :mod:`het.ps.store.saves`); without one they are refused.
        wal: keep a write-ahead log in ``state_dir/wal`` (:mod:`het.ps.store.wal`): every push is
            logged before it is acknowledged, and a shard started on a state directory that
            holds a log recovers its last save and replays the pushes after it.
        fsync_s: with ``wal``, how often at most the log is forced to disk.

    Example:
        >>> from het.config import OptimizerConfig, TableConfig
        >>> from het.ps.store.fixed import initial_rows
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
                 wal: bool = False, fsync_s: float = 0.05):
        self.cfg = cfg
        self.secret = check_secret(secret)
        self.state_dir = None if state_dir is None else os.path.abspath(state_dir)
        if wal and state_dir is None:
            raise ValueError("a write-ahead log needs a state directory (het serve --state-dir DIR --wal)")
        self.tables = {t.name: self._table(t) for t in cfg.tables}
        self._prefetch: list = []  # (table, slots) a sync named: brought into DRAM after its reply
        self._fit_memory()
        self.stats = Counter(unauthenticated=0, replays=0)
        self.started = time.time()
        self.stopping = False
        # With a secret, a signed request must be fresh: it names this incarnation's nonce (a
        # capture from before a restart is stale) and a sequence number past its session's last.
        self.nonce = secrets.token_hex(16)
        self._sessions: dict[str, int] = {}  # session -> the last sequence number served
        self._applied: dict[str, int] = {}   # session -> the sequence number of its last push applied
        self.wal: WriteAheadLog | None = None
        if wal:
            self._recover(os.path.join(self.state_dir, "wal"), fsync_s)

    def _table(self, t):
        if not t.dynamic:
            return TableRows(t, self.cfg.index, self.cfg.num_shards)
        if self.cfg.memory is None:
            return DynamicRows(t, self.cfg.index, self.cfg.num_shards)
        if self.state_dir is None:
            raise ValueError("a memory budget needs a state directory for its disk tier (het serve --state-dir DIR)")
        tier = os.path.join(self.state_dir, "tier")
        if not hasattr(self, "_tier_cleared"):  # what an earlier run left there is not state: saves are
            shutil.rmtree(tier, ignore_errors=True)
            self._tier_cleared = True
        return DynamicRows(t, self.cfg.index, self.cfg.num_shards, os.path.join(tier, saves.table_dir(t.name)),
                           self.cfg.memory_policy)

    def _fit_memory(self) -> None:
        """Give the tiered tables' DRAM pools what the budget leaves beside everything else
        (fixed tables, indexes, clocks, sketches), in equal shares."""
        if self.cfg.memory is None:
            return
        tiered = [t for t in self.tables.values() if isinstance(t, DynamicRows) and t.disk_dir is not None]
        others = sum(t.stats()["bytes"] for t in self.tables.values() if t not in tiered)
        fixed = sum(t.index_bytes() + t.store.fixed_bytes(t.used) for t in tiered)
        share = max(0, self.cfg.memory - others - fixed) // len(tiered)
        for t in tiered:
            t.store.set_capacity(share // t.store.position_bytes())

    @property
    def prefetch_pending(self) -> bool:
        return bool(self._prefetch)

    def prefetch(self) -> int:
        """Bring the rows on disk that the syncs since the last call named into DRAM: the
        pushes and pulls of the step they prefetch for find them there. Rows brought in."""
        pending, self._prefetch = self._prefetch, []
        brought = sum(t.store.prefetch(slots) for t, slots in pending)
        self.stats["prefetched_rows"] += brought
        return brought

    # -- the wire ---------------------------------------------------------------------------
    def handle_frames(self, frames) -> list:
        """Frames in, frames out. Never raises: a bad request gets an error reply.

        With a secret, a request not signed with it is refused and counted in
        ``stats["unauthenticated"]``. A request that does not decode gets an unsigned error
        reply (its sender may not hold the secret); the replies to the others are signed.
        """
        start = time.perf_counter()
        self.stats["bytes_in"] += sum(memoryview(_buf(f)).nbytes for f in frames)
        try:
            msg = decode(frames, self.secret)
        except ProtocolError as e:
            self.stats["unauthenticated" if isinstance(e, AuthError) else "errors"] += 1
            out = encode(error_reply(peek_request_id(_buf(frames[0])) if frames else 0, 0, e))
        else:
            refusal = self._refusal(msg)
            if refusal is not None:
                self.stats["stale" if isinstance(refusal, StaleError) else "replays"] += 1
                out = encode(error_reply(msg.request_id, msg.op, refusal), self.secret)
            else:
                out = encode(self.handle(msg), self.secret)
        self.stats["bytes_out"] += sum(memoryview(f).nbytes for f in out)
        self.stats["busy_s"] += time.perf_counter() - start
        return out

    def _refusal(self, msg: Message) -> ProtocolError | None:
        """Why a request is refused unread (None: it is not). A request naming another nonce
        was sent to an earlier run of this shard (or is a replay of one): StaleError, so its
        client re-sends what this run has not answered. With a secret, every request but INFO
        (it changes nothing, and tells the nonce) must name this run's nonce, a session and a
        sequence number past the session's last: else AuthError."""
        if msg.op is Op.INFO:
            return None
        nonce = msg.meta.get("nonce")
        if (nonce is not None or self.secret is not None) and nonce != self.nonce:
            return StaleError(f"request names nonce {nonce!r}, not this shard's: it was meant for an earlier run "
                              f"of this shard, or is a replay (INFO tells the nonce); refused, nothing changed")
        if self.secret is None:
            return None
        session, seq = msg.meta.get("session"), msg.meta.get("seq")
        if (not isinstance(session, str) or not 16 <= len(session) <= 64 or not isinstance(seq, int)
                or isinstance(seq, bool) or seq < 1):
            return AuthError(f"a signed request carries session (16-64 characters) and seq (an integer >= 1), "
                             f"got {session!r}, {seq!r}")
        last = self._sessions.get(session, 0)
        if seq <= last:
            return AuthError(f"replayed request: seq {seq} of its session, whose last was {last}; refused, "
                             f"nothing changed")
        self._sessions[session] = seq
        return None

    def handle(self, msg: Message) -> Message:
        """Answer one decoded request; errors become error replies."""
        self.stats[f"requests_{msg.op.name.lower()}"] += 1
        try:
            meta, arrays = self._dispatch(msg)
        except (ValueError, KeyError, TypeError, OSError, RuntimeError, ArithmeticError) as e:
            self.stats["errors"] += 1
            return error_reply(msg.request_id, msg.op, e)
        return Message(msg.op, msg.request_id, meta, arrays)

    def _dispatch(self, msg: Message):
        """Every field of the request is parsed and checked before anything changes."""
        op, meta, a = msg.op, msg.meta, msg.arrays
        checks.every_field(meta)
        if op is Op.PULL:
            _expect_arrays(msg, 1)
            a = self._keys(msg, (0,))
            return {}, self.pull(checks.table(meta), a[0], lazy=checks.lazy(meta))
        if op is Op.PUSH:
            _expect_arrays(msg, 3 + checks.sq(meta))
            a = self._keys(msg, (0,))
            if not self._first_time(meta):  # re-sent after a restart, applied before it
                return {"applied": len(a[0]), "again": True}, []
            return {"applied": self.push(checks.table(meta), *a[:3], step=checks.step(meta),
                                         grads_as=checks.grads_as(meta), session=checks.session(meta),
                                         sq=a[3] if checks.sq(meta) else None)}, []
        if op is Op.SYNC:
            _expect_arrays(msg, 2)
            a = self._keys(msg, (0,))
            return {}, self.sync(checks.table(meta), *a, bound=meta.get("bound"), lazy=checks.lazy(meta),
                                 state=checks.state(meta))
        if op is Op.PUSH_SYNC:
            with_sq = checks.sq(meta)
            _expect_arrays(msg, 5 + with_sq)
            a = self._keys(msg, (0, 3 + with_sq))
            table, lazy, step, grads = checks.table(meta), checks.lazy(meta), checks.step(meta), checks.grads_as(meta)
            bound_from_wire(meta.get("bound"))
            wanted, sync = checks.state(meta), a[3 + with_sq:]
            self._check_sync(table, *sync, state=wanted)  # the sync checked before the push changes anything
            if self._first_time(meta):
                self.push(table, *a[:3], step=step, grads_as=grads, session=checks.session(meta),
                          sq=a[3] if with_sq else None)
            return {}, self.sync(table, *sync, bound=meta.get("bound"), lazy=lazy, state=wanted)
        if op is Op.SAVE:  # a name inside the state directory, checked before anything is written
            self.save(saves.resolve(self.state_dir, checks.path(meta), write=True))
            return {"path": meta["path"]}, []
        if op is Op.LOAD:
            self.load(saves.resolve(self.state_dir, checks.path(meta), write=False))
            return {"path": meta["path"]}, []
        if op is Op.STATS:
            return {"stats": self.stats_dict()}, []
        if op is Op.INFO:
            return {"shard": {"index": self.cfg.index, "num_shards": self.cfg.num_shards, "nonce": self.nonce,
                              "state_dir": self.state_dir,
                              "tables": [t.to_dict() for t in self.cfg.tables], "max_keys": self.cfg.max_keys}}, []
        if op is Op.STOP:
            self.stopping = True
            return {}, []
        raise ValueError(f"op {op.name} is not served")

    def _keys(self, msg: Message, key_arrays: tuple) -> list:
        """The request's arrays with its delta-coded key arrays decoded (int64), checked first:
        only arrays of keys (``key_arrays``, by position) travel so."""
        coded = checks.deltas(msg.meta)
        if not set(coded) <= set(key_arrays):
            raise ValueError(f"meta['deltas'] names arrays {sorted(coded)}: {msg.op.name}'s keys are arrays "
                             f"{list(key_arrays)}")
        arrays = list(msg.arrays)
        for i, first in coded.items():
            arrays[i] = undelta_keys(arrays[i], first, self.cfg.max_keys)
        return arrays

    # -- the verbs --------------------------------------------------------------------------
    def pull(self, table: str, keys: np.ndarray, lazy: bool = False) -> list:
        """Rows and clocks of ``keys``. Shape: (n,) -> (n, D), (n,). With ``lazy``: rows of the
        touched keys only (k, D), clocks (n,), built (n,) uint8 (see :meth:`TableRows.rows_to_send`)."""
        t, at = self._rows_of(table, keys)
        rows, sent = t.rows_to_send(at, lazy)
        self._count_rows(sent, len(at))
        return [rows[0], narrow(t.clocks_of(_sent(at, rows, sent))).numpy(), *_packed(rows[1:])]

    def push(self, table, keys, grads, counts, step: int = 1, grads_as: str = "f32", logged: bool = True,
             session: tuple[str, int] | None = None, sq: np.ndarray | None = None) -> int:
        """Apply the optimizer to ``grads`` and add ``counts`` to the clocks; duplicate keys are
        summed first. ``grads_as="bf16"``: ``grads`` are int16 bits of bfloat16 values. With a
        write-ahead log the push is logged (as applied, in float32) unless ``logged`` is False
        (a replay). ``session``: the request's (session, seq), remembered so that the push is
        not applied again when re-sent. ``sq``: the sums of the squared gradients of the steps
        each row's gradient sums (Adagrad tables follow them: :class:`het.ps.store.optim.Pushed`),
        for every row, or as they travel for the rows of several steps only (``counts > 1``).
        Shape: (n,), (n, D), (n,), sq (n, 1) or (n, D), or (k, 1) or (k, D)."""
        if grads_as == "bf16":
            if grads.dtype != np.int16:
                raise ValueError(f"bf16 grads travel as int16 bits, got {grads.dtype}")
            grads = torch.from_numpy(grads).view(torch.bfloat16).float().numpy()
        step = checks.step({"step": step})
        counts = widen(counts, "counts")  # the narrowest integers that held them on the wire
        sq = _every_row_sq(sq, keys, grads, counts)
        t, at = self._check_push(table, keys, grads, counts, sq)
        if len(at) == 0:
            return 0
        if self.wal is not None and logged:
            # logged before it is applied (applying may overwrite grads) and acknowledged: a push
            # the table refuses is refused again, the same way, when the log is replayed
            self.wal.append(table, keys, grads, counts, step, session, sq)
        try:
            t.push(at, torch.from_numpy(grads), torch.from_numpy(counts), step,
                   None if sq is None else torch.from_numpy(sq))
        except ValueError as e:  # refused whole: the rows, clocks and state are as they were
            self.stats["refused_pushes"] += 1
            raise ValueError(f"push to table {table!r} refused, nothing changed: {e}") from None
        if session is not None:
            self._applied[session[0]] = session[1]
        self.stats["rows_in"] += len(at)
        self._fit_memory()
        return len(at)

    def _first_time(self, meta: dict) -> bool:
        """Whether a push is new: one its session sent before (a re-send to a restarted shard
        that had applied and logged it) is not applied twice. A client re-sends in order, and a
        shard refuses requests meant for its earlier run, so "before" is "not after the last"."""
        session = checks.session(meta)
        if session is None or session[1] > self._applied.get(session[0], 0):
            return True
        self.stats["pushes_again"] += 1
        return False

    def sync(self, table, keys, clocks, bound=None, lazy: bool = False, state: str | None = None) -> list:
        """Rows whose clock ran more than ``bound`` ahead of the sent ``clocks``, and every key
        sent with clock -1. Shape: (n,), (n,) -> index (m,), rows (m, D), clocks (m,); with
        ``state`` (``"row"`` or ``"full"``) then the optimizer state the worker's cache follows
        them with, (m, 1) or (m, D) float32 (:meth:`TableRows.local_state`); with ``lazy`` the
        rows of untouched keys stay behind: rows (k, D) and a last array, built (m,) uint8
        (see :meth:`TableRows.rows_to_send`)."""
        t, at = self._check_sync(table, keys, clocks, state=state)
        server = t.clocks_of(at)
        sent = torch.from_numpy(widen(clocks, "clocks"))
        index = must_refresh(server, sent, bound_from_wire(bound)).nonzero().flatten()
        rows, n_sent = t.rows_to_send(at.index_select(0, index), lazy)
        self._count_rows(n_sent, len(index))
        self.stats["stale_rows"] += int((sent[index] >= 0).sum())
        if self.cfg.prefetch and isinstance(t, DynamicRows) and t.disk_dir is not None:
            self._prefetch = [*self._prefetch[-PREFETCH_SYNCS + 1:], (t, at[at[:, 1] >= 0, 1])]
        index_sent = _sent(index, rows, n_sent)
        sent_state = [] if state is None else [t.local_state(at.index_select(0, index_sent), state == "full")]
        return [narrow(index).numpy(), rows[0], narrow(server.index_select(0, index_sent)).numpy(), *sent_state,
                *_packed(rows[1:])]

    def _count_rows(self, sent: int, asked: int) -> None:
        self.stats["rows_out"] += sent
        self.stats["rows_built_by_client"] += asked - sent

    def save(self, path: str) -> str:
        """Write rows, clocks, marks and optimizer state to ``path`` (atomically). With a
        write-ahead log, the save becomes the log's base and the log starts afresh."""
        self._write(path)
        if self.wal is not None:
            self._rebase(path)
        return path

    def load(self, path: str) -> str:
        """Read a save of this shard's layout; with a write-ahead log it becomes the log's base."""
        self._read(path)
        if self.wal is not None:
            self._rebase(None)
        return path

    def close(self) -> None:
        """Force the write-ahead log to disk (a clean stop); remove the disk tier's files (a
        save holds links of its own)."""
        if self.wal is not None:
            self.wal.close()
            self.wal = None
        for t in self.tables.values():
            if isinstance(t, DynamicRows):
                t.close()

    def _recover(self, directory: str, fsync_s: float) -> None:
        """The last base save, then every logged push after it, applied again (not logged)."""
        base, lsn, replayed = os.path.join(directory, "base.pt"), 0, 0
        if os.path.exists(base):
            lsn = self._read(base)
        for record in wal.read(directory, after=lsn):
            session = (record["session"], record["seq"]) if record.get("session") else None
            try:
                self.push(record["table"], record["keys"], record["grads"], record["counts"], record["step"],
                          sq=record.get("sq"),
                          logged=False, session=session)
            except ValueError:  # refused when it was sent too (logged before it was applied)
                pass
            lsn, replayed = record["lsn"], replayed + 1
        self.wal = WriteAheadLog(directory, fsync_s, lsn)
        self.stats["wal_replayed"] = replayed

    def _rebase(self, saved: str | None) -> None:
        """Make ``saved`` (hard-linked, or this state written afresh when None) the log's base,
        then truncate the log: a crash between the two replays nothing twice (the base names
        the last push it holds)."""
        base = os.path.join(self.wal.directory, "base.pt")
        if saved is None:
            self._write(base)
        else:
            saves.link_save(saved, base)  # no copy: the save's own files, whatever becomes of their names
        self.wal.truncate()

    def _write(self, path: str) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tiered = {name: t for name, t in self.tables.items() if isinstance(t, DynamicRows) and t.disk_dir is not None}
        rows = saves.new_rows_suffix() if tiered else None  # the disk tier's files, linked beside the save
        tables = {name: t.state_dict(os.path.join(path + rows, saves.table_dir(name))) if name in tiered else t.state_dict()
                  for name, t in self.tables.items()}
        saved = {"format": SAVE_FORMAT, "index": self.cfg.index, "num_shards": self.cfg.num_shards,
                 "wal_lsn": self.wal.lsn if self.wal is not None else 0, "applied": dict(self._applied),
                 "tables": tables, "rows": rows}
        tmp = f"{path}.tmp-{os.getpid()}"
        torch.save(saved, tmp)
        os.replace(tmp, path)  # a reader never sees half a save: it names its own rows directory
        saves.remove_other_rows(path, rows)

    def _read(self, path: str) -> int:
        """Load a save; the number of the last logged push it holds (0: none)."""
        saved = saves.read_save(path)
        if saved.get("format") != SAVE_FORMAT:
            raise ValueError(f"{path}: save format {saved.get('format')}, expected {SAVE_FORMAT}")
        if (saved["index"], saved["num_shards"]) != (self.cfg.index, self.cfg.num_shards):
            raise ValueError(f"{path} holds shard {saved['index']} of {saved['num_shards']}, "
                             f"this is shard {self.cfg.index} of {self.cfg.num_shards}")
        if set(saved["tables"]) != set(self.tables):
            raise ValueError(f"{path} holds tables {sorted(saved['tables'])}, expected {sorted(self.tables)}")
        for name, t in self.tables.items():
            t.check_state(saved["tables"][name], path)
        self._prefetch = []  # slots of the rows it replaces
        for name, t in self.tables.items():  # all checked: now change
            if isinstance(t, DynamicRows):
                t.load_state_dict(saved["tables"][name], saves.rows_dir(path, saved, name))
            else:
                t.load_state_dict(saved["tables"][name])
        self._fit_memory()
        self._applied = dict(saved.get("applied", {}))
        return int(saved.get("wal_lsn", 0))

    def stats_dict(self) -> dict:
        """Counters, and per table its stored rows and bytes (``tables``); the process's
        resident memory now and at its peak (``rss_bytes``, ``peak_rss_bytes``), its CPU seconds
        so far, every thread's (ZeroMQ's I/O thread too: ``process_cpu_s``); its torch threads
        (``threads``). The process is the one serving the shard: ``het serve``'s, or the caller's
        for a shard in a thread or in process."""
        return dict(self.stats, **(self.wal.stats if self.wal is not None else {}),
                    uptime_s=time.time() - self.started, index=self.cfg.index, process_cpu_s=time.process_time(),
                    tables={name: t.stats() for name, t in self.tables.items()}, threads=torch.get_num_threads(),
                    rss_bytes=rss_bytes(),
                    peak_rss_bytes=peak_rss_bytes())

    # -- checks -----------------------------------------------------------------------------
    def _rows_of(self, table, keys):
        t = self.tables.get(table)
        if t is None:
            raise KeyError(f"unknown table {table!r}: this shard holds {sorted(self.tables)}")
        if keys.dtype not in (np.int64, np.int32) or keys.ndim != 1:
            raise ValueError(f"keys must be a 1-D int64 or int32 array, got {keys.dtype} of shape {keys.shape}")
        if len(keys) > self.cfg.max_keys:
            raise ValueError(f"a request holds at most {self.cfg.max_keys} keys (the shard's max_keys), "
                             f"got {len(keys)}")
        keys = torch.from_numpy(keys).long()  # int32 on the wire when every key fits
        problem = t.check_keys(keys)
        if problem:
            raise ValueError(problem)
        return t, t.locate(keys)

    def _check_push(self, table, keys, grads, counts, sq=None):
        t, local = self._rows_of(table, keys)
        n, d = len(keys), t.cfg.dim
        if grads.dtype != np.float32 or grads.shape != (n, d):
            raise ValueError(f"grads must be float32 of shape ({n}, {d}), got {grads.dtype} {grads.shape}")
        if counts.dtype != np.int64 or counts.shape != (n,):  # widened from the wire (push)
            raise ValueError(f"counts must be int64 of shape ({n},), got {counts.dtype} {counts.shape}")
        if sq is not None and (sq.dtype != np.float32 or sq.shape not in ((n, 1), (n, d))):
            raise ValueError(f"sq must be float32 of shape ({n}, 1) or ({n}, {d}), got {sq.dtype} {sq.shape}")
        if sq is not None and n and not (_all_finite(sq) and sq.min() >= 0):
            raise ValueError(f"sq (sums of squared gradients) for table {table!r} must be finite and >= 0: refused")
        if n and not _all_finite(grads):
            raise ValueError(f"grads for table {table!r} hold NaN or inf: refused")
        if n and (counts.min() < 0 or counts.max() > limits.MAX_COUNT):
            bad = counts.min() if counts.min() < 0 else counts.max()
            raise ValueError(f"counts must lie in [0, {limits.MAX_COUNT}], got {bad}")
        return t, local

    def _check_sync(self, table, keys, clocks, state: str | None = None):
        t, local = self._rows_of(table, keys)
        if state is not None and not t.optimizer.followed:
            name = t.cfg.optimizer.name
            raise ValueError(f"table {table!r}'s optimizer {name} has no state a cache follows: a sync may ask for "
                             f"state only of an Adagrad or row-wise Adagrad table, got state {state!r}")
        if state == "full" and t.cfg.optimizer.name == "rowwise_adagrad":
            raise ValueError(f"table {table!r}'s row-wise Adagrad keeps one float a row: expected state 'row', "
                             f"got {state!r}")
        if clocks.dtype not in WIRE_INTS or clocks.shape != keys.shape:
            raise ValueError(f"clocks must be integers ({', '.join(t.name for t in WIRE_INTS)}) of shape {keys.shape}, "
                             f"got {clocks.dtype} {clocks.shape}")
        if len(clocks) and (clocks.min() < -1 or clocks.max() > limits.MAX_CLOCK):
            raise ValueError(f"clocks must lie in [-1, {limits.MAX_CLOCK}] (-1: not cached), "
                             f"got {clocks.min() if clocks.min() < -1 else clocks.max()}")
        return t, local


def _sent(asked: torch.Tensor, rows: list, n_sent: int) -> torch.Tensor:
    """Of the rows ``asked``, those whose values a reply carries (:meth:`TableRows.rows_to_send`
    gave ``rows``, ``n_sent`` of them): all, or in a lazy reply the touched ones. A row left for
    the client to build has clock 0 and its initial optimizer state, which stay behind too."""
    if n_sent == len(asked):
        return asked
    return asked[torch.from_numpy(rows[-1]) == 0]


def _packed(built: list) -> list:
    """A lazy reply's ``built`` marks (uint8, one a row) as they travel: a bit a row, the first
    row's in the lowest bit of the first byte (``np.packbits(..., bitorder="little")``)."""
    return [np.packbits(b, bitorder="little") for b in built]


def _every_row_sq(sq: np.ndarray | None, keys: np.ndarray, grads: np.ndarray, counts: np.ndarray) -> np.ndarray | None:
    """A push's squares for every row, from those it carried: all of them (n rows), or only
    the rows of several steps (``counts > 1``, k rows, as a client sends them:
    :func:`het.ps.wire.requests.several_steps`; ``k == n`` reads the same either way). Adagrad
    takes a row of one step by its gradient's square and ignores its ``sq``, unless its key
    repeats in the push (the steps of a repeated key add up): those rows get their gradients'
    squares (the mean over the row for a width of 1), the others 0.
    Shape: sq (n, w) or (k, w), keys (n,), grads (n, D), counts (n,) -> (n, w)."""
    n = len(grads)
    if sq is None or len(sq) == n or grads.ndim != 2 or counts.shape != (n,) or keys.shape != (n,):
        return sq  # as it came: the push's checks name what is wrong
    several = counts > 1
    k = int(several.sum())
    if sq.ndim != 2 or len(sq) != k or sq.dtype != np.float32 or sq.shape[1] not in (1, grads.shape[1]):
        raise ValueError(f"sq must be float32 of shape ({n}, 1|{grads.shape[1]}), or of ({k}, 1|"
                         f"{grads.shape[1]}) for the {k} rows of several steps, got {sq.dtype} {sq.shape}")
    full = np.zeros((n, sq.shape[1]), np.float32)
    full[several] = sq
    if n > 1 and not bool((keys[1:] > keys[:-1]).all()):  # not ascending: a key may repeat
        _, inverse, times = np.unique(keys, return_inverse=True, return_counts=True)
        one = ~several & (times[inverse] > 1)
        if one.any():
            g = torch.from_numpy(grads[one])
            full[one] = (g * g if sq.shape[1] > 1 else (g * g).mean(1, keepdim=True)).numpy()
    return full


def _all_finite(a: np.ndarray) -> bool:
    """Whether every value is finite: natively for a contiguous float32 array (het.ps.wire.checks);
    else NaN and inf reach the sum, so a finite sum clears the array in one cheap pass."""
    if a.dtype == np.float32 and a.flags.c_contiguous:
        return limits.all_finite(torch.from_numpy(a))
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(np.isfinite(a.sum())) or bool(np.isfinite(a).all())



def _expect_arrays(msg: Message, n: int) -> None:
    if len(msg.arrays) != n:
        raise ValueError(f"{msg.op.name} takes {n} arrays, got {len(msg.arrays)}")


def _buf(frame):
    return frame.buffer if hasattr(frame, "buffer") else frame
