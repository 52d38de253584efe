"""`het data prepare table` (het.data.table: users' CSV, TSV, Parquet) and `het data prepare
criteo --hash`: one pass, hashed keys, the same arrays from the same rows whatever the file
format; users' files that cannot be read refused in one line, a previous output kept."""

import argparse
import gzip
import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from het.data import table_reader
from het.data.criteo import CriteoDataset
from het.data.criteo_hashed import prepare_hashed
from het.data.criteo_tsv import COLUMNS
from het.data.prepare import add_parser
from het.data.table import TableDataset, TableSpec, prepare_table

SHARED = os.environ.get("HET_SHARED") or os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared")
HEAD = os.path.join(SHARED, "data", "criteo_kaggle_head1000.tsv")
NAMES = [f"{split}_{name}" for split in ("train", "test") for name in ("dense", "sparse", "labels")]
DENSE, SPARSE = ",".join(COLUMNS[1:14]), ",".join(COLUMNS[14:])
CRITEO_FLAGS = ["--label", "label", "--dense", DENSE, "--sparse", SPARSE, "--log-dense"]
BAD = {3: "1\t2\t3", 10: "2" + "\t" * 39, 20: None}  # at these 0-based lines: wrong count, label 2, dense "abc"

pytestmark = pytest.mark.skipif(not os.path.exists(HEAD), reason=f"{HEAD} is not here")


def run_cli(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["data", "prepare", *argv])
    return args.func(args)


def arrays(out) -> dict:
    return {n: np.load(os.path.join(out, f"{n}.npy")) for n in NAMES}


def assert_same_arrays(a, b):
    a, b = arrays(a), arrays(b)
    for n in NAMES:
        assert a[n].dtype == b[n].dtype and a[n].tobytes() == b[n].tobytes(), n  # bit-identical


def criteo_lines() -> list[str]:
    """The shared head with the BAD lines put in (the dense one a good line with I3 = abc)."""
    lines = open(HEAD).read().splitlines()
    for i, bad in sorted(BAD.items()):
        if bad is None:
            cols = lines[i].split("\t")
            cols[3] = "abc"
            bad = "\t".join(cols)
        lines.insert(i, bad)
    return lines


@pytest.fixture(scope="module")
def hashed(tmp_path_factory):
    """`criteo --hash` on the head with the bad lines: (directory, summary)."""
    d = tmp_path_factory.mktemp("hashed")
    (d / "raw.tsv").write_text("\n".join(criteo_lines()) + "\n")
    return str(d / "out"), prepare_hashed([str(d / "raw.tsv")], str(d / "out"), progress=False)


# ---- the same arrays from every format ------------------------------------------------------------

def test_criteo_hash_keeps_every_row_and_estimates_the_ids(hashed):
    out, s = hashed
    assert (s["rows"], s["skipped"], s["num_rows"], s["positives"]) == (1000, 3, None, 205)
    assert [e["line"] for e in s["first_skipped"]] == [4, 11, 21]
    keys = np.concatenate([arrays(out)["train_sparse"], arrays(out)["test_sparse"]])
    exact = len(np.unique(keys))
    assert abs(s["num_ids"] - exact) < 0.05 * exact and not s["num_ids_exact"]
    data = CriteoDataset(out)  # `het train --data criteo:OUT` reads it
    assert (data.num_rows, data.num_ids, data.cardinalities, data.num_fields) == (None, s["num_ids"], None, 26)
    dense = arrays(out)["train_dense"]
    assert (dense >= 0).all() and keys.dtype == np.int64 and (keys < 0).any()  # full int64 range


