"""The ``het`` command: flags -> configs -> the right entry point."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

from het.config import OptimizerConfig, ShardConfig, TableConfig


def _staleness(text: str) -> float:
    if text.lower() in ("inf", "infinity"):
        return math.inf
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0 or 'inf', got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0 or 'inf', got {text!r}")
    return value


def _table(text: str) -> tuple[str, int, int]:
    parts = text.split(":")
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        raise argparse.ArgumentTypeError(f"expected NAME:ROWS:DIM, e.g. user:1000000:128, got {text!r}")
    return parts[0], int(parts[1]), int(parts[2])


def _print_json(obj: dict) -> None:
    print(json.dumps(obj, sort_keys=True, default=str))


def cmd_serve(args) -> None:
    from het.ps.auth import load_secret
    from het.ps.server import run_foreground

    if args.shard_config:
        d = json.loads(args.shard_config)
        cfg = ShardConfig(tuple(TableConfig.from_dict(t) for t in d["tables"]), d["index"], d["num_shards"])
    elif args.config:
        from het.train.config import TrainConfig
        from het.train.loop import job_tables

        tables = tuple(job_tables(TrainConfig.load(args.config, {})))
        cfg = ShardConfig(tables, args.shard_index, args.num_shards)
    else:
        if not args.table:
            raise SystemExit("het serve: give at least one --table NAME:ROWS:DIM, or --config JOB.toml")
        opt = OptimizerConfig(args.optimizer, lr=args.lr)
        tables = tuple(TableConfig(n, rows=r, dim=d, optimizer=opt, seed=args.seed) for n, r, d in args.table)
        cfg = ShardConfig(tables, args.shard_index, args.num_shards)
    run_foreground(cfg, args.bind, load_secret(args.secret_file))


TRAIN_FLAGS = {  # flag -> (type, help); each one given overrides the config file
    "model": (str, "wdl"), "data": (str, "synthetic-criteo"), "mode": (str, "het | hybrid | ps"),
    "staleness": (_staleness, "bound s: an integer (0 = BSP) or inf"), "steps": (int, "training steps"),
    "batch": (int, "samples per worker per step"), "dim": (int, "embedding width"),
    "optimizer": (str, "sgd | adagrad | adam (sparse on the PS, dense locally)"),
    "lr": (float, "sparse learning rate"), "dense_lr": (float, "dense learning rate"),
    "dense_optimizer": (str, "the dense layers' optimizer, if not --optimizer"),
    "weight_decay": (float, "the dense optimizer's L2 penalty"),
    "cache_frac": (float, "cache rows as a fraction of the table"), "cache_rows": (int, "cache rows"),
    "policy": (str, "lru | lfu"),
    "lookahead": (int, "announce the next N steps' keys to the cache: Belady's rule within them"),
    "push_dtype": (str, "f32 | bf16: pushed gradients in bfloat16 travel in half the bytes (rounded)"),
    "workers": (int, "local cluster: worker processes"),
    "servers": (int, "local cluster: PS shard processes"), "eval_samples": (int, "held-out samples"),
    "seed": (int, "seed of the data and the model"), "checkpoint": (str, "checkpoint directory"),
    "checkpoint_every": (int, "steps between checkpoints"), "resume": (str, "checkpoint to resume from"),
    "synthetic_cap": (int, "cap on each synthetic field's cardinality"),
    "synthetic_alpha": (float, "power-law exponent of the synthetic ids"),
    "fanouts": (lambda t: tuple(int(x) for x in t.split(",")), "graphs: neighbours per layer, e.g. 10,5"),
    "hidden": (int, "graphs: GraphSAGE hidden width"), "dropout": (float, "graphs: dropout"),
    "eval_every": (int, "graphs: evaluate every N steps; report the metrics of the best validation"),
}


def cmd_train(args) -> None:
    from het.ps.auth import load_secret
    from het.train.config import TrainConfig

    if args.config_json:  # a worker started by the local launcher
        cfg = TrainConfig.from_dict(json.loads(args.config_json))
    else:
        overrides = {k: getattr(args, k) for k in TRAIN_FLAGS if getattr(args, k) is not None}
        if args.no_prefetch:
            overrides["prefetch"] = False
        if args.no_lazy_init:
            overrides["lazy_init"] = False
        cfg = TrainConfig.load(args.config, overrides)
    secret = load_secret(args.secret_file)
    if args.ps:  # a worker of a multi-node job (torchrun) or of the local launcher
        from het.train.loop import run_worker

        summary = run_worker(cfg, args.ps.split(","), secret, progress=not args.quiet)
        if summary is None:
            return
        if args.summary:
            with open(args.summary, "w") as f:
                json.dump(summary, f)
    else:
        from het.dist.launch import ClusterError, LocalCluster

        log_dir = args.log_dir or os.path.join("runs", time.strftime("%Y%m%d-%H%M%S"))
        try:
            summary = LocalCluster(cfg, log_dir, secret, progress=not args.quiet).run()
        except ClusterError as e:
            print(f"het train: {e}", file=sys.stderr)
            raise SystemExit(1) from None
        except KeyboardInterrupt:
            print("het train: interrupted; every process was stopped", file=sys.stderr)
            raise SystemExit(130) from None
    _report(summary, args.json)


def _report(summary: dict, as_json: bool) -> None:
    if as_json:
        _print_json(summary)
        return
    split = summary["time_split"]
    metrics = ", ".join(f"{k} {summary[k]:.4f}" for k in ("auc", "planted_auc", "logloss", "val_acc", "test_acc")
                        if k in summary)
    print(f"het train: {summary['mode']} s={summary['staleness']}, {summary['workers']} workers x "
          f"{summary['servers']} servers, {summary['steps']} steps in {summary['wall_s']:.1f} s "
          f"({summary['samples_per_s']:,.0f} samples/s)\n"
          f"  {metrics}; hit rate {summary['hit_rate']:.3f}\n"
          f"  sparse bytes/sample {summary['sparse_bytes_per_sample']:,.0f}; time: compute {split['compute']:.0%}, "
          f"PS wait {split['wait_ps']:.0%}, AllReduce {split['allreduce']:.0%}")


def cmd_reshard(args) -> None:
    from het.ps.reshard import reshard, reshard_checkpoint

    checkpoint = os.path.exists(os.path.join(args.src, "worker.pt"))
    paths = (reshard_checkpoint if checkpoint else reshard)(args.src, args.dst, args.shards)
    what = "checkpoint" if checkpoint else "PS save"
    print(f"het reshard: {what} {args.src} -> {args.dst}: {len(paths)} shard files"
          + (f"; continue it with het train --resume {args.dst} --servers {args.shards}" if checkpoint else ""))


def cmd_demo(args) -> None:
    from het.demo import run

    result = run(steps=args.steps, batch=args.batch, staleness=args.staleness)
    if args.json:
        _print_json(result)


def cmd_bench_cache(args) -> None:
    import numpy as np
    import torch

    from het.bench import cache
    from het.data.zipf import zipf_keys

    torch.set_num_threads(args.threads)
    if args.graph:
        trace, distinct = cache.graph_steps(args.graph, args.fanouts, args.batch, args.batches, args.seed)
    elif args.ctr:
        trace, distinct = cache.ctr_steps(args.batch, args.batches)
    elif args.trace:
        trace = cache.load_trace(args.trace)
        distinct = int(np.unique(trace).size)
    else:
        trace = zipf_keys(args.keys, args.alpha, args.batch * args.batches, seed=args.seed)
        distinct = args.keys
    if args.capacity is not None:
        capacity = args.capacity
    elif args.capacity_frac is not None:
        capacity = max(1, int(round(args.capacity_frac * distinct)))
    else:
        raise SystemExit("het bench cache: give --capacity N or --capacity-frac F")
    result = cache.run(trace, args.batch, capacity, args.policy, dim=args.dim, staleness=args.staleness,
                       ways=args.ways, device=args.device, lookahead=args.lookahead)
    if args.belady:
        from het.cache.belady import belady_miss_rate

        steps = cache.trace_steps(trace, args.batch) if isinstance(trace, np.ndarray) else trace
        result["belady_miss_rate"] = belady_miss_rate(steps, capacity)
    if args.graph:
        result.update(graph=args.graph, fanouts=list(args.fanouts), nodes=distinct, seeds_per_batch=args.batch)
    elif args.ctr:
        result.update(ctr="synthetic-criteo rank 0 of 2", rows=distinct, samples_per_batch=args.batch)
    elif args.trace:
        result.update(trace=args.trace)
    else:
        result.update(alpha=args.alpha, keys=args.keys)
    if args.json:
        _print_json(result)
    else:
        print(f"miss rate {result['miss_rate']:.4f} over {result['lookups']} lookups; "
              f"{result['keys_per_s']:,.0f} unique keys/s through the cache "
              f"({result['keys_per_s_with_ps']:,.0f} with the in-process shard)")


def cmd_bench_ps(args) -> None:
    import torch

    from het.bench import ps

    torch.set_num_threads(args.threads)
    result = ps.run(batch=args.batch, dim=args.dim, rows=args.rows, seconds=args.seconds)
    if args.json:
        _print_json(result)
    else:
        print(f"{result['rows_per_s']:,.0f} rows/s, {result['bytes_per_s'] / 1e6:,.0f} MB/s through the PS; "
              f"raw ZeroMQ {result['zmq_bytes_per_s'] / 1e6:,.0f} MB/s ({result['ps_fraction']:.0%})")


def cmd_bench_e2e(args) -> None:
    from het.bench import e2e
    from het.dist.netns import NetworkEmulationUnavailable
    from het.train.config import TrainConfig

    overrides = {k: getattr(args, k) for k in ("steps", "batch", "dim", "workers", "servers", "cache_frac",
                                               "lookahead") if getattr(args, k) is not None}
    base = TrainConfig.load(args.config, {"eval_samples": 0, **overrides})
    try:
        result = e2e.run(base, args.bandwidths.split(","), args.modes.split(","), args.log_dir,
                         latency_ms=args.latency_ms)
    except NetworkEmulationUnavailable as e:
        raise SystemExit(f"het bench e2e: cannot emulate a cluster network here: {e}") from None
    if args.json:
        _print_json(result)
        return
    print(f"{'bandwidth':>9} {'mode':>6} {'s':>4} {'samples/s':>10} {'vs het100':>9} {'sparse B/sample':>15} "
          f"{'dense B/sample':>14}  compute/ps/allreduce")
    for r in result["results"]:
        t = r["time_split"]
        print(f"{r['bandwidth']:>9} {r['mode']:>6} {r['staleness']:>4} {r['samples_per_s']:>10,.0f} "
              f"{r.get('speed_vs_het100', float('nan')):>9.2f} {r['sparse_bytes_per_sample']:>15,.0f} "
              f"{r['dense_bytes_per_sample']:>14,.0f}  {t['compute']:.0%}/{t['wait_ps']:.0%}/{t['allreduce']:.0%}")


PLUGGED_BENCHES = ("staleness", "scale", "missrate", "report", "profile")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="het", description="Huge embedding model training: sharded parameter "
                                "servers, per-worker caches with per-row clocks, AllReduce for dense layers.")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("reshard", help="a saved PS or a training checkpoint, moved to another number of shards")
    r.add_argument("src", help="a PS save directory (shard-<i>.pt) or a checkpoint directory (ps/, worker.pt)")
    r.add_argument("dst", help="a new (or empty) directory")
    r.add_argument("--shards", type=int, required=True, help="the number of shards to write")
    r.set_defaults(func=cmd_reshard)

    s = sub.add_parser("serve", help="run one PS shard in the foreground")
    s.add_argument("--bind", default="127.0.0.1:5555", help="HOST:PORT to listen on (port 0: any free port); "
                   "an address other than 127.0.0.1 needs a shared secret")
    s.add_argument("--secret-file", metavar="PATH", help="file holding the shared secret that every request "
                   "must be signed with (default: the environment variable HET_SECRET, if set)")
    s.add_argument("--table", action="append", type=_table, default=[], metavar="NAME:ROWS:DIM",
                   help="a table to hold (repeat for several)")
    s.add_argument("--optimizer", default="sgd", choices=["sgd", "adagrad", "adam"])
    s.add_argument("--lr", type=float, default=0.01)
    s.add_argument("--seed", type=int, default=0, help="initial rows are a function of (seed, table, key)")
    s.add_argument("--shard-index", type=int, default=0)
    s.add_argument("--num-shards", type=int, default=1)
    s.add_argument("--config", help="a training job's TOML: hold the tables that job needs")
    s.add_argument("--shard-config", help=argparse.SUPPRESS)  # JSON, used by ServerProcess
    s.set_defaults(func=cmd_serve)

    d = sub.add_parser("demo", help="train het.Embedding against a local shard process and show its hit rate")
    d.add_argument("--steps", type=int, default=600)
    d.add_argument("--batch", type=int, default=512)
    d.add_argument("--staleness", type=_staleness, default=10)
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=cmd_demo)

    t = sub.add_parser("train", help="train a model: a local cluster by default, or a worker of a "
                       "multi-node job with --ps (under torchrun)")
    t.add_argument("--config", help="TOML file of the job (flags override it)")
    for name, (kind, text) in TRAIN_FLAGS.items():
        t.add_argument("--" + name.replace("_", "-"), type=kind, default=None, help=text)
    t.add_argument("--no-prefetch", action="store_true", help="do not send the next step's sync early")
    t.add_argument("--no-lazy-init", action="store_true",
                   help="have the PS send rows no push touched yet, instead of building them from the seed")
    t.add_argument("--ps", help="HOST:PORT,... of running shards (`het serve`): be a worker of that PS")
    t.add_argument("--secret-file", metavar="PATH", help="the shards' shared secret (or HET_SECRET)")
    t.add_argument("--log-dir", help="local cluster: where the processes' logs go (default runs/<time>)")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.add_argument("--json", action="store_true", help="the last line of stdout is the summary as JSON")
    t.add_argument("--config-json", help=argparse.SUPPRESS)
    t.add_argument("--summary", help=argparse.SUPPRESS)
    t.set_defaults(func=cmd_train)

    from het.data.criteo import add_prepare_parser

    data = sub.add_parser("data", help="prepare data sets")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    prepare = data_sub.add_parser("prepare", help="turn raw data into het's memory-mappable format")
    add_prepare_parser(prepare.add_subparsers(dest="dataset", required=True))

    b = sub.add_parser("bench", help="benchmarks; each prints one JSON object with --json")
    bsub = b.add_subparsers(dest="bench", required=True)
    c = bsub.add_parser("cache", help="cache miss rate and unique keys/s on a trace or a Zipf stream")
    c.add_argument("--trace", help="1-D int64 .npy of keys in access order")
    c.add_argument("--graph", help="a graph (cora, planetoid:DIR, npz:PATH, synthetic-graph): the trace is "
                   "GraphSAGE's node accesses, --batch seed nodes a step; --capacity-frac is of the nodes")
    c.add_argument("--ctr", action="store_true", help="the trace is rank 0's keys of the default synthetic "
                   "Criteo job (2 workers), --batch samples a step; --capacity-frac is of the table")
    c.add_argument("--fanouts", type=lambda t: tuple(int(x) for x in t.split(",")), default=(10, 5),
                   help="with --graph: neighbours per layer")
    c.add_argument("--alpha", type=float, default=1.05, help="Zipf exponent of the generated stream")
    c.add_argument("--keys", type=int, default=1_000_000, help="distinct keys of the generated stream")
    c.add_argument("--batches", type=int, default=200, help="steps of the generated stream")
    c.add_argument("--batch", type=int, default=4096, help="trace keys per step (de-duplicated); "
                   "with --graph, seed nodes per step")
    c.add_argument("--capacity", type=int, help="cache rows")
    c.add_argument("--capacity-frac", type=float, help="cache rows as a fraction of the distinct keys")
    c.add_argument("--policy", default="lfu", choices=["lru", "lfu"])
    c.add_argument("--dim", type=int, default=128)
    c.add_argument("--staleness", type=_staleness, default=100)
    c.add_argument("--ways", type=int, default=32)
    c.add_argument("--lookahead", type=int, default=0, help="steps of keys the cache sees ahead "
                   "(Belady's rule within that window; 0: the policy alone)")
    c.add_argument("--belady", action="store_true", help="also Belady's optimal miss rate on the same trace "
                   "(the floor; a slow reference)")
    c.add_argument("--threads", type=int, default=1, help="torch threads (the target is for one core)")
    c.add_argument("--device", default="cpu")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_bench_cache)
    e = bsub.add_parser("e2e", help="modes ps, hybrid, het on an emulated cluster network (namespaces, tbf; root)")
    e.add_argument("--bandwidths", "--bandwidth", default="1gbit", help="comma-separated: 1gbit, 10gbit, none, ...")
    e.add_argument("--modes", default=",".join(("ps", "hybrid", "het:10", "het:100")),
                   help="comma-separated: ps, hybrid, het:S")
    e.add_argument("--config", help="the job's TOML (default: the default Wide&Deep job)")
    for name in ("steps", "batch", "dim", "workers", "servers", "lookahead"):
        e.add_argument("--" + name, type=int)
    e.add_argument("--cache-frac", type=float)
    e.add_argument("--latency-ms", type=float, help="one-way delay added to each worker's PS link "
                   "in the transport (tbf shapes only the rate)")
    e.add_argument("--log-dir")
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=cmd_bench_e2e)
    q = bsub.add_parser("ps", help="pull + push rows/s through one shard over TCP loopback vs raw ZeroMQ")
    q.add_argument("--batch", type=int, default=4096)
    q.add_argument("--dim", type=int, default=128)
    q.add_argument("--rows", type=int, default=200_000)
    q.add_argument("--seconds", type=float, default=5.0)
    q.add_argument("--threads", type=int, default=1)
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=cmd_bench_ps)
    import importlib

    for module in PLUGGED_BENCHES:  # each adds its own subcommand: add_parser(bsub)
        importlib.import_module(f"het.bench.{module}").add_parser(bsub)
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        args.func(args)
    except (ValueError, OSError) as e:  # bad input: say what was wrong, no traceback
        print(f"het {args.command}: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
