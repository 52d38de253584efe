"""``het bench scale``: throughput against workers and embedding width (the paper's Fig. 9),
measured on this machine and projected to a cluster with a small, stated model.

Measured: samples/s of each mode (``--modes``) at W = 1..4 workers (``--workers``), at the
config's dim, over loopback (``--bandwidth none``) or an emulated network (``1gbit``: network
namespaces and tbf, root; see het.bench.netns); then at each of ``--dims`` at the reference W0
(below). Every process of a run shares this machine's cores: a run whose workers need more
threads than there are cores (W x threads > cores) is CPU-bound here and is marked so.

The projection model (also in the JSON, ``model.formula``)::

    From the runs of a mode at the reference W0 (by default the largest measured W that is not
    CPU-bound) and dim d, each quantity below is a line a + b d, least squares through the dims
    measured at W0, with b >= 0 (a cost that seems to fall as rows widen is noise: then b = 0,
    a = the mean; a constant if one dim was measured), and at least 0 wherever it is used:
      t_c   compute seconds per worker-step = wall_s * time_split.compute / steps
      b_ps  bytes per worker-step on the PS link = sparse_bytes_per_sample * batch
            (+ in mode ps the dense table's pull and push, 2 R (4 * 256 + 12), R = ceil(P / 256))
      o_ps  PS seconds per step the link does not explain = wait_ps per step - wire_ps(W0)
      o_ar  AllReduce seconds per step the link does not explain, per unit of ring(W):
            (allreduce per step - wire_ar(W0)) / ring(W0)   (0 when W0 = 1: nothing measured)
    and P(d), the dense parameters (4 bytes each), is counted on the model. At W workers, S
    shards and a link of B bytes/s each way (B = inf for none):
      wire_ps(W) = max(b_ps / B, W b_ps / (S B))   # a worker's own link, or the shards' links
      ring(W)    = 2 (W - 1) / W
      wire_ar(W) = ring(W) 4 P / B                 # ring AllReduce; modes het and hybrid only
      t(W)       = t_c + o_ps + ring(W) o_ar + wire_ps(W) + wire_ar(W)
      samples/s  = W batch / t(W)

Assumptions, to read the projection by: one worker per machine, so t_c stays what it was at W0
(no CPU contention, same batch); the bytes per sample stay those of W0 (in mode het more writers
make more stale refreshes, so b_ps grows somewhat with W: the projection is optimistic there);
the shards' links are the shared bottleneck and a shard's CPU is not (o_ps stays constant);
nothing overlaps (het's prefetch hides part of wire_ps behind t_c: pessimistic there); no
latency term. With B = inf the projection is nearly linear in W by construction (only the
AllReduce overhead grows, by ring(W) < 2): it says only what the measured per-step costs allow.

The check (``check`` in the JSON) compares the model with every measured W at the config's dim.
Here W worker processes of ``threads`` threads share ``cores`` cores, so the CPU terms are
stretched by the contention factor c(W) = max(1, W threads / cores):
predicted t = c(W) (t_c + o_ps + ring(W) o_ar) + wire_ps(W) + wire_ar(W). The shards' processes
are not counted: in modes het and hybrid they idle most of a step, but in mode ps the shard
serves the whole dense model every step and competes for the cores, so its check is rougher.
At W0 over loopback the check is exact by construction whenever the fitted lines pass through
the measured point (one or two dims, costs rising with the dim); the other points test the model.
"""

from __future__ import annotations

import dataclasses
import math
import os
import secrets
import tempfile
import textwrap

from het.bench.e2e import parse_mode
from het.dist.dense import ps_dense_bytes
from het.dist.launch import threads_per_process
from het.train.config import TrainConfig
from het.train.flags import add_config_flags, config_from_args
from het.train.tasks import dense_params

DEFAULTS = {"workers": "1,2,3,4", "modes": "het:100,hybrid,ps", "dims": "128,512",
            "project_workers": "1,2,4,8,16,32", "project_dims": "128,256,512,1024,2048,4096",
            "project_bandwidths": "none,10gbit,1gbit"}
FORMULA = textwrap.dedent((__doc__ or "::\n\n(see het/bench/scale.py)").split("::\n\n")[1]
                          .split("\n\nAssumptions")[0]).strip()
