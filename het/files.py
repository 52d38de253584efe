"""Writing files and directories so that a failure, a crash or a planted link cannot leave a
half-written result where a complete one is expected, nor write anywhere else; reading back
only what was written.

- :func:`create`: a new file, opened so that it follows no link and reuses no name.
- :func:`write_file`: a file written whole under a fresh temporary name beside it, forced to
  disk, renamed into place, the directory forced to disk; :func:`link_into_place` the same for
  a hard link of an existing file.
- :func:`link_or_copy`: a hard link, or a copy where none can be made; never through a link.
- :func:`make_directories`: directories made, refused through a link planted on the way.
- :func:`check_zip`: a zip file (``torch.save``'s) read back in blocks against the CRC-32 of
  every member: a file cut off or changed is a :class:`DamagedFile` naming it and where.
- :func:`block_crcs`, :func:`check_blocks`: any file's CRC-32 a block, kept beside it (an
  export's manifest, a prepared directory's ``meta.json``), and the file read back against them.
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
import errno
import os
import secrets
import shutil
import stat
import zipfile
import zlib
from collections.abc import Callable, Iterator
from typing import BinaryIO

CHECK_BLOCK = 1 << 20  # bytes read at once when a file is checked: memory stays this, whatever its size
CRC_BLOCK = 4 << 20  # bytes a CRC-32 of block_crcs covers


class DamagedFile(ValueError):
    """A file het wrote that does not read back as written (cut off or changed): the message
    names the file and where."""


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


def write_file(path: str, write: Callable[[BinaryIO], None], mode: int = 0o644) -> None:
    """Write the file ``path`` whole or not at all: ``write(f)`` fills a new file under a
    fresh temporary name beside it (:func:`create`: no link followed), which is forced to disk
    and renamed to ``path`` (a file or a link there is replaced, not written through), and the
    directory is forced to disk. On an error the temporary file goes and ``path`` is as it was.

    Example:
        >>> import tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "f")
        >>> write_file(path, lambda f: f.write(b"whole"))
        >>> open(path, "rb").read(), os.listdir(os.path.dirname(path))
        (b'whole', ['f'])
    """
    directory = os.path.dirname(os.path.abspath(path))
    tmp, f = _temporary(path, mode)
    try:
        with f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise
    fsync_directory(directory)


def link_or_copy(src: str, dst: str) -> None:
    """``dst`` a hard link of ``src`` (no copy of a big file), or a copy where no link can be
    made (another filesystem). A name already at ``dst``, a link included, is refused
    (FileExistsError): nothing is written through it."""
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError as e:
        if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise
        with open(src, "rb") as source, create(dst) as out:
            shutil.copyfileobj(source, out, CHECK_BLOCK)


def link_into_place(src: str, dst: str) -> None:
    """``dst`` replaced whole by a link of ``src`` (:func:`link_or_copy` under a fresh
    temporary name, renamed), the directory forced to disk."""
    tmp, f = _temporary(dst, 0o644)
    f.close()
    os.remove(tmp)  # the name was ours: it takes the link now
    try:
        link_or_copy(src, tmp)
        os.replace(tmp, dst)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise
    fsync_directory(os.path.dirname(os.path.abspath(dst)))


def make_directories(path: str) -> str:
    """``path`` made as a directory (and those above it), refused (NotADirectoryError) when a
    directory on the way is a symbolic link: nothing is made through one. ``path`` is named
    as the real path of its parent (its symbolic links resolved)."""
    path = os.path.abspath(path)
    if os.path.realpath(path) != path:
        raise NotADirectoryError(f"refused {path!r}: a directory on the way there is a symbolic link")
    os.makedirs(path, exist_ok=True)
    return path


def check_zip(path: str) -> None:
    """Read the zip file at ``path`` (a ``torch.save`` file) back in blocks of
    :data:`CHECK_BLOCK` bytes, every member against the CRC-32 its entry holds; a file that is
    cut off, changed, or not a zip file is a :class:`DamagedFile` naming it and the bytes."""
    try:
        with open(path, "rb") as f, zipfile.ZipFile(f) as z:
            for info in z.infolist():
                start = member_offset(f, info)
                try:
                    with z.open(info) as member:
                        while member.read(CHECK_BLOCK):
                            pass
                except (zipfile.BadZipFile, EOFError, ValueError, NotImplementedError) as e:
                    raise DamagedFile(f"{path}: {info.filename}, bytes {start}..{start + info.compress_size - 1}, "
                                      f"does not read back as written ({e}): damaged") from None
    except zipfile.BadZipFile as e:
        raise DamagedFile(f"{path}: not a whole file as written ({e}): cut off or damaged") from None


def block_crcs(path: str, block: int = CRC_BLOCK) -> dict:
    """A file's size and the CRC-32 of each ``block`` bytes of it, read a block at a time: what
    :func:`check_blocks` reads it back against."""
    crcs, size = [], 0
    with open(path, "rb") as f:
        while chunk := f.read(block):
            crcs.append(zlib.crc32(chunk))
            size += len(chunk)
    return {"bytes": size, "block": block, "crc32": crcs}


def check_blocks(path: str, entry: dict, remedy: str, error: type = None) -> None:
    """Read ``path`` back against its :func:`block_crcs` ``entry``; ``error`` (a ValueError,
    :class:`DamagedFile` by default) names the file and the bytes of its first block that
    differs, and ``remedy``: what to do about it."""
    error = error or DamagedFile
    try:
        size = os.path.getsize(path)
    except OSError:
        raise error(f"{path}: missing (listed with {entry['bytes']} bytes); {remedy}") from None
    if size != entry["bytes"]:
        raise error(f"{path}: {size} bytes, {entry['bytes']} when written: damaged or replaced; {remedy}")
    block = entry["block"]
    with open(path, "rb") as f:
        for i, expected in enumerate(entry["crc32"]):
            if zlib.crc32(f.read(block)) != expected:
                raise error(f"{path}: checksum mismatch in bytes {i * block}..{min(size, (i + 1) * block) - 1}: "
                            f"the file is damaged; {remedy}")


def member_offset(fp, info: zipfile.ZipInfo) -> int:
    """Where a zip member's bytes start in the file ``fp``: past its local header, name and
    extra field."""
    fp.seek(info.header_offset)
    header = fp.read(30)
    if header[:4] != b"PK\x03\x04":
        raise DamagedFile(f"{getattr(fp, 'name', 'zip file')}: no local header for {info.filename} at byte "
                          f"{info.header_offset}: damaged")
    name_len, extra_len = int.from_bytes(header[26:28], "little"), int.from_bytes(header[28:30], "little")
    return info.header_offset + 30 + name_len + extra_len


def open_own(path: str, flags: int, mode: int = 0o600) -> int:
    """``os.open`` of a file a process keeps for itself (a log, a lock), never through a link:
    a symbolic link at ``path`` is refused (OSError saying so, in one line)."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OSError(e.errno, f"refused {path}: a symbolic link where a file of its own belongs") from None
        raise


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


def _temporary(path: str, mode: int) -> tuple[str, BinaryIO]:
    """A new file beside ``path`` under a fresh name (``.NAME.tmp-XXXXXXXX``), open for writing."""
    directory, name = os.path.split(os.path.abspath(path))
    while True:
        tmp = os.path.join(directory, f".{name}.tmp-{secrets.token_hex(4)}")
        try:
            return tmp, create(tmp, mode)
        except FileExistsError:
            continue


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
