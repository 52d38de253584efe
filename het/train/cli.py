"""``het train``: a job on a local cluster by default, or one worker of a multi-node job
(``--ps``, under torchrun). Its settings are TrainConfig's, as generated flags and TOML keys."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from het.train.config import TrainConfig
from het.train.flags import add_config_flags, config_from_args


def add_parser(sub) -> None:
    """Register ``het train`` on the ``het`` command's subparsers."""
    t = sub.add_parser("train", help="train a model: a local cluster by default, or a worker of a "
                       "multi-node job with --ps (under torchrun)",
                       description="Train a model. Every job setting is a flag and a key of the --config TOML "
                       "file (flags override it); the defaults of some depend on --model.")
    add_config_flags(t)
    t.add_argument("--ps", help="HOST:PORT,... of running shards (`het serve`): be a worker of that PS")
    t.add_argument("--secret-file", metavar="PATH", help="the shards' shared secret (or HET_SECRET)")
    t.add_argument("--log-dir", help="local cluster: where the processes' logs go (default runs/<time>)")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.add_argument("--json", action="store_true", help="the last line of stdout is the summary as JSON")
    t.add_argument("--config-json", help=argparse.SUPPRESS)  # a worker started by the local launcher
    t.add_argument("--summary", help=argparse.SUPPRESS)
    t.set_defaults(func=cmd_train)


def cmd_train(args) -> None:
    from het.ps.protocol.auth import load_secret

    if args.config_json:
        cfg = TrainConfig.from_dict(json.loads(args.config_json))
    else:
        cfg = config_from_args(args)
    secret = load_secret(args.secret_file)
    if args.ps:  # a worker of a multi-node job (torchrun) or of the local launcher
        from het.train.loop import run_worker
        from het.train.tasks import warn_of_data

        if not args.config_json and int(os.environ.get("RANK", 0)) == 0:  # the local launcher warns itself
            warn_of_data(cfg, int(os.environ.get("WORLD_SIZE", 1)))

        summary = run_worker(cfg, args.ps.split(","), secret, progress=not args.quiet)
        if summary is None:
            return
        if args.summary:
            with open(args.summary, "w") as f:
                json.dump(summary, f)
    else:
        from het.dist.launch import ClusterError
        from het.train.local import run_local

        log_dir = args.log_dir or os.path.join("runs", time.strftime("%Y%m%d-%H%M%S"))
        try:  # a dead process's line comes at once, not after the teardown
            summary = run_local(cfg, log_dir, secret, progress=not args.quiet,
                                on_failure=lambda e: print(f"het train: {e}", file=sys.stderr, flush=True))
        except ClusterError:
            raise SystemExit(1) from None
        except KeyboardInterrupt:
            print("het train: interrupted; every process was stopped", file=sys.stderr)
            raise SystemExit(130) from None
    if args.json:
        print(json.dumps(summary, sort_keys=True, default=str))
    else:
        print(format_summary(summary))


def format_summary(summary: dict) -> str:
    """The summary as readable lines: the job, its metrics, its traffic and time, what the
    shards hold.

    Example:
        >>> print(format_summary({"mode": "het", "staleness": "100", "workers": 2, "servers": 1, "steps": 10,
        ...     "wall_s": 2.0, "samples_per_s": 5120.0, "auc": 0.75, "hit_rate": 0.5, "sparse_bytes_per_sample": 900.0,
        ...     "time_split": {"compute": 0.8, "wait_ps": 0.1, "allreduce": 0.1},
        ...     "ps": {"rows": 3000, "bytes": 2_000_000, "admitted": 3000, "refused_updates": 12, "expired": 0,
        ...            "evicted": 0, "peak_rss_bytes": 900_000_000}}).splitlines()[-1])
          PS: 3,000 rows stored (2 MB), 3,000 admitted, 12 gradient rows dropped before admission; shards' peak RSS 900 MB
    """
    split = summary["time_split"]
    metrics = ", ".join(f"{k} {summary[k]:.4f}" for k in ("auc", "planted_auc", "logloss", "val_acc", "test_acc")
                        if k in summary)
    if "auc_ci95" in summary:
        metrics += f" (auc's 95% interval {summary['auc_ci95'][0]:.3f}-{summary['auc_ci95'][1]:.3f}: a small test split)"
    if "best_step" in summary:
        metrics += f"; the model of step {summary['best_step']} (best on validation)"
    if "stream" in summary:  # its batches scored before each trained
        s = summary["stream"]
        metrics = (f"stream: {s['partitions']} partitions, {s['rows_trained']:,} rows trained, progressive auc "
                   f"{s['progressive']['auc']:.4f}, logloss {s['progressive']['logloss']:.4f}")
    return (f"het train: {summary['mode']} s={summary['staleness']}, {summary['workers']} workers x "
            f"{summary['servers']} servers, {summary['steps']} steps in {summary['wall_s']:.1f} s "
            f"({summary['samples_per_s']:,.0f} samples/s)\n"
            f"  {metrics}; hit rate {summary['hit_rate']:.3f}\n"
            f"  sparse bytes/sample {summary['sparse_bytes_per_sample']:,.0f}; time: compute {split['compute']:.0%}, "
            f"PS wait {split['wait_ps']:.0%}, AllReduce {split['allreduce']:.0%}" + _format_flush(summary.get("flush"))
            + _format_ps(summary.get("ps")))


def _format_flush(flush: dict | None) -> str:
    """The final flush, already in the figures before it: its time and share of the sparse bytes.

    Example:
        >>> _format_flush({"s": 1.25, "sparse_bytes": 44_000_000, "share_of_sparse": 0.3})
        '; the final flush 1.25 s, 30% of the sparse bytes'
    """
    if not flush or not flush["sparse_bytes"]:
        return ""
    return f"; the final flush {flush['s']:.2f} s, {flush['share_of_sparse']:.0%} of the sparse bytes"


def _format_ps(ps: dict | None) -> str:
    """What the shards hold, one line (the rows on disk, admission, expiry and eviction only when
    they are there or acted).

    Example:
        >>> _format_ps({"rows": 3000, "bytes": 2_000_000, "rows_in_memory": 1000, "rows_on_disk": 2000,
        ...             "disk_bytes": 5_000_000, "peak_rss_bytes": 900_000_000}).strip()
        "PS: 3,000 rows stored (2 MB): 1,000 in memory, 2,000 on disk (5 MB on disk); shards' peak RSS 900 MB"
    """
    if not ps:
        return ""
    acted = [f"{ps[k]:,} {what}" for k, what in (("admitted", "admitted"),
                                                  ("refused_updates", "gradient rows dropped before admission"),
                                                  ("expired", "expired"), ("evicted", "evicted")) if ps.get(k)]
    disk = (f": {ps.get('rows_in_memory', 0):,} in memory, {ps['rows_on_disk']:,} on disk "
            f"({ps.get('disk_bytes', 0) / 1e6:,.0f} MB on disk)" if ps.get("rows_on_disk") else "")
    return (f"\n  PS: {ps['rows']:,} rows stored ({ps['bytes'] / 1e6:,.0f} MB){disk}" + "".join(f", {a}" for a in acted)
            + f"; shards' peak RSS {ps['peak_rss_bytes'] / 1e6:,.0f} MB")