ASSUMPTIONS = [
    "one worker per machine: per-worker compute t_c stays as measured at W0",
    "bytes per sample stay as measured at W0 (het: more workers make more stale refreshes; optimistic)",
    "the shards' links are the shared bottleneck, a shard's CPU is not (o_ps constant in W)",
    "no overlap of communication and compute (het prefetches its sync; pessimistic)",
    "no latency term; B is the bandwidth of every link, each way",
    "quantities at other dims: rising lines through the dims measured at W0, at least 0; P(d) counted on the model",
]
FIELDS = ("t_compute_s", "ps_bytes_per_worker_step", "ps_overhead_s", "allreduce_overhead_s_per_ring")


def parse_ints(text: str, what: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]``: positive integers, at least one.

    Example:
        >>> parse_ints("1,2,4", "--workers")
        [1, 2, 4]
    """
    parts = [p.strip() for p in str(text).split(",")]
    if not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"{what} expects comma-separated positive integers, e.g. 1,2,4, got {text!r}")
    return [int(p) for p in parts]


def link_rate(bandwidth: str) -> float:
    """Bytes/s of a link: ``"none"`` -> inf, else tc's rate (``"1gbit"`` -> 1.25e8)."""
    from het.bench.netns import parse_rate

    return math.inf if str(bandwidth).lower() == "none" else parse_rate(bandwidth)


def ring(workers: int) -> float:
    """The share of the dense gradient a worker sends in a ring AllReduce: 2 (W - 1) / W."""
    return 2 * (workers - 1) / workers


def contention(workers: int, servers: int, cores: int) -> float:
    """How much this machine stretches each worker's CPU time: max(1, W threads / cores)."""
    return max(1.0, workers * threads_per_process(workers + servers, cores) / cores)


def fit_line(xs: list[float], ys: list[float]) -> dict:
    """Least-squares ``{"a", "b"}`` of ``y = a + b x``; with one distinct x, ``b = 0``.

    Example:
        >>> fit_line([128, 512], [1.0, 2.0])
        {'a': 0.6666666666666667, 'b': 0.0026041666666666665}
    """
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return {"a": my - b * mx, "b": b}


def fit_rising(xs: list[float], ys: list[float]) -> dict:
    """:func:`fit_line` with a slope >= 0: a falling fit is taken for noise, and is the mean.

    Example:
        >>> fit_rising([128, 512], [2.0, 1.0])
        {'a': 1.5, 'b': 0.0}
    """
    line = fit_line(xs, ys)
    return line if line["b"] >= 0 else {"a": sum(ys) / len(ys), "b": 0.0}


def at(line: dict, x: float) -> float:
    """The line at ``x``, at least 0 (below the dims measured, a rising line can cross 0)."""
    return max(0.0, line["a"] + line["b"] * x)


def wire(mode: str, workers: int, servers: int, rate: float, ps_bytes: float, params: int) -> tuple[float, float]:
    """Seconds per step on the PS links and in the AllReduce: ``(wire_ps, wire_ar)``."""
    wire_ps = max(ps_bytes / rate, workers * ps_bytes / (servers * rate))
    wire_ar = 0.0 if mode == "ps" else ring(workers) * 4 * params / rate
    return wire_ps, wire_ar


def measured_point(run: dict, rate: float, servers: int, params: int) -> dict:
    """One run's per-step quantities of the model: t_c, b_ps, o_ps, o_ar (see the module)."""
    mode, workers, steps, split = run["mode"].split(":")[0], run["workers"], run["steps"], run["time_split"]
    step_s = run["wall_s"] / steps
    ps_bytes = run["sparse_bytes_per_sample"] * run["batch"] + (ps_dense_bytes(params) if mode == "ps" else 0)
    wire_ps, wire_ar = wire(mode, workers, servers, rate, ps_bytes, params)
    return {"t_compute_s": split["compute"] * step_s, "ps_bytes_per_worker_step": ps_bytes,
            "ps_overhead_s": max(0.0, split["wait_ps"] * step_s - wire_ps),
            "allreduce_overhead_s_per_ring": (max(0.0, split["allreduce"] * step_s - wire_ar) / ring(workers)
                                              if workers > 1 else 0.0)}


def mode_params(runs: list[dict], rate: float, servers: int, dense: dict[int, int]) -> dict:
    """The model's parameters of one mode from its runs at W0 (one per dim): a line per quantity."""
    points = [(r["dim"], measured_point(r, rate, servers, dense[r["dim"]])) for r in runs]
    dims = [d for d, _ in points]
    return {"reference_workers": runs[0]["workers"], "servers": servers, "batch": runs[0]["batch"],
            "dims_measured": sorted(dims), **{f: fit_rising(dims, [p[f] for _, p in points]) for f in FIELDS}}


