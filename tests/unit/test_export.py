"""het export, het.load_model and het predict against training itself: the same scores (1e-6)
and AUC for every CTR model on fixed tables, dynamic tables and a shard with a disk tier; raw
files read as prepared ones; quantised rows; refusals that name what is wrong."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
import torch

from het.bench.predict import trained_export
from het.export import layout, load_model
from het.export.predict import predict
from het.export.writer import export
from het.ps.local import local_client
from het.train.config import TrainConfig

SAMPLES = 3000  # held-out samples scored by training and by the export


def job(model="wdl", kind="fixed", **settings) -> tuple[TrainConfig, dict]:
    """A small CTR job of ``kind``: fixed table, dynamic (hashed ids, admission after two
    sightings, so some keys are never stored), or tiered (dynamic, its shard's rows mostly on
    disk); and the shard options it needs."""
    base = {"model": model, "batch": 128, "dim": 16, "eval_samples": SAMPLES, "lookahead": 4,
            "synthetic": {"cap": 800}, **settings}
    options = {}
    if kind in ("dynamic", "tiered"):
        base.update(ids="hashed", table={**base.get("table", {}), "admit_after": 2})
    if kind == "tiered":
        base.update(shard={"memory": "2MiB"})
        options = {"memory": 2 << 20}
    return TrainConfig.from_dict(base), options


def scores_of(path: str) -> np.ndarray:
    """The scores ``het predict --out`` wrote (float32; a CSV spells each so it reads back exact)."""
    table = pq.read_table(path) if path.endswith(".parquet") else pcsv.read_csv(path)
    return table.column("score").to_numpy().astype(np.float32)


FAST = [("wdl", "fixed", 1), ("deepfm", "dynamic", 2), ("dcn", "tiered", 1), ("dlrm", "fixed", 2)]
SLOW = [(m, k, s) for m in ("wdl", "deepfm", "dcn", "dlrm") for k, s in (("fixed", 2), ("dynamic", 1), ("tiered", 2))
        if (m, k, s) not in FAST]


def check_reproduces_training(tmp_path, model, kind, shards, **settings):
    cfg, options = job(model, kind, **settings)
    ckpt, out, metrics, (labels, reference) = trained_export(cfg, 25, str(tmp_path), servers=shards,
                                                             shard_options=options, scores=True)
    s = predict(out, "synthetic-criteo", out=str(tmp_path / "scores.parquet"))
    scores = scores_of(str(tmp_path / "scores.parquet"))
    assert s["rows"] == SAMPLES == len(reference)
    assert np.abs(scores - reference).max() <= 1e-6
    assert round(s["auc"], 4) == round(metrics["auc"], 4)
    manifest = layout.read_manifest(out)
    assert manifest["evaluation"]["auc"] == metrics["auc"] and manifest["step"] == 25
    assert manifest["tables"]["embedding"]["dynamic"] == (kind != "fixed")
    return out, manifest


@pytest.mark.parametrize("model, kind, shards", FAST)
def test_fp32_export_reproduces_training(tmp_path, model, kind, shards):
    out, manifest = check_reproduces_training(tmp_path, model, kind, shards)
    if kind == "tiered":  # the rows came from the disk tier's segment files, linked beside the save
        assert any("rows-" in name for name in os.listdir(os.path.join(manifest["checkpoint"], "ps")))


@pytest.mark.parametrize("row_dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("kind", ["fixed", "dynamic"])
def test_an_export_of_rows_stored_in_half_reproduces_training(tmp_path, row_dtype, kind):
    """The shards' half rows are saved as they are; the export widens them exactly."""
    check_reproduces_training(tmp_path, "wdl", kind, 1, table={"row_dtype": row_dtype})


@pytest.mark.slow
@pytest.mark.parametrize("model, kind, shards", SLOW)
def test_fp32_export_reproduces_training_everywhere(tmp_path, model, kind, shards):
    check_reproduces_training(tmp_path, model, kind, shards)