def test_csv_gzipped_tsv_headerless_tsv_and_parquet_give_criteo_hash_arrays(hashed, tmp_path):
    out, s = hashed
    lines = criteo_lines()
    (tmp_path / "t.csv").write_text("\n".join([",".join(COLUMNS)] + [x.replace("\t", ",") for x in lines]) + "\n")
    with gzip.open(tmp_path / "t.tsv.gz", "wt") as f:
        f.write("\n".join(["\t".join(COLUMNS)] + lines) + "\n")
    (tmp_path / "raw.tsv").write_text("\n".join(lines) + "\n")
    rows = [x.split("\t") for x in lines if len(x.split("\t")) == 40]  # Parquet holds no short row
    pq.write_table(pa.table({c: [r[j] for r in rows] for j, c in enumerate(COLUMNS)}), tmp_path / "t.parquet")
    runs = {"csv": [str(tmp_path / "t.csv")], "tsv.gz": [str(tmp_path / "t.tsv.gz")],
            "no header": [str(tmp_path / "raw.tsv"), "--no-header", "--names", ",".join(COLUMNS)],
            "parquet": [str(tmp_path / "t.parquet")]}
    for name, argv in runs.items():
        t = run_cli(["table", argv[0], str(tmp_path / name), *CRITEO_FLAGS, *argv[1:], "--quiet", "--json"])
        assert_same_arrays(out, str(tmp_path / name))
        assert (t["rows"], t["num_ids"], t["num_rows"]) == (1000, s["num_ids"], None), name
        lines_of_bad = {"csv": [5, 12, 22], "tsv.gz": [5, 12, 22], "no header": [4, 11, 21], "parquet": [10, 20]}
        assert t["skipped"] == len(lines_of_bad[name]), name  # Parquet holds no short row
        assert [e["line"] for e in t["first_skipped"]] == lines_of_bad[name], name


def test_parquet_integer_and_null_columns_hash_as_their_csv_text(tmp_path):
    (tmp_path / "t.csv").write_text("y,x,n\n1,1.5,7\n0,,\n1,-2,123456789012\n")
    pq.write_table(pa.table({"y": pa.array([1, 0, 1], pa.int8()), "x": [1.5, None, -2.0],
                             "n": pa.array([7, None, 123456789012], pa.int64())}), tmp_path / "t.parquet")
    spec = TableSpec("y", ("x",), ("n",), dense_transform="none")
    for name in ("csv", "parquet"):
        prepare_table(str(tmp_path / f"t.{name}"), str(tmp_path / name), spec, test_fraction=0.0, progress=False)
    assert_same_arrays(str(tmp_path / "csv"), str(tmp_path / "parquet"))
    assert arrays(str(tmp_path / "csv"))["train_dense"][:, 0].tolist() == [1.5, 0.0, -2.0]  # raw, missing -> 0


# ---- malformed lines --------------------------------------------------------------------------------

def test_bad_lines_are_counted_and_named_across_blocks_and_files(tmp_path, monkeypatch):
    monkeypatch.setattr(table_reader, "_BLOCK_BYTES", 64)  # a few lines a block: the numbering crosses them
    good = [f"{i % 2},{i},v{i % 7}" for i in range(200)]
    lines, bad = list(good), {}
    for at, text, reason in [(5, "1,2", "got 2"), (17, "x,1,a", "label 'y': 'x'"), (40, "", "label 'y': ''"),
                             (41, "0,1,a,b", "got 4"), (90, '1,"1,5",q', "x: '1,5' is not a finite number"),
                             (150, "0,inf,q", "x: 'inf'")]:
        lines.insert(at, text)
        bad[at + 2] = reason  # + the header, 1-based
    (tmp_path / "a.csv").write_text("\n".join(["y,x,c"] + lines) + "\n")
    (tmp_path / "b.csv").write_text("y,x,c\n0,1,a\n1\n")
    s = prepare_table([str(tmp_path / "a.csv"), str(tmp_path / "b.csv")], str(tmp_path / "out"),
                      TableSpec("y", ("x",), ("c",), dense_transform="none"), progress=False, max_skipped=0.05)
    assert (s["rows"], s["skipped"]) == (201, 7)
    assert s["skipped_by_reason"] == {"label": 2, "dense": 2, "columns": 3}
    assert [e["source_line"] for e in s["first_skipped"]] == [*bad, 3]
    for e, reason in zip(s["first_skipped"], [*bad.values(), "got 1"]):
        assert reason in e["reason"], (e, reason)
    assert s["first_skipped"][-1]["line"] == len(lines) + 1 + 3 and s["first_skipped"][-1]["source"].endswith("b.csv")
    written = np.concatenate([arrays(str(tmp_path / "out"))[f"{p}_dense"][:, 0] for p in ("train", "test")])
    assert sorted(written.tolist()) == sorted([float(i) for i in range(200)] + [1.0])  # no row shifted


