"""A training job on a local cluster: its shards and workers as processes of this machine."""

from __future__ import annotations

import json

from het.dist.launch import LocalCluster
from het.train.config import TrainConfig
from het.train.tasks import job_tables


def run_local(cfg: TrainConfig, log_dir: str, secret: bytes | None = None, progress: bool = True,
              network=None) -> dict:
    """Train ``cfg`` on ``cfg.servers`` shard and ``cfg.workers`` worker processes of this
    machine (inside ``network``'s namespaces when given); rank 0's summary. Raises
    :class:`het.dist.launch.ClusterError` when a process fails, naming it and its log."""
    cluster = LocalCluster(job_tables(cfg), cfg.workers, cfg.servers, ["--config-json", json.dumps(cfg.to_dict())],
                           log_dir, secret, progress, network)
    return cluster.run()
