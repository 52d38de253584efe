"""Labels mapped to 0/1, dense transforms fitted on the training rows and applied unchanged when
scoring, and the validation split carved from the training rows."""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pytest
from hypothesis import given, settings, strategies as st

from het.data.buckets import QuantileSample, bucket_keys
from het.data.labels import Positive
from het.data.multi import PAD
from het.data.prepared import PreparedDataset
from het.data.table import TableSpec, prepare_table
from het.data.transforms import DenseStats, apply
from het.data.validation import ValidatedTable
from het.data.vocab import KeyCounter, apply_vocab, oov_keys
from het.export.spec import Inputs, build_spec


def _write(path, columns: dict) -> str:
    pcsv.write_csv(pa.table(columns), path)
    return str(path)


def test_a_five_class_label_is_refused_without_positive_and_trains_with_it(tmp_path):
    rng = np.random.default_rng(0)
    n = 400
    src = _write(tmp_path / "r.csv", {"rating": rng.integers(1, 6, n), "user": rng.integers(0, 9, n).astype(str)})
    spec = TableSpec("rating", (), ("user",))
    with pytest.raises(ValueError, match="--positive"):
        prepare_table(src, str(tmp_path / "out"), spec, progress=False)
    assert not os.path.exists(tmp_path / "out")  # refused: nothing written
    s = prepare_table(src, str(tmp_path / "out"), TableSpec("rating", (), ("user",), positive=">=4"), progress=False)
    ratings = pcsv.read_csv(src).column("rating").to_numpy()
    assert s["rows"] == n and s["skipped"] == 0 and s["positives"] == int((ratings >= 4).sum())


def test_one_class_after_mapping_is_refused(tmp_path):
    src = _write(tmp_path / "r.csv", {"y": ["no"] * 50, "c": ["a"] * 50})
    with pytest.raises(ValueError, match="one class"):
        prepare_table(src, str(tmp_path / "out"), TableSpec("y", (), ("c",), positive="yes"), progress=False)
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("text, values, expected", [
    (">50K", [">50K", "<=50K", " >50K ", None], ([1, 0, 1, 0], [False, False, False, True])),
    ("yes,y", ["y", "no", "yes", ""], ([1, 0, 1, 0], [False, False, False, True])),
    ("<0", ["-1", "0", "x", "2"], ([1, 0, 0, 0], [False, False, True, False])),
    (None, ["1", "0", "2", "0.0"], ([1, 0, 0, 0], [False, False, True, False])),
])
def test_positive_maps_values_and_comparisons(text, values, expected):
    y, bad = Positive(text).labels(pa.array(values))
    assert (y.tolist(), bad.tolist()) == (list(map(float, expected[0])), expected[1])


def test_a_malformed_positive_is_refused_before_any_file_is_read():
    with pytest.raises(ValueError, match="--positive"):
        TableSpec("y", (), ("c",), positive=" , ")


def test_the_transforms_are_fitted_on_the_training_rows_alone(tmp_path):
    rng = np.random.default_rng(1)
    n = 3000
    counts = rng.exponential(50, n).round()
    src = _write(tmp_path / "t.csv", {"y": rng.integers(0, 2, n), "count": counts, "age": rng.normal(40, 10, n),
                                      "c": rng.integers(0, 5, n).astype(str)})
    s = prepare_table(src, str(tmp_path / "out"), TableSpec("y", ("count", "age"), ("c",)), test_fraction=0.2,
                      progress=False)
    kinds = {t["column"]: t["kind"] for t in s["dense_transforms"]}
    assert kinds == {"count": "log-standard", "age": "standard"}  # right-skewed counts get log1p first
    data = PreparedDataset(str(tmp_path / "out"))
    train = np.asarray(data.take("train", np.arange(data.rows["train"])).dense)
    assert np.allclose(train.mean(0), 0, atol=1e-5) and np.allclose(train.std(0), 1, atol=1e-4)
    test = np.asarray(data.take("test", np.arange(data.rows["test"])).dense)
    assert not np.allclose(test.mean(0), 0, atol=1e-5)  # test rows were not fitted on


