"""A training job on a local cluster: its shards and workers as processes of this machine,
restarted from the latest checkpoint when one of them dies (``max_restarts``)."""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
import sys
import threading

from het.dist.launch import ClusterError, LocalCluster
from het.train.config import TrainConfig

# The launcher imports het.train.checkpoint and het.train.tasks (and with them torch) only where a
# job needs them: the shards make the job's tables themselves, so a default job's processes start
# at once, each loading torch beside the others.


def run_local(cfg: TrainConfig, log_dir: str, secret: bytes | None = None, progress: bool = True,
              network=None, on_failure=None) -> dict:
    """Train ``cfg`` on ``cfg.servers`` shard and ``cfg.workers`` worker processes of this
    machine (inside ``network``'s namespaces when given); rank 0's summary. Up to
    ``cfg.max_restarts`` times in all: a worker that dies is started again and the workers
    re-formed while the shards serve on (het.train.rejoin; the summary counts
    ``worker_restarts`` and ``updates_lost``); any other death (a shard's, unless ``ps_wal``
    restarts it in place) gives ``on_failure`` the :class:`het.dist.launch.ClusterError` at
    once, before the teardown, and the job is stopped and started again from its latest
    checkpoint (or from where it started, before the first); the summary then counts
    ``restarts`` and says which step the last run ``resumed_from_step``. Raises the
    ClusterError when a process fails once no restart is left, naming it and its log; raises
    ValueError, before any process starts, for what :func:`check_job` finds wrong."""
    check_job(cfg)
    if cfg.stream.pattern:  # its first partition gives the tables' shapes: here before any process starts
        from het.train.streaming import StreamSource

        StreamSource.of(cfg.stream)
    if cfg.epochs is not None:
        from het.train.tasks import resolve_epochs

        cfg = resolve_epochs(cfg, cfg.workers)
    cfg = with_restart_checkpoints(cfg, log_dir)
    if cfg.max_restarts and not cfg.rejoin_dir:
        cfg = dataclasses.replace(cfg, rejoin_dir=os.path.join(log_dir, "rejoin"))
    if cfg.tensorboard_every and not cfg.tensorboard_dir:
        cfg = dataclasses.replace(cfg, tensorboard_dir=os.path.join(log_dir, "tensorboard"))
    if cfg.checkpoint:  # what interrupted saves of an earlier job left beside it
        from het.train import checkpoint

        checkpoint.remove_stale(cfg.checkpoint)
    warned = _warn_beside(cfg)
    first, restarts, rejoins = cfg, [], 0
    while True:
        try:
            summary = _run_once(cfg, log_dir, secret, progress, network, on_failure,
                                cfg.max_restarts - len(restarts) - rejoins)
        except ClusterError as e:
            rejoins += getattr(e, "worker_restarts", 0)
            if len(restarts) + rejoins >= cfg.max_restarts:
                raise
            from het.train import checkpoint

            step = checkpoint.saved_step(cfg.checkpoint)
            cfg = dataclasses.replace(cfg, resume=cfg.checkpoint if step is not None else first.resume)
            where = f"the checkpoint at step {step} ({cfg.checkpoint})" if step is not None else "its start"
            restarts.append({"error": str(e), "resumed_from_step": step or 0})
            said = "" if on_failure else f"het train: {e}\n"  # on_failure said it already
            print(f"{said}het train: restart {len(restarts)} of {cfg.max_restarts}: from {where}",
                  file=sys.stderr, flush=True)
            continue
        if warned is not None:
            warned.join(timeout=5.0)
        summary["worker_restarts"] = rejoins + summary.get("worker_restarts", 0)
        if restarts:
            # the job's steps, not the last run's (a time limit stopped it at stopped_at_step)
            summary.update(steps=summary.get("stopped_at_step", cfg.steps),
                           resumed_from_step=restarts[-1]["resumed_from_step"])
        return {**summary, "restarts": len(restarts), "restart_log": restarts}


