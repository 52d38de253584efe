"""A shard's state directory: the one place SAVE and LOAD requests may name.

A request names a file by a relative name (``ckpt/shard-0.pt``): no absolute path, no ``..``,
nothing that resolves out of the directory (a symlink leading out), and only regular files
(not a FIFO, which would hang the shard, nor a device). A refused name changes nothing, and the
error does not say whether anything exists outside the directory.
"""

from __future__ import annotations

import os
import stat
import tempfile


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


def temporary() -> str:
    """A new state directory for a shard that was given none (in-process, tests)."""
    return tempfile.mkdtemp(prefix="het-shard-state-")
