"""A shard's state directory, owned whole: locked against a second shard, saves written whole and
read back checked, and the write-ahead log recovered before the shard serves.

``STATE_DIR`` holds:

- ``lock``: the shard's claim on the directory (:class:`het.lock.DirectoryLock`: its pid, host
  and address); a second shard on the directory refuses to start, in one line, and one that
  finds the claim of a shard that ended without a clean stop takes it over and says so;
- ``wal/``: the write-ahead log and its base save (:mod:`het.ps.store.wal`);
- ``tier/``: the disk tier's segment files (:mod:`het.ps.store.disk`), emptied at start;
- whatever SAVE requests named (:mod:`het.ps.store.saves`), never one of the names above.

Every file the shard writes there is created without following a link and under a name no one
else picked, forced to disk, then renamed into place (:mod:`het.files`); every save and segment
is read back against its checksums before a row of it is trusted.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from het import files
from het.lock import DirectoryLock
from het.ps.store import saves, wal
from het.ps.store.wal import WriteAheadLog


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

    def resolve(self, name: str, write: bool) -> str:
        """The file a SAVE or LOAD request names (:func:`het.ps.store.saves.resolve`)."""
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
        (:meth:`het.ps.shard.Shard.push`, not logged again), then open it for new records after
        the last intact one; how many were replayed. A log damaged, not only cut short by a
        crash, is refused (ValueError naming what would be lost) unless ``recover_prefix``."""
        if not self.logged:
            return 0
        directory = os.path.join(self.root, "wal")
        found = wal.scan(directory, self._after)
        if found.problem is not None and not found.torn and not self.recover_prefix:
            raise ValueError(f"{found.problem}: the pushes from there may have been acknowledged, so the shard "
                             f"refuses to start; `het serve --wal-recover-prefix` recovers the {found.records} "
                             f"records before byte {found.end} and drops the rest")
        replayed = 0
        for record in wal.read_log(directory, self._after, found.end):
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
        self.log = WriteAheadLog(directory, self.fsync_s, max(self._after, found.last_lsn), valid_bytes=found.end)
        return replayed

    # -- saves ------------------------------------------------------------------------------
    def save(self, path: str, stores: dict, header: dict) -> None:
        """Write a save of ``stores`` at ``path`` (:func:`het.ps.store.saves.write`); with a
        log, it becomes the log's base and the log starts afresh."""
        saves.write(path, stores, {**header, "wal_lsn": self._lsn()})
        if self.log is not None:
            saves.link_save(path, self._base())  # no copy: the save's own files, whatever becomes of their names
            self.log.truncate()  # a crash between the two replays nothing twice: the base names its last push

    def load(self, path: str, stores: dict, index: int, num_shards: int) -> dict:
        """Load the save at ``path`` into ``stores`` (checked whole first; refused whole); with
        a log, the state loaded is written as its base and the log starts afresh. The save's
        header."""
        header = saves.read(path, stores, index, num_shards)
        if self.log is not None:
            kept = {k: header[k] for k in ("index", "num_shards", "applied") if k in header}
            saves.write(self._base(), stores, {**kept, "wal_lsn": self._lsn()})
            self.log.truncate()
        return header

    def close(self) -> None:
        """A clean stop: the log forced to disk and closed, the directory let go."""
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