def predict(mode: str, params: dict, workers: int, dim: int, rate: float, dense_params: int,
            stretch: float = 1.0) -> dict:
    """The model's step at ``workers`` and ``dim`` on links of ``rate`` bytes/s; ``stretch``
    multiplies the CPU terms (the contention factor of a check on this machine)."""
    t_c, o_ps = at(params["t_compute_s"], dim), at(params["ps_overhead_s"], dim)
    o_ar = ring(workers) * at(params["allreduce_overhead_s_per_ring"], dim) if mode != "ps" else 0.0
    wire_ps, wire_ar = wire(mode, workers, params["servers"], rate, at(params["ps_bytes_per_worker_step"], dim),
                            dense_params)
    step_s = max(stretch * (t_c + o_ps + o_ar) + wire_ps + wire_ar, 1e-12)  # 0 only if every fit hit 0
    return {"compute_s": stretch * t_c, "ps_s": stretch * o_ps + wire_ps, "allreduce_s": stretch * o_ar + wire_ar,
            "step_s": step_s, "samples_per_s": workers * params["batch"] / step_s}


def run(base: TrainConfig, workers: list[int], modes: list[str], bandwidth: str = "none",
        dims: list[int] = (128, 512), project_workers: list[int] = (1, 2, 4, 8, 16, 32),
        project_dims: list[int] = (128, 256, 512, 1024, 2048, 4096),
        project_bandwidths: list[str] = ("none", "10gbit", "1gbit"), dim_workers: int = 8,
        reference_workers: int | None = None, log_dir: str | None = None, progress: bool = False) -> dict:
    """Measure ``modes`` at each of ``workers`` (dim ``base.dim``) and at each of ``dims`` (at
    W0 = ``reference_workers``, by default the largest of ``workers`` not CPU-bound here), fit
    the model, check it against the measured points, and project.

    Returns:
        ``{"bench": "scale", "cores", "threads", "note", "bandwidth", "config", "log_dir",
        "model": {"formula", "assumptions", "params": {mode: {...}}}, "measured": [...],
        "check": [...], "projected": [...]}``: see the module's docstring for the model;
        ``projected`` holds ``sweep: "workers"`` entries (dim ``base.dim``) and ``sweep: "dim"``
        entries (at ``dim_workers`` workers).
    """
    if not workers or not modes or not dims:
        raise ValueError(f"expected at least one worker count, mode and dim, got {workers}, {modes}, {dims}")
    if base.is_graph:
        raise ValueError(f"het bench scale measures a CTR job, got model {base.model!r}")
    rate = link_rate(bandwidth)
    for b in project_bandwidths:
        link_rate(b)  # a bad rate fails now, not after an hour of measuring
    parsed = {text: parse_mode(text) for text in modes}
    cores = os.cpu_count() or 1
    servers = base.servers
    bound = {w: contention(w, servers, cores) > 1 for w in workers}
    w0 = reference_workers or max((w for w in workers if not bound[w]), default=min(workers))
    if w0 not in workers:
        raise ValueError(f"reference_workers must be one of the measured worker counts {workers}, got {w0}")
    log_dir = log_dir or tempfile.mkdtemp(prefix="het-scale-")
    measured = {}
    jobs = [(t, w, base.dim) for t in modes for w in workers]
    jobs += [(t, w0, d) for t in modes for d in dims if d != base.dim]
    for text, w, d in jobs:
        mode, staleness = parsed[text]
        cfg = dataclasses.replace(base, mode=mode, staleness=staleness, workers=w, dim=d)
        summary = _measure(cfg, bandwidth, os.path.join(log_dir, f"{text.replace(':', '-')}-w{w}-d{d}"), progress)
        measured[text, w, d] = _measured_entry(summary, text, bandwidth, cores, bound.get(w, True))
    dense = {d: dense_params(dataclasses.replace(base, dim=d)) for d in sorted({base.dim, *dims, *project_dims})}
    params = {text: mode_params([m for (t, w, _), m in measured.items() if t == text and w == w0], rate, servers,
                                dense) for text in modes}
    check = [_check(m, parsed[m["mode"]][0], params[m["mode"]], rate, dense, servers, cores, w0)
             for (t, w, d), m in measured.items() if d == base.dim]
    projected = [{"sweep": "workers", "mode": text, "workers": w, "dim": base.dim, "bandwidth": b,
                  "dense_params": dense[base.dim],
                  **predict(parsed[text][0], params[text], w, base.dim, link_rate(b), dense[base.dim])}
                 for text in modes for b in project_bandwidths for w in project_workers]
    projected += [{"sweep": "dim", "mode": text, "workers": dim_workers, "dim": d, "bandwidth": b,
                   "dense_params": dense[d], **predict(parsed[text][0], params[text], dim_workers, d, link_rate(b),
                                                       dense[d])}
                  for text in modes for b in project_bandwidths for d in project_dims]
    return {"bench": "scale", "cores": cores, "reference_workers": w0,
            "threads": {w: threads_per_process(w + servers, cores) for w in workers},
            "note": f"{cores} cores: runs with workers x threads > cores ({cores}) share the CPUs "
                    f"(cpu_bound: true); their samples/s measure this machine, not the system",
            "bandwidth": bandwidth, "config": base.to_dict(), "log_dir": log_dir,
            "model": {"formula": FORMULA, "assumptions": ASSUMPTIONS, "params": params},
            "measured": list(measured.values()), "check": check, "projected": projected}


