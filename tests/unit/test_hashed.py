"""Raw 64-bit ids (het.data.hashed): hashed keys of any CTR data set, as ``--ids hashed`` and
prepared hashed Criteo give them."""

import argparse
import hashlib
import os
import time
import tracemalloc

import numpy as np
import pytest

from het.data.hashed import HashedIds
from het.data.hashing import hash_ids
from het.data.synthetic import SyntheticCriteo, SyntheticCriteoConfig, criteo_1tb
from het.train.config import TrainConfig
from het.train.flags import add_config_flags, config_from_args
from het.train.tasks import CTRTask


def digest(batch) -> str:
    h = hashlib.sha256()
    for t in (batch.dense, batch.sparse, batch.labels):
        h.update(t.numpy().tobytes())
    return h.hexdigest()[:16]


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
    assert cfg.cache_rows_for(task.num_ids) == (2 << 30) // cfg.cache_slot_bytes < 3_376_257  # cache_memory, not a tenth
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
    rows = task.data.rows  # the training split less the validation rows carved from it
    assert task.num_rows is None and task.num_ids == plain.num_rows and rows["test"] == plain.rows["test"]
    assert rows["train"] + rows["val"] == plain.rows["train"]
    keys = task.data.batch("test", 0, 64).sparse.numpy()
    assert np.array_equal(task.data.unhash(keys), plain.batch("test", 0, 64).sparse.numpy())
