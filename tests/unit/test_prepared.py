"""The one writer and the one reader of prepared data (het.data.prepared), as every `het data
prepare` uses them: a preparation that fails, however, leaves the previous output as it was; one
that succeeds replaces its files and keeps a user's others, never writing through a planted link."""

import os

import numpy as np
import pytest

from het.data import criteo, criteo_hashed, table
from het.data.criteo import CriteoDataset
from het.data.prepared import PreparedDataset, SplitWriter, writing
from het.data.table import TableDataset, TableSpec

LINE = "1\t5" + "\t" * 12 + "\tabcdef01" * 26  # one valid raw Criteo line


def raw(tmp_path, lines: int = 20) -> str:
    path = tmp_path / "raw.tsv"
    path.write_text((LINE + "\n") * lines)
    return str(path)


def prepare_each(kind: str, tmp_path, out: str, **kwargs) -> dict:
    if kind == "criteo":
        return criteo.prepare(raw(tmp_path), out, progress=False, **kwargs)
    if kind == "criteo --hash":
        return criteo_hashed.prepare_hashed(raw(tmp_path), out, progress=False, **kwargs)
    (tmp_path / "t.csv").write_text("y,x,c\n" + "1,2,a\n0,3,b\n" * 10)
    return table.prepare_table(str(tmp_path / "t.csv"), out, TableSpec("y", ("x",), ("c",)), progress=False, **kwargs)


def contents(directory) -> dict:
    return {name: open(os.path.join(directory, name), "rb").read() for name in sorted(os.listdir(directory))}


KINDS = ["criteo", "criteo --hash", "table"]
BREAK = {"criteo": (criteo.Vocabulary, "encode"), "criteo --hash": (criteo_hashed, "criteo_keys"),
         "table": (table, "_convert")}  # a step of each pass that writes


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_a_preparation_that_fails_while_writing_leaves_the_previous_one_as_it_was(kind, error, tmp_path,
                                                                                 monkeypatch):
    out = tmp_path / "out"
    prepare_each(kind, tmp_path, str(out), max_rows=10)
    (out / "notes.txt").write_text("the user's")
    before = contents(out)

    def broken(*args, **kwargs):
        raise error("broke")
    monkeypatch.setattr(*BREAK[kind], broken)
    with pytest.raises(error, match="broke"):
        prepare_each(kind, tmp_path, str(out))
    assert contents(out) == before  # no temporary directory left either, in it or beside it
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]


@pytest.mark.parametrize("kind", KINDS)
def test_a_new_preparation_replaces_its_files_and_keeps_the_users(kind, tmp_path):
    out = tmp_path / "out"
    first = prepare_each(kind, tmp_path, str(out), max_rows=10)
    (out / "notes.txt").write_text("the user's")
    second = prepare_each(kind, tmp_path, str(out))
    assert (first["rows"], second["rows"]) == (10, 20)
    names = {f"{s}_{a}.npy" for s in ("train", "test") for a in ("dense", "sparse", "labels")}
    kept = {"vocab.npy"} if kind == "criteo" else set()  # label-encoding keeps its vocabulary
    assert set(os.listdir(out)) == names | {"meta.json", "notes.txt"} | kept
    assert (out / "notes.txt").read_text() == "the user's"
    data = (TableDataset if kind == "table" else CriteoDataset)(str(out))
    assert sum(data.rows.values()) == 20


def test_a_link_planted_at_an_arrays_name_is_replaced_not_written_through(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"not prepare's")
    os.symlink(victim, out / "train_sparse.npy")
    os.symlink(victim, out / "meta.json")
    prepare_each("criteo --hash", tmp_path, str(out))
    assert victim.read_bytes() == b"not prepare's"
    assert not os.path.islink(out / "train_sparse.npy") and CriteoDataset(str(out)).rows["train"] > 0


def test_every_preparation_is_read_by_the_one_reader(tmp_path):
    for kind, reader in (("criteo", CriteoDataset), ("criteo --hash", CriteoDataset), ("table", TableDataset)):
        out = tmp_path / kind.replace(" ", "")
        prepare_each(kind, tmp_path, str(out), test_fraction=0.0)
        data = reader(str(out))
        assert isinstance(data, PreparedDataset) and data.rows == {"train": 20, "test": 0}, kind
        assert data.batch("train", 0, 20).sparse.shape == (20, data.num_fields)


def test_a_directory_that_was_never_finished_is_refused_naming_how_to_prepare_it(tmp_path):
    w = SplitWriter(str(tmp_path), num_dense=1, num_fields=1)
    w.add(np.ones((2, 1)), np.ones((2, 1)), np.ones(2), np.zeros(2, bool))
    w.close()  # no meta.json: as a crash before the end leaves a directory
    for reader, command in ((CriteoDataset, f"het data prepare criteo RAW... {tmp_path}"),
                            (TableDataset, f"het data prepare table FILE... {tmp_path} --label COL --sparse COLS")):
        with pytest.raises(ValueError, match=f"holds no meta.json: prepare it first with `{command}`"):
            reader(str(tmp_path))


def test_writing_refuses_a_file_where_the_directory_goes(tmp_path):
    (tmp_path / "out").write_text("a file")
    with pytest.raises(NotADirectoryError):
        with writing(str(tmp_path / "out"), 1, 1):
            pass
    assert (tmp_path / "out").read_text() == "a file"


READERS = {"criteo": CriteoDataset, "criteo --hash": CriteoDataset, "table": TableDataset}


@pytest.mark.parametrize("kind", KINDS)
def test_a_prepared_directory_is_read_back_against_its_checksums_and_a_damaged_one_is_refused(kind, tmp_path):
    import json

    from het.files import DamagedFile

    out = str(tmp_path / "out")
    prepare_each(kind, tmp_path, out)
    meta = json.load(open(os.path.join(out, "meta.json")))
    assert set(meta["files"]) >= {f"{s}_{a}.npy" for s in ("train", "test") for a in ("dense", "sparse", "labels")}
    READERS[kind](out)  # as written: read
    path = os.path.join(out, "train_sparse.npy")
    data = bytearray(open(path, "rb").read())
    data[-3] ^= 0x10  # one bit of the last key
    open(path, "wb").write(bytes(data))
    with pytest.raises(DamagedFile, match=r"train_sparse.npy: checksum mismatch in bytes 0\.\..*prepare it again"):
        READERS[kind](out)
    READERS[kind](out, verify=False)  # the sizes alone, as a big table's are checked at every start
    with open(path, "ab") as f:
        f.write(b"\0" * 8)
    with pytest.raises(DamagedFile, match=r"train_sparse.npy: \d+ bytes, \d+ when written: damaged or replaced"):
        READERS[kind](out, verify=False)
    meta["num_dense"] += 1  # meta.json itself changed
    open(os.path.join(out, "meta.json"), "w").write(json.dumps(meta))
    with pytest.raises(DamagedFile, match="meta.json: does not match its checksum"):
        READERS[kind](out)


def test_a_directory_prepared_before_checksums_is_still_read(tmp_path):
    import json

    out = str(tmp_path / "out")
    prepare_each("table", tmp_path, out)
    meta = json.load(open(os.path.join(out, "meta.json")))
    del meta["files"], meta["crc32"]
    open(os.path.join(out, "meta.json"), "w").write(json.dumps(meta))
    assert TableDataset(out).rows["train"] > 0
