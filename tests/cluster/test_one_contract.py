"""What was fitted in training is applied, unchanged, everywhere the model scores: a model
trained on a prepared table scores its test rows the same from the prepared arrays, from the
raw file through `het predict`, from `het.load_model(...).predict(DataFrame)` and from
`het serve-model` over HTTP, bit for bit, and so do random rows (missing values, values out of
the training range, unseen ids, lists of any length in a multi-hot column: text in a file and a
DataFrame, a JSON list over HTTP). The table holds every kind of fitted input: dense transforms,
a dense column made quantile buckets, and a vocabulary whose rare and unseen ids share a key."""

from __future__ import annotations

import csv
import json

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from het.bench.predict import trained_export
from het.data.prepared import split_is_test
from het.data.table import TableSpec, prepare_table
from het.export import load_model
from het.export.predict import predict
from het.export.spec import to_arrow
from het.train.config import TrainConfig
from jobs import Server

pytestmark = pytest.mark.cluster
COLUMNS = ("y", "count", "age", "city", "ad_id", "genres")
GENRES = ["Action", "Comedy", "Drama", "Horror", "Romance"]


def _text(rows: list[tuple]) -> str:
    return ",".join(COLUMNS) + "\n" + "".join(",".join(r) + "\n" for r in rows)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A model trained on a prepared table, its export, its own test scores, and a server of it.
    Everything scores on one torch thread, as `het serve-model` does by default: the split of a
    matrix product over threads can change a score's last bit, which is not what is tested."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    d = tmp_path_factory.mktemp("contract")
    rng = np.random.default_rng(0)
    n = 3000
    city = rng.choice(["Oslo", "Rome", "Lima", "Pune", ""], n)
    ad = rng.integers(0, 400, n)  # about 7 a value: a tail rarer than the vocabulary's 3
    count = np.where(rng.random(n) < 0.1, "", rng.exponential(30, n).round().astype(int).astype(str))
    age = np.where(rng.random(n) < 0.05, "", rng.normal(40, 12, n).round(1).astype(str))
    genres = ["|".join(rng.choice(GENRES, rng.integers(0, 5), replace=False)) for _ in range(n)]
    logit = (city == "Rome") * 1.5 - (ad % 7 == 0) * 1.0 + 0.3 * (age != "") + np.char.count(genres, "Comedy")
    y = (rng.random(n) < 1 / (1 + np.exp(-(logit - 0.5)))).astype(int).astype(str)
    rows = list(zip(y, count, age, city, ad.astype(str), genres))
    (d / "raw.csv").write_text(_text(rows))
    prepare_table(str(d / "raw.csv"), str(d / "prep"), TableSpec("y", ("count", "age"), ("city", "ad_id", "genres"),
                                                                  multi=(("genres", "|"),), bag=3, bucket=("age",),
                                                                  min_freq=3), progress=False)
    cfg = TrainConfig.from_dict({"data": f"table:{d / 'prep'}", "batch": 64, "dim": 8, "eval_samples": 100_000,
                                 "lookahead": 4})
    _, export, _, (labels, probs) = trained_export(cfg, 30, str(d), scores=True)
    test = split_is_test(np.arange(n), 0, 0.1)
    (d / "test.csv").write_text(_text([r for r, t in zip(rows, test) if t]))
    try:
        with Server(export) as server:
            yield d, export, probs, server
    finally:
        torch.set_num_threads(threads)


def test_the_table_holds_a_vocabulary_and_a_bucketed_column(trained):
    d = trained[0]
    meta = json.loads((d / "prep" / "meta.json").read_text())
    assert meta["dense"] == ["count"] and meta["sparse"] == ["city", "ad_id", "genres", "age"]
    assert meta["buckets"][0]["column"] == "age" and meta["buckets"][0]["buckets"] == 10
    train = np.load(d / "prep" / "train_sparse.npy")
    oov = meta["vocabulary"]["oov"]["ad_id"]
    assert 0 < (train[:, 1] == oov).sum() < len(train) // 2  # the rare ids share one key
    assert len(np.unique(train[:, -1])) == 11  # ten buckets and the missing key


def test_the_test_rows_score_alike_from_the_arrays_and_the_raw_file(trained):
    d, export, probs, _ = trained
    prepared = predict(export, f"table:{d / 'prep'}", out=str(d / "prepared.csv"))
    raw = predict(export, str(d / "test.csv"), out=str(d / "raw.csv.scores.csv"))
    assert prepared["rows"] == raw["rows"] == len(probs) and raw["skipped"] == 0
    scores = [np.array([float(r["score"]) for r in csv.DictReader(open(p))])
              for p in (d / "prepared.csv", d / "raw.csv.scores.csv")]
    assert np.array_equal(scores[0], scores[1])
    assert np.array_equal(scores[0].astype(np.float32), probs.astype(np.float32))  # as training scored them


values = st.one_of(st.none(), st.sampled_from(["0", "1", "3", "25"]), st.floats(-1e7, 1e9, allow_nan=False).map(repr),
                   st.integers(-5, 10 ** 6).map(str))
row = st.tuples(st.sampled_from(["0", "1"]), values, values,
                st.one_of(st.none(), st.sampled_from(["Oslo", "Rome", "Atlantis", "x" * 40])),
                st.one_of(st.none(), st.integers(-3, 10 ** 12).map(str)),
                st.lists(st.sampled_from(GENRES + ["Noir", "x" * 30]), max_size=7))  # past the bag's 3 too


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(row, min_size=1, max_size=30))
def test_random_rows_score_alike_everywhere(trained, rows):
    d, export, _, server = trained
    model = load_model(export)
    text = [(*r[:5], "|".join(r[5]) or None) for r in rows]  # a list as a file holds it
    frame = pd.DataFrame(text, columns=COLUMNS, index=np.arange(len(text)) * 3 + 7)
    by_frame = model.predict(frame)
    assert isinstance(by_frame, pd.Series) and by_frame.name == "score" and by_frame.index.equals(frame.index)
    parsed = model.inputs.parse(to_arrow(frame))  # the arrays the spec makes, scored by the model itself
    by_arrays = model(torch.from_numpy(parsed.dense), torch.from_numpy(parsed.keys)).numpy()
    path = d / "random.csv"
    path.write_text(_text([tuple("" if v is None else v for v in r) for r in text]))
    out = d / "random_scores.csv"
    s = predict(export, str(path), out=str(out))
    assert s["rows"] == len(rows) and parsed.ok.all()
    by_file = np.array([float(r["score"]) for r in csv.DictReader(open(out))], np.float32)
    body = {"instances": [{c: v for c, v in zip(COLUMNS[1:], r[1:])} for r in rows]}
    reply = server.predict(body)
    assert reply.status_code == 200, reply.text
    by_http = np.array(reply.json()["predictions"], np.float32)
    for name, other in (("arrays", by_arrays), ("file", by_file), ("http", by_http)):
        assert np.array_equal(by_frame, other), name
