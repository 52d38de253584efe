"""Writing files and directories so that a failure, a crash or a planted link cannot leave a
half-written result where a complete one is expected, nor write anywhere else.

- :func:`create`: a new file, opened so that it follows no link and reuses no name.
- :func:`atomic_directory`: a directory written whole under a fresh temporary name, forced to
  disk, then put in place (renamed, replacing the directory there before; or its entries moved
  into an existing directory, the one that marks it complete last); on a failure the temporary
  directory goes and the previous one is left as it was.
- :func:`fsync_tree`, :func:`fsync_directory`: what is written, forced to disk.

A crash (kill -9, power loss) while the temporary directory is written leaves it as
``NAME.tmp-XXXXXXXX`` (beside ``NAME``, or inside it); a crash between the two renames of a
replacement leaves the previous directory as ``NAME.old-XXXXXXXX`` and the new one complete
under its temporary name; a crash while entries are moved leaves ``NAME`` without its marker.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from typing import BinaryIO


def create(path: str, mode: int = 0o644) -> BinaryIO:
    """A new file at ``path``, open for writing (binary). It must not exist: a name already
    there, a symbolic link included, is refused (FileExistsError), so nothing is written
    through a link someone planted.

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> os.symlink("/etc/hostname", f"{d}/planted")
        >>> create(f"{d}/planted")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        FileExistsError: [Errno 17] File exists: '.../planted'
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    return os.fdopen(os.open(path, flags, mode), "wb")


def fsync_directory(path: str) -> None:
    """Force a directory's entries (names created, renamed, removed) to disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str) -> None:
    """Force every file under ``root`` to disk, then every directory, deepest first (links are
    not followed: a link's own entry is the directory's)."""
    for directory, _, files in os.walk(root, topdown=False):
        for name in files:
            path = os.path.join(directory, name)
            if os.path.islink(path):
                continue
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_directory(directory)


@contextlib.contextmanager
def atomic_directory(path: str, marker: str | None = None) -> Iterator[str]:
    """Write the directory ``path`` whole or not at all: yields a fresh, empty temporary
    directory to write in; when the ``with`` block ends without an error, everything in it is
    forced to disk and put in place, and on an error (Ctrl-C too) it is removed, with the
    directories made above ``path``, and ``path`` is left as it was.

    Args:
        path: the directory to write (directories above it are made as needed); through a
            symbolic link, the directory it names.
        marker: the entry that marks the directory complete, as ``meta.json`` does a prepared
            data set (readers trust nothing without it). ``None``: the temporary directory is
            made beside ``path`` and renamed to it, replacing a directory there (whose mode it
            takes) whole. Given: an existing ``path`` is updated in place (a user's other files
            there stay, and neither a mount point nor a shell's working directory is moved):
            the temporary directory is made inside it; on success ``path``'s marker is removed,
            the new entries replace those of the same names one by one, the marker last.

    Example:
        >>> import tempfile
        >>> out = os.path.join(tempfile.mkdtemp(), "out")
        >>> with atomic_directory(out, marker="done") as tmp:
        ...     for name in ("a", "done"):
        ...         with create(os.path.join(tmp, name)) as f:
        ...             _ = f.write(b"1")
        >>> with atomic_directory(out, marker="done") as tmp:
        ...     raise RuntimeError("stopped")
        Traceback (most recent call last):
        ...
        RuntimeError: stopped
        >>> os.listdir(os.path.dirname(out)), sorted(os.listdir(out))
        (['out'], ['a', 'done'])
    """
    final = os.path.realpath(path)
    if os.path.exists(final) and not os.path.isdir(final):
        raise NotADirectoryError(f"{path!r} is a file, expected a directory (or no such name)")
    in_place = marker is not None and os.path.isdir(final)
    parent, name = os.path.split(final)
    made = None if in_place else _first_missing(parent)
    os.makedirs(parent, exist_ok=True)
    try:
        tmp = _fresh_directory(final if in_place else parent, f"{name}.tmp-")
    except BaseException:
        _remove(made)
        raise
    try:
        yield tmp
        fsync_tree(tmp)
        if in_place:
            _update(tmp, final, marker)
        else:
            _replace(tmp, final)
    except BaseException:
        _remove(tmp)
        _remove(made)
        raise


def _replace(tmp: str, final: str) -> None:
    """``tmp`` renamed to ``final``; a directory there before goes whole."""
    parent, name = os.path.split(final)
    if not os.path.isdir(final):
        os.rename(tmp, final)
    else:
        os.chmod(tmp, stat.S_IMODE(os.stat(final).st_mode))
        old = _fresh_directory(parent, f"{name}.old-")
        os.rename(final, old)  # onto the empty directory just made: the name is ours
        os.rename(tmp, final)
        shutil.rmtree(old)
    fsync_directory(parent)


def _update(tmp: str, final: str, marker: str) -> None:
    """``tmp``'s entries (``tmp`` inside ``final``) moved into ``final``, the marker removed
    first and moved last; ``tmp`` goes."""
    entries = sorted(os.listdir(tmp), key=lambda e: (e == marker, e))  # the marker last
    in_final = [os.path.join(final, e) for e in entries]
    taken = [p for p in in_final if os.path.isdir(p) and not os.path.islink(p)]
    if taken:
        raise IsADirectoryError(f"{final} holds directories named as entries it is to hold: {taken}")
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(final, marker))
    fsync_directory(final)  # no complete-looking mix of old and new entries, even after a crash
    for entry in entries:
        os.replace(os.path.join(tmp, entry), os.path.join(final, entry))  # a link there is replaced, not followed
    os.rmdir(tmp)
    fsync_directory(final)


def _fresh_directory(parent: str, prefix: str) -> str:
    """A new directory ``parent/prefix + 8 random hex digits``, made by this call (mode 0777
    less the umask, as ``os.makedirs``'s): a name already there, a link included, is not used."""
    while True:
        path = os.path.join(parent, prefix + secrets.token_hex(4))
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            continue


def _first_missing(path: str) -> str | None:
    """The outermost directory that ``os.makedirs(path)`` would create (None: ``path`` exists)."""
    path, missing = os.path.abspath(path), None
    while not os.path.lexists(path):
        path, missing = os.path.dirname(path), path
    return missing


def _remove(path: str | None) -> None:
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)