def test_multi_hot_fields_and_mode_ps_reproduce_training(tmp_path):
    """MLPerf's shape (bags pooled per field, hashed ids) and dense parameters kept on the PS."""
    for i, settings in enumerate(({"data": "synthetic-criteo-1tb", "synthetic": {"cap": 300}},
                                  {"mode": "ps"})):
        cfg, _ = job("wdl", "fixed", **settings)
        _, out, _, (_, reference) = trained_export(cfg, 12, str(tmp_path / str(i)), scores=True)
        data = cfg.data
        s = predict(out, data, out=str(tmp_path / f"s{i}.csv"))
        assert s["rows"] == SAMPLES
        assert np.abs(scores_of(str(tmp_path / f"s{i}.csv")) - reference).max() <= 1e-6


@pytest.mark.parametrize("model, settings", [
    ("deepfm", {"dim": "auto"}),                                               # fixed tables, projections
    ("dlrm", {"dim": 8, "widths": {"C1": 16, "C2": 4}, "ids": "hashed"}),       # dynamic tables
    ("dcn", {"dim": "auto", "data": "synthetic-criteo-1tb", "synthetic": {"cap": 300}}),  # pooled bags
])
def test_an_export_of_fields_of_several_widths_scores_as_training(tmp_path, model, settings):
    cfg, _ = job(model, "fixed", **settings)
    _, out, metrics, (_, reference) = trained_export(cfg, 20, str(tmp_path), scores=True)
    manifest = layout.read_manifest(out)
    assert len(manifest["tables"]) > 1 and manifest["model"]["fields"]
    s = predict(out, cfg.data, out=str(tmp_path / "scores.parquet"))
    assert s["rows"] == SAMPLES
    assert np.abs(scores_of(str(tmp_path / "scores.parquet")) - reference).max() <= 1e-6
    assert round(s["auc"], 4) == round(metrics["auc"], 4)


def test_the_program_and_the_model_class_give_the_same_scores(tmp_path):
    cfg, _ = job("deepfm")
    _, out, _ = trained_export(cfg, 10, str(tmp_path))
    program, eager = load_model(out), load_model(out, use_program=False)
    assert program.uses_program and not eager.uses_program
    from het.data.synthetic import SyntheticCriteo, SyntheticCriteoConfig

    b = SyntheticCriteo(SyntheticCriteoConfig(cap=800)).batch("test", 0, 257)
    assert torch.equal(program(b), eager(b))


# ---- raw input --------------------------------------------------------------------------------

