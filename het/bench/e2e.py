"""``het bench e2e``: the paper's end-to-end comparison on an emulated cluster network.

Every PS shard and every worker runs in its own network namespace, the hosts joined by a bridge
and every link shaped with tbf to ``--bandwidth`` (het.dist.netns); each mode trains the same
Wide&Deep job and reports its samples/s, bytes per sample and time split, and its ratio to
het s=100 in the same run. tbf shapes bandwidth only; ``latency_ms`` adds a one-way delay to
every worker's PS link in the transport (``HET_PS_LATENCY_MS``, see het.ps.transport), not to
the AllReduce between workers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import secrets
import tempfile

from het.ps.transport import LATENCY_ENV, check_latency, latency_from_env
from het.train.config import TrainConfig

DEFAULT_MODES = ("ps", "hybrid", "het:10", "het:100")


def parse_mode(text: str) -> tuple[str, float]:
    """``"het:100"`` -> ``("het", 100)``; ``"hybrid"`` -> ``("hybrid", 0)``.

    Example:
        >>> parse_mode("het:inf"), parse_mode("ps")
        (('het', inf), ('ps', 0))
    """
    mode, _, s = text.partition(":")
    if mode not in ("ps", "hybrid", "het"):
        raise ValueError(f"expected a mode ps, hybrid or het[:STALENESS], got {text!r}")
    if not s:
        return mode, 100 if mode == "het" else 0
    return mode, math.inf if s == "inf" else int(s)


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
    from het.dist.launch import LocalCluster
    from het.dist.netns import EmulatedNetwork

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
                summary = LocalCluster(cfg, run_dir, secret, progress=progress, network=net).run()
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