def test_max_rows_leaves_the_later_lines_unread(tmp_path):
    (tmp_path / "t.csv").write_text("y,c\n1,a\n0,b\n1,c\nbad,d\n")
    s = prepare_table(str(tmp_path / "t.csv"), str(tmp_path / "out"), TableSpec("y", (), ("c",)), max_rows=2,
                      progress=False)
    assert (s["rows"], s["skipped"]) == (2, 0)


# ---- the command ------------------------------------------------------------------------------------

def test_missing_columns_and_bad_flags_are_clear_errors(tmp_path):
    (tmp_path / "t.csv").write_text("y,x,c\n1,2,a\n")
    base = ["table", str(tmp_path / "t.csv"), str(tmp_path / "out"), "--quiet"]
    cases = [(["--label", "y", "--dense", "X", "--sparse", "c"], r"dense column\(s\) \['X'\] not found; its "
              r"columns are \['y', 'x', 'c'\]"),
             (["--label", "label", "--sparse", "c"], r"label column\(s\) \['label'\] not found"),
             (["--label", "y", "--dense", "x", "--sparse", "c,x"], r"each column may appear once.*\['x'\]"),
             (["--label", "y", "--sparse", "c", "--no-header"], "--no-header and --names go together")]
    for argv, message in cases:
        with pytest.raises(SystemExit, match=message):
            run_cli(base + argv)
    assert not os.path.exists(tmp_path / "out")  # a refused run leaves nothing behind
    with pytest.raises(SystemExit, match="does not exist"):
        run_cli(["table", str(tmp_path / "nope.csv"), str(tmp_path / "out"), "--label", "y", "--sparse", "c"])


def test_json_summary_is_the_last_line_and_the_human_one_names_the_lines(tmp_path, capsys):
    (tmp_path / "t.csv").write_text("y,x,c\n1,2,a\n0,3\n0,1,b\n")
    argv = ["table", str(tmp_path / "t.csv"), str(tmp_path / "out"), "--label", "y", "--dense", "x", "--sparse",
            "c", "--quiet", "--max-skipped", "0.5"]
    run_cli(argv + ["--json"])
    s = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (s["rows"], s["skipped"], s["num_fields"], s["num_dense"], s["num_rows"]) == (2, 1, 1, 1, None)
    run_cli(argv)
    out = capsys.readouterr().out
    assert "skipped 1 malformed line(s):" in out and "line 3 (" in out and "table:" + str(tmp_path / "out") in out


def test_a_training_job_takes_table_and_hashed_criteo_directories(hashed, tmp_path):
    from het.train.config import TrainConfig
    from het.train.tasks import CTRTask, job_tables

    (tmp_path / "t.csv").write_text("y,a,b,c\n" + "".join(f"{i % 2},{i},u{i % 5},{i % 3}\n" for i in range(50)))
    prepare_table(str(tmp_path / "t.csv"), str(tmp_path / "out"), TableSpec("y", ("a",), ("b", "c")),
                  progress=False)
    for data, fields, dense in ((f"table:{tmp_path / 'out'}", 2, 1), (f"criteo:{hashed[0]}", 26, 13)):
        cfg = TrainConfig(data=data, batch=8)
        task = CTRTask(cfg)
        assert (task.num_rows, task.data.num_fields, task.data.num_dense) == (None, fields, dense)
        assert task.num_ids == task.data.meta["num_ids"] and job_tables(cfg, task)[0].rows is None
        b = task.batch(0, 0, 1, "cpu")
        assert b.sparse.shape == (8, fields) and b.dense.shape == (8, dense)
    assert TableDataset(str(tmp_path / "out")).num_ids == 8  # 5 + 3 distinct values: exact below k


# ---- users' files refused in one line, the previous output kept --------------------------------------

def test_a_rerun_with_a_misspelt_column_leaves_the_previous_output_intact(tmp_path):
    (tmp_path / "t.csv").write_text("y,price,city\n1,2.5,Paris\n0,1,Oslo\n")
    out = tmp_path / "out"
    base = ["table", str(tmp_path / "t.csv"), str(out), "--label", "y", "--sparse", "city", "--quiet"]
    run_cli(base + ["--dense", "price"])
    (out / "notes.txt").write_text("the user's")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(SystemExit, match=r"dense column\(s\) \['prise'\] not found"):
        run_cli(base + ["--dense", "prise"])
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert TableDataset(str(out)).rows == {"train": 2, "test": 0}


