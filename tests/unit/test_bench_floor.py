"""`het bench floor`'s floor: the job's model on a plain local nn.Embedding trains as het does at
s = 0 (so the ratio compares the same work), and the bench reports both sides."""

import pytest
import torch

from het.bench.floor import _train_argv, floor_model
from het.ps.local import local_client
from het.train.config import TrainConfig
from het.train.loop import Worker
from het.train.tasks import job_tables

SMALL = {"dim": 8, "batch": 64, "synthetic.cap": 2000}


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_the_floor_trains_as_het_does_at_staleness_zero(optimizer):
    cfg = TrainConfig.load(None, {**SMALL, "staleness": 0, "optimizer": optimizer, "lr": 0.1,
                                  "dense_optimizer": optimizer, "dense_lr": 0.05, "cache.lookahead": 0}, {})
    _, floor, step = floor_model(cfg)
    losses = [step(i) for i in range(10)]
    client = local_client(job_tables(cfg))
    try:
        worker = Worker(cfg, client)
        het_loss = worker.train(10, progress=False)["loss"]
    finally:
        client.close()
    assert het_loss == pytest.approx(losses[-1], abs=1e-5) and losses[-1] < losses[0]
    het_dense = {k: v for k, v in worker.model.state_dict().items() if not k.startswith("embedding.")}
    for name, value in het_dense.items():
        assert torch.allclose(value, floor.state_dict()[name], atol=1e-5), name


def test_hashed_ids_reach_a_table_of_the_datas_ids_by_modulo():
    cfg = TrainConfig.load(None, {**SMALL, "ids": "hashed"}, {})
    task, model, step = floor_model(cfg)
    assert model.embedding.hashed and model.embedding.rows == task.num_ids
    assert torch.isfinite(torch.tensor([step(i) for i in range(3)])).all()


def test_the_bench_passes_on_the_train_flags_only():
    assert _train_argv(["het", "bench", "floor", "--steps=3", "--model", "dcn", "--rounds", "1", "--json"]) == \
        ["--model", "dcn"]
