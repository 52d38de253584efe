"""``het bench landing``: from a partition landing to the served model that has trained on it.

A writer lands a partition of drifting synthetic Criteo every ``--every`` seconds (as ``het data
stream-synthetic`` does: a prepared directory, then its ``_SUCCESS``); ``het train --stream``
trains on them as they land and publishes (``--publish``, at the default interval unless
``--publish-every`` says otherwise); ``het serve-model --follow`` serves what it publishes. This
process notes when each partition landed (its marker written) and, from the server's own
``het_serve_model_version`` gauge sampled every ``--sample-s`` seconds, when each version began to
answer. A version's manifest says how many of the stream's rows it holds (``stream_rows``); a
partition is served once a version holding its last row answers. Its landing-to-served time is
the difference: the data's age when served scores first carry it, which is what a follower of
the stream sees (Monolith's sync interval). The percentiles are over the partitions that land
once the server answers; those before it wait for the job's start (``before_serving_s``).

It also checks that the served model moved with the data: the server's scores of a fixed probe (256
rows read as the first base's input) change from the first version to the last.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np


def run(partitions: int, every_s: float, rows: int, drift: float, extra: list[str], sample_s: float = 0.25,
        publish_every: float | None = None, say=print) -> dict:
    """Land ``partitions`` partitions ``every_s`` apart, trained and served as they come; see the module."""
    from het.bench.freshness import _has_base, _instances, _serve, _wait_for
    from het.data.synthetic import SyntheticCriteo, SyntheticCriteoConfig

    from het.train.sections import PublishConfig

    publish_every = PublishConfig().every if publish_every is None else publish_every  # het train's default
    data = SyntheticCriteo(SyntheticCriteoConfig())
    with tempfile.TemporaryDirectory(prefix="het-bench-landing-") as work:
        parts, pub = os.path.join(work, "parts"), os.path.join(work, "pub")
        os.makedirs(parts)
        landed = [_land(parts, data, 0, rows, drift)]
        idle = 1.5 * every_s + 10  # the job ends once it waited this long for a partition: past the last
        job = subprocess.Popen([sys.executable, "-m", "het", "train", "--stream", os.path.join(parts, "part-*"),
                                "--stream-idle", str(idle), "--publish", pub, "--publish-every",
                                str(publish_every), "--json", "--quiet", "--log-dir",
                                os.path.join(work, "logs"), *extra],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        server, versions, stop = None, {}, threading.Event()
        writer = threading.Thread(target=_land_every, args=(parts, data, partitions, rows, drift, every_s, landed,
                                                            stop), daemon=True)
        try:
            writer.start()
            _wait_for(lambda: _has_base(pub) or job.poll() is not None, 300, "the job's first base")
            if job.poll() is not None:
                raise RuntimeError(f"het train failed: {_last_line(job.stderr.read())}")
            server = _serve(pub)
            watcher = threading.Thread(target=_watch, args=(server[0], pub, versions, sample_s, stop), daemon=True)
            watcher.start()
            from het.online.follow import newest_base

            probe = _instances(newest_base(pub).model, 256)
            first_scores = _scores(server[0], probe)
            say(f"het bench landing: {partitions} partitions of {rows:,} rows, one every {every_s:g} s; serving "
                f"at {server[0]}")
            out, err = job.communicate()
            if job.returncode != 0:
                raise RuntimeError(f"het train failed: {_last_line(err)}")
            summary = json.loads(out.strip().splitlines()[-1])
            last = summary["published"]["version"]
            _wait_for(lambda: max(versions, default=-1) >= last, 120, "the server's last version")
            last_scores = _scores(server[0], probe)
            stop.set()
            return _report(summary, landed, versions, pub, rows, every_s, publish_every, first_scores, last_scores)
        finally:
            stop.set()
            for proc in (job, server[1] if server else None):
                if proc is not None and proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGTERM)
                    proc.wait(60)


def _land(parts: str, data, number: int, rows: int, drift: float) -> float:
    """Write partition ``number`` whole, then its marker; the time it landed."""
    from het.data.stream_synthetic import write_partition

    write_partition(parts, data, number, rows, drift)
    return time.time()


def _land_every(parts, data, partitions, rows, drift, every_s, landed: list, stop: threading.Event) -> None:
    start = time.monotonic()
    for p in range(1, partitions):
        if stop.wait(max(0.0, start + p * every_s - time.monotonic())):
            return
        landed.append(_land(parts, data, p, rows, drift))


def _watch(url: str, pub: str, versions: dict, sample_s: float, stop: threading.Event) -> None:
    """``versions``: each version the server answered with: when it was first seen doing so, and
    the stream rows it holds (read then: a later base prunes it)."""
    import httpx

    from het.bench.freshness import _gauge

    while not stop.is_set():
        try:
            version = int(float(_gauge(httpx.get(f"{url}/metrics", timeout=10).text, "het_serve_model_version")))
            if version not in versions:
                versions[version] = (time.time(), _rows(pub, version))
        except (httpx.HTTPError, ValueError, OSError):
            pass
        stop.wait(sample_s)


def _scores(url: str, instances: list[dict]) -> np.ndarray:
    """The server's scores of ``instances``."""
    import httpx

    reply = httpx.post(f"{url}/v1/predict", json={"instances": instances}, timeout=30)
    reply.raise_for_status()
    return np.asarray(reply.json()["predictions"], np.float64)


