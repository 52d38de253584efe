"""Real Criteo: `het data prepare criteo` on the shipped 1,000-row head of Kaggle's train.txt."""

import argparse
import gzip
import json
import zlib
import math
import os
from collections import Counter

import numpy as np
import pytest
import torch

from het.data.batch import Batch
from het.data.criteo import CriteoDataset, add_prepare_parser, prepare
from het.models import WideDeep

SHARED = os.environ.get("HET_SHARED") or os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared")
HEAD = os.path.join(SHARED, "data", "criteo_kaggle_head1000.tsv")
NAMES = [f"{split}_{name}" for split in ("train", "test") for name in ("dense", "sparse", "labels")]

pytestmark = pytest.mark.skipif(not os.path.exists(HEAD), reason=f"{HEAD} is not here")


def raw_lines() -> list[str]:
    with open(HEAD) as f:
        return f.read().splitlines()


def fields(line: str) -> list[str]:
    cols = line.split("\t")
    assert len(cols) == 40
    return cols


def arrays(out) -> dict:
    return {n: np.load(os.path.join(out, f"{n}.npy"), mmap_mode="r") for n in NAMES}


def assert_same_arrays(a, b):
    a, b = arrays(a), arrays(b)
    for n in NAMES:
        assert a[n].dtype == b[n].dtype and np.array_equal(a[n], b[n]), n


@pytest.fixture(scope="module")
def ordered(tmp_path_factory):
    """The head prepared with no test split: train row i is line i + 1."""
    out = str(tmp_path_factory.mktemp("ordered"))
    return prepare([HEAD], out, test_fraction=0.0, progress=False), CriteoDataset(out)


# ---- the real file ---------------------------------------------------------------------------

def test_head_has_1000_rows_205_clicks_and_no_skipped_line(tmp_path):
    s = prepare([HEAD], str(tmp_path), progress=False)
    assert (s["rows"], s["positives"], s["positive_rate"], s["skipped"]) == (1000, 205, 0.205, 0)
    assert s["first_skipped"] == [] and s["train_rows"] + s["test_rows"] == 1000
    assert 50 <= s["test_rows"] <= 150  # test_fraction 0.1
    with open(tmp_path / "meta.json") as f:
        meta = json.load(f)
    assert meta["rows"] == 1000 and meta["cardinalities"] == s["cardinalities"]
    a = arrays(str(tmp_path))
    for split in ("train", "test"):
        n = s[f"{split}_rows"]
        assert a[f"{split}_dense"].shape == (n, 13) and a[f"{split}_dense"].dtype == np.float32
        assert a[f"{split}_sparse"].shape == (n, 26) and a[f"{split}_sparse"].dtype == np.int64
        assert a[f"{split}_labels"].shape == (n,) and a[f"{split}_labels"].dtype == np.float32
    assert a["train_labels"].sum() + a["test_labels"].sum() == 205


def test_keys_lie_in_their_fields_range(ordered):
    s, data = ordered
    cards = np.array(data.cardinalities)
    assert data.offsets[0] == 0 and np.array_equal(data.offsets[1:], data.offsets[:-1] + cards[:-1])
    assert data.num_rows == s["num_rows"] == cards.sum()
    keys = data.batch("train", 0, 1000).sparse.numpy()
    assert (keys >= data.offsets).all() and (keys < data.offsets + cards).all()
    assert (keys < data.num_rows).all()


def test_each_field_is_label_encoded_in_hex_order_with_a_missing_id(ordered):
    _, data = ordered
    keys = data.batch("train", 0, 1000).sparse.numpy()
    lines = [fields(line) for line in raw_lines()]
    for f in range(26):
        raw = [cols[14 + f] for cols in lines]
        seen = sorted({int(h, 16) for h in raw if h})
        expect = {h: seen.index(int(h, 16)) for h in set(raw) if h}  # min_freq 1: nothing is rare
        expect[""] = len(seen) + 1  # the missing id; len(seen) is the (unused) rare id
        assert data.cardinalities[f] == len(seen) + 2
        assert [data.offsets[f] + expect[h] for h in raw] == keys[:, f].tolist(), f"C{f + 1}"
    assert sum(cols[14 + 11] == "" for cols in lines) > 0  # the file has missing values (C12)


