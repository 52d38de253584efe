"""An export directory on disk: its manifest, its files' checksums, and how it is written whole.

::

    OUT/export.json            the manifest (format, version, model, tables, input spec, files)
    OUT/dense.pt               the dense model's parameters (torch.save)
    OUT/dense.pt2              the dense model as a torch.export program, where it exports
    OUT/tables/<name>/rows.npy        rows: float32, float16 or uint8 (int8 quantised)
    OUT/tables/<name>/qparams.npy     int8: each row's float16 scale and bias
    OUT/tables/<name>/hashes.npy      dynamic tables: the key index (het.export.index)
    OUT/tables/<name>/directory.npy
    OUT/input/vocab.npy        label-encoded Criteo: the vocabulary of het data prepare criteo

Every file is listed in the manifest with its size and a CRC-32 of each block of
:data:`BLOCK` bytes, and the manifest carries a CRC-32 of itself: a damaged file is refused
naming the file and the offset of its first bad block (:func:`verify`), never read as rows.

An export is written into a fresh directory of its own beside ``OUT``, every file fsynced, then
renamed into place and the parent fsynced (:func:`het.files.atomic_directory`): ``OUT`` holds a
whole export or what it held before, never half of one.
"""

from __future__ import annotations

import json
import os
import zlib

from het import files

FORMAT, VERSION = "het-export", 1
MANIFEST = "export.json"
BLOCK = files.CRC_BLOCK


class ExportError(ValueError):
    """An export that cannot be used: another format or version, a damaged or missing file."""


def file_entry(path: str, block: int = BLOCK) -> dict:
    """A file's size and the CRC-32 of each block of it, read in blocks."""
    return files.block_crcs(path, block)


def verify(root: str, rel: str, entry: dict) -> None:
    """Check ``root/rel`` against its manifest entry; ExportError names the file and the offset
    of its first block that differs."""
    files.check_blocks(os.path.join(root, rel), entry, "export it again", ExportError)


def write_manifest(directory: str, body: dict) -> None:
    """``directory/export.json``: ``body`` and a CRC-32 of its canonical JSON."""
    text = json.dumps(body, sort_keys=True)
    with open(os.path.join(directory, MANIFEST), "w") as f:
        json.dump({"manifest": body, "crc32": zlib.crc32(text.encode())}, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())


def read_manifest(directory: str) -> dict:
    """The manifest of the export in ``directory``, checked: its format, version and checksum.

    Example:
        >>> import tempfile
        >>> read_manifest(tempfile.mkdtemp())
        Traceback (most recent call last):
        ...
        het.export.layout.ExportError: expected an export directory holding export.json (het export CKPT OUT writes one), got a directory holding []
    """
    path = os.path.join(directory, MANIFEST)
    if not os.path.isdir(directory):
        raise ExportError(f"expected an export directory (het export CKPT OUT writes one), got "
                          f"{'a file' if os.path.exists(directory) else 'nothing'} at {directory!r}")
    if not os.path.isfile(path):
        raise ExportError(f"expected an export directory holding {MANIFEST} (het export CKPT OUT writes one), "
                          f"got a directory holding {sorted(os.listdir(directory))[:8]}")
    try:
        with open(path) as f:
            outer = json.load(f)
        body = outer["manifest"]
        ok = zlib.crc32(json.dumps(body, sort_keys=True).encode()) == outer["crc32"]
    except (ValueError, KeyError, TypeError) as e:
        raise ExportError(f"{path}: not an export manifest ({type(e).__name__}: {e})") from None
    if not ok:
        raise ExportError(f"{path}: the manifest's checksum does not match: it is damaged")
    got = (body.get("format"), body.get("version"))
    if got != (FORMAT, VERSION):
        raise ExportError(f"{path}: an export of format {got[0]!r} version {got[1]!r}; this het reads "
                          f"{FORMAT!r} version {VERSION}: export the checkpoint again with this version")
    return body