rows = st.lists(st.tuples(st.sampled_from(["0", "1"]),
                          st.one_of(st.just(""), st.floats(-1e6, 1e9, allow_nan=False).map(repr)),
                          st.one_of(st.just(""), st.integers(0, 10 ** 7).map(str)),
                          st.text("abcxyz", max_size=4)), min_size=8, max_size=60)


@settings(max_examples=25, deadline=None)
@given(train=rows, scored=rows, kind=st.sampled_from(["auto", "standard", "log", "log-standard", "none", "bucket"]),
       bucket=st.sampled_from([(), ("n",)]), min_freq=st.sampled_from([1, 2, 3]))
def test_prepared_arrays_and_the_export_spec_agree_bit_for_bit(tmp_path_factory, train, scored, kind, bucket,
                                                               min_freq):
    """Rows with missing values, values outside the training range and unseen ids, under every
    dense transform, quantile buckets and vocabularies: the prepared arrays and the input spec
    an export applies to the raw file are equal."""
    d = tmp_path_factory.mktemp("t")
    train = [("0", "1.0", "5", "a"), ("1", "2.0", "7", "b")] + train  # both classes
    header = "y,x,n,c\n"
    (d / "train.csv").write_text(header + "".join(",".join(r) + "\n" for r in train))
    spec = TableSpec("y", ("x", "n"), ("c",), dense_transform=kind, bucket=bucket, buckets=4, min_freq=min_freq)
    prepare_table(str(d / "train.csv"), str(d / "out"), spec, test_fraction=0.0, progress=False)
    input_spec, files = build_spec({"data": f"table:{d / 'out'}", "ids": "encoded"})
    for name, source in files.items():  # as an export holds them
        os.makedirs(d / os.path.dirname(name), exist_ok=True)
        shutil.copy(source, d / name)
    inputs = Inputs(input_spec, str(d))
    data = PreparedDataset(str(d / "out"))
    table = pcsv.read_csv(d / "train.csv", convert_options=pcsv.ConvertOptions(
        column_types={c: pa.string() for c in "yxnc"}))
    parsed = inputs.parse(table)
    stored = data.take("train", np.arange(data.rows["train"]))
    assert np.array_equal(parsed.dense.view(np.uint32), stored.dense.numpy().view(np.uint32))
    assert np.array_equal(parsed.keys, stored.sparse.numpy())
    (d / "scored.csv").write_text(header + "".join(",".join(r) + "\n" for r in scored))
    other = inputs.parse(pcsv.read_csv(d / "scored.csv", convert_options=pcsv.ConvertOptions(
        column_types={c: pa.string() for c in "yxnc"})))
    meta = json.load(open(d / "out" / "meta.json"))
    for j, t in enumerate(meta["dense_transforms"] or []):  # out-of-range values land in the fitted range
        given = np.array([r[1 + j] != "" for r in scored])
        if t["lo"] is not None:
            assert (other.dense[given, j] >= np.float32(t["lo"]) - 1e-6).all()
            assert (other.dense[given, j] <= np.float32(t["hi"]) + 1e-6).all()


@settings(max_examples=30, deadline=None)
@given(blocks=st.lists(st.lists(st.integers(-2 ** 63, 2 ** 63 - 1) | st.integers(-3, 3), max_size=40), max_size=6),
       min_freq=st.integers(1, 4))
def test_the_key_counter_counts_as_a_counter_does(blocks, min_freq):
    c, ref = KeyCounter(), Counter()
    for b in blocks:
        c.add(np.array(b, np.int64))
        ref.update(b)
    assert c.at_least(min_freq).tolist() == sorted(k for k, v in ref.items() if v >= min_freq)


def test_a_vocabulary_gives_rare_and_unseen_ids_their_columns_key_and_keeps_the_padding():
    oov = oov_keys(["a", "b"])
    keys = np.array([[1, 2], [7, PAD], [1, 9]])
    out = apply_vocab(keys, np.array([1, 2]), oov)
    assert out.tolist() == [[1, 2], [oov[0], PAD], [1, oov[1]]]
    assert (apply_vocab(keys, np.zeros(0, np.int64), oov)[:, 0] == oov[0]).all()


