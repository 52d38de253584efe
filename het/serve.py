"""``het serve``: one PS shard in the foreground, holding tables named on the command line or
the tables a training job's TOML needs."""

from __future__ import annotations

import argparse
import json

from het.config import OPTIMIZERS, OptimizerConfig, ShardConfig, TableConfig, parse_bytes


def add_parser(sub) -> None:
    """Register ``het serve`` on the ``het`` command's subparsers."""
    s = sub.add_parser("serve", help="run one PS shard in the foreground")
    s.add_argument("--bind", default="127.0.0.1:5555", help="HOST:PORT to listen on (port 0: any free port); "
                   "an address other than 127.0.0.1 needs a shared secret")
    s.add_argument("--secret-file", metavar="PATH", help="file holding the shared secret that every request "
                   "must be signed with (default: the environment variable HET_SECRET, if set)")
    s.add_argument("--table", action="append", type=_table, default=[], metavar="NAME:ROWS:DIM",
                   help="a table to hold (repeat for several); ROWS 'dynamic': any int64 key, only the rows "
                   "pushes changed are stored")
    s.add_argument("--admit-after", type=int, default=1, help="dynamic tables: store a key once pushes touched it "
                   "in N worker-steps (default 1)")
    s.add_argument("--admit-counters", type=int, default=1 << 22, help="dynamic tables: bytes of each table's "
                   "sketch of sightings (default %(default)s)")
    s.add_argument("--expire-after", type=int, default=None, help="dynamic tables: remove rows not updated for "
                   "N steps (default: never)")
    s.add_argument("--max-rows", type=int, default=None, help="dynamic tables: rows this shard stores at most; "
                   "the least recently updated go first (default: no budget)")
    s.add_argument("--optimizer", default="sgd", choices=OPTIMIZERS, help="the tables' optimizer (default sgd)")
    s.add_argument("--lr", type=float, default=0.01, help="the tables' learning rate (default 0.01)")
    s.add_argument("--seed", type=int, default=0, help="initial rows are a function of (seed, table, key)")
    s.add_argument("--shard-index", type=int, default=0, help="which shard of --num-shards this one is")
    s.add_argument("--num-shards", type=int, default=1, help="how many shards hold the tables together")
    s.add_argument("--state-dir", metavar="DIR", help="where SAVE and LOAD requests may read and write "
                   "(relative names only; created if missing); without it the shard saves and loads nothing")
    s.add_argument("--encrypt", action="store_true", help="every frame under ZeroMQ's CURVE encryption, keyed "
                   "by the shared secret (workers: het train --ps-encrypt)")
    s.add_argument("--wal", action="store_true", help="log every push in the state directory before it is "
                   "acknowledged; started again on the same directory, the shard recovers its last save and "
                   "the pushes after it (kill -9 loses nothing acknowledged)")
    s.add_argument("--wal-fsync-s", type=float, default=0.05, help="force the log to disk at most this often "
                   "(seconds; a machine crash can lose that much; default %(default)s)")
    s.add_argument("--max-keys", type=int, default=1 << 18, help="keys in one request at most; a larger "
                   "frame than such a request needs drops its sender (default %(default)s)")
    s.add_argument("--config", help="a training job's TOML: hold the tables that job needs")
    s.add_argument("--memory", type=size, default=None, metavar="SIZE",
                   help="dynamic tables: DRAM kept for rows, optimizer state and index (e.g. 2GiB); the "
                        "rest of the rows live in a disk tier under --state-dir (default: all in memory)")
    s.add_argument("--memory-policy", default="lru", choices=("lru", "lfu"),
                   help="with --memory: which rows leave DRAM first (default lru)")
    s.add_argument("--no-page-in", action="store_true",
                   help="with --memory: do not page a sync's rows on disk into DRAM after replying")
    s.add_argument("--threads", type=int, default=None, metavar="N",
                   help="torch threads of the shard's row operations (default: OMP_NUM_THREADS if set, else 1: "
                        "a request's operations are small, and idle pool threads spin on the cores ZeroMQ's "
                        "I/O threads need)")
    s.add_argument("--shard-config", help=argparse.SUPPRESS)  # JSON, used by ServerProcess
    s.set_defaults(func=cmd_serve)


def size(text: str) -> int:
    """``--memory``'s type (argparse names it in an error: "invalid size value")."""
    return parse_bytes(text)


def cmd_serve(args) -> None:
    import os

    import torch

    from het.ps.wire.auth import load_secret
    from het.ps.server import run_foreground

    threads = args.threads if args.threads is not None else int(os.environ.get("OMP_NUM_THREADS") or 1)
    if threads < 1:
        raise ValueError(f"--threads must be >= 1, got {threads}")
    torch.set_num_threads(threads)

    if args.shard_config:
        d = json.loads(args.shard_config)
        cfg = ShardConfig(tuple(TableConfig.from_dict(t) for t in d["tables"]), d["index"], d["num_shards"],
                          d.get("max_keys", ShardConfig.max_keys), d.get("memory"), d.get("memory_policy", "lru"),
                          d.get("page_in", True))
    elif args.config:
        from het.train.config import TrainConfig
        from het.train.tasks import job_tables

        job = TrainConfig.load(args.config)
        memory = args.memory if args.memory is not None else job.ps_memory_bytes  # the flag wins
        cfg = ShardConfig(tuple(job_tables(job)), args.shard_index, args.num_shards, args.max_keys, memory,
                          args.memory_policy, not args.no_page_in)
    else:
        if not args.table:
            raise SystemExit("het serve: give at least one --table NAME:ROWS:DIM, or --config JOB.toml")
        opt = OptimizerConfig(args.optimizer, lr=args.lr)
        dynamic = {"admit_after": args.admit_after, "admit_counters": args.admit_counters,
                   "expire_after": args.expire_after, "max_rows": args.max_rows}
        tables = tuple(TableConfig(n, rows=r, dim=d, optimizer=opt, seed=args.seed, **(dynamic if r is None else {}))
                       for n, r, d in args.table)
        cfg = ShardConfig(tables, args.shard_index, args.num_shards, args.max_keys, args.memory,
                          args.memory_policy, not args.no_page_in)
    if args.wal and not args.state_dir:
        raise ValueError("--wal needs --state-dir DIR: the log lives there")
    run_foreground(cfg, args.bind, load_secret(args.secret_file), args.state_dir, args.wal, args.wal_fsync_s,
                   args.encrypt)


def _table(text: str) -> tuple[str, int | None, int]:
    parts = text.split(":")
    if len(parts) != 3 or not (parts[1].isdigit() or parts[1] == "dynamic") or not parts[2].isdigit():
        raise argparse.ArgumentTypeError(f"expected NAME:ROWS:DIM or NAME:dynamic:DIM, e.g. user:1000000:128, "
                                         f"got {text!r}")
    return parts[0], None if parts[1] == "dynamic" else int(parts[1]), int(parts[2])
