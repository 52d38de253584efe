"""Where a PS save sits on disk, which both sides read: shard ``i``'s file ``shard-<i>.pt``
with its rows directories beside it (``<file>.rows-<hex>``, a disk tier's rows), and how a save
is moved, linked or lent between a directory and the shards' state directories (a client's
:meth:`~het.ps.client.client.PSClient.save` of shards on a filesystem it sees; a shard's own
kept saves)."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil

from het import files


def rows_dirs(path: str) -> list[str]:
    """The rows directories beside the save at ``path`` (one; more only after a crash mid-save);
    a link planted at such a name is none."""
    return sorted(d for d in glob.glob(glob.escape(path) + ".rows-*") if not os.path.islink(d) and os.path.isdir(d))


def link_save(src: str, dst: str) -> None:
    """Make ``dst`` a save equal to ``src`` by hard links (copies across filesystems); an older
    save at ``dst`` is replaced whole."""
    suffixes = [d[len(src):] for d in rows_dirs(src)]
    for suffix in suffixes:
        _link_tree(src + suffix, dst + suffix)
    files.link_into_place(src, dst)
    for d in rows_dirs(dst):
        if d[len(dst):] not in suffixes:
            shutil.rmtree(d, ignore_errors=True)


def move_save(src: str, dst: str) -> str:
    """Move a save and its rows directories; the new path."""
    for d in rows_dirs(src):
        shutil.move(d, dst + d[len(src):])
    return shutil.move(src, dst)


def _link_tree(src: str, dst: str) -> None:
    for root, _, names in os.walk(src):
        out = files.make_directories(os.path.join(dst, os.path.relpath(root, src)))
        for name in names:
            files.link_or_copy(os.path.join(root, name), os.path.join(out, name))
        files.fsync_directory(out)


def shard_name(index: int) -> str:
    """The file of shard ``index`` in a save: ``shard-<i>.pt``."""
    return f"shard-{index}.pt"


def collect(state_dirs: list[str], tag: str, directory: str) -> list[str]:
    """Move each shard's ``tag/shard-<i>.pt`` out of its state directory into ``directory``."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    for i, root in enumerate(state_dirs):
        paths.append(move_save(os.path.join(root, tag, shard_name(i)), os.path.join(directory, shard_name(i))))
        os.rmdir(os.path.join(root, tag))
    return paths


@contextlib.contextmanager
def lent(state_dirs: list[str], tag: str, directory: str):
    """``directory/shard-<i>.pt`` linked (or copied) into each shard's state directory as
    ``tag/shard-<i>.pt`` within the block, removed after it."""
    sources = [os.path.join(directory, shard_name(i)) for i in range(len(state_dirs))]
    missing = [p for p in sources if not os.path.isfile(p)]
    if missing:
        raise ValueError(f"no saved shard at {missing[0]}: expected shard-<i>.pt for each of the "
                         f"{len(state_dirs)} shards in {directory}")
    try:
        for i, (root, src) in enumerate(zip(state_dirs, sources)):
            os.makedirs(os.path.join(root, tag))
            link_save(src, os.path.join(root, tag, shard_name(i)))
        yield
    finally:
        for root in state_dirs:
            shutil.rmtree(os.path.join(root, tag), ignore_errors=True)
