"""``het bench e2e``: the paper's end-to-end comparison on an emulated cluster network.

Every PS shard and every worker runs in its own network namespace, the hosts joined by a bridge
and every link shaped with tbf to ``--bandwidth`` (het.bench.netns); each mode trains the same
Wide&Deep job and reports its samples/s, bytes per sample and time split, and its ratio to
het s=100 in the same run. tbf shapes bandwidth only; ``latency_ms`` adds a one-way delay to
every worker's PS link in the transport (``HET_PS_LATENCY_MS``, see het.ps.protocol.transport), not to
the AllReduce between workers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import tempfile

from het.ps.protocol.transport import LATENCY_ENV, check_latency, latency_from_env
from het.staleness import parse_staleness
from het.train.config import MODES, TrainConfig
from het.train.flags import add_config_flags, config_from_args

DEFAULT_MODES = ("ps", "hybrid", "het:10", "het:100")


def parse_mode(text: str) -> tuple[str, float]:
    """``"het:100"`` -> ``("het", 100)``; ``"hybrid"`` -> ``("hybrid", 0)``.

    Example:
        >>> parse_mode("het:inf"), parse_mode("ps")
        (('het', inf), ('ps', 0))
    """
    mode, _, s = text.partition(":")
    if mode not in MODES or (s and mode != "het"):
        raise ValueError(f"expected a mode {', '.join(m for m in MODES if m != 'het')} or het[:STALENESS], "
                         f"got {text!r}")
    if not s:
        return mode, 100 if mode == "het" else 0
    return mode, parse_staleness(s)


@contextlib.contextmanager
def ps_latency(latency_ms: float | None):
    """Within the block, worker processes started from here get ``latency_ms`` of one-way PS
    latency (they inherit ``HET_PS_LATENCY_MS``); None leaves the environment as it is."""
    if latency_ms is None:
        yield
        return
    value = str(check_latency(latency_ms, "latency_ms"))
    previous = os.environ.get(LATENCY_ENV)
    os.environ[LATENCY_ENV] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(LATENCY_ENV, None)
        else:
            os.environ[LATENCY_ENV] = previous


def run(base: TrainConfig, bandwidths: list[str], modes: list[str], log_dir: str | None = None,
        progress: bool = False, latency_ms: float | None = None) -> dict:
    """Train ``base`` once per (bandwidth, mode) on an emulated network; the results.
    ``latency_ms``: one-way delay of each worker's PS link (None: as ``HET_PS_LATENCY_MS`` says)."""
    from het.bench.netns import EmulatedNetwork
    from het.train.local import run_local

    log_dir = log_dir or tempfile.mkdtemp(prefix="het-e2e-")
    secret = secrets.token_hex(16).encode()
    hosts = [f"ps{i}" for i in range(base.servers)] + [f"worker{r}" for r in range(base.workers)]
    results = []
    for bandwidth in bandwidths:
        for text in modes:
            mode, staleness = parse_mode(text)
            cfg = dataclasses.replace(base, mode=mode, staleness=staleness)
            with EmulatedNetwork(hosts, bandwidth=None if bandwidth == "none" else bandwidth) as net, \
                    ps_latency(latency_ms):
                run_dir = os.path.join(log_dir, f"{bandwidth}-{text.replace(':', '-')}")
                summary = run_local(cfg, run_dir, secret, progress=progress, network=net)
                latency = latency_from_env()
            samples = summary["samples"] or 1
            results.append({**summary, "bandwidth": bandwidth, "latency_ms": latency,
                            "dense_bytes_per_sample": summary["bytes"]["dense"] / samples})
    for r in results:  # every run beside het s=100 at the same bandwidth
        ref = next((x for x in results if x["bandwidth"] == r["bandwidth"] and x["mode"] == "het"
                    and x["staleness"] == 100), None)
        if ref:
            r["speed_vs_het100"] = r["samples_per_s"] / ref["samples_per_s"]
            r["sparse_bytes_vs_het100"] = r["sparse_bytes_per_sample"] / max(ref["sparse_bytes_per_sample"], 1e-9)
    return {"bench": "e2e", "log_dir": log_dir, "results": results}


def add_parser(bsub) -> None:
    """Register ``het bench e2e`` on the subparsers of ``het bench``."""
    e = bsub.add_parser("e2e", help="modes ps, hybrid, het on an emulated cluster network (namespaces, tbf; root)")
    e.add_argument("--bandwidths", "--bandwidth", default="1gbit", help="comma-separated: 1gbit, 10gbit, none, ...")
    e.add_argument("--modes", default=",".join(DEFAULT_MODES), help="comma-separated: ps, hybrid, het:S")
    e.add_argument("--latency-ms", type=float, help="one-way delay added to each worker's PS link "
                   "in the transport (tbf shapes only the rate)")
    e.add_argument("--log-dir")
    e.add_argument("--json", action="store_true")
    add_config_flags(e, exclude=("mode", "staleness"), fixed={"eval_samples": 0})
    e.set_defaults(func=_main)


def _main(args) -> None:
    import json

    from het.bench.netns import NetworkEmulationUnavailable

    modes = args.modes.split(",")
    for text in modes:
        parse_mode(text)  # bad input fails before anything starts
    try:
        result = run(config_from_args(args), args.bandwidths.split(","), modes, args.log_dir,
                     latency_ms=args.latency_ms)
    except NetworkEmulationUnavailable as e:
        raise SystemExit(f"het bench e2e: cannot emulate a cluster network here: {e}") from None
    if args.json:
        print(json.dumps(result, sort_keys=True, default=str))
        return
    print(f"{'bandwidth':>9} {'mode':>6} {'s':>4} {'samples/s':>10} {'vs het100':>9} {'sparse B/sample':>15} "
          f"{'dense B/sample':>14}  compute/ps/allreduce")
    for r in result["results"]:
        t = r["time_split"]
        print(f"{r['bandwidth']:>9} {r['mode']:>6} {r['staleness']:>4} {r['samples_per_s']:>10,.0f} "
              f"{r.get('speed_vs_het100', float('nan')):>9.2f} {r['sparse_bytes_per_sample']:>15,.0f} "
              f"{r['dense_bytes_per_sample']:>14,.0f}  {t['compute']:.0%}/{t['wait_ps']:.0%}/{t['allreduce']:.0%}")
