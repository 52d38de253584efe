"""Damaging files het wrote, as a failing disk would (tests only)."""

from __future__ import annotations

import zipfile

from het.files import member_offset


def flip_in_largest_member(path, bit: int = 0x01) -> None:
    """``bit`` flipped in a byte in the middle of the zip file's largest member (a table's rows)."""
    with open(path, "rb") as f, zipfile.ZipFile(f) as z:
        info = max(z.infolist(), key=lambda i: i.file_size)
        at = member_offset(f, info) + info.file_size // 2
    data = bytearray(path.read_bytes())
    data[at] ^= bit
    path.write_bytes(bytes(data))
