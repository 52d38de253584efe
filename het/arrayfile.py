"""A file of named arrays that het can trust again: checksummed, written whole or not at all.

Layout: a header ``HETARR1\\n``, then each array's raw bytes (64-byte aligned), then the
manifest (JSON: metadata, and per array its dtype, shape, offset and a CRC-32 of its bytes),
then the manifest's length and CRC-32 (8 + 4 bytes) and ``\\nHETEND\\n``. A reader checks the
end first (a file cut off mid-write has none), then the manifest's CRC, then each array's
(:func:`read`); any mismatch is an :class:`ArrayFileError` naming the file and what is wrong.

Written under a temporary name in the same directory (created exclusively: a link planted
there is not followed), fsynced, renamed into place, the directory fsynced
(:func:`het.files.write_file`).
"""

from __future__ import annotations

import json
import struct
import zlib

import numpy as np

from het import files

MAGIC, END = b"HETARR1\n", b"\nHETEND\n"
_TAIL = struct.Struct("<QI")
_ALIGN = 64


class ArrayFileError(files.DamagedFile):
    """A file that is not a whole, intact array file."""


def write(path: str, arrays: dict[str, np.ndarray], meta: dict) -> int:
    """Write ``arrays`` and ``meta`` (JSON-able) to ``path`` atomically; the bytes written.

    Example:
        >>> import tempfile
        >>> path = tempfile.mkdtemp() + "/a.het"
        >>> _ = write(path, {"keys": np.arange(3)}, {"version": 7})
        >>> meta, arrays = read(path)
        >>> meta["version"], arrays["keys"].tolist()
        (7, [0, 1, 2])
    """
    written = []

    def fill(f) -> None:
        f.write(MAGIC)
        entries, offset = {}, len(MAGIC)
        for name, array in arrays.items():
            data = np.ascontiguousarray(array)
            pad = -offset % _ALIGN
            f.write(b"\0" * pad)
            offset += pad
            raw = data.tobytes()
            entries[name] = {"dtype": data.dtype.str, "shape": list(data.shape), "offset": offset,
                             "crc32": zlib.crc32(raw)}
            f.write(raw)
            offset += len(raw)
        manifest = json.dumps({"meta": meta, "arrays": entries}, sort_keys=True).encode()
        f.write(manifest + _TAIL.pack(len(manifest), zlib.crc32(manifest)) + END)
        written.append(f.tell())

    files.write_file(path, fill)
    return written[0]


def read(path: str) -> tuple[dict, dict[str, np.ndarray]]:
    """``(meta, arrays)`` of the file at ``path``, every checksum checked."""
    with open(path, "rb") as f:
        data = f.read()
    tail = _TAIL.size + len(END)
    if len(data) < len(MAGIC) + tail or data[:len(MAGIC)] != MAGIC or data[-len(END):] != END:
        raise ArrayFileError(f"{path}: not a whole array file ({len(data)} bytes, no end marker: cut off or "
                             f"not het's)")
    length, crc = _TAIL.unpack_from(data, len(data) - tail)
    start = len(data) - tail - length
    manifest = data[start:start + length] if start >= len(MAGIC) else b""
    if zlib.crc32(manifest) != crc or not manifest:
        raise ArrayFileError(f"{path}: its manifest's checksum does not match: damaged")
    doc = json.loads(manifest)
    arrays = {}
    for name, e in doc["arrays"].items():
        dtype = np.dtype(e["dtype"])
        size = int(np.prod(e["shape"], dtype=np.int64)) * dtype.itemsize
        raw = data[e["offset"]:e["offset"] + size]
        if len(raw) != size or zlib.crc32(raw) != e["crc32"]:
            raise ArrayFileError(f"{path}: array {name!r} (bytes {e['offset']}..{e['offset'] + size - 1}) does not "
                                 f"match its checksum: damaged")
        arrays[name] = np.frombuffer(raw, dtype=dtype).reshape(e["shape"])
    return doc["meta"], arrays
