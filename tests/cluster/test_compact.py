"""A base compacted from the base before it and the deltas since (het.export.compact) is the
export ``het export`` writes of a checkpoint taken at the same step: every file's rows, the
dense weights and the scores, bit for bit."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from het.export.compact import compact
from het.export.model import load_model
from het.export.writer import export
from het.ps.local import local_client
from het.train import checkpoint
from het.train.config import TrainConfig
from het.train.loop import Worker
from het.train.publish import Publisher
from het.train.published import base_name, delta_name, listing
from het.train.tasks import job_tables

pytestmark = pytest.mark.cluster


@pytest.mark.parametrize("ids, dtype, rows_dtype", [  # about 9 s each: the first in make test
    ("encoded", "fp32", "fp32"), pytest.param("hashed", "int8", "fp32", marks=pytest.mark.slow),
    pytest.param("encoded", "fp16", "bf16", marks=pytest.mark.slow)])
def test_a_compacted_base_is_the_export_of_a_checkpoint_at_its_step(tmp_path, ids, dtype, rows_dtype):
    pub = tmp_path / "pub"
    cfg = TrainConfig.from_dict({"steps": 40, "dim": 8, "batch": 64, "synthetic": {"cap": 400}, "ids": ids,
                                 "row_dtype": rows_dtype, "export": {"dtype": dtype},
                                 "publish": {"dir": str(pub), "every": 1000, "base_every": 1000, "keep": 1000}})
    client = local_client(job_tables(cfg), num_shards=2, lazy_init=cfg.lazy_init)
    worker = Worker(cfg, client)
    publisher = Publisher(worker, cfg)  # base 0 from a snapshot, exported by het export
    step = 0
    for _ in range(3):  # three deltas, each after a flush: every update up to its step
        for _ in range(5):
            worker.step(worker.upcoming.batch(step, end=40))
            step += 1
        worker.embedding.flush()
        publisher.publish(step)
    publisher.finish(step)
    bases, deltas = listing(str(pub))
    assert bases[0] == 0 and deltas == [1, 2, 3, 4]
    summary = compact(str(pub / base_name(0)), [str(pub / delta_name(v)) for v in (1, 2, 3, 4)],
                      str(tmp_path / "compacted"), {"version": 4, "trained_at": 0.0, "step": step})
    checkpoint.write(worker, str(tmp_path / "ck"), step)
    export(str(tmp_path / "ck"), str(tmp_path / "ref"), dtype=dtype)
    got, want = load_model(str(tmp_path / "compacted")), load_model(str(tmp_path / "ref"))
    assert summary["rows_changed"] > 0 and got.manifest["published"]["version"] == 4
    for f in ("rows.npy", "qparams.npy", "hashes.npy", "directory.npy"):
        a, b = (os.path.join(d, "tables", "embedding", f) for d in (tmp_path / "compacted", tmp_path / "ref"))
        assert os.path.exists(a) == os.path.exists(b), f
        if os.path.exists(a):
            assert np.array_equal(np.load(a), np.load(b)), f
    assert all(torch.equal(p, q) for p, q in zip(got.dense.state_dict().values(), want.dense.state_dict().values()))
    batch = worker.upcoming.batch(step, end=step + 1)
    assert torch.equal(got(batch), want(batch))
