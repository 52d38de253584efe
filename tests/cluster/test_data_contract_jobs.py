"""A raw file to a score with no hand-wired columns: Adult and the Criteo rows prepared by
inference, trained, and Kaggle's Criteo test layout (no label) scored line by line."""

from __future__ import annotations

import csv
import subprocess
import sys

import numpy as np
import pytest

from jobs import het, shared_file

pytestmark = pytest.mark.cluster


@pytest.mark.slow  # three commands on the Criteo rows: about 40 s
def test_the_criteo_test_layout_is_scored_one_line_each_in_order(tmp_path):
    raw = shared_file("data", "criteo_kaggle_head1000.tsv")
    het("data", "prepare", "table", raw, str(tmp_path / "prep"), "--preset", "criteo", "--quiet", "--json")
    s = het("train", "--data", f"table:{tmp_path / 'prep'}", "--steps", "10", "--batch", "64", "--export",
            str(tmp_path / "export"), "--export-every", "10", "--json", "--quiet", "--log-dir", str(tmp_path / "logs"))
    assert s["exports"]["written"] >= 1 and not s["exports"]["failed"]
    lines = open(raw).read().splitlines()
    (tmp_path / "test.tsv").write_text("".join(line.split("\t", 1)[1] + "\n" for line in lines))  # 39 columns
    scores = {}
    for name, path in (("test", tmp_path / "test.tsv"), ("train", raw)):
        out = tmp_path / f"{name}.csv"
        p = het("predict", str(tmp_path / "export"), "--data", str(path), "--preset", "criteo", "--out", str(out),
                "--keep", "C1,I2", "--json", "--quiet")
        assert p["rows"] == len(lines) and p["skipped"] == 0
        with open(out) as f:
            rows = list(csv.DictReader(f))
        assert [int(r["row"]) for r in rows] == list(range(len(lines)))
        assert [int(r["line"]) for r in rows] == list(range(1, len(lines) + 1))
        assert [(r["C1"], r["I2"]) for r in rows] == [tuple(line.split("\t")[j] for j in (14, 2)) for line in lines]
        scores[name] = np.array([float(r["score"]) for r in rows])
    assert np.array_equal(scores["test"], scores["train"])  # the label column changes no score


@pytest.mark.slow  # DeepFM on Adult's 44k rows: about 25 s
def test_adult_prepared_without_column_flags_trains(tmp_path):
    raw = shared_file("data", "adult", "adult.parquet")
    p = het("data", "prepare", "table", raw, str(tmp_path / "adult"), "--label", "income", "--positive", ">50K",
            "--quiet", "--json")
    assert p["num_dense"] == 6 and p["num_fields"] == 8 and 0.2 < p["positive_rate"] < 0.3
    s = het("train", "--model", "deepfm", "--data", f"table:{tmp_path / 'adult'}", "--steps", "40", "--json",
            "--quiet", "--log-dir", str(tmp_path / "logs"))
    assert s["auc"] > 0.85 and s["validation"]["best_step"] >= 1


@pytest.mark.slow  # a preparation and a job: about 20 s
def test_a_five_class_rating_mapped_by_positive_trains(tmp_path):
    rng = np.random.default_rng(3)
    n = 2000
    users, items = rng.integers(0, 40, n), rng.integers(0, 60, n)
    rating = np.clip(np.round(3 + (users % 5 - 2) * 0.8 + rng.normal(0, 0.7, n)), 1, 5).astype(int)
    lines = ["user_id,item_id,rating"] + [f"{u},{i},{r}" for u, i, r in zip(users, items, rating)]
    (tmp_path / "r.csv").write_text("\n".join(lines) + "\n")
    p = het("data", "prepare", "table", str(tmp_path / "r.csv"), str(tmp_path / "prep"), "--label", "rating",
            "--positive", ">=4", "--quiet", "--json")
    assert p["rows"] == n and p["positives"] == int((rating >= 4).sum())
    s = het("train", "--data", f"table:{tmp_path / 'prep'}", "--steps", "30", "--batch", "64", "--json", "--quiet",
            "--log-dir", str(tmp_path / "logs"))
    assert s["auc"] > 0.6  # a user's mean rating is learnt


@pytest.mark.slow  # about 10 s: three jobs
def test_a_table_smaller_than_a_batch_is_said_once(tmp_path):
    """What the data holds is said once, by rank 0 (the launcher never reads the data)."""
    lines = ["user,item,clicked"] + [f"u{i % 7},i{i % 11},{(i * 7) % 3 == 0:d}" for i in range(300)]
    (tmp_path / "r.csv").write_text("\n".join(lines) + "\n")
    het("data", "prepare", "table", str(tmp_path / "r.csv"), str(tmp_path / "prep"), "--label", "clicked",
        "--quiet", "--json")
    out = subprocess.run([sys.executable, "-m", "het", "train", "--data", f"table:{tmp_path / 'prep'}", "--steps", "2",
                          "--quiet", "--json", "--log-dir", str(tmp_path / "logs")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    said = [line for line in out.stderr.splitlines() if line.startswith("het train: warning: ")]
    assert len(said) == 2 and "fewer than one global batch (2 workers x 512)" in said[0], out.stderr[-3000:]
