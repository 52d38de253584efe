"""A compacted base starts as a copy of the base before it: the copy is checked block by block
against that base's manifest, so a damaged base is refused and never copied into a new one,
whether the kernel copies (copy_file_range) or the bytes are read and written by hand."""

from __future__ import annotations

import os

import numpy as np
import pytest

from het.export import compact, layout


@pytest.fixture
def base(tmp_path):
    root = tmp_path / "base"
    (root / "tables").mkdir(parents=True)
    data = np.random.default_rng(0).bytes(3 * 4096 + 100)
    (root / "tables" / "rows.npy").write_bytes(data)
    return root, layout.file_entry(str(root / "tables" / "rows.npy"), block=4096), data


@pytest.mark.parametrize("kernel", [True, False])
def test_a_copy_is_the_bytes_of_the_base(tmp_path, base, monkeypatch, kernel):
    root, entry, data = base
    if not kernel:
        def refuse(*args):
            raise OSError(38, "Function not implemented")
        monkeypatch.setattr(os, "copy_file_range", refuse)
    compact._copy_checked(str(root), str(tmp_path / "new"), "tables/rows.npy", entry)
    assert (tmp_path / "new" / "tables" / "rows.npy").read_bytes() == data


@pytest.mark.parametrize("where", [0, 4096 + 7, 3 * 4096 + 99])
def test_a_damaged_base_is_refused_naming_its_block(tmp_path, base, where):
    root, entry, data = base
    damaged = bytearray(data)
    damaged[where] ^= 0x40
    (root / "tables" / "rows.npy").write_bytes(bytes(damaged))
    with pytest.raises(layout.ExportError, match=f"checksum mismatch in its block {where // 4096}: the base is damaged"):
        compact._copy_checked(str(root), str(tmp_path / "new"), "tables/rows.npy", entry)


def test_a_base_cut_short_or_grown_is_refused(tmp_path, base):
    root, entry, data = base
    for i, changed in enumerate((data[:-1], data + b"x")):
        (root / "tables" / "rows.npy").write_bytes(changed)
        with pytest.raises(layout.ExportError, match="damaged"):
            compact._copy_checked(str(root), str(tmp_path / f"new{i}"), "tables/rows.npy", entry)
