"""Evaluation shared among ranks gives the metrics one rank computes over the whole split."""

import math

import pytest
import torch

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


@pytest.mark.parametrize("world", [2, 3, 5])
def test_ctr_evaluation_shared_among_ranks_equals_one_ranks(world):
    task = make_task(TrainConfig(dim=8, synthetic={"cap": 500}))
    torch.manual_seed(0)
    model = task.build_model(torch.nn.Embedding(task.num_rows, 8)).eval()
    alone = task.evaluate(model, 3000, "cpu", batch_size=1024)
    shared = ranks_together(task, model, 3000, world, batch_size=1024)  # 3 batches: with 5 ranks, two score none
    assert set(shared) == {"auc", "logloss", "planted_auc"}
    for k, v in alone.items():
        assert math.isclose(shared[k], v, rel_tol=1e-9), (k, shared[k], v)


def test_graph_evaluation_shared_among_ranks_equals_one_ranks():
    task = make_task(TrainConfig(model="graphsage", data="synthetic-graph:600", dim=8, graph={"hidden": 8, "fanouts": (3,)}))
    torch.manual_seed(0)
    model = task.build_model(torch.nn.Embedding(task.num_rows, 8)).eval()
    alone = task.evaluate(model, 0, "cpu", batch_size=64)
    assert 0 <= alone["val_acc"] <= 1 and 0 <= alone["test_acc"] <= 1
    assert ranks_together(task, model, 0, 3, batch_size=64) == alone