def clicks_csv(path, rows=600, seed=0) -> None:
    """A CSV of clicks: user and ad ids, a city, a price and an age; a few malformed lines."""
    rng = np.random.default_rng(seed)
    users, ads = rng.zipf(1.3, rows) % 300, rng.zipf(1.2, rows) % 80
    label = (rng.random(rows) < 0.2 + 0.5 * (ads % 7 == 0)).astype(int)
    lines = ["clicked,user,ad,city,price,age"]
    for i in range(rows):
        price = "" if i % 17 == 0 else f"{rng.random() * 100:.2f}"
        city = "" if i % 23 == 0 else ["Paris", "Oslo", "Rome"][i % 3]
        lines.append(f"{label[i]},u{users[i]},a{ads[i]},{city},{price},{20 + i % 50}")
    lines[50] = "2,u1,a1,Paris,3.5,30"      # a label that is not 0/1
    lines[90] = "1,u1,a1,Paris,abc,30"      # a price that is not a number
    lines[120] = "1,u1,a1"                  # too few columns
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def test_raw_csv_scores_equal_those_of_its_prepared_table(tmp_path):
    from het.data.table import TableSpec, prepare_table

    clicks = str(tmp_path / "clicks.csv")
    clicks_csv(clicks)
    prepared = str(tmp_path / "prepared")
    meta = prepare_table(clicks, prepared, TableSpec("clicked", ("price", "age"), ("user", "ad", "city"),
                                                     log_dense=True), test_fraction=0.3, progress=False)
    cfg = TrainConfig.from_dict({"data": f"table:{prepared}", "batch": 64, "dim": 8, "eval_samples": 100,
                                 "lookahead": 2})
    _, out, _ = trained_export(cfg, 15, str(tmp_path / "job"))
    a = predict(out, clicks, out=str(tmp_path / "a.csv"))
    b = predict(out, f"table:{prepared}", split="all", out=str(tmp_path / "b.csv"))
    assert a["rows"] == b["rows"] == meta["rows"] and a["skipped"] == meta["skipped"] == 3
    assert [e["line"] for e in a["first_skipped"]] == [e["line"] for e in meta["first_skipped"]]
    ta, tb = pcsv.read_csv(str(tmp_path / "a.csv")), pcsv.read_csv(str(tmp_path / "b.csv"))
    assert ta.column("row").to_pylist() == tb.column("row").to_pylist() == list(range(meta["rows"]))
    assert np.array_equal(scores_of(str(tmp_path / "a.csv")), scores_of(str(tmp_path / "b.csv")))
    assert a["auc"] == pytest.approx(b["auc"])
    import csv

    model = load_model(out)  # the same rows as a dict of columns, and a Parquet file
    with open(clicks) as f:
        header, *rows = list(csv.reader(f))
    good = [r for k, r in enumerate(rows) if len(r) == len(header) and k not in (49, 89)]  # lines 51, 91
    cols = {name: [r[j] for r in good] for j, name in enumerate(header)}
    p = model.predict({c: cols[c] for c in ("user", "ad", "city", "price", "age")})
    assert np.array_equal(p, scores_of(str(tmp_path / "a.csv")))
    pq.write_table(pa.table(cols), str(tmp_path / "clicks.parquet"))
    predict(out, str(tmp_path / "clicks.parquet"), out=str(tmp_path / "c.parquet"))
    assert np.array_equal(scores_of(str(tmp_path / "c.parquet")), scores_of(str(tmp_path / "a.csv")))


def test_raw_criteo_lines_score_as_their_label_encoded_preparation(tmp_path):
    from het.data.criteo import prepare
    from jobs import shared_file

    head = shared_file("data", "criteo_kaggle_head1000.tsv")
    prepared = str(tmp_path / "criteo")
    prepare(head, prepared, test_fraction=0.2, progress=False)
    cfg = TrainConfig.from_dict({"data": f"criteo:{prepared}", "batch": 64, "dim": 8, "eval_samples": 100,
                                 "lookahead": 2})
    _, out, _ = trained_export(cfg, 10, str(tmp_path / "job"))
    a = predict(out, head, out=str(tmp_path / "a.csv"))
    b = predict(out, f"criteo:{prepared}", split="all", out=str(tmp_path / "b.csv"))
    assert a["rows"] == b["rows"] > 900
    assert np.array_equal(scores_of(str(tmp_path / "a.csv")), scores_of(str(tmp_path / "b.csv")))


# ---- smaller --------------------------------------------------------------------------------

def test_fp16_and_int8_rows_keep_the_auc_and_int8_is_a_quarter_the_size(tmp_path):
    cfg, _ = job("wdl", dim=64, eval_samples=20_000, synthetic={"cap": 2000})
    ckpt, out, _ = trained_export(cfg, 150, str(tmp_path))
    auc = {"fp32": predict(out, "synthetic-criteo")["auc"]}
    size = {"fp32": layout.read_manifest(out)["tables"]["embedding"]["bytes"]}
    for dtype in ("fp16", "int8"):
        export(ckpt, str(tmp_path / dtype), dtype)
        auc[dtype] = predict(str(tmp_path / dtype), "synthetic-criteo")["auc"]
        size[dtype] = layout.read_manifest(str(tmp_path / dtype))["tables"]["embedding"]["bytes"]
    assert abs(auc["fp16"] - auc["fp32"]) <= 0.0005 and abs(auc["int8"] - auc["fp32"]) <= 0.001
    assert size["fp32"] / size["int8"] >= 3.5 and size["fp32"] / size["fp16"] == pytest.approx(2, rel=1e-3)