def test_dense_values_are_log1p_of_the_integers_and_missing_is_zero(ordered):
    _, data = ordered
    b = data.batch("train", 0, 1000)
    lines = raw_lines()
    assert fields(lines[0])[1:14] == ["1", "1", "5", "0", "1382", "4", "15", "2", "181", "1", "2", "", "2"]
    for i in (0, 1, 2, 500, 999):
        cols = fields(lines[i])
        expect = [math.log1p(max(int(v), 0)) if v else 0.0 for v in cols[1:14]]
        assert b.dense[i].tolist() == pytest.approx(expect, rel=1e-6), i
        assert b.labels[i].item() == float(cols[0])
    negatives = [i for i, line in enumerate(lines) if any(v.startswith("-") for v in fields(line)[1:14])]
    assert negatives and (b.dense[negatives] >= 0).all()  # real Criteo has a few: clamped to 0


def test_edge_values_parse_exactly(tmp_path):
    ids = ["00000000", "ffffffff", "7fffffff", "80000000", "ABCDEF12", "abcdef12", ""]
    dense = ["-0", "007", "4294967296", "-12", "99999999999999999999", "", "0"]
    rows = ["\t".join(["1", d, *[""] * 12, h, *["0000000a"] * 25]) for d, h in zip(dense, ids)]
    (tmp_path / "raw.tsv").write_text("\r\n".join(rows))  # CRLF, no final newline
    s = prepare([str(tmp_path / "raw.tsv")], str(tmp_path / "out"), test_fraction=0.0, progress=False)
    assert (s["rows"], s["skipped"], s["cardinalities"][:2]) == (7, 0, [7, 3])  # 5 ids + rare + missing
    b = CriteoDataset(str(tmp_path / "out")).batch("train", 0, 7)
    assert b.sparse[:, 0].tolist() == [0, 4, 1, 2, 3, 3, 6]  # hex order, case-blind; 6: missing
    assert b.sparse[:, 1].tolist() == [7] * 7
    expect = [0.0, math.log1p(7), math.log1p(2 ** 32), 0.0, math.log1p(1e20 - 1), 0.0, 0.0]
    assert b.dense[:, 0].tolist() == pytest.approx(expect, rel=1e-7)


def test_two_runs_give_identical_output(tmp_path):
    prepare([HEAD], str(tmp_path / "a"), progress=False)
    prepare([HEAD], str(tmp_path / "b"), progress=False)
    assert_same_arrays(tmp_path / "a", tmp_path / "b")
    assert (tmp_path / "a" / "meta.json").read_bytes() == (tmp_path / "b" / "meta.json").read_bytes()


def test_gz_input_and_several_files_give_the_same_arrays(tmp_path):
    lines = raw_lines()
    with gzip.open(tmp_path / "head.tsv.gz", "wt") as f:
        f.write("\n".join(lines) + "\n")
    (tmp_path / "part1.tsv").write_text("\n".join(lines[:400]) + "\n")
    with gzip.open(tmp_path / "part2.tsv.gz", "wt") as f:
        f.write("\n".join(lines[400:]))  # no final newline
    plain = prepare([HEAD], str(tmp_path / "plain"), progress=False)
    gz = prepare([str(tmp_path / "head.tsv.gz")], str(tmp_path / "gz"), progress=False)
    parts = prepare([str(tmp_path / "part1.tsv"), str(tmp_path / "part2.tsv.gz")], str(tmp_path / "parts"),
                    progress=False)
    assert_same_arrays(tmp_path / "plain", tmp_path / "gz")
    assert_same_arrays(tmp_path / "plain", tmp_path / "parts")
    assert plain["cardinalities"] == gz["cardinalities"] == parts["cardinalities"]
    assert (gz["rows"], parts["rows"], parts["lines"]) == (1000, 1000, 1000)


