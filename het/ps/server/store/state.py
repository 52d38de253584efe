"""A shard's state directory, owned whole: locked against a second shard, saves written whole and
read back checked, and the write-ahead log recovered before the shard serves.

``STATE_DIR`` holds:

- ``lock``: the shard's claim on the directory (:class:`het.lock.DirectoryLock`: its pid, host
  and address); a second shard on the directory refuses to start, in one line, and one that
  finds the claim of a shard that ended without a clean stop takes it over and says so;
- ``wal/``: the write-ahead log and its base save (:mod:`het.ps.server.store.wal`);
- ``tier/``: the disk tier's segment files (:mod:`het.ps.server.store.disk`), emptied at start;
- whatever SAVE requests named (:mod:`het.ps.server.store.saves`), never one of the names above.

Every file the shard writes there is created without following a link and under a name no one
else picked, forced to disk, then renamed into place (:mod:`het.files`); every save and segment
is read back against its checksums before a row of it is trusted.
"""

from __future__ import annotations

import os
import signal
import warnings
from collections import Counter
from collections.abc import Callable

from het import files
from het.lock import DirectoryLock
from het.process import die_with_parent
from het.ps.protocol import layout
from het.ps.server.store import saves, wal
from het.ps.server.store.wal import WriteAheadLog


