"""``het bench tiers``: a job whose shards keep at most a budget of rows in DRAM, the rest on
disk (``het train --shard-memory``), against the same job with every row in DRAM.

Both jobs train on synthetic-criteo-1tb at dim 64 (hashed ids: one dynamic table that grows
with the ids training touches), each ``het train`` a subprocess that stops after its time
limit and samples the shards every 10 s (its summary's ``timeline``): the tiered job with
``--shard-memory BUDGET`` for ``--minutes``, the baseline without it for ``--baseline-minutes``.
Reported, beside each job's figures:

- ``speed_ratio_first_5min``: the tiered job's samples/s over the first ``--baseline-minutes``
  of its timeline over the baseline's over the same window (``window_s``);
- ``touched_over_budget``: the most rows the tiered job's shards held (``peak_rows``) times the
  bytes of a row (``bytes_per_row``: the baseline's ``ps.bytes / ps.rows``, every row in DRAM:
  the row, its optimizer state, index and meta), over the budget of every shard;
- ``max_rss_over_budget_bytes``: the largest shard RSS the tiered job's timeline saw, minus
  the budget (the budget is a shard's).

The plot (``--plot``): samples/s of both jobs, the tiered job's largest shard RSS with the budget
and the budget + 1 GiB, and its rows in memory and on disk, against minutes of training.

Example (the last line of stdout is the JSON object)::

    het bench tiers --minutes 20 --baseline-minutes 5 --shard-memory 2GiB --json
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

from het.config import parse_bytes
from het.process import parent_env

JOB = ("--data", "synthetic-criteo-1tb", "--dim", "64")
STEPS = 10**9  # more than any time limit allows: the limit ends each job
STATS_EVERY_S = 10
FIGURES = ("steps", "samples", "samples_per_s", "wall_s", "auc", "planted_auc", "logloss", "hit_rate",
           "workers", "servers", "stopped_at_step", "ps", "timeline")
GIB = 1 << 30


def job_args(minutes: float, ps_memory: str | None = None, extra: list[str] = ()) -> list[str]:
    """``het train``'s arguments for one job (``extra`` last: its flags win).

    Example:
        >>> " ".join(job_args(20, "2GiB", ["--workers", "1"]))
        'train --data synthetic-criteo-1tb --dim 64 --time-limit 1200 --steps 1000000000 --ps-stats-every 10 --json --quiet --shard-memory 2GiB --workers 1'
    """
    args = ["train", *JOB, "--time-limit", f"{minutes * 60:g}", "--steps", str(STEPS),
            "--ps-stats-every", str(STATS_EVERY_S), "--json", "--quiet"]
    return args + (["--shard-memory", ps_memory] if ps_memory else []) + list(extra)


def run_job(args: list[str], timeout_s: float) -> dict:
    """The summary of ``python -m het ARGS``, its logs in a temporary directory, removed after.
    A job that fails raises RuntimeError with its stderr's last lines, and leaves its logs."""
    log_dir = tempfile.mkdtemp(prefix="het-tiers-")
    with open(os.path.join(log_dir, "stderr.log"), "w+") as err:
        try:
            out = subprocess.run([sys.executable, "-m", "het", *args, "--log-dir", os.path.join(log_dir, "job")],
                                 stdout=subprocess.PIPE, stderr=err, text=True, timeout=timeout_s,
                                 env=parent_env())
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"het {shlex.join(args)} ran past {timeout_s:.0f} s; its logs: {log_dir}") from None
        err.seek(0)
        tail = "\n".join(err.read().strip().splitlines()[-15:])
    if out.returncode != 0:
        raise RuntimeError(f"het {shlex.join(args)} exited {out.returncode}; its logs: {log_dir}\n{tail}")
    shutil.rmtree(log_dir, ignore_errors=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def rate_over(timeline: list[dict], window_s: float) -> float | None:
    """Samples/s over the first ``window_s`` seconds of a timeline: each entry's rate weighted by
    its interval, up to the first entry at or past ``window_s`` (None: no entry).

    Example:
        >>> rate_over([{"t_s": 10, "samples_per_s": 100}, {"t_s": 20, "samples_per_s": 50},
        ...            {"t_s": 30, "samples_per_s": 10}], 20)
        75.0
    """
    samples = seconds = previous = 0.0
    for entry in timeline:
        dt = entry["t_s"] - previous
        samples, seconds, previous = samples + entry["samples_per_s"] * dt, seconds + dt, entry["t_s"]
        if entry["t_s"] >= window_s:
            break
    return samples / seconds if seconds > 0 else None


def compare(tiered: dict, baseline: dict, budget_bytes: int, window_s: float) -> dict:
    """The bench's figures from the two jobs' summaries (see the module's docstring).

    Example:
        >>> line = lambda rate, rows, rss: [{"t_s": 60.0 * i, "samples_per_s": rate, "rows": rows * i,
        ...                                  "rss_bytes": rss} for i in (1, 2)]
        >>> tiered = {"servers": 1, "timeline": line(50, 300, 3 * GIB), "ps": {"rows": 600}}
        >>> baseline = {"timeline": line(100, 500, GIB), "ps": {"rows": 1000, "bytes": 100_000}}
        >>> c = compare(tiered, baseline, budget_bytes=20_000, window_s=120)
        >>> c["speed_ratio_first_5min"], c["peak_rows"], c["bytes_per_row"], c["touched_over_budget"]
        (0.5, 600, 100.0, 3.0)
        >>> c["max_rss_over_budget_bytes"] == 3 * GIB - 20_000
        True
    """
    t_rate, b_rate = rate_over(tiered["timeline"], window_s), rate_over(baseline["timeline"], window_s)
    rows = [e["rows"] for e in tiered["timeline"]] + [tiered["ps"]["rows"]]
    base = baseline["ps"]
    if base.get("rows"):
        per_row, source = base["bytes"] / base["rows"], "the baseline's ps.bytes / ps.rows (every row in DRAM)"
    else:
        ps = tiered["ps"]
        per_row = (ps.get("bytes", 0) + ps.get("disk_bytes", 0)) / max(ps["rows"], 1)
        source = "the tiered job's (ps.bytes + ps.disk_bytes) / ps.rows"
    budget = budget_bytes * tiered.get("servers", 1)
    rss = max((e["rss_bytes"] for e in tiered["timeline"]), default=0)
    return {"window_s": window_s, "tiered_samples_per_s_in_window": t_rate, "baseline_samples_per_s_in_window": b_rate,
            "speed_ratio_first_5min": t_rate / b_rate if t_rate is not None and b_rate else None,
            "peak_rows": max(rows), "bytes_per_row": per_row, "bytes_per_row_from": source,
            "touched_bytes": max(rows) * per_row, "touched_over_budget": max(rows) * per_row / budget,
            "max_sampled_rss_bytes": rss, "max_rss_over_budget_bytes": rss - budget_bytes}


def plot_tiers(result: dict, path: str) -> None:
    """Samples/s (both jobs), the largest shard's RSS with the budget, and the rows in memory and
    on disk of the tiered job, against minutes of training; a PNG at ``path``."""
    from het.bench.report_plots import _pyplot, _save

    plt = _pyplot()
    tiered, baseline = result["tiered"]["timeline"], result["baseline"]["timeline"]
    minutes = [e["t_s"] / 60 for e in tiered]
    budget = result["budget_bytes"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    axes[0].plot(minutes, [e["samples_per_s"] for e in tiered], label=f"--shard-memory {result['ps_memory']}")
    axes[0].plot([e["t_s"] / 60 for e in baseline], [e["samples_per_s"] for e in baseline], "--",
                 label="every row in DRAM")
    axes[0].set_ylabel("samples/s (all workers, between samples)")
    axes[0].set_title("Training throughput")
    axes[1].plot(minutes, [e["rss_bytes"] / GIB for e in tiered], label="largest shard's RSS")
    axes[1].axhline(budget / GIB, ls="--", color="gray", label="budget")
    axes[1].axhline((budget + GIB) / GIB, ls=":", color="tab:red", label="budget + 1 GiB")
    axes[1].set_ylabel("GiB")
    axes[1].set_title("Shard memory")
    axes[2].plot(minutes, [e["rows"] / 1e6 for e in tiered], ":", color="gray", label="rows stored")
    axes[2].plot(minutes, [e["rows_in_memory"] / 1e6 for e in tiered], label="rows in memory")
    axes[2].plot(minutes, [e["rows_on_disk"] / 1e6 for e in tiered], label="rows on disk")
    axes[2].set_ylabel("rows (millions, every shard)")
    axes[2].set_title("Where the rows are")
    for ax in axes:
        ax.set_xlabel("minutes of training")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    _save(fig, path)


def run(minutes: float = 20, baseline_minutes: float = 5, ps_memory: str = "2GiB",
        plot: str | None = "docs/img/tiers_scale.png", extra: list[str] = (), say=print) -> dict:
    """Run the tiered job, then the baseline; the result (and the plot at ``plot``, unless None)."""
    budget = parse_bytes(ps_memory)  # a bad size fails before any job starts
    if budget <= 0:
        raise ValueError(f"--shard-memory must be more than 0 bytes, got {ps_memory!r}")
    jobs = {}
    for name, job_minutes, memory in (("tiered", minutes, ps_memory), ("baseline", baseline_minutes, None)):
        say(f"het bench tiers: the {name} job, {job_minutes:g} min" + (f", --shard-memory {memory}" if memory else ""))
        summary = run_job(job_args(job_minutes, memory, extra), timeout_s=job_minutes * 60 + 900)
        jobs[name] = {k: summary[k] for k in FIGURES if k in summary}
    result = {"bench": "tiers", "ps_memory": ps_memory, "budget_bytes": budget, "minutes": minutes,
              "baseline_minutes": baseline_minutes, "extra": list(extra), **jobs,
              **compare(jobs["tiered"], jobs["baseline"], budget, baseline_minutes * 60)}
    if plot:
        plot_tiers(result, plot)
        result["plot"] = plot
    return result


def add_parser(bsub) -> None:
    """Register ``het bench tiers`` on the subparsers of ``het bench``."""
    p = bsub.add_parser("tiers", help="a job with a DRAM budget per shard (--shard-memory) against every row in DRAM",
                        description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=20, help="the tiered job's training time (default 20)")
    p.add_argument("--baseline-minutes", type=float, default=5,
                   help="the baseline's training time, and the window the speeds are compared over (default 5)")
    p.add_argument("--shard-memory", "--ps-memory", dest="ps_memory", default="2GiB",
                   help="each shard's DRAM budget, as het train takes it (default 2GiB)")
    p.add_argument("--plot", default="docs/img/tiers_scale.png", help="where the PNG goes (default %(default)s)")
    p.add_argument("--extra", default="", help="more het train flags for both jobs, in one string (they win): "
                   "--extra='--workers 1 --servers 2'")
    p.add_argument("--json", action="store_true", help="the last line of stdout is the result as JSON")
    p.set_defaults(func=_main)


def _main(args) -> None:
    try:
        result = run(args.minutes, args.baseline_minutes, args.ps_memory, args.plot, shlex.split(args.extra),
                     say=lambda line: print(line, file=sys.stderr, flush=True))
    except RuntimeError as e:
        raise SystemExit(f"het bench tiers: {e}") from None
    if args.json:
        print(json.dumps(result, sort_keys=True, default=str))
        return
    t, b = result["tiered"], result["baseline"]
    print(f"tiered ({result['ps_memory']} a shard): {t['samples_per_s']:,.0f} samples/s, AUC {_fmt(t.get('auc'), 4)}; "
          f"baseline: {b['samples_per_s']:,.0f} samples/s, AUC {_fmt(b.get('auc'), 4)}\n"
          f"speed over the first {result['window_s'] / 60:g} min: {_fmt(result['speed_ratio_first_5min'])}x the "
          f"baseline's; rows touched: {result['touched_over_budget']:.2f}x the budget; largest shard RSS "
          f"{result['max_rss_over_budget_bytes'] / GIB:+.2f} GiB over the budget; plot: {result.get('plot')}")


def _fmt(x, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"
