"""`het bench freshness`: how fresh a served model stays while training runs, and what it costs.

A training job (any ``het train`` flags; a local cluster) publishes every ``--publish-every``
seconds (``--publish DIR``, :mod:`het.train.publish`) and evaluates itself every
``--eval-curve`` steps; a server follows it (``het serve-model --follow DIR``). Meanwhile this
process samples the server's own lag gauge (``het_serve_update_lag_seconds``) twice a second,
and at every version the server reaches scores the held-out samples with a replica of it (the
same base and deltas applied here: the same rows and weights, so the same scores, checked over
HTTP at the end). It reports:

- the lag: p50, p99 and the largest of the gauge's samples;
- the follower's AUC at each version against the trainer's at the same step (its curve
  interpolated), and against the first base's;
- at the end, the follower's scores against ``het export`` of the job's final checkpoint;
- bytes per delta against the rows it carried (and the dense weights' share), beside the bytes
  the job's pushes took over the same time (what a write-ahead log would hold instead); the
  publish directory's largest size sampled against one base's.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from het.train.flags import add_config_flags, overrides


def run(train_args: list[str], steps: int, publish_every: float, eval_every: int, samples: int, work: str) -> dict:
    """Train ``steps`` steps with ``train_args``, publishing and followed; see the module."""
    pub, ck = os.path.join(work, "pub"), os.path.join(work, "ck")
    job = subprocess.Popen([sys.executable, "-m", "het", "train", *train_args, "--steps", str(steps),
                            "--publish", pub, "--publish-every", str(publish_every), "--eval-curve", str(eval_every),
                            "--eval-samples", str(samples), "--checkpoint", ck, "--checkpoint-every", str(steps),
                            "--json", "--quiet", "--log-dir", os.path.join(work, "logs")],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    server = watcher = None
    disk, stop = [], threading.Event()
    sampler = threading.Thread(target=_sample_disk, args=(pub, disk, stop), daemon=True)
    sampler.start()
    try:
        _wait_for(lambda: _has_base(pub), 300, "the job's first base")
        server = _serve(pub)
        watcher = _Watcher(server[0], pub, samples).start()
        out, err = job.communicate()
        if job.returncode != 0:
            raise RuntimeError(f"het train failed: {err.strip().splitlines()[-1] if err.strip() else job.returncode}")
        summary = json.loads(out.strip().splitlines()[-1])
        _wait_for(lambda: watcher.version >= summary["published"]["version"], 120, "the follower's last version")
        watcher.stop()
        stop.set()
        return _report(summary, watcher, disk, pub, ck, work, server[0], samples)
    finally:
        stop.set()
        if watcher is not None:
            watcher.stop()
        for proc in (job, server[1] if server else None):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(60)


class _Watcher:
    """Samples the server's lag gauge; scores each new version with a replica follower."""

    def __init__(self, url: str, pub: str, samples: int):
        from het.online.follow import Follower, newest_base
        from het.online.live import Live

        self.url, self.samples, self.pub = url, samples, pub
        self.live = Live(newest_base(pub))
        self.replica = Follower(self.live, pub)
        self.lags, self.points = [], []
        self.version = -1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._data = _held_out(self.live.current.model, samples)

    def start(self) -> _Watcher:
        self._score()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _loop(self) -> None:
        import httpx

        while not self._stop.is_set():
            try:
                metrics = httpx.get(f"{self.url}/metrics", timeout=10).text
                version = int(float(_gauge(metrics, "het_serve_model_version")))
                self.lags.append((time.time(), _gauge(metrics, "het_serve_update_lag_seconds"), version))
                if version > self.version:
                    self.replica.poll()
                    self._score()
            except (httpx.HTTPError, ValueError):
                pass
            self._stop.wait(0.5)

    def _score(self) -> None:
        from sklearn.metrics import roc_auc_score

        v = self.live.current
        dense, keys, labels = self._data
        scores = v.model(dense, keys).numpy()
        step = _step_of(self.replica, v.number)
        self.points.append({"version": v.number, "step": step, "auc": float(roc_auc_score(labels, scores)),
                            "trained_at": v.trained_at})
        self.version = v.number


