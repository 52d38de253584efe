"""A directory one process at a time may own: :class:`DirectoryLock` (a shard's state
directory, :mod:`het.ps.server.store.state`)."""

from __future__ import annotations

import fcntl
import json
import os
import socket

from het.files import open_own


class DirectoryInUse(OSError):
    """A directory another process holds (:class:`DirectoryLock`)."""


class DirectoryLock:
    """A directory owned by one process at a time: an exclusive ``flock`` on ``DIR/lock``
    (opened without following a link), which the kernel lets go when the process ends, however
    it ends. The file names its holder (pid, host, and what :meth:`note` adds) for the refusal
    of another and for the one that takes over after a holder that ended without a clean stop.

    Args:
        directory: the directory, which exists.
        what: what holds it, for messages (``"shard"``).

    Raises:
        DirectoryInUse: another holds it; the message names the holder, in one line.

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> mine = DirectoryLock(d)
        >>> DirectoryLock(d)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        het.lock.DirectoryInUse: ... is in use by another process (pid ...): refused; give each its own directory
        >>> mine.release()
    """

    def __init__(self, directory: str, what: str = "process"):
        self.path, self.what = os.path.join(directory, "lock"), what
        fd = open_own(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        self._file = os.fdopen(fd, "r+b")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._read()
            self._file.close()
            raise DirectoryInUse(f"{directory} is in use by another {what} ({_holder(holder)}): refused; give "
                                 f"each its own directory") from None
        self.previous = self._read() or None  # a holder that ended without a clean stop
        self.fields = {"pid": os.getpid(), "host": socket.gethostname()}
        self._write()

    def note(self, **fields) -> None:
        """Add ``fields`` (an address, say) to what the file says of its holder."""
        self.fields.update(fields)
        self._write()

    def took_over(self) -> str | None:
        """What this holder took over from, in words (None: the directory was free)."""
        return None if self.previous is None else f"{_holder(self.previous)}, which ended without a clean stop"

    def release(self) -> None:
        """Let the directory go, saying no one holds it (a clean stop)."""
        if not self._file.closed:
            self._file.truncate(0)
            self._file.close()

    def abandon(self) -> None:
        """Let the directory go as a process that is killed does: the file still names this
        holder (what the next one finds; for tests)."""
        self._file.close()

    def _read(self) -> dict:
        self._file.seek(0)
        try:
            return json.loads(self._file.read(4096) or b"{}")
        except ValueError:
            return {}

    def _write(self) -> None:
        self._file.seek(0)
        self._file.truncate(0)
        self._file.write(json.dumps(self.fields).encode())
        self._file.flush()


def _holder(fields: dict) -> str:
    words = [f"pid {fields.get('pid', '?')}"]
    words += [f"on {fields['host']}"] if fields.get("host") and fields["host"] != socket.gethostname() else []
    words += [f"listening on {fields['address']}"] if fields.get("address") else []
    return " ".join(words)
