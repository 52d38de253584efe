"""Raw 64-bit ids (issue 12): hashed keys of any CTR data set, and MLPerf's multi-hot shape of
the synthetic data (``--data synthetic-criteo-1tb``) pooled through the embedding's bag mode."""

import argparse
import hashlib
import math
import os
import time
import tracemalloc

import numpy as np
import pytest
import torch
from torch import nn

from het.config import CacheConfig, TableConfig
from het.data.hashed import HashedIds
from het.data.hashing import hash_ids
from het.data.synthetic import MLPERF_BAG_SIZES, MLPERF_CARDINALITIES, SyntheticCriteo, SyntheticCriteoConfig, criteo_1tb
from het.nn import Embedding, FieldBags
from het.ps.client import PSClient
from het.train import loop
from het.train.config import TrainConfig
from het.train.flags import add_config_flags, config_from_args
from het.train.tasks import CTR_MODELS, CTRTask

ONE_TB = "synthetic-criteo-1tb"


def digest(batch) -> str:
    h = hashlib.sha256()
    for t in (batch.dense, batch.sparse, batch.labels):
        h.update(t.numpy().tobytes())
    return h.hexdigest()[:16]


@pytest.fixture(scope="module")
def one_tb():
    return CTRTask(TrainConfig(data=ONE_TB, model="dlrm", batch=64, dim=8))


# ---- --ids hashed ---------------------------------------------------------------------------

def test_the_default_jobs_batches_are_those_of_before_hashing_and_bags():
    # Computed on main at ebf95f7, before this change: batches (step, rank) of 2 workers, then test batch 0.
    task = CTRTask(TrainConfig())
    got = [digest(task.batch(s, r, 2, "cpu")) for s in range(2) for r in range(2)]
    assert got == ["daa0d862f81e975c", "ae0f76f7edaf25fb", "9799bd46c9be1e27", "d4aeef512ebd19eb"]
    assert digest(task.data.batch("test", 0, 100)) == "6eda7a19ea1b3345"
    assert (task.num_rows, task.num_ids, task.pooling) == (840_543, 840_543, None)


def test_hashed_keys_span_int64_and_are_the_field_local_ids_hashes():
    plain = SyntheticCriteo(SyntheticCriteoConfig(cap=None))
    data = HashedIds(plain)
    raw, keys = plain.batch("train", 0, 4096).sparse.numpy(), data.batch("train", 0, 4096).sparse.numpy()
    assert keys.dtype == np.int64 and keys.shape == raw.shape
    assert keys.min() < -2 ** 62 and keys.max() > 2 ** 62  # both halves of the int64 range
    assert np.array_equal(keys, data.batch("train", 0, 4096).sparse.numpy())  # deterministic
    for f in (0, 2, 25):  # the field-local id, salted by the field: not the global key
        assert np.array_equal(keys[:, f], hash_ids(f, raw[:, f] - plain.offsets[f]))
    assert np.array_equal(data.unhash(keys), raw)
    test = data.batch("test", 1, 512)
    assert np.array_equal(data.planted_logits(test.sparse, test.dense),
                          plain.planted_logits(plain.batch("test", 1, 512).sparse, test.dense))


def test_ids_hashed_and_cap_none_flags_give_a_dynamic_table_sized_by_the_ids():
    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    cfg = config_from_args(parser.parse_args(["--ids", "hashed", "--synthetic-cap", "none"]))
    assert cfg.synthetic.cap is None and cfg.ids == "hashed"
    task = CTRTask(cfg)
    assert task.num_rows is None and task.num_ids == 33_762_577
    assert cfg.cache_rows_for(task.num_ids) == 3_376_257
    b = task.batch(0, 0, 2, "cpu")
    assert b.sparse.shape == (512, 26) and task.pooling is None


def test_full_cardinality_data_allocates_nothing_per_id():
    tracemalloc.start()
    try:
        start = time.perf_counter()
        for cfg in (SyntheticCriteoConfig(cap=None), criteo_1tb(cap=None)):
            HashedIds(SyntheticCriteo(cfg)).batch("train", 0, 512)
        seconds = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # One int64 per id would be 1.6 GB; the 1tb calibration's 8192 x 214 keys take ~14 MB an array.
    assert peak < 256 * 2 ** 20
    assert seconds < 10


def test_hashed_prepared_criteo_reads_back_its_keys(tmp_path):
    from het.data.criteo import CriteoDataset, prepare

    head = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "criteo_kaggle_head1000.tsv")
    if not os.path.exists(head):
        pytest.skip(f"{head} is not here")
    prepare([head], str(tmp_path), test_fraction=0.1, progress=False)
    task = CTRTask(TrainConfig(data=f"criteo:{tmp_path}", ids="hashed"))
    plain = CriteoDataset(str(tmp_path))
    assert task.num_rows is None and task.num_ids == plain.num_rows and task.data.rows == plain.rows
    keys = task.data.batch("train", 0, 64).sparse.numpy()
    assert np.array_equal(task.data.unhash(keys), plain.batch("train", 0, 64).sparse.numpy())


# ---- synthetic-criteo-1tb -------------------------------------------------------------------

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
    cfg = TrainConfig(data=ONE_TB, model="dcn", batch=32, dim=8, steps=4, workers=1, lookahead=2, cache_rows=300)
    client = PSClient.local([TableConfig("embedding", rows=1000, dim=8)])
    worker = loop.Worker(cfg, client)
    assert worker.embedding.mode == "sum" and worker.prefetch and worker.lookahead == 2
    run = worker.train(4, progress=False)
    assert math.isfinite(run["loss"]) and worker.embedding.stats()["embedding"]["lookups"] > 0
    assert 0 <= worker.evaluate(256)["auc"] <= 1


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