def het_prepare(*argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "het", "data", "prepare", *argv], capture_output=True, text=True,
                          timeout=120)


def test_duplicate_column_names_are_refused_in_one_line(tmp_path):
    (tmp_path / "t.csv").write_text("y,city,city\n1,Paris,Rome\n")
    pq.write_table(pa.Table.from_arrays([pa.array([1, 0]), pa.array(["a", "b"]), pa.array(["c", "d"])],
                                        names=["y", "city", "city"]), tmp_path / "t.parquet")
    for name in ("t.csv", "t.parquet"):
        with pytest.raises(SystemExit) as e:
            run_cli(["table", str(tmp_path / name), str(tmp_path / "out"), "--label", "y", "--sparse", "city"])
        assert str(e.value) == (f"het data prepare table: {tmp_path / name}: column 'city' appears 2 times among "
                                f"its columns, expected once (which one is meant?): rename the others")
    (tmp_path / "free.csv").write_text("y,c,x,x\n1,a,2,3\n0,b,4,5\n")  # a repeated column not read is no matter
    run_cli(["table", str(tmp_path / "free.csv"), str(tmp_path / "out"), "--label", "y", "--sparse", "c", "--quiet"])
    ran = het_prepare("table", str(tmp_path / "t.csv"), str(tmp_path / "o2"), "--label", "y", "--sparse", "city")
    assert ran.returncode == 1 and len(ran.stderr.strip().splitlines()) == 1 and "Traceback" not in ran.stderr


@pytest.mark.parametrize("column, kind", [([[1, 2], [3]], "list<element: int64>"),
                                          ([{"a": 1}, {"a": 2}], "struct<a: int64>")])
def test_a_nested_parquet_column_is_refused_in_one_line(tmp_path, column, kind):
    pq.write_table(pa.table({"y": [1, 0], "c": column, "x": ["u", "v"]}), tmp_path / "t.parquet")
    ran = het_prepare("table", str(tmp_path / "t.parquet"), str(tmp_path / "out"), "--label", "y", "--sparse", "c")
    assert ran.returncode == 1 and "Traceback" not in ran.stderr
    assert ran.stderr.strip() == (f"het data prepare table: {tmp_path / 't.parquet'}: column 'c' holds {kind}, "
                                  f"expected numbers or text (one value a row, not lists, structs or maps)")
    assert not (tmp_path / "out").exists()
    run_cli(["table", str(tmp_path / "t.parquet"), str(tmp_path / "out"), "--label", "y", "--sparse", "x", "--quiet"])


def _refusals(tmp_path) -> list[tuple[list[str], str]]:
    (tmp_path / "dup.csv").write_text("y,city,city\n1,Paris,Rome\n")
    (tmp_path / "five.csv").write_text("y,c\n" + "".join(f"{i % 5 + 1},c{i}\n" for i in range(50)))
    (tmp_path / "gone.csv").write_text("y,c\n1,a\n0,b\n")
    return [(["table", str(tmp_path / "dup.csv"), str(tmp_path / "o"), "--label", "y", "--sparse", "city"],
             "column 'city' appears 2 times"),
            (["table", str(tmp_path / "five.csv"), str(tmp_path / "o"), "--label", "y", "--sparse", "c"],
             "give --positive"),
            (["table", str(tmp_path / "gone.csv"), str(tmp_path / "o"), "--label", "y", "--sparse", "nope"],
             "sparse column(s) ['nope'] not found")]


@pytest.mark.parametrize("times", [2, pytest.param(20, marks=pytest.mark.slow)])
def test_a_refusal_is_the_same_one_line_and_exit_code_every_time(tmp_path, times):
    for argv, says in _refusals(tmp_path):
        seen = set()
        for _ in range(times):
            ran = het_prepare(*argv, "--quiet")
            seen.add((ran.returncode, ran.stderr.strip()))
        assert len(seen) == 1, seen  # never an abort (exit -6) in between
        [(code, err)] = seen
        assert code == 1 and len(err.splitlines()) == 1 and says in err and "Traceback" not in err, (argv, err)
        assert not (tmp_path / "o").exists()