def test_min_freq_maps_ids_seen_fewer_times_to_the_rare_id(tmp_path):
    s = prepare([HEAD], str(tmp_path), min_freq=2, test_fraction=0.0, progress=False)
    data = CriteoDataset(str(tmp_path))
    keys = data.batch("train", 0, 1000).sparse.numpy()
    lines = [fields(line) for line in raw_lines()]
    counts = [Counter(cols[14 + f] for cols in lines if cols[14 + f]) for f in range(26)]
    assert s["cardinalities"] == [sum(c >= 2 for c in counts[f].values()) + 2 for f in range(26)]
    assert s["min_freq"] == 2
    # Line 1's C3 (fb936136) occurs once, its C1 (68fd1e64) many times.
    assert (counts[2]["fb936136"], counts[0]["68fd1e64"] >= 2) == (1, True)
    rare, missing = data.offsets + data.cardinalities - 2, data.offsets + data.cardinalities - 1
    assert keys[0, 2] == rare[2]
    assert keys[0, 0] < rare[0]
    assert (keys[:, 2] == rare[2]).sum() == sum(c == 1 for c in counts[2].values())
    assert (keys == missing).sum() == sum(cols[14:].count("") for cols in lines)
    one = prepare([HEAD], str(tmp_path / "one"), test_fraction=0.0, progress=False)
    assert all(a <= b for a, b in zip(s["cardinalities"], one["cardinalities"]))
    assert s["num_rows"] < one["num_rows"] / 2  # most ids of 1,000 rows are seen once


# ---- malformed lines -------------------------------------------------------------------------

def test_malformed_lines_are_reported_skipped_and_never_shift_columns(tmp_path):
    lines = raw_lines()
    bad = {  # 1-based line number in the corrupted file -> (line, reason)
        3: ("\t".join(fields(lines[0])[:-1]), "expected 40 tab-separated columns, got 39"),
        10: ("\t".join(fields(lines[1])[:5] + ["abc"] + fields(lines[1])[6:]),
             "I5: 'abc' is not an integer (at most 20 characters)"),
        20: ("\t".join(fields(lines[2])[:20] + ["xyz123"] + fields(lines[2])[21:]),
             "C7: 'xyz123' is not 8 hex digits"),
        400: ("2" + lines[3][1:], "label: '2' is not 0 or 1"),
        1004: (lines[4].replace("\t", "\t\t", 1), "expected 40 tab-separated columns, got 41"),
    }
    corrupted = list(lines)
    for number in sorted(bad):
        corrupted.insert(number - 1, bad[number][0])
    (tmp_path / "bad.tsv").write_text("\n".join(corrupted) + "\n")
    s = prepare([str(tmp_path / "bad.tsv")], str(tmp_path / "bad"), progress=False)
    assert (s["rows"], s["skipped"], s["lines"]) == (1000, 5, 1005)
    assert [(x["line"], x["reason"]) for x in s["first_skipped"]] == [(n, r) for n, (_, r) in bad.items()]
    assert all(x["source_line"] == x["line"] for x in s["first_skipped"])
    prepare([HEAD], str(tmp_path / "clean"), progress=False)
    assert_same_arrays(tmp_path / "bad", tmp_path / "clean")  # the split ignores skipped lines


def test_blocks_cut_anywhere_and_endless_lines_change_nothing_else(tmp_path, monkeypatch):
    import het.data.criteo_tsv as criteo_tsv  # the block reader's limits live there

    lines = raw_lines()
    (tmp_path / "raw.tsv").write_text("\n".join(lines[:7] + ["9" * 5000] + lines[7:]) + "\n")
    prepare([HEAD], str(tmp_path / "whole"), progress=False)
    monkeypatch.setattr(criteo_tsv, "_BLOCK_BYTES", 1000)  # ~4 lines a block, most lines cut in two
    monkeypatch.setattr(criteo_tsv, "_MAX_LINE", 1500)  # the 5,000-byte line spans blocks and is cut
    s = prepare([str(tmp_path / "raw.tsv")], str(tmp_path / "small"), progress=False)
    assert (s["rows"], s["skipped"], s["first_skipped"]) == (1000, 1, [
        {"line": 8, "source": str(tmp_path / "raw.tsv"), "source_line": 8,
         "reason": "line longer than 1500 bytes"}])
    assert_same_arrays(tmp_path / "whole", tmp_path / "small")