def with_restart_checkpoints(cfg: TrainConfig, log_dir: str) -> TrainConfig:
    """``cfg`` with checkpoints to restart from when restarts are allowed and it has none: one
    every tenth of the steps (at most every 1,000), under the run's logs.

    Example:
        >>> with_restart_checkpoints(TrainConfig(max_restarts=2, steps=300), "runs/x").checkpoint_every
        30
    """
    if not cfg.max_restarts or cfg.checkpoint_every:
        return cfg
    return dataclasses.replace(cfg, checkpoint=cfg.checkpoint or os.path.join(log_dir, "checkpoint"),
                               checkpoint_every=min(1000, max(1, cfg.steps // 10)))


def _run_once(cfg: TrainConfig, log_dir: str, secret, progress: bool, network, on_failure,
              max_worker_restarts: int) -> dict:
    if cfg.resume is None:  # a job from its start: a log an earlier job left in the directory is not its own
        for i in range(cfg.servers):
            shutil.rmtree(os.path.join(log_dir, f"ps-{i}", "wal"), ignore_errors=True)
    if cfg.ps_encrypt and secret is None:  # CURVE's keys derive from a shared secret: one for this job
        secret = secrets.token_hex(16).encode()
    cluster = LocalCluster(cfg.to_dict(), cfg.workers, cfg.servers, ["--config-json", json.dumps(cfg.to_dict())],
                           log_dir, secret, progress, network, wal=cfg.ps_wal, on_failure=on_failure,
                           encrypt=cfg.ps_encrypt, metrics_port=cfg.ps_metrics_port,
                           max_worker_restarts=max_worker_restarts)
    return cluster.run()


def _warn_beside(cfg: TrainConfig) -> threading.Thread | None:
    """What a prepared table holds that a user should know (het.train.tasks.data_warnings), said
    by a thread while the job starts: reading it needs torch, which the processes' start does
    not wait for here. Synthetic data has nothing to say, and loads nothing."""
    if not cfg.data.startswith(("table:", "criteo:")):
        return None
    warned = threading.Thread(target=_warn_of_data, args=(cfg,), daemon=True)
    warned.start()
    return warned


def _warn_of_data(cfg: TrainConfig) -> None:
    from het.train.tasks import warn_of_data

    warn_of_data(cfg, cfg.workers)


def shard_options(cfg: TrainConfig) -> dict:
    """The job's settings of its shards beyond their tables: every field of its ``[shard]``
    (:class:`het.config.ShardSettings`), so a setting declared there reaches the shards as it is.

    Example:
        >>> shard_options(TrainConfig(shard={"memory": "1GiB"}))["memory"]
        1073741824
    """
    return {f.name: getattr(cfg.shard, f.name) for f in dataclasses.fields(cfg.shard)}


def check_job(cfg: TrainConfig) -> None:
    """What a worker would find wrong only after every process started, found before any
    does: a checkpoint to resume that is not there or not for ``cfg.servers`` shards, a
    checkpoint directory that cannot be written, data that is not there. Raises ValueError
    naming the setting (``het train`` prints it on one line and exits 2)."""
    if cfg.resume or cfg.checkpoint:
        from het.train import checkpoint
    if cfg.resume:
        _as_setting("resume", checkpoint.check_resumable, cfg.resume, cfg.servers)
    if cfg.checkpoint:
        _as_setting("checkpoint", checkpoint.check_writable, cfg.checkpoint)
    _check_data(cfg.data)


def _as_setting(name: str, check, *args) -> None:
    try:
        check(*args)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None


def _check_data(spec: str) -> None:
    """ValueError if the files that ``spec`` (``--data``) names are not there."""
    kind, _, path = spec.partition(":")
    if kind == "criteo" and not os.path.isfile(os.path.join(path, "meta.json")):
        raise ValueError(f"data {spec!r}: {path} holds no meta.json: prepare it first with "
                         f"`het data prepare criteo RAW... {path}`")
    if kind == "planetoid" and not os.path.isdir(path):
        raise ValueError(f"data {spec!r}: no directory {path}")
    if kind == "npz" and not os.path.isfile(path):
        raise ValueError(f"data {spec!r}: no file {path}")
