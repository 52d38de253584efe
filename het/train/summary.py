"""What a training job reports: its summary, from every rank's counters and the shards' stats."""

from __future__ import annotations

import math

from het.staleness import format_staleness
from het.train.config import TrainConfig
from het.train.streaming import stream_summary


def summarise(cfg: TrainConfig, world: int, servers: int, steps: int, wall_s: float, per_rank: list[dict],
              metrics: dict, table_rows: int) -> dict:
    """The job's summary from every rank's :meth:`het.train.loop.Worker.counters`; ``servers``: the shards the
    job really used (``--ps`` may name others than ``cfg.servers``)."""
    total = {k: sum(r[k] for r in per_rank) for k in per_rank[0]}
    samples = steps * cfg.batch * world
    sparse = total["sparse_pull"] + total["sparse_push"] + total["sync"]
    busy = wall_s * world
    wait, allreduce = total["wait_ps_s"], total["allreduce_s"]
    return {
        "mode": cfg.mode, "staleness": format_staleness(cfg.staleness),
        "workers": world, "servers": servers, "steps": steps, "samples": samples, "wall_s": wall_s,
        "samples_per_s": samples / wall_s if wall_s else 0.0, **metrics,
        "hit_rate": total["hits"] / total["lookups"] if total["lookups"] else 0.0,
        "stale_refreshes": total["stale_refreshes"], "evictions": total["evictions"],
        # how far refreshed copies had drifted from the server's rows (het.cache.cache's stats)
        "drift": math.sqrt(total["drift_sq"] / total["drift_norm_sq"]) if total["drift_norm_sq"] else 0.0,
        "bytes": {k: total[k] for k in ("sparse_pull", "sparse_push", "sync", "dense")},
        "sparse_bytes_per_sample": sparse / samples if samples else 0.0,
        # the final flush (every cache's pending updates pushed), already in the figures above:
        # its share of the sparse bytes, and its time on a rank (a mean over ranks)
        "flush": {"s": total["flush_s"] / world, "sparse_bytes": total["flush_bytes"],
                  "share_of_sparse": total["flush_bytes"] / sparse if sparse else 0.0},
        "time_split": {"compute": max(0.0, 1 - (wait + allreduce) / busy) if busy else 0.0,
                       "wait_ps": wait / busy if busy else 0.0, "allreduce": allreduce / busy if busy else 0.0},
        "batch": cfg.batch, "dim": cfg.dim, "cache_rows": cfg.cache_rows_for(table_rows),
        "policy": cfg.cache.policy, "optimizer": cfg.optimizer, "local_update": cfg.cache.local_update,
        "lookahead": cfg.cache.lookahead, "lazy_init": cfg.lazy_init,
        "push_dtype": cfg.push_dtype, "row_dtype": cfg.table.row_dtype,
    }


PS_COUNTERS = ("rows", "admitted", "refused_updates", "expired", "evicted", "bytes",
               "rows_in_memory", "rows_on_disk", "disk_bytes", "disk_reads", "disk_writes")


def ps_summary(shard_stats: list[dict], timeline: list[dict] = ()) -> dict:
    """What the shards hold, over every shard and table: stored rows, keys admitted, gradient rows
    dropped before admission, rows expired and evicted, their bytes (rows, optimizer state, index,
    counters), the rows in memory and on disk with the disk's bytes, reads and writes (a counter a
    shard does not report counts 0); the shards' peak RSS summed (``peak_rss_bytes``) and at most
    (``max_rss_bytes``), and the largest shard RSS the ``timeline`` saw (``sampled_peak_rss_bytes``).

    Example:
        >>> ps = ps_summary([{"tables": {"t": {"rows": 3, "bytes": 96}}, "peak_rss_bytes": 10},
        ...                  {"tables": {"t": {"rows": 2, "bytes": 64, "evicted": 1}}, "peak_rss_bytes": 12}],
        ...                 [{"rss_bytes": 9}, {"rss_bytes": 11}])
        >>> ps["rows"], ps["evicted"], ps["bytes"], ps["rows_on_disk"], ps["max_rss_bytes"], ps["sampled_peak_rss_bytes"]
        (5, 1, 160, 0, 12, 11)
    """
    tables = [t for s in shard_stats for t in s.get("tables", {}).values()]
    out = {k: sum(int(t.get(k, 0)) for t in tables) for k in PS_COUNTERS}
    rss = [int(s.get("peak_rss_bytes", 0)) for s in shard_stats]
    return {**out, "peak_rss_bytes": sum(rss), "max_rss_bytes": max(rss, default=0),
            "sampled_peak_rss_bytes": max((int(e["rss_bytes"]) for e in timeline), default=0)}


def job_summary(worker, run: dict, per_rank: list[dict], metrics: dict, start: int, kept: int, curve, keeper,
                scored: dict | None = None) -> dict:
    """Rank 0's summary of the job: :func:`summarise`, what the shards hold, the curve, where
    the job stopped and the model it kept; ``scored``: a stream's rows and its batches' scores
    before each trained (merged tallies: :class:`het.train.streaming.Progressive`)."""
    cfg, steps = worker.cfg, worker.step_count
    summary = summarise(cfg, worker.world, worker.client.num_shards, steps, run["wall_s"], per_rank, metrics,
                        worker.task.num_ids)
    summary["cache_rows"], summary["dim"] = worker.cache_rows, cfg.dim if worker.task.groups else worker.task.dim
    if worker.task.groups:  # fields of several widths: a table a width
        summary["widths"] = {g.table: {"width": g.width, "fields": len(g.fields)} for g in worker.task.groups}
    # every rank flushed before the gather of the counters
    summary.update(ps=ps_summary(worker.client.stats(), run["timeline"]), timeline=run["timeline"])
    if curve:
        summary["curve"] = curve.points + [{"step": start + steps, **metrics}]
    if worker.out_of_time or worker.early_stop:
        summary["stopped_at_step"] = start + steps
    if keeper:
        summary["validation"] = keeper.summary(start + steps)
        summary["best_step"] = kept
    if scored is not None:
        summary["stream"] = stream_summary(worker.task, start + steps, scored)
    return summary