def test_only_the_first_lines_are_listed_but_all_are_counted(tmp_path):
    lines = raw_lines()[:30]
    (tmp_path / "raw.tsv").write_text("\n".join(lines[:10] + ["oops"] * 15 + lines[10:]) + "\n")
    s = prepare([str(tmp_path / "raw.tsv")], str(tmp_path / "out"), progress=False)
    assert (s["rows"], s["skipped"]) == (30, 15)
    assert [x["line"] for x in s["first_skipped"]] == list(range(11, 21))


def test_max_rows_stops_after_that_many_valid_rows(tmp_path, ordered):
    lines = raw_lines()
    (tmp_path / "raw.tsv").write_text("\n".join(lines[:50] + ["bad"] + lines[50:100] + ["bad"] + lines[100:]))
    s = prepare([str(tmp_path / "raw.tsv")], str(tmp_path / "out"), max_rows=100, test_fraction=0.0,
                progress=False)
    assert (s["rows"], s["skipped"], s["lines"]) == (100, 1, 101)  # the 2nd bad line is never read
    data = CriteoDataset(str(tmp_path / "out"))
    full = ordered[1].batch("train", 0, 100)
    part = data.batch("train", 0, 100)
    assert torch.equal(part.dense, full.dense) and torch.equal(part.labels, full.labels)
    assert data.rows == {"train": 100, "test": 0}


def test_bad_arguments_and_inputs_are_refused(tmp_path):
    with pytest.raises(ValueError, match="min_freq must be an int >= 1, got 0"):
        prepare([HEAD], str(tmp_path), min_freq=0)
    with pytest.raises(ValueError, match=r"test_fraction must lie in \[0, 1\), got 1.0"):
        prepare([HEAD], str(tmp_path), test_fraction=1.0)
    with pytest.raises(FileNotFoundError, match="raw Criteo file 'nope.tsv' does not exist"):
        prepare(["nope.tsv"], str(tmp_path))
    (tmp_path / "junk.tsv").write_text("hello\nworld\n")
    with pytest.raises(ValueError, match="no valid Criteo rows .* 2 lines skipped"):
        prepare([str(tmp_path / "junk.tsv")], str(tmp_path / "out"), progress=False)