class StateDirectory:
    """A shard's state directory (see the module), locked while this object lives.

    Args:
        root: the directory (made if missing); None: a shard without one, which saves and loads
            only where it is called to (:meth:`save`, :meth:`load`), never for a request.
        log: keep a write-ahead log in ``root/wal``.
        fsync_s: with ``log``, how often at most the log is forced to disk.
        recover_prefix: a damaged log (not only a write cut short by a crash) is recovered up
            to the damage, and what follows dropped, instead of refusing to start.

    Attributes:
        notes: what the start found worth telling an operator, one line each (a claim taken
            over, a write cut short removed, records dropped).
        log: the write-ahead log once :meth:`replay` opened it (None without one).

    Raises:
        DirectoryInUse: another shard holds the directory.
    """

    def __init__(self, root: str | None, log: bool = False, fsync_s: float = 0.05, recover_prefix: bool = False):
        if log and root is None:
            raise ValueError("a write-ahead log needs a state directory (het serve --state-dir DIR --wal)")
        self.root = None if root is None else files.make_directories(os.path.realpath(root))
        self.lock = None if root is None else DirectoryLock(self.root, "shard")
        taken = self.lock and self.lock.took_over()
        self.notes = [f"took over {self.root} from {taken}"] if taken else []
        self.logged, self.fsync_s, self.recover_prefix = log, fsync_s, recover_prefix
        self.log: WriteAheadLog | None = None
        self._after = 0  # the last push the log's base holds
        self._writer: int | None = None  # the pid of the child writing a base in the background
        self.rebases = Counter(wal_rebases=0, wal_rebases_failed=0)

    def resolve(self, name: str, write: bool) -> str:
        """The file a SAVE or LOAD request names (:func:`het.ps.server.store.saves.resolve`)."""
        if self.root is None:
            raise ValueError("this shard was started without a state directory (het serve --state-dir DIR): "
                             "it saves and loads nothing")
        return saves.resolve(self.root, name, write)

    # -- the log ----------------------------------------------------------------------------
    def read_base(self, stores: dict, index: int, num_shards: int) -> dict | None:
        """With a log, load its base save into ``stores`` (checked whole first); its header,
        or None when there is none (or no log)."""
        if not self.logged:
            return None
        base = os.path.join(files.make_directories(os.path.join(self.root, "wal")), "base.pt")
        if os.path.islink(base):
            raise ValueError(f"refused {base}: a symbolic link where the log's base save belongs")
        if not os.path.exists(base):
            return None
        header = saves.read(base, stores, index, num_shards)
        self._after = int(header.get("wal_lsn", 0))
        return header

    def replay(self, push: Callable[..., int]) -> int:
        """With a log, apply every push it holds past its base again, in order, with ``push``
        (:meth:`het.ps.server.shard.Shard.push`, not logged again), then open it for new records after
        the last intact one; how many were replayed. A log damaged, not only cut short by a
        crash, is refused (ValueError naming what would be lost) unless ``recover_prefix``."""
        if not self.logged:
            return 0
        directory = os.path.join(self.root, "wal")
        replayed = 0
        if os.path.exists(os.path.join(directory, wal.OLD)):  # a base was being written when the shard ended
            replayed = self._replay(directory, wal.OLD, push, final=False)
        return replayed + self._replay(directory, "log", push, final=True)

    def _replay(self, directory: str, name: str, push, final: bool) -> int:
        found = wal.scan(directory, self._after, name)
        if found.problem is not None and not found.torn and not self.recover_prefix:
            raise ValueError(f"{found.problem}: the pushes from there may have been acknowledged, so the shard "
                             f"refuses to start; `het serve --wal-recover-prefix` recovers the {found.records} "
                             f"records before byte {found.end} and drops the rest")
        if not final and found.problem is not None and not self.recover_prefix:  # it was on disk before set aside
            raise ValueError(f"{found.problem}: refusing to start; `het serve --wal-recover-prefix` recovers the "
                             f"{found.records} records before byte {found.end} and drops the rest")
        replayed = 0
        for record in wal.read_log(directory, self._after, found.end, name):
            session = (record["session"], record["seq"]) if record.get("session") else None
            try:
                push(record["table"], record["keys"], record["grads"], record["counts"], record["step"],
                     sq=record.get("sq"), logged=False, session=session)
            except ValueError:  # refused when it was sent too (logged before it was applied)
                pass
            replayed += 1
        if found.torn:
            self.notes.append(f"removed {found.problem}")
        elif found.problem is not None:
            self.notes.append(f"recovered the {found.records} records before byte {found.end} and dropped the rest "
                              f"(--wal-recover-prefix): {found.problem}")
        if final:
            self.log = WriteAheadLog(directory, self.fsync_s, max(self._after, found.last_lsn), valid_bytes=found.end)
        else:
            self.notes.append(f"replayed {replayed} pushes of {found.path}, set aside while a base was written")
        self._after = max(self._after, found.last_lsn)
        return replayed

    @property
    def old_log(self) -> bool:
        """Whether a log set aside (``log.old``) waits for a base that holds it."""
        return self.root is not None and os.path.exists(os.path.join(self.root, "wal", wal.OLD))

    def rebase(self, stores: dict, header: dict, background: bool = False) -> None:
        """Write ``stores`` as they are as the log's base and start the log afresh: what keeps
        the log under a bound (``wal_max``). A crash between the two replays nothing twice: the
        base names its last push. ``background``: the log is set aside (``log.old``) and a child
        process writes the base from a copy-on-write image of this one, while the shard serves
        on; :meth:`settle` removes ``log.old`` once the base holds it (one child at a time: a
        call while one writes does nothing)."""
        if self.settle(block=False) is not None:
            return
        self.rebases["wal_rebases"] += 1
        if not background or self.old_log:  # a base that failed in the background: this one in the foreground
            saves.write(self._base(), stores, {**header, "wal_lsn": self._lsn()})
            self.log.truncate()
            self._drop_old_log()
            return
        header = {**header, "wal_lsn": self._lsn()}
        self.log.rotate()
        self._writer = _write_in_child(self._base(), stores, header)

    def bound_log(self, most: int, stores: dict, header: Callable[[], dict], background: bool) -> None:
        """After a push: a base written in the background looked after, and a log past ``most``
        bytes rebased (:meth:`rebase`; ``header()``: the save's header). When the base before
        is still being written, the shard waits for it: the log and the one set aside stay
        under ``2 * most`` bytes (and a push) together."""
        self.settle(block=False)
        if self.log.size > most:
            self.settle(block=True)
            try:
                self.rebase(stores, header(), background)
            except OSError as e:  # the push is applied and logged: a base not written now is written next time
                self.rebases["wal_rebases_failed"] += 1
                self.notes.append(f"a base of the log could not be written: {e}")

    def settle(self, block: bool = True) -> int | None:
        """The child writing a base: None once none is (its log set aside removed if it wrote
        the base; counted in ``wal_rebases_failed`` if not), else its pid (``block``: wait)."""
        if self._writer is None:
            return None
        pid, status = os.waitpid(self._writer, 0 if block else os.WNOHANG)
        if pid == 0:
            return self._writer
        self._writer = None
        if os.waitstatus_to_exitcode(status) == 0:
            self._drop_old_log()
        else:  # the log set aside stays, and is replayed after the base before it; the next rebase is whole
            self.rebases["wal_rebases_failed"] += 1
        return None

    def stats(self) -> dict:
        """With a log: its counters (:class:`WriteAheadLog`), the rebases, and the bytes of log on
        disk (``wal_log_bytes``: the log, and the one set aside while a base is written)."""
        if self.log is None:
            return {}
        directory = os.path.join(self.root, "wal")
        on_disk = sum(os.path.getsize(os.path.join(directory, name)) for name in ("log", wal.OLD)
                      if os.path.exists(os.path.join(directory, name)))
        return {**self.log.stats, **self.rebases, "wal_log_bytes": on_disk}

    def _drop_old_log(self) -> None:
        old = os.path.join(self.root, "wal", wal.OLD)
        if os.path.exists(old):
            os.unlink(old)
            files.fsync_directory(os.path.dirname(old))

    # -- saves ------------------------------------------------------------------------------
    def save(self, path: str, stores: dict, header: dict, rows_only: bool = False) -> None:
        """Write a save of ``stores`` at ``path`` (:func:`het.ps.server.store.saves.write`); with a
        log, it becomes the log's base and the log starts afresh, unless it is ``rows_only``."""
        self.settle()  # a base written in the background must not land over this one
        saves.write(path, stores, {**header, "wal_lsn": self._lsn()}, rows_only)
        if self.log is not None and not rows_only:
            layout.link_save(path, self._base())  # no copy: the save's own files, whatever becomes of their names
            self.log.truncate()  # a crash between the two replays nothing twice: the base names its last push
            self._drop_old_log()

    def drop(self, path: str | None) -> None:
        """Remove the save at ``path`` (:meth:`resolve`'d), its rows directories, and its folder
        once empty; nothing when there is none (or ``path`` is None)."""
        if path is None or not os.path.isfile(path) or path == self._base():
            return  # (the shard refuses a SAVE that would drop its own new file before it writes)
        os.unlink(path)
        saves.remove_other_rows(path, None)
        folder = os.path.dirname(path)
        if folder != self.root and not os.listdir(folder):
            os.rmdir(folder)
        files.fsync_directory(os.path.dirname(folder) if folder != self.root else folder)

    def load(self, path: str, stores: dict, index: int, num_shards: int) -> dict:
        """Load the save at ``path`` into ``stores`` (checked whole first; refused whole); with
        a log, the state loaded is written as its base and the log starts afresh. The save's
        header."""
        self.settle()
        header = saves.read(path, stores, index, num_shards)
        if self.log is not None:
            kept = {k: header[k] for k in ("index", "num_shards", "applied") if k in header}
            saves.write(self._base(), stores, {**kept, "wal_lsn": self._lsn()})
            self.log.truncate()
            self._drop_old_log()
        return header

    def close(self) -> None:
        """A clean stop: a base being written finished, the log forced to disk and closed, the
        directory let go."""
        self.settle()
        if self.log is not None:
            self.log.close()
            self.log = None
        if self.lock is not None:
            self.lock.release()

    def abandon(self) -> None:
        """Let go of the directory as a shard killed (-9) does: the log closed without forcing
        it to disk, the claim still naming this holder (what a restart finds; for tests)."""
        if self.log is not None:
            os.close(self.log.fd)
            self.log = None
        if self.lock is not None:
            self.lock.abandon()

    def _base(self) -> str:
        return os.path.join(self.root, "wal", "base.pt")

    def _lsn(self) -> int:
        return self.log.lsn if self.log is not None else 0


def _write_in_child(path: str, stores: dict, header: dict) -> int:
    """Fork a child that writes the save of ``stores`` at ``path`` and exits (0: written); its
    pid. The child sees the tables as they are at the fork, whatever the shard changes after,
    touches nothing but the save's files, and dies with the shard (a shard killed must not
    have a stale base land after its successor started). Python 3.12 warns of any fork in a
    process with threads (ZeroMQ's I/O threads here): the child takes no lock another thread
    may hold, writing files only, so the warning is silenced."""
    parent = os.getpid()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the shard's handlers
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        die_with_parent(signal.SIGKILL)
        if os.getppid() == parent:  # not orphaned before the line above took hold
            import torch

            torch.set_num_threads(1)  # the shard's OpenMP pool did not survive the fork: run inline
            saves.write(path, stores, header)
            code = 0
    finally:
        os._exit(code)