def _measure(cfg: TrainConfig, bandwidth: str, run_dir: str, progress: bool) -> dict:
    """One local-cluster run: over loopback, or inside an emulated network at ``bandwidth``."""
    from het.train.local import run_local

    if bandwidth == "none":
        return run_local(cfg, run_dir, progress=progress)
    from het.bench.netns import EmulatedNetwork

    hosts = [f"ps{i}" for i in range(cfg.servers)] + [f"worker{r}" for r in range(cfg.workers)]
    with EmulatedNetwork(hosts, bandwidth=bandwidth) as net:
        return run_local(cfg, run_dir, secrets.token_hex(16).encode(), progress=progress, network=net)


def _measured_entry(summary: dict, text: str, bandwidth: str, cores: int, cpu_bound: bool) -> dict:
    samples = summary["samples"] or 1
    return {"mode": text, "workers": summary["workers"], "dim": summary["dim"], "bandwidth": bandwidth,
            "samples_per_s": summary["samples_per_s"], "wall_s": summary["wall_s"], "steps": summary["steps"],
            "batch": summary["batch"], "time_split": summary["time_split"], "hit_rate": summary["hit_rate"],
            "sparse_bytes_per_sample": summary["sparse_bytes_per_sample"],
            "dense_bytes_per_sample": summary["bytes"]["dense"] / samples,
            "threads": threads_per_process(summary["workers"] + summary["servers"], cores), "cpu_bound": cpu_bound}


def _check(m: dict, mode: str, params: dict, rate: float, dense: dict, servers: int, cores: int, w0: int) -> dict:
    w, d = m["workers"], m["dim"]
    stretch = contention(w, servers, cores)
    predicted = predict(mode, params, w, d, rate, dense[d], stretch)["samples_per_s"]
    plain = predict(mode, params, w, d, rate, dense[d])["samples_per_s"]
    return {"mode": m["mode"], "workers": w, "dim": d, "measured_samples_per_s": m["samples_per_s"],
            "predicted_samples_per_s": predicted, "predicted_uncontended_samples_per_s": plain,
            "rel_error": (predicted - m["samples_per_s"]) / m["samples_per_s"], "contention": stretch,
            "cpu_bound": m["cpu_bound"], "reference": w == w0}