def _rows(pub: str, version: int) -> int | None:
    """The stream rows a published version holds (its manifest's ``stream_rows``: a delta's,
    or a base's ``published``); None for a base pruned since (a later version holds more)."""
    from het import arrayfile
    from het.online.follow import base_dir, delta_path

    if os.path.exists(delta_path(pub, version)):
        return int(arrayfile.read(delta_path(pub, version))[0]["stream_rows"])
    manifest = os.path.join(base_dir(pub, version), "export.json")
    if os.path.exists(manifest):
        with open(manifest) as f:
            return int(json.load(f)["manifest"]["published"]["stream_rows"])
    return None


def _report(summary, landed, versions, pub, rows, every_s, publish_every, first_scores, last_scores) -> dict:
    lags = []
    for p, at in enumerate(landed):
        end = (p + 1) * rows  # the partition's last row, plus one
        served = [seen for seen, held in versions.values() if held is not None and held >= end]
        lags.append(min(served) - at if served else float("nan"))
    serving = min(seen for seen, _ in versions.values())  # a partition landed before holds the job's start
    steady = [x for x, at in zip(lags, landed) if at >= serving]
    lag = np.asarray(steady or [float("nan")])
    return {"partitions": len(landed), "rows": rows, "every_s": every_s, "measured": len(steady),
            "publish_every_s": publish_every, "versions": len(versions),
            "landing_to_served_s": {"p50": float(np.nanpercentile(lag, 50)), "p99": float(np.nanpercentile(lag, 99)),
                                    "max": float(np.nanmax(lag)), "never": int(np.isnan(lag).sum())},
            "before_serving_s": [round(x, 2) for x, at in zip(lags, landed) if at < serving],
            "by_partition": [round(x, 2) for x in lags],
            "landed_at_s": [round(t - landed[0], 2) for t in landed],  # since the first landed
            # each version served: since the first landed, and the stream rows it holds
            "served_at_s": {v: [round(versions[v][0] - landed[0], 2), versions[v][1]] for v in sorted(versions)},
            "rows_trained": summary["stream"]["rows_trained"],
            "scores_moved": float(np.abs(last_scores - first_scores).mean()),
            "published": {k: summary["published"][k] for k in ("version", "deltas", "bases", "consistency")}}


def _last_line(err: str) -> str:
    return (err.strip().splitlines() or ["?"])[-1]


def add_parser(bsub) -> None:
    p = bsub.add_parser("landing", help="a stream trained and served as it lands: from a partition landing to the "
                                        "served model holding it")
    p.add_argument("--partitions", type=int, default=12, help="partitions landed (default 12)")
    p.add_argument("--every", type=float, default=20.0, help="seconds between two partitions (default 20)")
    p.add_argument("--rows", type=int, default=50_000, help="rows a partition (default 50,000)")
    p.add_argument("--drift", type=float, default=0.05, help="radians the planted model turns a partition")
    p.add_argument("--sample-s", type=float, default=0.25, help="how often the server's version is read")
    p.add_argument("--publish-every", type=float, default=None, help="het train --publish-every (default: its own)")
    p.add_argument("--het-args", default="", help="more het train flags, e.g. '--workers 1'")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(func=_main)


def _main(args) -> None:
    if args.partitions < 1 or args.rows < 1 or not args.every > 0 or not args.sample_s > 0:
        raise SystemExit(f"het bench landing: expected --partitions >= 1, --rows >= 1, --every > 0 and --sample-s > 0, "
                         f"got {args.partitions}, {args.rows}, {args.every}, {args.sample_s}")
    say = (lambda line: print(line, file=sys.stderr)) if args.json else print
    result = run(args.partitions, args.every, args.rows, args.drift, args.het_args.split(), args.sample_s,
                 args.publish_every, say)
    if args.json:
        print(json.dumps(result))
    else:
        lag = result["landing_to_served_s"]
        print(f"landing to served over {result['measured']} partitions (publish every "
              f"{result['publish_every_s']:g} s): p50 {lag['p50']:.1f} s, p99 {lag['p99']:.1f} s, max {lag['max']:.1f} s"
              f"{'; never served: ' + str(lag['never']) if lag['never'] else ''}")
