"""``het serve``: one PS shard in the foreground, holding tables named on the command line or
the tables a training job's TOML needs.

The shard's and the tables' flags are generated from :class:`~het.config.ShardConfig`,
:class:`~het.config.TableConfig` and :class:`~het.config.OptimizerConfig` (their help and
defaults are the fields'); a flag not given leaves the config's default. A field renamed keeps
its old flag working through its metadata's ``aliases`` (:func:`het.config.setting`).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import typing

from het.config import DYNAMIC_ONLY, OptimizerConfig, ShardConfig, TableConfig
from het.ps.server.server import run_foreground
from het.train.flags import add_flag, default_help, flag_name

# The flags generated from each config: (config, its fields left out, flags named otherwise than --FIELD: a
# name, or names, the first the flag's and the others its aliases)
GENERATED = {
    "shard": (ShardConfig, ("tables",), {"index": "--shard-index", "page_in": ("--page-in", "--prefetch")}),
    "table": (TableConfig, ("name", "rows", "dim", "optimizer"), {}),
    "optimizer": (OptimizerConfig, ("schedule",), {"name": "--optimizer"}),  # a schedule comes with a job (--job)
}


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
    s.add_argument("--config", help="a training job's TOML: hold the tables that job needs, with its shard "
                   "settings ([shard]; the flags given win)")
    s.add_argument("--state-dir", metavar="DIR", help="where SAVE and LOAD requests may read and write "
                   "(relative names only; created if missing); without it the shard saves and loads nothing")
    s.add_argument("--encrypt", action="store_true", help="every frame under ZeroMQ's CURVE encryption, keyed "
                   "by the shared secret (workers: het train --ps-encrypt)")
    s.add_argument("--wal", action="store_true", help="log every push in the state directory before it is "
                   "acknowledged; started again on the same directory, the shard recovers its last save and "
                   "the pushes after it (kill -9 loses nothing acknowledged)")
    fsync_s = inspect.signature(run_foreground).parameters["fsync_s"].default
    s.add_argument("--wal-fsync-s", type=float, default=fsync_s, help="force the log to disk at most this often "
                   "(seconds; a machine crash can lose that much; default %(default)s)")
    s.add_argument("--wal-recover-prefix", action="store_true", help="when the log is damaged (not only a "
                   "write a crash cut short), recover the pushes before the damage and drop the rest instead of "
                   "refusing to start (what is dropped is printed)")
    s.add_argument("--threads", type=int, default=None, metavar="N",
                   help="torch threads of the shard's row operations (default: OMP_NUM_THREADS if set, else 1: "
                        "a request's operations are small, and idle pool threads spin on the cores ZeroMQ's "
                        "I/O threads need)")
    s.add_argument("--metrics-port", type=_port, default=None, metavar="P", help="serve Prometheus' text format at "
                   "http://HOST:P/metrics, HOST the one --bind names (0: any free port; the address is printed): "
                   "requests by op, latency, refusals by reason, rows, memory, disk, log bytes, sessions")
    s.add_argument("--supervise", nargs="?", type=_restarts, const=-1, default=None, metavar="N",  # -1: always
                   help="run the shard as a child and start it again on the same address whenever it dies, up "
                        "to N times (no N: always); with --wal on the same --state-dir nothing acknowledged is "
                        "lost and clients re-send the rest (shards under torchrun)")
    s.add_argument("--shard-config", help=argparse.SUPPRESS)  # JSON, used by ServerProcess
    s.add_argument("--job-shard", help=argparse.SUPPRESS)  # JSON of a JobShard, used by ServerProcess
    groups = {"shard": s.add_argument_group("the shard"),
              "table": s.add_argument_group("every --table (the dynamic ones' settings apply to dynamic tables)")}
    groups["optimizer"] = groups["table"]
    for prefix, (cls, left_out, names) in GENERATED.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name not in left_out:
                flag = names.get(f.name, flag_name(f.name))
                name, *aliases = (flag,) if isinstance(flag, str) else flag
                add_flag(groups[prefix], name, f"{prefix}.{f.name}", f, hints[f.name], default_help(f),
                         none_ok=f.default is None, aliases=tuple(aliases))
    s.set_defaults(func=cmd_serve)


def given(args: argparse.Namespace, prefix: str) -> dict:
    """The generated flags of one config that were given: ``{field: value}``."""
    return {k.partition(".")[2]: v for k, v in vars(args).items() if k.startswith(prefix + ".")}


def shard_config(args: argparse.Namespace) -> ShardConfig:
    """The shard the flags ask for: ``--shard-config``'s JSON or ``--job-shard``'s (a
    launcher's), a job's tables and shard settings (``--config``), or the ``--table`` flags;
    the flags given win."""
    if args.shard_config:
        spec = _json_object("--shard-config", args.shard_config, "a shard's config: tables and ShardConfig's fields")
        try:
            return ShardConfig.from_dict(spec)
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"--shard-config: expected a shard's config (tables: a list of tables as "
                             f"TableConfig.to_dict gives them; ShardConfig's fields), got keys {sorted(spec)}: "
                             f"{type(e).__name__}: {e}") from None
    if args.job_shard or args.config:
        from het.train.config import TrainConfig
        from het.train.local import shard_options
        from het.train.tasks import job_tables

        if args.job_shard:
            spec = _json_object("--job-shard", args.job_shard, "job, index and num_shards")
            if not (isinstance(spec.get("job"), dict) and all(isinstance(spec.get(k), int) and not isinstance(
                    spec.get(k), bool) for k in ("index", "num_shards"))):
                raise ValueError(f"--job-shard: expected job (a job's config), index and num_shards (integers), "
                                 f"got {json.dumps(spec)[:200]}")
            job = TrainConfig.from_dict(spec["job"])
            place = {"index": spec["index"], "num_shards": spec["num_shards"]}
        else:
            job, place = TrainConfig.load(args.config), {}
        return ShardConfig(tuple(job_tables(job)), **{**place, **shard_options(job), **given(args, "shard")})
    if not args.table:
        raise SystemExit("het serve: give at least one --table NAME:ROWS:DIM, or --config JOB.toml")
    opt = OptimizerConfig(**given(args, "optimizer"))
    settings = given(args, "table")
    fixed = {k: v for k, v in settings.items() if k not in DYNAMIC_ONLY}
    tables = tuple(TableConfig(n, rows=r, dim=d, optimizer=opt, **(settings if r is None else fixed))
                   for n, r, d in args.table)
    return ShardConfig(tables, **given(args, "shard"))


def _json_object(flag: str, text: str, what: str) -> dict:
    """``text`` as a JSON object, or a ValueError naming ``flag`` and what it takes."""
    try:
        value = json.loads(text)
    except ValueError as e:
        raise ValueError(f"{flag}: expected a JSON object ({what}), got {text[:80]!r}: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{flag}: expected a JSON object ({what}), got {type(value).__name__} {text[:80]!r}")
    return value


def cmd_serve(args) -> None:
    import os
    import sys

    import torch

    from het.ps.protocol.auth import load_secret

    if args.supervise is not None:
        if not (args.wal and args.state_dir):
            raise ValueError("--supervise needs --wal and --state-dir DIR: a shard restarted without its log "
                             "would come back empty")
        from het.ps.server.process import supervise

        raise SystemExit(supervise(_without_supervise(sys.argv[2:]), args.bind,
                                   None if args.supervise < 0 else args.supervise))

    threads = args.threads if args.threads is not None else int(os.environ.get("OMP_NUM_THREADS") or 1)
    if threads < 1:
        raise ValueError(f"--threads must be >= 1, got {threads}")
    torch.set_num_threads(threads)
    cfg = shard_config(args)
    if args.wal and not args.state_dir:
        raise ValueError("--wal needs --state-dir DIR: the log lives there")
    run_foreground(cfg, args.bind, load_secret(args.secret_file), args.state_dir, args.wal, args.wal_fsync_s,
                   args.encrypt, args.wal_recover_prefix, args.metrics_port)


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"expected a port, 0 to 65535 (0: any free one), got {text!r}")
    return int(text)


def _restarts(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected how many restarts at most, an integer >= 0, got {text!r}")
    return int(text)


def _table(text: str) -> tuple[str, int | None, int]:
    parts = text.split(":")
    if len(parts) != 3 or not (parts[1].isdigit() or parts[1] == "dynamic") or not parts[2].isdigit():
        raise argparse.ArgumentTypeError(f"expected NAME:ROWS:DIM or NAME:dynamic:DIM, e.g. user:1000000:128, "
                                         f"got {text!r}")
    return parts[0], None if parts[1] == "dynamic" else int(parts[1]), int(parts[2])


def _without_supervise(argv: list[str]) -> list[str]:
    """``het serve``'s arguments less ``--supervise [N]`` and ``--bind ADDRESS`` (the
    supervisor gives the child its own).

    Example:
        >>> _without_supervise(["--table", "t:8:4", "--supervise", "3", "--bind", "127.0.0.1:0", "--wal"])
        ['--table', 't:8:4', '--wal']
        >>> _without_supervise(["--supervise", "--wal", "--bind=127.0.0.1:5555"])
        ['--wal']
    """
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg == "--bind" or (arg == "--supervise" and i + 1 < len(argv) and argv[i + 1].isdigit()):
            skip = True
        elif arg != "--supervise" and not arg.startswith(("--bind=", "--supervise=")):
            out.append(arg)
    return out
