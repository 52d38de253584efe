"""A shard's record of changed keys lives in memory: after a restart it starts again, and what
changed before is not in it. The reader is told (CHANGED's ``started``), and a publishing job
publishes that version as a base, never as a delta that would leave followers on old rows."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from het.config import TableConfig
from het.ps.client.client import PSClient
from het.ps.local import local_client
from het.train.config import TrainConfig
from het.train.loop import Worker
from het.train.publish import Publisher, listing
from het.train.tasks import job_tables

pytestmark = pytest.mark.cluster


def _restart_records(client: PSClient, shards) -> None:
    """What a restarted shard holds of its record: nothing."""
    for i in shards:
        client.channels[i].shard.changes.clear()


def test_a_reader_is_told_which_shards_record_started_again():
    table = TableConfig("t", rows=100, dim=2)
    client = local_client([table], num_shards=2)
    started = []
    assert list(client.changed("t", started=started)) == [] and started == [0, 1]  # the records begin

    def push(keys):
        client.wait(client.push("t", torch.tensor(keys), torch.ones(len(keys), 2), torch.ones(len(keys), dtype=torch.int64)))

    push([1, 2, 3, 4])
    started = []
    keys = np.concatenate([k for k, _, _ in client.changed("t", started=started)])
    assert sorted(keys.tolist()) == [1, 2, 3, 4] and started == []
    push([5, 6])
    _restart_records(client, [1])
    started = []
    keys = np.concatenate([k for k, _, _ in client.changed("t", started=started)] or [np.zeros(0, np.int64)])
    assert started == [1] and 5 not in keys.tolist()  # shard 1 (odd keys) lost key 5's change


def test_a_version_after_a_shards_record_started_again_is_a_base(tmp_path):
    cfg = TrainConfig.from_dict({"steps": 20, "dim": 8, "batch": 64, "synthetic": {"cap": 500}, "servers": 2,
                                 "publish": {"dir": str(tmp_path / "pub"), "every": 1000, "keep": 2}})
    client = local_client(job_tables(cfg), num_shards=2, lazy_init=cfg.lazy_init)
    worker = Worker(cfg, client)
    publisher = Publisher(worker, cfg)  # a base at the start
    for step in range(3):
        worker.step(worker.upcoming.batch(step, end=20))
    worker.embedding.flush()
    publisher.publish(3)  # a delta
    for step in range(3, 6):
        worker.step(worker.upcoming.batch(step, end=20))
    worker.embedding.flush()
    _restart_records(client, [0])
    publisher.publish(6)  # shard 0 restarted: a base stands for this version
    summary = publisher.finish(6)
    bases, deltas = listing(str(tmp_path / "pub"))
    assert bases == [0, 2] and deltas == [1, 3], (bases, deltas)
    assert summary["records_restarted"] == 1 and not summary["failed"]
    assert os.path.isfile(tmp_path / "pub" / "base-00000002" / "export.json")
