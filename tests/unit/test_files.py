"""Writing a directory whole or not at all (het.files): a failure leaves the previous one as it
was, nothing is written through a planted link, and everything is on disk before the rename."""

import os

import pytest

from het import files


def write(directory, name, data=b"new"):
    with files.create(os.path.join(directory, name)) as f:
        f.write(data)


def test_create_refuses_an_existing_name_and_a_planted_link(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_bytes(b"theirs")
    os.symlink(target, tmp_path / "link")
    (tmp_path / "there").write_bytes(b"old")
    for name in ("link", "there"):
        with pytest.raises(FileExistsError):
            files.create(str(tmp_path / name))
    assert target.read_bytes() == b"theirs" and (tmp_path / "there").read_bytes() == b"old"


def test_a_new_directory_appears_whole_and_a_failure_leaves_nothing(tmp_path):
    out = tmp_path / "a" / "b" / "out"
    with pytest.raises(RuntimeError, match="broke"):
        with files.atomic_directory(str(out)) as tmp:
            write(tmp, "x")
            raise RuntimeError("broke")
    assert os.listdir(tmp_path) == []  # the directories made above it went too
    with files.atomic_directory(str(out)) as tmp:
        write(tmp, "x")
        assert not out.exists()
    assert os.listdir(out) == ["x"] and os.listdir(out.parent) == ["out"]


def test_a_replaced_directory_goes_whole_and_keeps_its_mode(tmp_path):
    out = tmp_path / "out"
    out.mkdir(mode=0o750)
    os.chmod(out, 0o750)
    (out / "old").write_bytes(b"old")
    with pytest.raises(KeyboardInterrupt):
        with files.atomic_directory(str(out)) as tmp:
            write(tmp, "x")
            raise KeyboardInterrupt
    assert os.listdir(out) == ["old"] and os.listdir(tmp_path) == ["out"]
    with files.atomic_directory(str(out)) as tmp:
        write(tmp, "x")
    assert os.listdir(out) == ["x"] and os.listdir(tmp_path) == ["out"]
    assert os.stat(out).st_mode & 0o777 == 0o750


def test_an_update_in_place_keeps_other_files_and_puts_the_marker_last(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    for name in ("a", "done", "notes.txt"):
        (out / name).write_bytes(b"old")
    target = tmp_path / "elsewhere"
    target.write_bytes(b"theirs")
    os.symlink(target, out / "b")  # planted where a new entry goes: replaced, not written through
    moved = []
    replace = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: moved.append(os.path.basename(dst)) or replace(src, dst))
    with files.atomic_directory(str(out), marker="done") as tmp:
        assert os.path.dirname(tmp) == str(out)  # inside: the same file system, whatever is mounted there
        for name in ("done", "a", "b"):
            write(tmp, name)
    assert moved == ["a", "b", "done"]
    assert sorted(os.listdir(out)) == ["a", "b", "done", "notes.txt"]
    assert [(out / n).read_bytes() for n in ("a", "b", "done", "notes.txt")] == [b"new", b"new", b"new", b"old"]
    assert not os.path.islink(out / "b") and target.read_bytes() == b"theirs"


def test_a_failed_update_in_place_leaves_the_directory_as_it_was(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "done").write_bytes(b"old")
    with pytest.raises(ValueError):
        with files.atomic_directory(str(out), marker="done") as tmp:
            write(tmp, "done")
            raise ValueError("a misspelt column")
    assert os.listdir(out) == ["done"] and (out / "done").read_bytes() == b"old"


def test_everything_is_on_disk_before_it_is_put_in_place(tmp_path, monkeypatch):
    synced, renamed = [], []
    fsync, rename = os.fsync, os.rename
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}")) or fsync(fd))
    monkeypatch.setattr(os, "rename", lambda a, b: renamed.append(len(synced)) or rename(a, b))
    out = tmp_path / "out"
    with files.atomic_directory(str(out)) as tmp:
        os.mkdir(os.path.join(tmp, "sub"))
        write(os.path.join(tmp, "sub"), "x")
        write(tmp, "y")
    before = synced[:renamed[0]]
    assert {os.path.relpath(p, tmp) for p in before} == {"sub/x", "sub", "y", "."}
    assert synced[-1] == str(tmp_path)  # the rename itself, in its directory


def test_a_name_planted_at_the_temporary_directorys_is_not_used(tmp_path, monkeypatch):
    names = iter(["planted", "fresh"])
    monkeypatch.setattr(files.secrets, "token_hex", lambda n: next(names))
    target = tmp_path / "elsewhere"
    target.mkdir()
    os.symlink(target, tmp_path / "out.tmp-planted")
    with files.atomic_directory(str(tmp_path / "out")) as tmp:
        assert tmp == str(tmp_path / "out.tmp-fresh")
        write(tmp, "x")
    assert os.listdir(target) == [] and os.listdir(tmp_path / "out") == ["x"]


def test_a_file_where_the_directory_goes_is_refused(tmp_path):
    (tmp_path / "out").write_bytes(b"a file")
    with pytest.raises(NotADirectoryError, match="is a file, expected a directory"):
        with files.atomic_directory(str(tmp_path / "out")):
            pass
