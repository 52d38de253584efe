"""`het bench serve`: a load generator against `het serve-model`: requests/s and p50/p99 latency
for 1, 8 and 64 concurrent clients sending 1 or 64 instances a request, with micro-batching on
and off, side by side.

The server runs as its own process (``het serve-model`` on loopback, one scoring thread); the
clients are asyncio tasks on one aiohttp session in this process (httpx's pool cost 1.3 ms of
client CPU a request at 8 in flight and 7 ms at 64, aiohttp's 0.16, measured), each sending its
next request as soon as the last is answered (a closed loop), so concurrency is the number of
requests in flight. Both share the machine's cores: on two, the client's own CPU is part of
every figure, the same for every cell. Without ``--export`` the model is made first: the job of
the ``het train`` flags (the default job's model) trained ``--train-steps`` steps in this
process and exported.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np

from het.train.flags import add_config_flags

CONCURRENCY = (1, 8, 64)
INSTANCES = (1, 64)


def run(export_dir: str, seconds: float = 4.0, concurrency=CONCURRENCY, instances=INSTANCES,
        max_wait_ms: float = 0.0, max_batch: int = 512) -> dict:
    """Every cell of the grid, each measured against a server with batching on, then at once
    against one with it off (both up throughout; the idle one takes no CPU)."""
    from het.export import load_model

    rows = _instances(load_model(export_dir), max(instances) * 8)
    servers = {on: _start(export_dir, on, max_wait_ms, max_batch) for on in (True, False)}
    cells = []
    try:
        for n in instances:
            for c in concurrency:
                for batching, (url, _) in servers.items():
                    cells.append({"batching": batching, "instances": n, "concurrency": c,
                                  **asyncio.run(_load(url, rows, n, c, seconds))})
        batches = {on: _batch_sizes(url) for on, (url, _) in servers.items()}
    finally:
        for _, proc in servers.values():
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
    on = {(c["instances"], c["concurrency"]): c for c in cells if c["batching"]}
    off = {(c["instances"], c["concurrency"]): c for c in cells if not c["batching"]}
    gain = {f"{n}x{c}": on[n, c]["qps"] / off[n, c]["qps"] for (n, c) in on if off[n, c]["qps"]}
    return {"export": os.path.abspath(export_dir), "seconds": seconds, "max_wait_ms": max_wait_ms,
            "max_batch": max_batch, "cells": cells, "batching_gain": gain, "server_batches": batches,
            "gain_64_single": gain.get(f"1x{max(concurrency)}"), "p99_ms_8_single": on.get((1, 8), {}).get("p99_ms")}


def _instances(model, n: int) -> list[dict]:
    """Held-out rows as raw instances (synthetic data: ``I1..I13``, each field's own id)."""
    spec = model.manifest["input"]
    if spec["source"] != "synthetic":
        raise ValueError("het bench serve makes its requests from synthetic data: export a synthetic-criteo job")
    from het.data.synthetic import SyntheticCriteo, SyntheticCriteoConfig

    gen = SyntheticCriteo(SyntheticCriteoConfig(**spec["synthetic"]))
    b = gen.batch("test", 0, n)
    ids = b.sparse.numpy() - gen.offsets
    dense = b.dense.numpy()
    return [{**{f"I{j + 1}": float(dense[i, j]) for j in range(dense.shape[1])},
             **{f"C{j + 1}": int(ids[i, j]) for j in range(ids.shape[1])}} for i in range(n)]


async def _load(url: str, rows: list[dict], n: int, concurrency: int, seconds: float) -> dict:
    import aiohttp

    bodies = [json.dumps({"instances": rows[i:i + n]}).encode() for i in range(0, len(rows) - n + 1, n)]
    latencies, errors = [], 0
    headers = {"content-type": "application/json"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        async with session.post(f"{url}/v1/predict", data=bodies[0], headers=headers) as r:
            await r.read()
        stop = time.perf_counter() + seconds

        async def one_client(k: int) -> None:
            nonlocal errors
            i = k
            while time.perf_counter() < stop:
                start = time.perf_counter()
                async with session.post(f"{url}/v1/predict", data=bodies[i % len(bodies)], headers=headers) as r:
                    await r.read()
                    errors += r.status != 200
                latencies.append(time.perf_counter() - start)
                i += concurrency

        began = time.perf_counter()
        await asyncio.gather(*(one_client(k) for k in range(concurrency)))
        elapsed = time.perf_counter() - began
    ms = np.array(latencies) * 1e3
    return {"requests": len(latencies), "errors": errors, "qps": len(latencies) / elapsed,
            "instances_per_s": len(latencies) * n / elapsed, "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)), "mean_ms": float(ms.mean())}


def _start(export_dir: str, batching: bool, max_wait_ms: float, max_batch: int) -> tuple[str, subprocess.Popen]:
    args = [sys.executable, "-m", "het", "serve-model", export_dir, "--bind", "127.0.0.1:0",
            "--max-wait-ms", str(max_wait_ms), "--max-batch", str(max_batch)]
    proc = subprocess.Popen(args + ([] if batching else ["--no-batching"]), stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    line = proc.stdout.readline()
    if "serving" not in line:
        proc.kill()
        raise RuntimeError(f"het serve-model did not start: {line!r}")
    return line.strip().split(" on ")[1].split(" ")[0], proc


def _batch_sizes(url: str) -> dict:
    """The server's histogram of rows per forward pass: their mean."""
    import httpx

    text = httpx.get(f"{url}/metrics").text
    value = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
             if line.startswith(("het_serve_batch_rows_sum", "het_serve_batch_rows_count"))}
    count = value.get("het_serve_batch_rows_count", 0)
    return {"forward_passes": count, "mean_rows": value.get("het_serve_batch_rows_sum", 0) / count if count else 0}


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for batching in (True, False):
        for n in sorted({c["instances"] for c in result["cells"]}):
            cells = sorted((c for c in result["cells"] if c["batching"] == batching and c["instances"] == n),
                           key=lambda c: c["concurrency"])
            label = f"{n} instance{'s' if n > 1 else ''}, batching {'on' if batching else 'off'}"
            style = "-" if batching else "--"
            axes[0].plot([c["concurrency"] for c in cells], [c["qps"] for c in cells], style, marker="o", label=label)
            axes[1].plot([c["concurrency"] for c in cells], [c["p99_ms"] for c in cells], style, marker="o", label=label)
    for ax, title in zip(axes, ("requests/s", "p99 latency (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def add_parser(bsub) -> None:
    """Register ``het bench serve`` on the subparsers of ``het bench``."""
    p = bsub.add_parser("serve", help="het serve-model under load: requests/s and p50/p99 at 1/8/64 clients, "
                                      "1/64 instances, micro-batching on and off")
    p.add_argument("--export", default=None, help="an export to serve (default: train the flags' job and export it)")
    p.add_argument("--train-steps", type=int, default=100, help="steps trained before exporting (without --export)")
    p.add_argument("--seconds", type=float, default=4.0, help="per cell (default: %(default)s)")
    p.add_argument("--max-wait-ms", type=float, default=0.0, help="the server's batching wait (default: %(default)s)")
    p.add_argument("--plot", default=None, help="a PNG of requests/s and p99 by clients")
    add_config_flags(p, exclude=("steps", "checkpoint", "checkpoint_every", "resume", "workers", "export.dir",
                                 "export.every", "export.dtype", "publish.dir", "publish.every", "publish.base_every",
                                 "publish.keep"), fixed={"workers": 1, "eval_samples": 0})
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_main)


def _main(args) -> None:
    from het.bench.predict import an_export

    with an_export(args) as export_dir:
        result = run(export_dir, args.seconds, max_wait_ms=args.max_wait_ms)
    if args.plot:
        plot(result, args.plot)
    if args.json:
        print(json.dumps(result, sort_keys=True))
        return
    print(f"{'batching':>8} {'inst':>5} {'clients':>7} {'req/s':>9} {'inst/s':>10} {'p50 ms':>8} {'p99 ms':>8}")
    for c in sorted(result["cells"], key=lambda c: (not c["batching"], c["instances"], c["concurrency"])):
        print(f"{'on' if c['batching'] else 'off':>8} {c['instances']:>5} {c['concurrency']:>7} {c['qps']:>9,.0f} "
              f"{c['instances_per_s']:>10,.0f} {c['p50_ms']:>8.2f} {c['p99_ms']:>8.2f}")
    print(f"micro-batching's gain at 64 clients of single instances: {result['gain_64_single']:.2f}x; "
          f"p99 at 8 clients of single instances: {result['p99_ms_8_single']:.1f} ms")