def test_a_truncated_gz_is_one_line_and_leaves_nothing_behind(tmp_path):
    data = gzip.compress(("\n".join(raw_lines()) + "\n").encode())
    (tmp_path / "cut.gz").write_bytes(data[:len(data) // 2])
    out = tmp_path / "new" / "out"
    with pytest.raises(SystemExit, match=rf"^het data prepare criteo: {tmp_path / 'cut.gz'}: a truncated or "
                                         rf"damaged gzip file \(Compressed file ended before"):
        run_cli([str(tmp_path / "cut.gz"), str(out), "--quiet"])
    assert not (tmp_path / "new").exists()  # made by prepare, so removed with what it held
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "notes.txt").write_text("not prepare's")
    with pytest.raises(SystemExit, match="a truncated or damaged gzip file"):
        run_cli([str(tmp_path / "cut.gz"), str(tmp_path / "kept"), "--quiet"])
    assert os.listdir(tmp_path / "kept") == ["notes.txt"]


def test_a_failure_while_writing_removes_the_arrays_begun(tmp_path, monkeypatch):
    from het.data import criteo

    def broken(self, keys):
        raise RuntimeError("encoding broke")

    monkeypatch.setattr(criteo.Vocabulary, "encode", broken)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("not prepare's")
    with pytest.raises(RuntimeError, match="encoding broke"):
        prepare([HEAD], str(tmp_path / "out"), progress=False)
    assert os.listdir(tmp_path / "out") == ["notes.txt"]


# ---- the dataset -----------------------------------------------------------------------------

def test_batches_have_the_batch_types_and_wrap_around(ordered):
    _, data = ordered
    b = data.batch("train", 0, 4)
    assert isinstance(b, Batch) and (b.dense.shape, b.sparse.shape, b.labels.shape) == (
        (4, 13), (4, 26), (4,))
    assert (data.num_fields, data.num_dense, data.has_planted) == (26, 13, False)
    every = data.batch("train", 0, 1000)
    wrapped = data.batch("train", 3, 300)  # rows 900..999 then 0..199
    order = np.r_[900:1000, 0:200]
    assert torch.equal(wrapped.sparse, every.sparse[order]) and torch.equal(wrapped.dense, every.dense[order])
    assert torch.equal(data.batch("train", 1001, 1).labels, every.labels[1:2])
    b.dense[0, 0] = 123.0  # batches are copies: the mapped file is never written
    assert data.batch("train", 0, 1).dense[0, 0] != 123.0
    with pytest.raises(ValueError, match="split 'test' of this Criteo directory has no rows"):
        data.batch("test", 0, 1)
    with pytest.raises(ValueError, match="split must be one of"):
        data.batch("valid", 0, 1)


def test_dataset_refuses_a_directory_without_metadata_or_of_another_version(tmp_path):
    with pytest.raises(ValueError, match="holds no meta.json"):
        CriteoDataset(str(tmp_path))
    prepare([HEAD], str(tmp_path), max_rows=10, progress=False)
    meta = json.loads((tmp_path / "meta.json").read_text())
    meta.pop("crc32")  # another version's meta.json, checksummed as it wrote it
    meta = {**meta, "version": 99}
    meta["crc32"] = zlib.crc32(json.dumps(meta, sort_keys=True).encode())
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="version 99, expected 'het-criteo' version 1"):
        CriteoDataset(str(tmp_path))


def test_a_few_training_steps_on_the_prepared_head_lower_the_loss(ordered):
    _, data = ordered
    torch.manual_seed(0)
    model = WideDeep(torch.nn.Embedding(data.num_rows, 8), data.num_fields, 8, data.num_dense, hidden=(16,))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for step in range(30):
        b = data.batch("train", step, 128)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(b.dense, b.sparse), b.labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(x) for x in losses)
    assert np.mean(losses[-8:]) < np.mean(losses[:8])


# ---- the command -----------------------------------------------------------------------------

def run_cli(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser()
    add_prepare_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["criteo", *argv])
    return args.func(args)


def test_cli_json_summary_is_the_last_line(tmp_path, capsys):
    lines = raw_lines()
    (tmp_path / "raw.tsv").write_text("\n".join(lines[:5] + ["1\tnope"] + lines[5:]) + "\n")
    run_cli([str(tmp_path / "raw.tsv"), str(tmp_path / "out"), "--json", "--quiet", "--min-freq", "2"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    s = json.loads(last)
    assert (s["rows"], s["skipped"], s["positive_rate"], s["min_freq"]) == (1000, 1, 0.205, 2)
    assert s["first_skipped"][0]["line"] == 6


def test_cli_human_summary_lists_the_skipped_lines(tmp_path, capsys):
    (tmp_path / "raw.tsv").write_text("\n".join(raw_lines()[:20] + ["0\t1"]) + "\n")
    run_cli([str(tmp_path / "raw.tsv"), str(tmp_path / "out"), "--quiet", "--max-rows", "20"])
    out = capsys.readouterr().out
    assert "20 rows" in out and "skipped 0 malformed" in out  # the bad line lies past --max-rows
    run_cli([str(tmp_path / "raw.tsv"), str(tmp_path / "out"), "--quiet"])
    out = capsys.readouterr().out
    assert "skipped 1 malformed line(s):" in out
    assert "line 21 (" in out and "expected 40 tab-separated columns, got 2" in out
    with pytest.raises(SystemExit, match="min_freq must be an int >= 1"):
        run_cli([str(tmp_path / "raw.tsv"), str(tmp_path / "out"), "--min-freq", "0"])