# ---- refusals ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_export(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("small")
    cfg, _ = job("wdl", "dynamic")
    ckpt, out, _ = trained_export(cfg, 5, str(tmp))
    return ckpt, out


def test_predict_from_columns_names_the_column_and_what_was_expected(small_export):
    _, out = small_export
    model = load_model(out)
    row = {f"I{i}": [0.5] for i in range(1, 14)} | {f"C{i}": [1] for i in range(1, 27)}
    assert model.predict(row).shape == (1,)
    with pytest.raises(ValueError, match=r"missing column\(s\) \['C26'\]"):
        model.predict({k: v for k, v in row.items() if k != "C26"})
    with pytest.raises(ValueError, match=r"row 0: I3: 'abc' is not a finite number"):
        model.predict(row | {"I3": ["abc"]})
    with pytest.raises(ValueError, match=r"row 0: C2: 900 is not an id in \[0, 583\)"):
        model.predict(row | {"C2": [900]})
    with pytest.raises(ValueError, match=r"column 'C1': expected a number or a string per row"):
        model.predict(row | {"C1": [[1, 2]]})
    assert np.isnan(model.predict(row | {"I3": ["abc"]}, errors="skip")[0])
    with pytest.raises(ValueError, match=r"row 0: I3: 1e\+39 is not a finite number"):  # past float32: not a model input
        model.predict(row | {"I3": [1e39]})


