"""`het bench quality`: every model on one split, chosen on validation, its table and plot."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pytest

from het.bench import quality
from het.data.table import TableSpec, prepare_table

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    d = tmp_path_factory.mktemp("quality")
    rng = np.random.default_rng(0)
    n = 2500
    a, b = rng.integers(0, 20, n), rng.integers(0, 8, n)
    x = rng.normal(size=n)
    y = (rng.random(n) < 1 / (1 + np.exp(-(np.sin(a) + (b == 3) + x)))).astype(int)
    pcsv.write_csv(pa.table({"y": y, "x": x, "a": a.astype(str), "b": b.astype(str)}), d / "t.csv")
    prepare_table(str(d / "t.csv"), str(d / "prep"), TableSpec("y", ("x",), ("a", "b")), progress=False)
    return str(d / "prep")


def test_the_split_is_het_trains_and_every_peer_sees_the_same_rows(table):
    split = quality.Split(table, 0.1)
    assert split.rows["train"] + split.rows["val"] == 2500 - split.rows["test"]
    for p in split.sparse:  # every field's codes within its numbering, the same over the splits
        assert (split.sparse[p].min(0) >= 0).all() and (split.sparse[p].max(0) < np.array(split.cardinalities)).all()
    assert split.cardinalities[0] == len(np.unique(np.concatenate([split.sparse[p][:, 0] for p in split.sparse])))


@pytest.mark.slow  # eight short jobs and the peers: about 90 s
def test_models_are_chosen_on_validation_and_drawn(table, tmp_path):
    models = ["het", "logreg"] + [m for m in ("lightgbm",) if quality._available(m)]
    r = quality.run(table, models, seeds=2, grid=2, val_frac=0.1, het_model="wdl", het_extra=["--steps", "20"],
                    progress=False)
    for name in models:
        m = r["models"][name]
        assert m["chosen"]["val_logloss"] == min(p["val_logloss"] for p in m["points"])  # validation chose
        assert len(m["points"]) == 2 and all(len(p["runs"]) == 2 for p in m["points"])
        assert 0.5 < m["chosen"]["test_auc"] < 1
    assert "| logreg |" in quality.table(r)
    quality.plot(r, str(tmp_path / "q.png"))
    assert (tmp_path / "q.png").read_bytes()[:4] == b"\x89PNG"


def test_sgc_propagates_the_features_twice_over_the_normalised_graph_with_self_loops():
    from het.bench import quality_graph

    split = quality_graph.GraphSplit("synthetic-graph:300")
    from het.data.graph import load, normalize_features

    graph = normalize_features(load("synthetic-graph:300"))  # the reference: dense matrices
    n = graph.num_nodes
    a = np.zeros((n, n))
    for v in range(n):
        a[v, graph.indices[graph.indptr[v]:graph.indptr[v + 1]].numpy()] = 1
    a += np.eye(n)
    d = np.diag(1 / np.sqrt(a.sum(1)))
    s = d @ a @ d
    assert np.allclose(split.propagated, s @ s @ graph.features.numpy(), atol=1e-6)
    assert split.rows["train"] > 0 and split.rows["test"] > 0


@pytest.mark.slow  # four short GraphSAGE jobs and the peers: about 60 s
def test_a_graph_is_benched_by_accuracy_chosen_on_validation(tmp_path):
    from het.bench import quality_graph

    r = quality_graph.run("synthetic-graph:2000", ["het", "logreg", "sgc"], seeds=2, grid=2,
                          extra=["--steps", "20", "--workers", "1"], progress=False)
    for name in ("het", "logreg", "sgc"):
        m = r["models"][name]
        assert m["chosen"]["val_acc"] == max(p["val_acc"] for p in m["points"])
        assert 0 < m["chosen"]["test_acc"] <= 1 and len(m["points"]) == 2
    assert "| sgc |" in quality_graph.table(r)
    quality.plot(r, str(tmp_path / "g.png"))
    assert (tmp_path / "g.png").read_bytes()[:4] == b"\x89PNG"
