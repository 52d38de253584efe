"""A shard's state directory: the one place SAVE and LOAD requests may name.

A request names a file by a relative name (``ckpt/shard-0.pt``): no absolute path, no ``..``,
nothing that resolves out of the directory (a symlink leading out), only regular files (not a
FIFO, which would hang the shard, nor a device), and none of the shard's own names (:data:`OWN`:
its log, its disk tier, its lock; a save's temporary files and rows directories). A refused
name changes nothing, and the error does not say whether anything exists outside the
directory.
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import stat
import tempfile

from het import files
from het.ps.protocol.layout import rows_dirs

OWN = ("wal", "tier", "lock")  # the shard's own names at the top of its state directory
_OWN_PARTS = (".tmp-", ".rows-")  # a save's temporary files and rows directories


def resolve(state_dir: str | None, name: str, write: bool) -> str:
    """The file ``name`` names inside ``state_dir``, checked; ValueError says why it is refused.

    Example:
        >>> with tempfile.TemporaryDirectory() as root:
        ...     resolve(root, "ckpt/shard-0.pt", write=True).endswith("ckpt/shard-0.pt")
        ...     resolve(root, "../etc/passwd", write=True)
        Traceback (most recent call last):
        ...
        ValueError: refused path '../etc/passwd': only a relative name inside the shard's state directory, without '..'
    """
    if state_dir is None:
        raise ValueError("this shard was started without a state directory (het serve --state-dir DIR): "
                         "it saves and loads nothing")
    parts = name.replace("\\", "/").split("/")
    if os.path.isabs(name) or any(p in ("", ".", "..") for p in parts) or "\0" in name:
        raise ValueError(f"refused path {name!r}: only a relative name inside the shard's state directory, "
                         f"without '..'")
    if parts[0] in OWN or any(mark in p for p in parts for mark in _OWN_PARTS):
        raise ValueError(f"refused path {name!r}: the shard's own files ({', '.join(OWN)}, names holding "
                         f"{' or '.join(_OWN_PARTS)}) are never a save's")
    root = os.path.realpath(state_dir)
    path = os.path.realpath(os.path.join(root, name))
    if os.path.commonpath([root, path]) != root:
        raise ValueError(f"refused path {name!r}: it leads out of the shard's state directory")
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if not write:
            raise ValueError(f"no saved shard at {name!r} in the state directory") from None
        return path
    if not stat.S_ISREG(mode):
        raise ValueError(f"refused path {name!r}: not a regular file")
    return path


# -- saves --------------------------------------------------------------------------------------
# A save is one file, ``shard-<i>.pt``; a shard with a disk tier adds a directory beside it,
# ``shard-<i>.pt.rows-<token>``, of hard links to the tier's segment files, which the file names
# (``rows``). A new save at the same path links a new directory, replaces the file (the one
# atomic step), then removes the old directory: a crash leaves the old save or the new one whole.
# Moving, lending or linking a save takes its rows directory along.

SAVE_FORMAT = 2  # 2: a disk tier's records carry checks (1: they do not, still read)
SAVE_FORMATS = (1, 2)


def check_format(saved, path: str) -> None:
    """ValueError unless ``saved`` (a save's object) is of a format this het reads."""
    got = saved.get("format") if isinstance(saved, dict) else type(saved).__name__
    if got not in SAVE_FORMATS:
        raise ValueError(f"{path}: save format {got!r}, expected one of {SAVE_FORMATS}")


def write(path: str, stores: dict, header: dict, rows_only: bool = False) -> None:
    """Write a shard's save to ``path``, atomically: ``header`` (its index and shard count, the
    last logged push it holds, each session's last push applied) and every store's state by
    table name (:meth:`het.ps.server.store.rowstore.RowStore.state_dict`); a store with files on disk
    links them into the rows directory beside the save instead of copying their rows. The
    rows directory, then the file, are on disk before the file takes its name
    (:func:`het.files.write_file`); the file is a zip whose members carry their CRC-32.
    ``rows_only``: the fixed tables' optimizer state is left out (a dynamic table's rows and
    state are one record) and the save says so: :func:`read` refuses it."""
    import torch

    files.make_directories(os.path.dirname(os.path.abspath(path)))
    rows = new_rows_suffix()
    tables = {name: t.state_dict(os.path.join(path + rows, table_dir(name))) for name, t in stores.items()}
    if rows_only:
        tables = {name: {k: v for k, v in t.items() if k != "optimizer" or "keys" in t} for name, t in tables.items()}
        header = {**header, "rows_only": True}
    rows = rows if os.path.isdir(path + rows) else None  # no store linked files: no rows directory
    if rows is not None:
        files.fsync_tree(path + rows)  # the segments' records on disk before a save names them
    saved = {"format": SAVE_FORMAT, **header, "tables": tables, "rows": rows}
    files.write_file(path, lambda f: torch.save(saved, f))  # a reader never sees half a save
    remove_other_rows(path, rows)


def read(path: str, stores: dict, index: int, num_shards: int) -> dict:
    """Load the save at ``path`` into ``stores`` (by table name), every one checked before any
    changes: a save of another format, shard or set of tables, one that does not fit a store,
    or one whose bytes or disk-tier records do not match their checksums, is refused
    (ValueError) and changes nothing. The save's header."""
    from het.ps.server.store.disk import check_saved  # imports torch, as a load does anyway

    saved = read_save(path)
    check_format(saved, path)
    if saved.get("rows_only"):
        raise ValueError(f"{path} holds rows only, without their optimizer state (a publication's snapshot): "
                         f"a shard cannot train on from it; load a checkpoint's save")
    if (saved["index"], saved["num_shards"]) != (index, num_shards):
        raise ValueError(f"{path} holds shard {saved['index']} of {saved['num_shards']}, "
                         f"this is shard {index} of {num_shards}")
    if set(saved["tables"]) != set(stores):
        raise ValueError(f"{path} holds tables {sorted(saved['tables'])}, expected {sorted(stores)}")
    for name, t in stores.items():
        t.check_state(saved["tables"][name], path)
        if "disk" in saved["tables"][name]:  # its records read back, in blocks
            check_saved(rows_dir(path, saved, name), saved["tables"][name]["disk"])
    for name, t in stores.items():  # all checked: now change
        t.load_state_dict(saved["tables"][name], rows_dir(path, saved, name))
    return {k: v for k, v in saved.items() if k not in ("tables", "rows")}

def new_rows_suffix() -> str:
    return f".rows-{secrets.token_hex(6)}"


def table_dir(table: str) -> str:
    """A table's directory in a disk tier and in a save's rows: its name, safe as a file name."""
    return "table-" + table.encode().hex()


def read_save(path: str) -> dict:
    """A save's file (its rows directory, if any, stays where it is), every byte checked
    against its checksum first (:func:`het.files.check_zip`: DamagedFile names the bytes)."""
    import pickle

    import torch  # saves are torch files; this module is imported by tools that need no torch
    files.check_zip(path)
    try:
        return torch.load(path, weights_only=True)
    except pickle.UnpicklingError as e:  # a file made by something else: tensors and plain values only
        raise ValueError(f"{path}: not a save het wrote ({str(e).strip().splitlines()[0][:200]})") from None


def rows_dir(path: str, saved: dict, table: str) -> str | None:
    """Where the save at ``path`` keeps ``table``'s disk-tier files (None: it has none)."""
    return os.path.join(path + saved["rows"], table_dir(table)) if saved.get("rows") else None


def remove_other_rows(path: str, keep: str | None) -> None:
    """Remove the rows directories of ``path`` but the one with suffix ``keep``."""
    for d in rows_dirs(path):
        if keep is None or d != path + keep:
            shutil.rmtree(d, ignore_errors=True)


def temporary() -> str:
    """A new state directory for a shard that was given none (in-process, tests)."""
    return tempfile.mkdtemp(prefix="het-shard-state-")


_LOCAL_ROOT: list[str] = []


def local(index: int) -> str:
    """A state directory for an in-process shard: under one temporary root of this process,
    removed when it exits."""
    if not _LOCAL_ROOT:
        _LOCAL_ROOT.append(tempfile.mkdtemp(prefix="het-local-shards-"))
        atexit.register(shutil.rmtree, _LOCAL_ROOT[0], True)
    return tempfile.mkdtemp(prefix=f"shard-{index}-", dir=_LOCAL_ROOT[0])


def check_shards_here(path: str, state: dict) -> None:
    """ValueError, saying what to do, for a checkpoint whose shards kept their saves in their own
    state directories (``het train --ps-saves-local``) and whose ``ps/`` does not hold copies."""
    named = state.get("ps_named")
    if named and not os.path.isdir(os.path.join(path, "ps")):
        raise ValueError(f"{path}: its PS rows stayed in each shard's state directory as {named['name']}/shard-<i>.pt "
                         f"(het train --ps-saves-local): copy those {named['num_shards']} files into {path}/ps/ first")