def test_predict_skips_and_counts_a_row_with_a_value_past_float32(tmp_path, small_export):
    _, out = small_export
    header = ["label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27))]
    good = ["1", *["0.5"] * 13, *["1"] * 26]
    huge = good[:3] + ["1e39"] + good[4:]
    (tmp_path / "rows.csv").write_text("\n".join(",".join(r) for r in (header, good, huge, good)) + "\n")
    s = predict(out, str(tmp_path / "rows.csv"), out=str(tmp_path / "scores.csv"))
    assert s["rows"] == 2 and s["skipped"] == 1
    assert np.isfinite(scores_of(str(tmp_path / "scores.csv"))).all()


def test_a_checkpoint_that_is_not_one_and_an_export_of_another_version_are_refused(tmp_path, small_export):
    ckpt, out = small_export
    with pytest.raises(ValueError, match="expected a checkpoint directory .* got nothing"):
        export(str(tmp_path / "nowhere"), str(tmp_path / "x"))
    (tmp_path / "notckpt").mkdir()
    (tmp_path / "notckpt" / "worker.pt").write_text("hello")
    with pytest.raises(ValueError, match="not a checkpoint's worker.pt"):
        export(str(tmp_path / "notckpt"), str(tmp_path / "x"))
    assert not os.path.exists(tmp_path / "x") and not any(p.name.startswith("x.") for p in tmp_path.iterdir())
    manifest = json.loads((open(os.path.join(out, layout.MANIFEST)).read()))
    manifest["manifest"]["version"] = 99
    import zlib

    manifest["crc32"] = zlib.crc32(json.dumps(manifest["manifest"], sort_keys=True).encode())
    other = tmp_path / "other"
    import shutil

    shutil.copytree(out, other)
    (other / layout.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(layout.ExportError, match="version 99; this het reads 'het-export' version 1"):
        load_model(str(other))


def test_a_damaged_file_is_refused_naming_it_and_the_offset(tmp_path, small_export):
    import shutil

    _, out = small_export
    damaged = tmp_path / "damaged"
    shutil.copytree(out, damaged)
    rows = damaged / "tables" / "embedding" / "rows.npy"
    data = bytearray(rows.read_bytes())
    data[len(data) // 2] ^= 0x40
    rows.write_bytes(bytes(data))
    with pytest.raises(layout.ExportError, match=r"rows.npy: checksum mismatch in bytes 0\.\."):
        load_model(str(damaged))


def test_a_failed_export_leaves_the_previous_one_whole(tmp_path, small_export, monkeypatch):
    from het.export import tables

    ckpt, out = small_export
    target = tmp_path / "model"
    export(ckpt, str(target))
    before = sorted(os.listdir(target))

    def broken(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(tables, "write", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        export(ckpt, str(target), "int8")
    assert sorted(os.listdir(target)) == before and sorted(os.listdir(tmp_path)) == ["model"]
    assert load_model(str(target)).manifest["dtype"] == "fp32"


def test_export_replaces_only_an_export_and_never_touches_its_checkpoint(tmp_path, small_export):
    ckpt, _ = small_export
    user = tmp_path / "photos"
    user.mkdir()
    (user / "holiday.jpg").write_bytes(b"a user's file")
    inside = os.path.join(ckpt, "model")
    for out, why in ((str(user), "no export het wrote"), (ckpt, "inside the checkpoint"),
                     (os.path.dirname(ckpt), "inside the checkpoint"), (inside, "inside the checkpoint")):
        before = {p: os.path.getsize(os.path.join(r, p)) for r, _, fs in os.walk(os.path.dirname(ckpt)) for p in fs}
        with pytest.raises(ValueError, match=why):
            export(ckpt, out)
        assert {p: os.path.getsize(os.path.join(r, p)) for r, _, fs in os.walk(os.path.dirname(ckpt))
                for p in fs} == before
    assert (user / "holiday.jpg").read_bytes() == b"a user's file" and not os.path.exists(inside)
    (tmp_path / "empty").mkdir()
    export(ckpt, str(tmp_path / "empty"))  # an empty directory, then its own export, are replaced
    export(ckpt, str(tmp_path / "empty"), "fp16")
    assert load_model(str(tmp_path / "empty")).manifest["dtype"] == "fp16"


def test_graphsage_is_refused_in_one_line(tmp_path):
    from het.train import checkpoint
    from types import SimpleNamespace

    cfg = TrainConfig(model="graphsage")
    from het.config import TableConfig
    from het.ps.client.client import PSClient

    worker = SimpleNamespace(rank=0, world=1, cfg=cfg, model=torch.nn.Linear(2, 1),
                             embedding=SimpleNamespace(flush=lambda: None), dense=SimpleNamespace(state_dict=dict),
                             client=local_client([TableConfig("embedding", rows=4, dim=2)]))
    checkpoint.save(worker, str(tmp_path / "ck"), 1)
    with pytest.raises(ValueError, match="a graphsage checkpoint is not exported: scoring a node needs"):
        export(str(tmp_path / "ck"), str(tmp_path / "out"))


def test_a_checkpoint_without_its_fields_record_or_any_embedding_table_is_refused_naming_its_tables():
    from types import SimpleNamespace

    from het.export.writer import _write

    for tables, fields, says in (({"dense": None}, None, r"holds no embedding table \(tables: \['dense'\]\)"),
                                 ({"embedding_8": None, "embedding_16": None}, None, "no record of their fields")):
        with pytest.raises(ValueError, match=says):
            _write(SimpleNamespace(path="ck", tables=tables, fields=fields), {}, {}, {}, "out", "fp32", False)


@pytest.mark.parametrize("kind, shards, settings", [
    ("fixed", 2, {}), ("dynamic", 1, {}), ("fixed", 1, {"row_dtype": "bf16"}),
    pytest.param("tiered", 1, {}, marks=pytest.mark.slow), pytest.param("dynamic", 1, {"row_dtype": "fp16"}, marks=pytest.mark.slow)])
def test_an_export_of_rows_that_decay_reproduces_training(tmp_path, kind, shards, settings):
    """L2 as a lazy decay: the save holds each row's last step, and the export brings every row
    to the checkpoint's (5% a step: rows left as saved would score far from training). Half rows
    travel as their bits, decayed."""
    check_reproduces_training(tmp_path, "deepfm", kind, shards, optimizer="adagrad", lr=0.05, row_l2=1.0, **settings)
