"""Bags of keys pooled into one row (het.nn.bags): bag_keys and pool as nn.EmbeddingBag's, and
MLPerf's multi-hot shape of the synthetic data (``--data synthetic-criteo-1tb``) pooled through
FieldBags and het.Embedding's bag mode."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from het.config import CacheConfig, TableConfig
from het.data.synthetic import MLPERF_BAG_SIZES, MLPERF_CARDINALITIES, SyntheticCriteo, criteo_1tb
from het.nn import Embedding, FieldBags
from het.nn.bags import bag_keys, pool
from het.ps.local import local_client
from het.train import loop
from het.train.config import TrainConfig
from het.train.tasks import CTR_MODELS, CTRTask

ONE_TB = "synthetic-criteo-1tb"


@pytest.fixture(scope="module")
def one_tb():
    return CTRTask(TrainConfig(data=ONE_TB, model="dlrm", batch=64, dim=8))


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_bag_keys_and_pool_are_an_embedding_bag(mode):
    """Rows of keys, offsets (with an empty bag) and a padding key: what nn.EmbeddingBag gives."""
    g = torch.Generator().manual_seed(0)
    bag = nn.EmbeddingBag(20, 3, mode=mode, padding_idx=0)
    keys, offsets = torch.randint(0, 20, (11,), generator=g), torch.tensor([0, 4, 4, 9])
    flat, which, bags = bag_keys(keys, offsets, padding_idx=0)
    assert torch.equal(flat, keys[keys != 0]) and bags == 4
    assert torch.allclose(pool(bag.weight[flat], which, bags, mode), bag(keys, offsets), atol=1e-6)
    rows = keys[:10].reshape(5, 2)
    flat, which, bags = bag_keys(rows, None)
    assert torch.equal(which, torch.arange(5).repeat_interleave(2)) and bags == 5
    with pytest.raises(ValueError, match=r"offsets must start at 0, not decrease and stay <= 11, got \[0, 5, 3\]"):
        bag_keys(keys, torch.tensor([0, 5, 3]))


def test_the_1tb_preset_has_mlperfs_tables_and_bags(one_tb):
    assert one_tb.num_rows is None and one_tb.pooling == "sum"
    assert one_tb.data.bag_sizes == MLPERF_BAG_SIZES and sum(MLPERF_BAG_SIZES) == 214
    full = SyntheticCriteo(criteo_1tb(cap=None))
    assert full.cardinalities == MLPERF_CARDINALITIES and full.num_rows == 204_184_588
    b = one_tb.batch(0, 0, 1, "cpu")
    assert b.sparse.shape == (64, 214) and b.dense.shape == (64, 13) and b.labels.shape == (64,)
    global_keys = one_tb.data.unhash(b.sparse.numpy())  # (B, 214): column j holds a key of field key_fields[j]
    fields = one_tb.data.key_fields
    assert np.array_equal(np.bincount(fields), MLPERF_BAG_SIZES)
    lo = one_tb.data.data.offsets[fields]
    hi = lo + np.array(one_tb.data.data.cardinalities)[fields]
    assert ((global_keys >= lo) & (global_keys < hi)).all()


@pytest.mark.parametrize("model", sorted(CTR_MODELS))
def test_every_ctr_model_trains_on_1tb_bags_through_an_embedding_bag(one_tb, model):
    torch.manual_seed(0)
    bag = nn.EmbeddingBag(1000, 8, mode="sum")
    net = CTR_MODELS[model](FieldBags(bag, one_tb.data.bag_sizes), num_fields=26, dim=8, num_dense=13)
    b = one_tb.batch(0, 0, 1, "cpu")
    keys = b.sparse.remainder(1000)  # a fixed table of 1000 rows stands in for the dynamic one
    loss = nn.functional.binary_cross_entropy_with_logits(net(b.dense, keys), b.labels)
    loss.backward()
    assert math.isfinite(loss.item()) and bag.weight.grad.abs().sum() > 0
    pooled = FieldBags(bag, one_tb.data.bag_sizes)(keys)  # field 20's bag of 100 keys is one row
    assert pooled.shape == (64, 26, 8)
    start = sum(MLPERF_BAG_SIZES[:20])  # 72: the bags of fields 0..19 come first
    assert torch.allclose(pooled[:, 20], bag.weight[keys[:, start:start + 100]].sum(1), atol=1e-4)


def test_a_worker_trains_1tb_bags_through_het_embeddings_sum_mode(monkeypatch):
    """The worker's own step, lookahead and prefetch on bags, against a fixed stand-in table
    (the keys modulo its rows) until dynamic tables are served."""
    class Modulo:  # the 1tb data with keys folded into 1000 rows
        def __init__(self, data):
            self.data, self.bag_sizes = data, data.bag_sizes
            self.num_fields, self.num_dense = data.num_fields, data.num_dense

        def batch(self, split, index, size):
            b = self.data.batch(split, index, size)
            return type(b)(b.dense, b.sparse.remainder(1000), b.labels)

    def make_task(cfg):
        task = CTRTask(cfg)
        task.data, task.num_rows, task.num_ids = Modulo(task.data), 1000, 1000
        return task

    monkeypatch.setattr(loop, "make_task", make_task)
    cfg = TrainConfig(data=ONE_TB, model="dcn", batch=32, dim=8, steps=4, workers=1, cache={"lookahead": 2, "rows": 300})
    client = local_client([TableConfig("embedding", rows=1000, dim=8)])
    worker = loop.Worker(cfg, client)
    assert worker.embedding.mode == "sum" and worker.prefetch and worker.lookahead == 2
    run = worker.train(4, progress=False)
    unique = sum(torch.unique(make_task(cfg).batch(s, 0, 1, "cpu").sparse).numel() for s in range(4))
    assert math.isfinite(run["loss"]) and worker.embedding.stats()["embedding"]["lookups"] == unique  # each step once
    metrics = worker.evaluate(256)
    assert set(metrics) == {"auc", "logloss", "auc_ci95"}  # no planted model; a split of 256: the AUC's interval
    assert math.isfinite(metrics["auc"]) and metrics["auc_ci95"][0] <= metrics["auc"] <= metrics["auc_ci95"][1]


def test_het_embedding_pools_1tb_bags_as_an_embedding_bag(one_tb):
    b = one_tb.batch(1, 0, 1, "cpu")
    keys = b.sparse.remainder(500)
    emb = Embedding(500, 4, optimizer="sgd", lr=0.1, mode="sum", cache=CacheConfig(capacity=64))
    bag = nn.EmbeddingBag(500, 4, mode="sum")
    with torch.no_grad():
        bag.weight.copy_(emb.read(torch.arange(500)))
    starts = []
    start = emb._start
    emb._start = lambda name, flat: starts.append(len(flat)) or start(name, flat)
    emb.announce(keys)  # what the worker announces and prefetches: the batch's keys as they come
    emb.prefetch(keys)
    got = FieldBags(emb, one_tb.data.bag_sizes)(keys)
    assert starts == [64 * 214] and not emb.prefetching()  # the forward used the prefetched sync
    assert torch.allclose(got, FieldBags(bag, one_tb.data.bag_sizes)(keys), atol=1e-5)
    got.sum().backward()
    emb.flush()


def test_the_1tb_presets_planted_auc_is_meaningful():
    auc = SyntheticCriteo(criteo_1tb()).planted_auc(samples=20_000)
    assert 0.75 < auc < 0.9