def test_quantile_buckets_hold_equal_shares_of_the_training_rows_and_merge_ties():
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.normal(0, 1, 50_000), np.zeros(50_000)]).astype(np.float32)[:, None]
    s = QuantileSample(1)
    for lo in range(0, len(x), 7_000):  # blocks of any size give the same sample
        s.add(x[lo:lo + 7_000], np.arange(lo, min(lo + 7_000, len(x))))
    t = s.fit(["x"], 10)[0]
    assert t["buckets"] < 10  # half the rows are 0: the buckets over it merge
    keys = bucket_keys(x[:, 0], np.zeros(len(x), bool), t)
    shares = np.unique(keys, return_counts=True)[1] / len(x)
    assert len(shares) == t["buckets"] and shares.max() >= 0.5 and shares.min() > 0.04
    rows = np.arange(len(x))
    big = QuantileSample(1, k=1000)
    big.add(x, rows)
    again = QuantileSample(1, k=1000)
    for lo in range(0, len(x), 333):
        again.add(x[lo:lo + 333], rows[lo:lo + 333])
    assert np.array_equal(np.sort(big.values[:, 0]), np.sort(again.values[:, 0]))


def test_buckets_and_vocabularies_are_checked_and_kept_in_the_schema(tmp_path, capsys):
    with pytest.raises(ValueError, match="bucketed columns must be dense"):
        TableSpec("y", ("x",), ("c",), bucket=("c",))
    with pytest.raises(ValueError, match="--min-freq"):
        TableSpec("y", ("x",), ("c",), min_freq=0)
    rng = np.random.default_rng(4)
    n = 400
    src = _write(tmp_path / "t.csv", {"y": rng.integers(0, 2, n), "x": rng.normal(0, 1, n),
                                      "c": rng.integers(0, 80, n).astype(str)})
    run_het(["data", "prepare", "table", src, str(tmp_path / "a"), "--label", "y", "--dense", "x", "--sparse", "c",
             "--dense-transform", "bucket", "--buckets", "5", "--min-freq", "4", "--quiet"], capsys)
    text = (tmp_path / "a" / "schema.toml").read_text()
    assert 'dense_transform = "bucket"' in text and "buckets = 5" in text and "min_freq = 4" in text
    s = json.loads(run_het(["data", "prepare", "table", src, str(tmp_path / "b"), "--schema",
                            str(tmp_path / "a" / "schema.toml"), "--quiet", "--json"], capsys).strip().splitlines()[-1])
    assert (s["dense"], s["sparse"], s["vocabulary"]["min_freq"], s["buckets"][0]["buckets"]) == ([], ["c", "x"], 4, 5)
    for name in ("train_dense.npy", "train_sparse.npy", "vocab.npy"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    with pytest.raises(SystemExit, match="bucketed columns must be dense ones"):  # never dropped without a word
        run_het(["data", "prepare", "table", src, str(tmp_path / "c"), "--label", "y", "--dense", "x", "--sparse",
                 "c", "--bucket", "c", "--quiet"], capsys)
    assert not (tmp_path / "c").exists()


def test_apply_leaves_a_missing_value_at_the_training_mean():
    s = DenseStats(1)
    s.add(np.array([[1.0], [2.0], [6.0], [np.nan]], np.float32))
    t = s.fit(["x"], "standard")[0]
    out = apply(np.array([3.0, 0.0, 100.0]), np.array([False, True, False]), t)
    assert out[0] == 0.0 and out[1] == 0.0 and out[2] == np.float32(t["hi"])


def test_the_validation_split_is_apart_and_each_epoch_a_permutation(tmp_path):
    from het.data.prepared import HASHED_FORMAT, HASHED_VERSION, SplitWriter

    w = SplitWriter(str(tmp_path), num_dense=1, num_fields=1)
    n = 1000
    w.add(np.arange(n, dtype=np.float32)[:, None], np.arange(n)[:, None], np.zeros(n), np.arange(n) >= 900)
    sizes = w.close()
    w.write_meta({"format": HASHED_FORMAT, "version": HASHED_VERSION, "num_rows": None, "num_ids": n,
                  "num_dense": 1, "num_fields": 1, "train_rows": sizes["train"], "test_rows": sizes["test"]})
    data = ValidatedTable(PreparedDataset(str(tmp_path)), frac=0.1, seed=3)
    train, val = data.rows["train"], data.rows["val"]
    assert train + val == 900 and 60 < val < 140
    keys = lambda split, i, k: data.batch(split, i, k).sparse.flatten().tolist()  # noqa: E731
    val_keys = set(keys("val", 0, val))
    epochs = [keys("train", 0, train), keys("train", 1, train)]
    for epoch in epochs:
        assert sorted(epoch) == sorted(set(range(900)) - val_keys)  # every training row once, no val row
    assert epochs[0] != epochs[1]  # a fresh order each epoch
    assert keys("train", 5, 64) == keys("train", 5, 64)  # a batch is a function of its index
    straddling = keys("train", 0, train + 10)
    assert straddling[:train] == epochs[0] and straddling[train:] == epochs[1][:10]
    assert set(keys("test", 0, 100)) == set(range(900, 1000))
    same = ValidatedTable(PreparedDataset(str(tmp_path)), frac=0.1, seed=4)  # another training order
    assert set(same.batch("val", 0, same.rows["val"]).sparse.flatten().tolist()) == val_keys
    assert keys("train", 0, 64) != same.batch("train", 0, 64).sparse.flatten().tolist()
    other = ValidatedTable(PreparedDataset(str(tmp_path)), frac=0.1, seed=3, split_seed=1)
    assert set(other.batch("val", 0, other.rows["val"]).sparse.flatten().tolist()) != val_keys


ADULT_DENSE = ["age", "fnlwgt", "educational-num", "capital-gain", "capital-loss", "hours-per-week"]
ADULT_SPARSE = ["workclass", "education", "marital-status", "occupation", "relationship", "race", "gender",
                "native-country"]


def test_inference_on_adult_and_the_criteo_rows_chooses_the_hand_written_roles():
    from het.data.schema import criteo_schema, infer, looks_like_criteo, sample
    from jobs import shared_file

    adult = infer(sample(shared_file("data", "adult", "adult.parquet")), "income")
    assert (adult.label, adult.dense, adult.sparse, adult.ignored) == ("income", ADULT_DENSE, ADULT_SPARSE, {})
    path = shared_file("data", "criteo_kaggle_head1000.tsv")
    names, header = looks_like_criteo(path, "\t")
    inferred = infer(sample(path, "\t", names))
    hand = criteo_schema(names)
    assert not header and (inferred.label, inferred.dense, inferred.sparse) == (hand.label, hand.dense, hand.sparse)


def test_a_row_id_and_a_constant_column_are_left_out(tmp_path):
    from het.data.schema import infer, sample

    n = 2000
    rng = np.random.default_rng(0)
    src = _write(tmp_path / "t.csv", {"id": np.arange(n), "click": rng.integers(0, 2, n), "site": ["s1"] * n,
                                      "ad_id": rng.integers(0, 30, n), "price": rng.random(n),
                                      "city": rng.choice(["Oslo", "Rome"], n)})
    s = infer(sample(src))
    assert s.label == "click" and s.dense == ["price"] and s.sparse == ["ad_id", "city"]  # integers named as ids
    assert set(s.ignored) == {"id", "site"}


def run_het(argv, capsys):
    from het import cli

    cli.main(argv)
    return capsys.readouterr().out


def test_prepare_without_column_flags_writes_the_schema_it_used_and_reads_it_back(tmp_path, capsys):
    rng = np.random.default_rng(2)
    n = 500
    src = _write(tmp_path / "t.csv", {"y": rng.choice(["yes", "no"], n), "n": rng.integers(0, 9, n),
                                      "c": rng.choice(list("abcde"), n)})
    out = run_het(["data", "prepare", "table", src, str(tmp_path / "a"), "--label", "y", "--positive", "yes",
                   "--quiet"], capsys)
    assert "schema (inferred from the head" in out
    text = (tmp_path / "a" / "schema.toml").read_text()
    assert 'label = "y"' in text and 'positive = "yes"' in text and 'dense = ["n"]' in text
    again = run_het(["data", "prepare", "table", src, str(tmp_path / "b"), "--schema",
                     str(tmp_path / "a" / "schema.toml"), "--quiet", "--json"], capsys)
    s = json.loads(again.strip().splitlines()[-1])
    assert (s["label"], s["dense"], s["sparse"], s["positive"]) == ("y", ["n"], ["c"], "yes")
    for name in ("train_dense.npy", "train_sparse.npy", "train_labels.npy"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_describe_writes_nothing_and_names_each_role(tmp_path, capsys):
    src = _write(tmp_path / "t.csv", {"label": [0, 1] * 10, "x": [1.5] * 19 + [2.0], "c": ["a", "b"] * 10})
    before = sorted(os.listdir(tmp_path))
    out = run_het(["data", "describe", src], capsys)
    assert sorted(os.listdir(tmp_path)) == before
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines()[2:]}
    assert rows == {"label": "label", "x": "dense", "c": "sparse"}


def test_a_multi_hot_column_becomes_a_padded_bag_and_trains_pooled(tmp_path):
    from het.data.multi import PAD
    from het.data.schema import infer, sample
    from het.data.table import hash_column

    rng = np.random.default_rng(5)
    n = 400
    genres = ["|".join(rng.choice(["Action", "Comedy", "Drama"], rng.integers(0, 4), replace=False)) for _ in range(n)]
    src = _write(tmp_path / "m.csv", {"click": rng.integers(0, 2, n), "genres": genres, "c": rng.choice(["a", "b"], n)})
    schema = infer(sample(src))
    assert schema.multi == {"genres": "|"} and schema.sparse == ["genres", "c"]
    s = prepare_table(src, str(tmp_path / "out"), TableSpec("click", (), ("genres", "c"), multi=(("genres", "|"),), bag=2),
                      test_fraction=0.0, progress=False)
    assert s["bag_sizes"] == [2, 1] and s["num_fields"] == 2
    data = PreparedDataset(str(tmp_path / "out"))
    keys = data.take("train", np.arange(n)).sparse.numpy()
    assert keys.shape == (n, 3) and data.bag_sizes == (2, 1) and data.pooling == "mean"
    for row, text in zip(keys[:50], genres[:50]):
        tokens = [t for t in text.split("|") if t][:2]
        expected = hash_column("genres", pa.array(tokens)).tolist() + [PAD] * (2 - len(tokens))
        assert row[:2].tolist() == expected


def test_a_multi_hot_field_in_a_request_takes_a_list_or_text_and_refuses_the_rest():
    from het.online.requests import BadRequest, columns_of, instances_of

    spec = {"source": "table", "label": "y", "dense": [], "sparse": ["g"], "bag_sizes": [3], "multi": {"g": "|"}}
    inputs = Inputs(spec, ".")
    body = json.dumps({"instances": [{"g": ["a", "b"]}, {"g": "a|c"}, {"g": None}, {"g": [1, 2.5]}]}).encode()
    columns = columns_of(instances_of(body, inputs, 8), ["g"], spec["multi"])
    assert columns == {"g": ["a|b", "a|c", None, "1|2.5"]}
    with pytest.raises(BadRequest, match="expected a list of ids"):
        instances_of(json.dumps({"instances": [{"g": {"x": 1}}]}).encode(), inputs, 8)


def test_a_row_id_or_a_constant_column_given_by_hand_is_warned_of(tmp_path, capsys):
    rng = np.random.default_rng(0)
    n = 1500
    src = _write(tmp_path / "w.csv", {"y": rng.integers(0, 2, n), "rid": [f"r{i}" for i in range(n)], "site": ["s"] * n,
                                      "c": rng.choice(["a", "b"], n)})
    from het import cli

    cli.main(["data", "prepare", "table", src, str(tmp_path / "o"), "--label", "y", "--sparse", "rid,site,c", "--quiet"])
    err = capsys.readouterr().err
    assert "column 'rid' (every value differs: a row id)" in err and "column 'site' (one value)" in err
    assert "column 'c'" not in err


def test_prepare_criteo_on_a_headed_csv_points_to_prepare_table(tmp_path):
    from het import cli

    (tmp_path / "c.csv").write_text("label," + ",".join(f"I{i}" for i in range(1, 14)) + ","
                                    + ",".join(f"C{i}" for i in range(1, 27)) + "\n" + "1," * 39 + "1\n")
    with pytest.raises(SystemExit, match="het data prepare table .* --preset criteo") as e:
        cli.main(["data", "prepare", "criteo", str(tmp_path / "c.csv"), str(tmp_path / "o")])
    assert "{" not in str(e.value) and not os.path.exists(tmp_path / "o")