def _held_out(model, samples: int):
    import torch

    from het.export.batches import open_source
    from het.export.chunk import Skipped

    spec = model.manifest["input"]
    chunks, _, _ = open_source(spec["preset"], model.inputs, model.manifest, "test", samples, 8192, Skipped())
    parts = list(chunks)
    return (torch.from_numpy(np.concatenate([c.dense for c in parts])),
            torch.from_numpy(np.concatenate([c.keys for c in parts])), np.concatenate([c.labels for c in parts]))


def _step_of(follower, version: int) -> int | None:
    from het import arrayfile
    from het.online.follow import delta_path

    path = delta_path(follower.directory, version)
    if not os.path.exists(path):
        return None
    return int(arrayfile.read(path)[0]["step"])


def _report(summary: dict, watcher: _Watcher, disk: list, pub: str, ck: str, work: str, url: str, samples: int) -> dict:
    import httpx

    from het.export import load_model
    from het.export.writer import export

    lags = np.array([lag for _, lag, _ in watcher.lags])
    curve = sorted(summary.get("curve", []), key=lambda p: p["step"])
    steps, aucs = np.array([p["step"] for p in curve]), np.array([p["auc"] for p in curve])
    points = [dict(p, trainer_auc=float(np.interp(p["step"], steps, aucs)) if p["step"] is not None and len(steps)
                   else None) for p in watcher.points]
    gaps = [abs(p["auc"] - p["trainer_auc"]) for p in points if p["trainer_auc"] is not None]
    export(ck, os.path.join(work, "final"))
    final = load_model(os.path.join(work, "final"))
    dense, keys, _ = watcher._data
    replica = watcher.live.current.model(dense, keys).numpy()
    ref = final(dense, keys).numpy()
    served = np.array(httpx.post(f"{url}/v1/predict", json={"instances": _instances(final, 256)}).json()["predictions"])
    expected = final.predict(_columns(_instances(final, 256)))
    deltas = _delta_sizes(summary["published"])
    wall = summary["wall_s"]
    return {"steps": summary["steps"], "wall_s": wall, "samples_per_s": summary["samples_per_s"],
            "trainer_auc": summary["auc"], "published": summary["published"],
            "lag_s": {"p50": float(np.percentile(lags, 50)), "p99": float(np.percentile(lags, 99)),
                      "max": float(lags.max()), "samples": len(lags)},
            "versions": points, "max_auc_gap": max(gaps, default=None),
            "first_auc": points[0]["auc"], "last_auc": points[-1]["auc"],
            "final_max_abs_difference": float(np.abs(replica - ref).max()),
            "served_max_abs_difference": float(np.abs(served - expected).max()),
            "deltas": deltas, "disk": _disk(disk, pub),
            "push_bytes_per_delta": summary["bytes"]["sparse_push"] / max(1, summary["published"]["deltas"]),
            "lag_series": [(round(t - watcher.lags[0][0], 2), round(lag, 3)) for t, lag, _ in watcher.lags]}


def _sample_disk(pub: str, samples: list, stop: threading.Event) -> None:
    """The publish directory's bytes every 0.2 s, each sample marked when taken at the start (the
    first base's snapshot of rows and optimizer state there, while it is exported)."""
    from het.train.published import bytes_under

    while not stop.wait(0.2):
        try:
            names = os.listdir(pub)
            samples.append((bytes_under(pub), any(n.startswith(".snapshot-") for n in names)))
        except OSError:  # not there yet, or a file pruned while it was counted
            continue


def _disk(samples: list[tuple[int, bool]], pub: str) -> dict:
    """The publish directory's largest size sampled, against its newest base's bytes: once the
    first base is written, and at the start (its snapshot of rows and optimizer state there)."""
    from het.train.published import base_name, bytes_under, listing

    bases = listing(pub)[0]
    base = bytes_under(os.path.join(pub, base_name(bases[-1]))) if bases else 0
    most = max((b for b, start in samples if not start), default=0)
    first = max((b for b, start in samples if start), default=0)
    return {"max_bytes": most, "base_bytes": base, "max_over_base": most / base if base else None,
            "start_max_bytes": first, "start_max_over_base": first / base if base else None}


def _delta_sizes(published: dict) -> dict:
    """The deltas the job wrote (most are gone by the end, covered by a later base): their
    count, mean bytes and rows, and bytes a row."""
    count = published["deltas"]
    if not count:
        return {"count": 0}
    return {"count": count, "bytes_mean": published["delta_bytes"] / count,
            "rows_mean": published["delta_rows"] / count,
            "bytes_per_row": published["delta_bytes"] / max(1, published["delta_rows"])}


