"""The tasks' evaluation (het.train.tasks): the metrics of exactly the held-out samples asked
for, computed here by hand, and the same whether one rank scores them or several share them."""

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import log_loss, roc_auc_score

from het.data.prepared import HASHED_FORMAT, HASHED_VERSION, writing
from het.train.config import TrainConfig
from het.train.tasks import make_task


def ranks_together(task, model, samples, world, **kwargs):
    """Run ``world`` ranks' evaluations one after another, with an all-gather that hands the
    last rank every part (the earlier ranks see only the parts gathered so far)."""
    parts, out = [], None
    for rank in range(world):
        def gather(part):
            parts.append(part)
            return list(parts)
        out = task.evaluate(model, samples, "cpu", rank, world, gather, **kwargs)
    return out


@pytest.fixture(scope="module")
def ctr():
    task = make_task(TrainConfig(dim=8, synthetic={"cap": 500}))
    torch.manual_seed(0)
    return task, task.build_model(torch.nn.Embedding(task.num_rows, 8)).eval()


def test_ctr_evaluation_is_auc_and_log_loss_of_the_test_batches(ctr):
    task, model = ctr
    got = task.evaluate(model, 3000, "cpu", batch_size=1024)
    batches = [task.data.batch("test", i, n) for i, n in enumerate((1024, 1024, 952))]
    with torch.no_grad():
        p = np.concatenate([torch.sigmoid(model(b.dense, b.sparse)).numpy() for b in batches])
    y = np.concatenate([b.labels.numpy() for b in batches])
    planted = np.concatenate([task.data.planted_logits(b.sparse, b.dense) for b in batches])
    assert got["auc"] == pytest.approx(roc_auc_score(y, p), abs=1e-12)
    assert got["logloss"] == pytest.approx(log_loss(y, np.clip(p, 1e-7, 1 - 1e-7)), abs=1e-12)
    assert got["planted_auc"] == pytest.approx(roc_auc_score(y, planted), abs=1e-12)


@pytest.mark.parametrize("world", [2, 3, 5])
def test_ctr_evaluation_shared_among_ranks_equals_one_ranks(ctr, world):
    task, model = ctr
    alone = task.evaluate(model, 3000, "cpu", batch_size=1024)
    shared = ranks_together(task, model, 3000, world, batch_size=1024)  # 3 batches: with 5 ranks, two score none
    assert set(shared) == {"auc", "logloss", "planted_auc"}
    for k, v in alone.items():
        assert math.isclose(shared[k], v, rel_tol=1e-9), (k, shared[k], v)


def test_prepared_data_is_scored_once_per_sample_whatever_the_batch(tmp_path):
    """A test split of 1,000 stored samples scored in batches of 300: samples 0..999 once each
    (the last batch is the head of batch 3, not samples 300..399 again)."""
    g = np.random.default_rng(0)
    with writing(str(tmp_path), num_dense=13, num_fields=26) as w:
        w.add(g.random((1000, 13)), g.integers(0, 50, (1000, 26)), g.integers(0, 2, 1000), np.ones(1000, bool))
        rows = w.close()
        w.write_meta({"format": HASHED_FORMAT, "version": HASHED_VERSION, "num_rows": None, "num_ids": 50,
                      "num_dense": 13, "num_fields": 26, "train_rows": rows["train"], "test_rows": rows["test"]})
    task = make_task(TrainConfig(data=f"table:{tmp_path}", dim=4))
    scored = []

    def model(dense, sparse):
        scored.append(dense[:, 0].clone())
        return dense[:, 1] - 0.5
    got = task.evaluate(model, 5000, "cpu", batch_size=300)  # more than the split holds: all of it
    every = task.data.batch("test", 0, 1000)
    assert torch.equal(torch.cat(scored), every.dense[:, 0])
    p = torch.sigmoid(every.dense[:, 1] - 0.5).numpy()  # as the task scores: float32 probabilities
    assert got["auc"] == pytest.approx(roc_auc_score(every.labels.numpy(), p), abs=1e-12)


@pytest.fixture(scope="module")
def graph():
    task = make_task(TrainConfig(model="graphsage", data="synthetic-graph:600", dim=8,
                                 graph={"hidden": 8, "fanouts": (3,)}))
    torch.manual_seed(0)
    return task, task.build_model(torch.nn.Embedding(task.num_rows, 8)).eval()


def test_graph_evaluation_is_the_accuracy_on_the_validation_and_test_nodes(graph):
    task, _ = graph
    labels = torch.as_tensor(task.graph.labels)

    class Always(torch.nn.Module):  # classifies every node as class 1
        def forward(self, input_nodes, features, blocks):
            return torch.nn.functional.one_hot(torch.ones(blocks[-1].dst_count, dtype=torch.int64),
                                               task.graph.num_classes).float()
    got = task.evaluate(Always(), 0, "cpu", batch_size=64)
    for split, mask in (("val", task.graph.val_mask), ("test", task.graph.test_mask)):
        nodes = torch.from_numpy(np.flatnonzero(np.asarray(mask)))
        assert got[f"{split}_acc"] == int((labels[nodes] == 1).sum()) / len(nodes)


def test_graph_evaluation_shared_among_ranks_or_batched_equals_one_batch(graph):
    task, model = graph
    whole = task.evaluate(model, 0, "cpu", batch_size=100_000)  # every node in one batch
    assert task.evaluate(model, 0, "cpu", batch_size=64) == whole
    assert ranks_together(task, model, 0, 3, batch_size=64) == whole
