"""TensorBoard scalars of a job while it trains (``het train --tensorboard-dir DIR``; a local
cluster writes them in RUN_DIR/tensorboard unless told otherwise; ``--tensorboard-every 0``: none).

Rank 0 writes, every ``every`` steps: the loss; its cache's hit rate, stale refreshes and drift
over the steps since the last point; the bytes each kind of traffic moved per sample, and the
samples/s of the whole job; where its time went (compute, waiting on the PS, AllReduce); and
the shards' rows, rows in DRAM and on disk, disk bytes, largest RSS and log (one STATS request to
each shard a point); a stream's progressive AUC and log loss over the rolling window of its
latest rows (``stream/*_window``: rank 0's share of each step's rows, scored before they train). Evaluations (``--eval-curve`` and the final one) add ``eval/*``. The
writer is torch's SummaryWriter: TensorBoard's own event files, written from a thread.
"""

from __future__ import annotations

import math
import time

from het.train.timeline import timeline_entry

# the cache's counters written as differences since the last point
CACHE = ("lookups", "hits", "stale_refreshes", "evictions", "drift_sq", "drift_norm_sq")
TRAFFIC = ("sparse_pull", "sparse_push", "sync")
SHARDS = ("rows", "rows_in_memory", "rows_on_disk", "disk_bytes", "rss_bytes", "wal_log_bytes")


class Board:
    """The step hook writing a job's scalars (rank 0 alone; a falsy board on the others).

    Args:
        worker: the rank's :class:`het.train.loop.Worker`.
        directory: where the event files go (None: no board).
        every: steps between points.
    """

    def __init__(self, worker, directory: str | None, every: int = 10):
        self.worker, self.every = worker, every
        self.writer = None
        if directory and worker.rank == 0 and every > 0:
            from torch.utils.tensorboard import SummaryWriter  # tensorboard's import: only for a board

            self.writer = SummaryWriter(directory, flush_secs=10)
        self._last = self._counters()
        self._time = time.perf_counter()

    def __bool__(self) -> bool:
        return self.writer is not None

    def __call__(self, step: int) -> None:
        if self.writer is None or step % self.every:
            return
        now, counters = time.perf_counter(), self._counters()
        since = {k: counters[k] - self._last.get(k, 0) for k in counters}
        wall = now - self._time
        self._last, self._time = counters, now
        w = self.worker
        samples = self.every * w.cfg.batch * w.world
        scalars = {"train/loss": w.last_loss, "train/samples_per_s": samples / wall if wall > 0 else 0.0}
        if since["lookups"]:
            scalars["cache/hit_rate"] = since["hits"] / since["lookups"]
        scalars.update({f"cache/{k}": since[k] for k in ("stale_refreshes", "evictions")})
        if since["drift_norm_sq"]:  # how far refreshed copies had moved from the shard's rows, relative
            scalars["cache/drift"] = (since["drift_sq"] / since["drift_norm_sq"]) ** 0.5
        scalars.update({f"bytes_per_sample/{k}": since[k] * w.world / samples for k in (*TRAFFIC, "dense")})
        waited = since["wait_ps_s"] + since["allreduce_s"]
        scalars.update({"time/wait_ps_s": since["wait_ps_s"], "time/allreduce_s": since["allreduce_s"],
                        "time/compute_s": max(0.0, wall - waited)})
        if w.task.progressive is not None:  # a stream: its latest rows scored before they trained (rank 0's share)
            window = w.task.progressive.window_metrics()
            scalars.update({f"stream/{k}_window": window[k] for k in ("auc", "logloss") if math.isfinite(window[k])})
        shards = timeline_entry(w.client.stats(), 0.0, step, 0.0)
        scalars.update({f"ps/{k}": shards[k] for k in SHARDS})
        for name, value in scalars.items():
            self.writer.add_scalar(name, value, step)

    def evaluation(self, step: int, metrics: dict) -> None:
        """Held-out metrics (``auc``, ``logloss``, ``accuracy``...) at ``step``."""
        if self.writer is None:
            return
        for name, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(f"eval/{name}", value, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def _counters(self) -> dict:
        w = self.worker
        stats = w.embedding.total_stats()
        dense = w.dense.counters()
        out = {k: stats.get(k, 0) for k in CACHE}
        out.update({k: w.embedding.traffic.get(k, 0) for k in TRAFFIC})
        out.update(dense=dense["dense"], wait_ps_s=w.embedding.wait_s + dense["wait_ps_s"],
                   allreduce_s=dense["allreduce_s"])
        return out