def _instances(model, n: int) -> list[dict]:
    from het.bench.serve import _instances as instances

    return instances(model, n)


def _columns(rows: list[dict]) -> dict:
    return {k: [r[k] for r in rows] for k in rows[0]}


def _gauge(metrics: str, name: str) -> float:
    for line in metrics.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise ValueError(f"no {name} in the server's metrics")


def _has_base(pub: str) -> bool:
    from het.online.follow import scan

    return bool(scan(pub)[0])


def _serve(pub: str) -> tuple[str, subprocess.Popen]:
    proc = subprocess.Popen([sys.executable, "-m", "het", "serve-model", "--follow", pub, "--poll-s", "0.5",
                             "--bind", "127.0.0.1:0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    line = proc.stdout.readline()
    if "serving" not in line:
        raise RuntimeError(f"het serve-model --follow did not start: {line!r}")
    return line.strip().split(" on ")[1].split(" ")[0], proc


def _wait_for(done, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout_s:.0f} s for {what}")
        time.sleep(0.5)


def add_parser(bsub) -> None:
    """Register ``het bench freshness`` on the subparsers of ``het bench``."""
    p = bsub.add_parser("freshness", help="a job publishing every S seconds and a server following it: lag, AUC "
                                          "by version against the trainer's, bytes per delta")
    p.add_argument("--train-steps", type=int, default=6000, help="the job's steps (default: %(default)s)")
    p.add_argument("--publish-every", type=float, default=10.0, help="seconds between deltas (default: %(default)s)")
    p.add_argument("--curve-every", type=int, default=500, help="the trainer evaluates every N steps (its curve)")
    p.add_argument("--samples", type=int, default=20000, help="held-out samples scored at each version")
    p.add_argument("--plot", default=None, help="a PNG of AUC by step and of the lag over time")
    add_config_flags(p, exclude=("steps", "checkpoint", "checkpoint_every", "resume", "eval_curve", "eval_samples",
                                 "export.dir", "export.every", "export.dtype", "publish.dir", "publish.every"))
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_main)


def _main(args) -> None:
    flags = []
    for key, value in overrides(args).items():
        flags += [f"--{key.replace('.', '-').replace('_', '-')}", str(value)]
    work = tempfile.mkdtemp(prefix="het-bench-freshness-")
    try:
        result = run(flags, args.train_steps, args.publish_every, args.curve_every, args.samples, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.plot:
        _plot(result, args.plot)
    if args.json:
        print(json.dumps(result, sort_keys=True))
        return
    lag = result["lag_s"]
    print(f"{result['steps']} steps in {result['wall_s']:.0f} s; lag p50 {lag['p50']:.1f} s, p99 {lag['p99']:.1f} s, "
          f"max {lag['max']:.1f} s; AUC gap to the trainer at most {result['max_auc_gap']:.4f}; first "
          f"{result['first_auc']:.4f} -> last {result['last_auc']:.4f}; final scores against het export: "
          f"{result['final_max_abs_difference']:.2g}; {result['deltas']['bytes_mean'] / 1e6:.1f} MB a delta for "
          f"{result['deltas']['rows_mean']:,.0f} rows; the directory at most {result['disk']['max_over_base'] or 0:.2f}x "
          f"a base ({result['disk']['start_max_over_base'] or 0:.2f}x at the start)")


def _plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    pts = [p for p in result["versions"] if p["step"] is not None]
    a.plot([p["step"] for p in pts], [p["trainer_auc"] for p in pts], "-", label="trainer (its curve)")
    a.plot([p["step"] for p in pts], [p["auc"] for p in pts], "o", label="follower, at each version")
    a.set_xlabel("step")
    a.set_ylabel("held-out AUC")
    a.legend()
    a.grid(alpha=0.3)
    b.plot([t for t, _ in result["lag_series"]], [lag for _, lag in result["lag_series"]], "-")
    b.set_title(f"the server's lag gauge (p99 {result['lag_s']['p99']:.1f} s)")
    b.set_xlabel("seconds")
    b.set_ylabel("lag (s)")
    b.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