def format_report(result: dict) -> str:
    """The measured points, the check and the projections as readable tables."""
    lines = [f"het bench scale: {result['note']}; reference W0 = {result['reference_workers']}; "
             f"measured at bandwidth {result['bandwidth']}; logs in {result['log_dir']}",
             "", "measured", f"{'mode':>9} {'W':>3} {'dim':>5} {'samples/s':>10} {'sparse B/sample':>15} "
             f"{'compute/ps/allreduce':>21} {'cpu-bound':>9}"]
    for m in result["measured"]:
        t = m["time_split"]
        split = f"{t['compute']:.0%}/{t['wait_ps']:.0%}/{t['allreduce']:.0%}"
        lines.append(f"{m['mode']:>9} {m['workers']:>3} {m['dim']:>5} {m['samples_per_s']:>10,.0f} "
                     f"{m['sparse_bytes_per_sample']:>15,.0f} {split:>21} {'yes' if m['cpu_bound'] else '':>9}")
    lines += ["", "check: the model at the measured points (CPU terms x contention on this machine)",
              f"{'mode':>9} {'W':>3} {'measured':>10} {'predicted':>10} {'error':>7} {'contention':>10}"]
    for c in result["check"]:
        lines.append(f"{c['mode']:>9} {c['workers']:>3} {c['measured_samples_per_s']:>10,.0f} "
                     f"{c['predicted_samples_per_s']:>10,.0f} {c['rel_error']:>+7.1%} {c['contention']:>10.2f}"
                     + ("  (W0: fitted here)" if c["reference"] else ""))
    for sweep, key, title in (("workers", "workers", "projected samples/s by workers (dim {dim})"),
                              ("dim", "dim", "projected samples/s by embedding dim ({workers} workers)")):
        rows = [p for p in result["projected"] if p["sweep"] == sweep]
        if not rows:
            continue
        xs = sorted({p[key] for p in rows})
        lines += ["", title.format(**rows[0]), f"{'mode':>9} {'link':>7} " + " ".join(f"{x:>9}" for x in xs)]
        for mode, bw in dict.fromkeys((p["mode"], p["bandwidth"]) for p in rows):
            by = {p[key]: p["samples_per_s"] for p in rows if (p["mode"], p["bandwidth"]) == (mode, bw)}
            lines.append(f"{mode:>9} {bw:>7} " + " ".join(f"{by[x]:>9,.0f}" for x in xs))
    return "\n".join(lines + ["", "model:", result["model"]["formula"]])


def add_parser(bsub) -> None:
    """Register ``het bench scale`` on the subparsers of ``het bench``."""
    p = bsub.add_parser("scale", help="samples/s by workers and by embedding dim, measured and projected (Fig. 9)",
                        description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--workers", default=DEFAULTS["workers"], help="worker counts to measure (default %(default)s)")
    p.add_argument("--modes", default=DEFAULTS["modes"], help="ps, hybrid, het:S (default %(default)s)")
    p.add_argument("--bandwidth", default="none", help="none (loopback, no namespaces) or a tc rate such as "
                   "1gbit (emulated network, needs root); default %(default)s")
    p.add_argument("--dims", default=DEFAULTS["dims"], help="embedding dims measured at W0 (default %(default)s)")
    p.add_argument("--project-workers", default=DEFAULTS["project_workers"], help="default %(default)s")
    p.add_argument("--project-dims", default=DEFAULTS["project_dims"], help="default %(default)s")
    p.add_argument("--project-bandwidths", default=DEFAULTS["project_bandwidths"],
                   help="links of the projection, none or tc rates (default %(default)s)")
    p.add_argument("--dim-workers", type=int, default=8, help="workers of the dim projection (default 8, the paper's)")
    p.add_argument("--reference-workers", type=int, help="W0, the measured W the model is fitted at (default: "
                   "the largest of --workers that is not CPU-bound here)")
    p.add_argument("--log-dir", help="where each run's logs go (default: a new temporary directory)")
    p.add_argument("--json", action="store_true", help="the last line of stdout is the result as JSON")
    add_config_flags(p, exclude=("mode", "staleness", "workers"), defaults={"steps": 200}, fixed={"eval_samples": 0})
    p.set_defaults(func=_main)


def _main(args) -> None:
    import json

    from het.dist.launch import ClusterError
    from het.bench.netns import NetworkEmulationUnavailable

    lists = {k: parse_ints(getattr(args, k), "--" + k.replace("_", "-"))
             for k in ("workers", "dims", "project_workers", "project_dims")}
    modes = args.modes.split(",")
    for text in modes:
        parse_mode(text)
    base = config_from_args(args)
    try:
        result = run(base, lists["workers"], modes, args.bandwidth, lists["dims"], lists["project_workers"],
                     lists["project_dims"], args.project_bandwidths.split(","), args.dim_workers,
                     args.reference_workers, args.log_dir)
    except NetworkEmulationUnavailable as e:
        raise SystemExit(f"het bench scale: cannot emulate a cluster network here: {e}") from None
    except ClusterError as e:
        raise SystemExit(f"het bench scale: {e}") from None
    if args.json:
        print(json.dumps(result, sort_keys=True, default=str))
    else:
        print(format_report(result))
