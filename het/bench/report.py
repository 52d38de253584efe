"""``het bench report``: run the evaluation suite, and render its results beside the paper's.

``het bench report --run [--quick] [--only e2e,missrate]`` runs each benchmark of :data:`SUITE`
as a subprocess of the ``het`` CLI with ``--json`` and stores ``<results>/<name>.json``:
``{"name", "command", "quick", "machine", "started", "seconds", "result"}`` (``result`` is the
benchmark's JSON, or None with ``error`` and ``returncode`` when it failed). Then, as
``het bench report`` alone does, it renders every stored result: one table per paper figure,
headed by the command and the machine, the paper's numbers beside, the checks the issues ask
for, and PNG plots; the markdown replaces only the region of the results page between
:data:`BEGIN` and :data:`END` (appended at the end if absent).

The rendering functions are pure: result dicts in, markdown strings or PNG files out.
"""

from __future__ import annotations

import datetime
import glob
import json
import math
import os
import platform
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import deque

BEGIN = "<!-- het bench report: begin -->"
END = "<!-- het bench report: end -->"
# (name, argv after `het bench`, the same with --quick). e2e runs the setting (batch 128
# per worker, dim 128, 10% cache). A full run is about 30 minutes on 2 cores (e2e 12 jobs of 600
# steps, staleness 4 of 1,000, scale 15 of 200, missrate 2 traces of 1,000 steps); quick about 5
# (e2e 4 jobs of 150 steps, staleness 4 of 200, scale 4 of 100, missrate 2 of 200).
SUITE = [
    ("e2e", ["e2e", "--bandwidths", "1gbit,10gbit,none", "--batch", "128", "--steps", "600", "--json"],
     ["e2e", "--bandwidths", "1gbit", "--batch", "128", "--steps", "150", "--json"]),
    ("staleness", ["staleness", "--json"], ["staleness", "--steps", "200", "--json"]),
    ("missrate", ["missrate", "--lookahead", "32", "--json"], ["missrate", "--quick", "--lookahead", "32", "--json"]),
    ("scale", ["scale", "--json"],
     ["scale", "--workers", "1,2", "--modes", "het:100,hybrid", "--steps", "100", "--json"]),
]
PAPER_AUC_WDL = {0: 0.7964, 100: 0.7962, 10_000: 0.7884, math.inf: 0.7461}  # Table 2, Criteo
PAPER_FRACS = (0.03, 0.05, 0.10, 0.15)
PAPER_MISS = {  # Fig. 8, miss rate at PAPER_FRACS
    "Reddit": {"lru": (0.74, 0.61, 0.35, 0.20), "lfu": (0.71, 0.56, 0.28, 0.12)},
    "ogbn-mag": {"lru": (0.40, 0.29, 0.14, 0.05), "lfu": (0.39, 0.27, 0.12, 0.03)},
}
PLOTS = {"e2e": "fig7_e2e.png", "staleness": "table2_staleness.png", "missrate": "fig8_missrate.png",
         "scale": "fig9_scale.png"}


# --- running the suite --------------------------------------------------------------------------

def machine() -> dict:
    """The machine a result was measured on: CPU model, cores, memory, torch, Python, date."""
    from importlib.metadata import PackageNotFoundError, version

    cpu, mem = platform.processor() or "unknown CPU", None
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
        with open("/proc/meminfo") as f:
            mem = next((int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal")), None)
    except OSError:
        pass
    try:
        torch = version("torch")
    except PackageNotFoundError:
        torch = None
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_bytes": mem, "torch": torch,
            "python": platform.python_version(), "system": platform.system(),
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}


def run_command(cmd: list[str], timeout_s: float, echo=sys.stderr) -> tuple[int, str, str]:
    """Run ``cmd``; its exit status, stdout, and the tail of its stderr (echoed as it comes).
    Past ``timeout_s`` it gets SIGINT (a local cluster stops its processes on it), then SIGKILL."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tail: deque[str] = deque(maxlen=30)

    def pump():
        for line in proc.stderr:
            tail.append(line)
            if echo:
                echo.write("    " + line)
                echo.flush()

    timed_out = threading.Event()

    def stop():
        timed_out.set()
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()

    pumper = threading.Thread(target=pump, daemon=True)
    pumper.start()
    timer = threading.Timer(timeout_s, stop)
    timer.start()
    try:
        out = proc.stdout.read()  # until the child exits (or is stopped)
        proc.wait()
    finally:
        timer.cancel()
    pumper.join(5)
    if timed_out.is_set():
        tail.append(f"stopped after the time limit of {timeout_s:.0f} s\n")
    return proc.returncode, out, "".join(tail)


def run_one(name: str, argv: list[str], quick: bool, timeout_s: float, runner=run_command) -> dict:
    """Run ``het bench *argv`` once; the record stored as ``<name>.json``."""
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    t0 = time.perf_counter()
    rc, out, err = runner([sys.executable, "-m", "het", "bench", *argv], timeout_s)
    record = {"name": name, "command": "het bench " + shlex.join(argv), "quick": quick, "machine": machine(),
              "started": started, "seconds": time.perf_counter() - t0, "returncode": rc, "result": None}
    lines = [line for line in out.splitlines() if line.strip()]
    if rc == 0:
        try:
            record["result"] = json.loads(lines[-1])
        except (IndexError, json.JSONDecodeError):
            record["error"] = "no JSON object on the last line of its stdout"
    else:
        reasons = [line for line in err.splitlines() if line.strip()]
        record["error"] = reasons[-1] if reasons else f"exited with code {rc}"
        record["stderr_tail"] = err[-3000:]
    return record


def run_suite(results_dir: str, quick: bool = False, only: list[str] | None = None, suite=SUITE,
              runner=run_command, timeout_s: float | None = None, log=sys.stderr) -> list[dict]:
    """Run the suite (or the benchmarks named in ``only``) and store each record; the records."""
    names = [name for name, *_ in suite]
    unknown = [n for n in only or () if n not in names]
    if unknown:
        raise ValueError(f"expected benchmarks among {', '.join(names)}, got {', '.join(unknown)}")
    os.makedirs(results_dir, exist_ok=True)
    chosen = [entry for entry in suite if not only or entry[0] in only]
    records = []
    for i, (name, argv, argv_quick) in enumerate(chosen, 1):
        argv = argv_quick if quick else argv
        print(f"het bench report: [{i}/{len(chosen)}] {name}: het bench {shlex.join(argv)}", file=log, flush=True)
        record = run_one(name, argv, quick, timeout_s or (1800 if quick else 7200), runner)
        with open(os.path.join(results_dir, f"{name}.json"), "w") as f:
            json.dump(record, f, indent=1, sort_keys=True, default=str)
        status = f"done in {record['seconds']:.0f} s" if record["result"] is not None else f"failed: {record['error']}"
        print(f"het bench report: {name} {status}", file=log, flush=True)
        records.append(record)
    return records


def load_results(results_dir: str) -> dict[str, dict]:
    """Every stored record, by name."""
    records = {}
    for path in sorted(glob.glob(os.path.join(results_dir, "*.json"))):
        with open(path) as f:
            record = json.load(f)
        records[record.get("name", os.path.splitext(os.path.basename(path))[0])] = record
    return records


# --- markdown -----------------------------------------------------------------------------------

def update_region(text: str, region: str) -> str:
    """``text`` with the lines between BEGIN and END replaced by ``region`` (both markers
    appended at the end if absent); nothing outside the markers changes.

    Example:
        >>> update_region(f"a\\n{BEGIN}\\nold\\n{END}\\nb\\n", "new")
        'a\\n<!-- het bench report: begin -->\\nnew\\n<!-- het bench report: end -->\\nb\\n'
    """
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        sep = "" if not text or text.endswith("\n\n") else ("\n" if text.endswith("\n") else "\n\n")
        return f"{text}{sep}{BEGIN}\n{region.strip()}\n{END}\n"
    return f"{text[:start]}{BEGIN}\n{region.strip()}\n{text[end:]}"


def _num(x, spec: str = ",.0f") -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _staleness(s) -> float:
    return math.inf if str(s).lower() in ("inf", "infinity") else float(s)


def _bandwidth(b: str) -> str:
    return {"none": "unshaped"}.get(b, b.replace("gbit", " Gbit").replace("mbit", " Mbit"))


def _mode(mode: str, staleness=None) -> str:
    if ":" in mode:
        mode, staleness = mode.split(":")
    return f"het s={_s_label(staleness)}" if mode == "het" else mode


def _s_label(s) -> str:
    s = _staleness(s)
    return "inf" if s == math.inf else f"{s:.0f}"


def _header(record: dict, title: str) -> list[str]:
    m = record.get("machine") or {}
    mem = f", {m['memory_bytes'] / 2**30:.0f} GiB" if m.get("memory_bytes") else ""
    quick = " (quick run)" if record.get("quick") else ""
    return [f"### {title}", "",
            (f"Command: `{record.get('command', '?')}`{quick}; {record.get('started', '?')}, "
            f"{_num(record.get('seconds'))} s.  "),
            (f"Machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores{mem}, torch {m.get('torch', '?')}, "
            f"Python {m.get('python', '?')}."), ""]


def _table(head: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(map(str, r)) + " |"
                                                                          for r in rows]


def _verdict(ok: bool, met: str = "met", short: str = "short") -> str:
    return met if ok else short


def checks_e2e(result: dict) -> list[str]:
    """The end-to-end checks: het s=100 against hybrid (>= 5x) and ps (>= 10x) at 1 Gbit, and
    its cut of sparse bytes against hybrid (>= 80%; the paper: up to 88%)."""
    out = []
    rows = result.get("results", [])
    for bw in dict.fromkeys(r.get("bandwidth") for r in rows):
        at = {_mode(r["mode"], r.get("staleness")): r for r in rows if r.get("bandwidth") == bw}
        het = at.get("het s=100")
        if not het:
            continue
        for other, target in (("hybrid", 5), ("ps", 10)):
            if other in at and at[other]["samples_per_s"]:
                x = het["samples_per_s"] / at[other]["samples_per_s"]
                tail = f" (target >= {target}x): {_verdict(x >= target)}" if bw == "1gbit" else ""
                where = "unshaped" if bw == "none" else f"at {_bandwidth(bw)}"
                out.append(f"het s=100 vs {other} {where}: {x:.1f}x{tail}")
        if bw == "1gbit" and "hybrid" in at and at["hybrid"]["sparse_bytes_per_sample"]:
            cut = 1 - het["sparse_bytes_per_sample"] / at["hybrid"]["sparse_bytes_per_sample"]
            out.append(f"sparse bytes per sample cut vs hybrid at 1 Gbit: {cut:.0%} (target >= 80%, paper up to "
                       f"88%): {_verdict(cut >= 0.8)}")
    return out


def render_e2e(record: dict, img: str | None = None) -> str:
    """Fig. 7 / Table 1: samples/s, bytes per sample and time split per mode and bandwidth."""
    result = record["result"]
    rows = []
    for r in result.get("results", []):
        t = r.get("time_split", {})
        split = " / ".join(_num(t.get(k), ".0%") for k in ("compute", "wait_ps", "allreduce"))
        rows.append([_bandwidth(r.get("bandwidth", "?")), _mode(r["mode"], r.get("staleness")),
                     _num(r.get("samples_per_s")), _num(r.get("speed_vs_het100"), ".2f"),
                     _num(r.get("sparse_bytes_per_sample")), _num(r.get("dense_bytes_per_sample")),
                     _num(r.get("hit_rate"), ".3f"), split])
    lines = _table(["bandwidth", "mode", "samples/s", "vs het s=100", "sparse B/sample", "dense B/sample",
                    "hit rate", "compute / PS wait / AllReduce"], rows)
    lines += ["", ("Paper (8 GPU workers, 1 CPU server, 1 GbE or 10 GbE, cache 10%): HET converges 4.36-5.14x "
              "faster than Hybrid without the cache and 6.37-20.68x faster than TF-PS / Parallax; embedding "
              "traffic cut by up to 88% (WDL, 1 GbE).")]
    return "\n".join(lines + _figure(img, "Fig. 7") + _checks(checks_e2e(result)))


def checks_staleness(result: dict) -> list[str]:
    """AUC at s=100 within 0.005 of s=0 (the paper: 0.0002), and what s=inf costs."""
    auc = {_staleness(r["staleness"]): r.get("auc") for r in result.get("results", []) if r.get("auc") is not None}
    out = []
    if 0 in auc and 100 in auc:
        d = auc[100] - auc[0]
        out.append(f"AUC s=100 - s=0 = {d:+.4f} (target |.| <= 0.005; paper WDL -0.0002): "
                   f"{_verdict(abs(d) <= 0.005, 'met', 'missed')}")
    if 0 in auc and math.inf in auc:
        out.append(f"AUC s=inf - s=0 = {auc[math.inf] - auc[0]:+.4f} (paper WDL -0.0503)")
    return out


def render_staleness(record: dict, img: str | None = None) -> str:
    """Table 2: AUC after the same samples per staleness bound, the paper's WDL row beside."""
    result = record["result"]
    rows = [[_s_label(r["staleness"]), _num(r.get("auc"), ".4f"), _num(r.get("logloss"), ".4f"),
             _num(r.get("planted_auc"), ".4f"), _num(r.get("hit_rate"), ".3f"), _num(r.get("stale_refreshes")),
             _num(r.get("samples")), _num(PAPER_AUC_WDL.get(_staleness(r["staleness"])), ".4f")]
            for r in result.get("results", [])]
    cfg = result.get("config", {})
    lines = _table(["s", "AUC", "logloss", "planted AUC", "hit rate", "stale refreshes", "samples",
                    "paper WDL AUC"], rows)
    lines += ["", (f"Measured: {cfg.get('model', '?')} on synthetic Criteo, {cfg.get('workers', '?')} workers, "
              f"batch {cfg.get('batch', '?')}, dim {cfg.get('dim', '?')} (the planted AUC is the best any model "
              f"can reach). Paper: Wide&Deep on Criteo Kaggle, 8 workers, one epoch.")]
    return "\n".join(lines + _figure(img, "Table 2") + _checks(checks_staleness(result)))


def _miss(result: dict) -> dict:
    """{trace: {policy: {frac: miss_rate}}} and the capacities {trace: {frac: rows}}."""
    miss: dict = {}
    for r in result.get("results", []):
        miss.setdefault(r["trace"], {}).setdefault(r["policy"], {})[r["frac"]] = r["miss_rate"]
    return miss


def checks_missrate(result: dict) -> list[str]:
    """LFU <= LRU at every size (the paper's ordering), Belady the floor, lookahead's effect."""
    out = []
    for trace, by in _miss(result).items():
        fracs = sorted(by.get("lru", {}))
        pairs = [("lfu", "lru", "LFU <= LRU"), ("belady", "lfu", "Belady <= LFU"),
                 ("lfu+lookahead", "lfu", f"LFU + lookahead {result.get('lookahead')} <= LFU"),
                 ("belady", "lfu+lookahead", f"Belady <= LFU + lookahead {result.get('lookahead')}")]
        for a, b, text in pairs:
            if a in by and b in by:
                ok = all(by[a][f] <= by[b][f] + 1e-12 for f in fracs if f in by[a] and f in by[b])
                out.append(f"{text} at every size ({trace}): {'yes' if ok else 'no'}")
        if "belady" in by and "lfu" in by:
            gaps = [by["lfu"][f] - by["belady"][f] for f in fracs if f in by["belady"]]
            out.append(f"LFU above Belady's floor ({trace}): {min(gaps):.3f}-{max(gaps):.3f}")
    return out


def render_missrate(record: dict, img: str | None = None) -> str:
    """Fig. 8: miss rate per cache size and policy, per trace, the paper's GNN numbers beside."""
    result = record["result"]
    miss = _miss(result)
    caps = {(r["trace"], r["frac"]): r["capacity"] for r in result.get("results", [])}
    lines = []
    for trace, by in miss.items():
        policies = [p for p in ("lru", "lfu", "lfu+lookahead", "belady", "static-oracle") if p in by]
        rows = []
        for f in sorted(by[policies[0]]):
            paper = [f"{d['lru'][PAPER_FRACS.index(f)]:.2f} / {d['lfu'][PAPER_FRACS.index(f)]:.2f}"
                     if f in PAPER_FRACS else "–" for d in PAPER_MISS.values()]
            rows.append([f"{100 * f:g}%", _num(caps.get((trace, f)))] + [_num(by[p].get(f), ".3f") for p in policies]
                        + paper)
        params = result.get("traces", {}).get(trace, {})
        order = ("source", "graph", "fanouts", "seeds_per_batch", "batch", "batches", "rows", "nodes", "lookups")
        keys = sorted(params, key=lambda k: order.index(k) if k in order else len(order))
        desc = ", ".join(f"{k} {params[k]:,}" if isinstance(params[k], int) else f"{k} {params[k]}" for k in keys)
        lines += [f"Trace `{trace}`: {desc}.", ""]
        names = {"lfu+lookahead": f"LFU + lookahead {result.get('lookahead')}", "belady": "Belady (floor)",
                 "static-oracle": "static oracle"}
        lines += _table(["cache", "rows"] + [names.get(p, p.upper()) for p in policies]
                        + [f"paper {d} LRU / LFU" for d in PAPER_MISS], rows) + [""]
    lines += [("The static oracle is a cache preloaded with the trace's most-used rows (chosen in hindsight; it "
              "pays no compulsory misses). The paper's numbers are GraphSAGE on Reddit and ogbn-mag: compare the "
              "ordering and the gaps, not the absolute rates.")]
    return "\n".join(lines + _figure(img, "Fig. 8") + _checks(checks_missrate(result)))


def checks_scale(result: dict) -> list[str]:
    """The model's error at the measured points, and the projected speedups."""
    out = []
    errors = [abs(c["rel_error"]) for c in result.get("check", [])
              if isinstance(c, dict) and c.get("rel_error") is not None and not c.get("cpu_bound")
              and not c.get("reference")]
    if errors:
        out.append(f"model vs measured at points neither CPU-bound nor fitted: max |error| {max(errors):.0%}")
    proj = [p for p in result.get("projected", []) if isinstance(p, dict)]
    for sweep, key in (("workers", "workers"), ("dim", "dim")):
        for mode in dict.fromkeys(p.get("mode") for p in proj if p.get("sweep") == sweep):
            pts = sorted((p[key], p["samples_per_s"]) for p in proj if p.get("sweep") == sweep
                         and p.get("mode") == mode and p.get("bandwidth") == "1gbit" and key in p)
            if len(pts) > 1 and pts[0][1]:
                out.append(f"projected {_mode(mode)} at 1 Gbit, {key} {pts[0][0]} -> {pts[-1][0]}: samples/s "
                           f"x{pts[-1][1] / pts[0][1]:.2f}")
    dims = [p for p in proj if p.get("sweep") == "dim" and p.get("bandwidth") == "1gbit"]
    top = max((p.get("dim", 0) for p in dims), default=None)
    at_top = {_mode(p["mode"]): p["samples_per_s"] for p in dims if p.get("dim") == top}
    if "het s=100" in at_top and "ps" in at_top and at_top["ps"]:
        out.append(f"projected het s=100 vs ps at dim {top}, 1 Gbit: {at_top['het s=100'] / at_top['ps']:.1f}x "
                   f"(paper at dim 4096: TF-PS 22.8x, Parallax 16.5x slower than HET)")
    return out


def _generic(rows: list) -> list[str]:
    """Any list of flat dicts as a table (the columns: every scalar key, in order of appearance)."""
    rows = [r for r in rows if isinstance(r, dict)]
    keys = list(dict.fromkeys(k for r in rows for k, v in r.items() if not isinstance(v, (dict, list))))
    return _table(keys, [[_cell(r.get(k, "–")) for k in keys] for r in rows]) if rows else ["(none)"]


def _cell(v) -> str:
    return _num(v, ",.4g") if isinstance(v, float) else str(v)


def render_scale(record: dict, img: str | None = None) -> str:
    """Fig. 9: samples/s by workers and by dim, measured here and projected by a stated model."""
    result = record["result"]
    lines = [f"{result.get('note', '')}".strip(), "", "Measured:", ""]
    measured = result.get("measured", [])
    if all(isinstance(m, dict) and "time_split" in m for m in measured):
        rows = [[_mode(m.get("mode", "?")), m.get("workers"), m.get("dim"), _bandwidth(str(m.get("bandwidth"))),
                 _num(m.get("samples_per_s")), _num(m.get("sparse_bytes_per_sample")),
                 " / ".join(_num(m["time_split"].get(k), ".0%") for k in ("compute", "wait_ps", "allreduce")),
                 "yes" if m.get("cpu_bound") else ""] for m in measured]
        lines += _table(["mode", "workers", "dim", "link", "samples/s", "sparse B/sample",
                         "compute / PS wait / AllReduce", "CPU-bound"], rows)
    else:
        lines += _generic(measured)
    check = result.get("check", [])
    lines += ["", "The model at the measured points (its CPU terms stretched by this machine's contention):", ""]
    if all(isinstance(c, dict) and "predicted_samples_per_s" in c for c in check):
        lines += _table(["mode", "workers", "measured", "predicted", "error", "note"],
                        [[_mode(c.get("mode", "?")), c.get("workers"), _num(c.get("measured_samples_per_s")),
                          _num(c["predicted_samples_per_s"]), _num(c.get("rel_error"), "+.0%"),
                          "fitted here" if c.get("reference") else ("CPU-bound" if c.get("cpu_bound") else "")]
                         for c in check])
    else:
        lines += _generic(check) if check and isinstance(check[0], dict) else [f"- {c}" for c in check]
    lines += _projection(result.get("projected", []))
    model = result.get("model", {})
    if model.get("formula"):
        lines += ["", "Model:", "", "```", model["formula"], "```"]
    if model.get("assumptions"):
        lines += ["", "Assumptions:", ""] + [f"- {a}" for a in model["assumptions"]]
    lines += ["", ("Paper (Fig. 9): HET scales to 32 workers and embedding dim 4096; at dim 4096 TF-PS is 22.8x and "
              "Parallax 16.5x slower per epoch than HET.")]
    return "\n".join(lines + _figure(img, "Fig. 9") + _checks(checks_scale(result)))


def _projection(projected: list) -> list[str]:
    lines = []
    for sweep, key, title in (("workers", "workers", "Projected samples/s by workers (dim {dim})"),
                              ("dim", "dim", "Projected samples/s by embedding dim ({workers} workers)")):
        rows = [p for p in projected if isinstance(p, dict) and p.get("sweep") == sweep and key in p]
        if not rows:
            continue
        xs = sorted({p[key] for p in rows})
        series = dict.fromkeys((p.get("mode"), p.get("bandwidth")) for p in rows)
        table = [[_mode(str(m)), _bandwidth(str(b))] + [_num(next((p["samples_per_s"] for p in rows if p[key] == x
                                                                   and (p.get("mode"), p.get("bandwidth")) == (m, b)),
                                                                  None)) for x in xs] for m, b in series]
        lines += ["", title.format_map({"dim": rows[0].get("dim", "?"), "workers": rows[0].get("workers", "?")})
                  + ":", ""] + _table(["mode", "link"] + [str(x) for x in xs], table)
    return lines


def _figure(img: str | None, alt: str) -> list[str]:
    return ["", f"![{alt}]({img})"] if img else []


def _checks(checks: list[str]) -> list[str]:
    return ["", "Checks:", ""] + [f"- {c}" for c in checks] if checks else []


FIGURES = [  # (name, title, renderer, checks)
    ("e2e", "Fig. 7 / Table 1: end to end on an emulated cluster network", render_e2e, checks_e2e),
    ("staleness", "Table 2: AUC against the staleness bound", render_staleness, checks_staleness),
    ("missrate", "Fig. 8: cache miss rate against cache size", render_missrate, checks_missrate),
    ("scale", "Fig. 9: scalability in workers and embedding dim", render_scale, checks_scale),
]


def render(records: dict[str, dict], images: dict[str, str] | None = None) -> str:
    """The report's markdown (the region between the markers) from the stored records; ``images``
    maps a record's name to its plot's path as the page should link it."""
    images = images or {}
    out = ["## Benchmark report", "",
           ("Generated by `het bench report` from docs/results/*.json (`het bench report --run` measures them "
           "again); edits between the markers are overwritten."), ""]
    for name, title, renderer, _ in FIGURES:
        record = records.get(name)
        if record is None:
            out += [f"### {title}", "", f"Not measured yet: `het bench report --run --only {name}`.", ""]
            continue
        out += _header(record, title)
        if record.get("result") is None:
            out += [(f"**Not measured**: the run failed (exit {record.get('returncode')}): "
                    f"{record.get('error', 'unknown error')}"), ""]
            continue
        try:
            out += [renderer(record, images.get(name)), ""]
        except (KeyError, TypeError, ValueError, AttributeError) as e:  # a result of another shape
            out += [(f"Could not render this result ({type(e).__name__}: {e}); its keys: "
                    f"{', '.join(sorted(record['result']))}."), ""]
    return "\n".join(out)


def all_checks(records: dict[str, dict]) -> list[str]:
    """Every check line of every stored result that can be computed."""
    out = []
    for name, _, _, checks in FIGURES:
        record = records.get(name) or {}
        if record.get("result") is not None:
            try:
                out += [f"{name}: {c}" for c in checks(record["result"])]
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                out.append(f"{name}: could not compute the checks ({type(e).__name__}: {e})")
        elif record:
            out.append(f"{name}: not measured ({record.get('error')})")
    return out


# --- plots --------------------------------------------------------------------------------------

def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_e2e(result: dict, path: str) -> None:
    """Fig. 7: samples/s per mode grouped by bandwidth, and sparse bytes per sample."""
    plt = _pyplot()
    rows = result["results"]
    bws = list(dict.fromkeys(r["bandwidth"] for r in rows))
    modes = list(dict.fromkeys(_mode(r["mode"], r.get("staleness")) for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / len(modes)
    for key, ax, label in (("samples_per_s", axes[0], "samples/s"),
                           ("sparse_bytes_per_sample", axes[1], "sparse bytes per sample (B)")):
        for i, mode in enumerate(modes):
            vals = [next((r[key] for r in rows if r["bandwidth"] == b and _mode(r["mode"], r.get("staleness")) == mode),
                         0) for b in bws]
            ax.bar([j + (i - (len(modes) - 1) / 2) * width for j in range(len(bws))], vals, width, label=mode)
        ax.set_xticks(range(len(bws)), [_bandwidth(b) for b in bws])
        ax.set_xlabel("link bandwidth (each way, every link)")
        ax.set_ylabel(label)
        ax.set_ylim(top=ax.get_ylim()[1] * 1.25)  # room for the legend above the bars
        ax.grid(axis="y", alpha=0.3)
        ax.legend(loc="upper left", ncol=len(modes), fontsize=8)
    axes[0].set_title("Training throughput per mode")
    axes[1].set_title("Embedding traffic per sample")
    _save(fig, path)


def plot_staleness(result: dict, path: str) -> None:
    """Table 2: AUC per staleness bound, with the planted AUC and the paper's WDL row."""
    plt = _pyplot()
    rows = sorted(result["results"], key=lambda r: _staleness(r["staleness"]))
    xs = range(len(rows))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(xs, [r.get("auc") for r in rows], "o-", label="measured AUC (synthetic Criteo)")
    planted = [r.get("planted_auc") for r in rows if r.get("planted_auc") is not None]
    if planted:
        ax.axhline(planted[0], ls="--", color="gray", label="planted model's AUC (the ceiling)")
    paper = [(i, PAPER_AUC_WDL[_staleness(r["staleness"])]) for i, r in enumerate(rows)
             if _staleness(r["staleness"]) in PAPER_AUC_WDL]
    if paper:
        ax.plot(*zip(*paper), "s:", color="tab:red", label="paper WDL AUC (Criteo Kaggle)")
    ax.set_xticks(list(xs), [_s_label(r["staleness"]) for r in rows])
    ax.set_xlabel("staleness bound s (clock ticks)")
    ax.set_ylabel("held-out AUC")
    ax.set_title("AUC after the same samples, by staleness bound")
    ax.grid(alpha=0.3)
    ax.legend()
    _save(fig, path)


def plot_missrate(result: dict, path: str) -> None:
    """Fig. 8: miss rate against cache size, one panel per trace."""
    plt = _pyplot()
    miss = _miss(result)
    fig, axes = plt.subplots(1, len(miss), figsize=(6 * len(miss), 4.5), squeeze=False)
    styles = {"lru": "o-", "lfu": "s-", "lfu+lookahead": "^-", "belady": "k--", "static-oracle": ":"}
    for ax, (trace, by) in zip(axes[0], miss.items()):
        for policy, style in styles.items():
            if policy in by:
                fracs = sorted(by[policy])
                label = {"lfu+lookahead": f"LFU + lookahead {result.get('lookahead')}", "belady": "Belady (optimal)",
                         "static-oracle": "static oracle"}.get(policy, policy.upper())
                ax.plot([100 * f for f in fracs], [100 * by[policy][f] for f in fracs], style, label=label)
        if trace == "graph":
            for (name, d), color in zip(PAPER_MISS.items(), ("tab:purple", "tab:brown")):
                for policy, ls in (("lru", (0, (5, 3))), ("lfu", (0, (1, 2)))):
                    ax.plot([100 * f for f in PAPER_FRACS], [100 * v for v in d[policy]], ls=ls, color=color,
                            alpha=0.6, label=f"paper {name} {policy.upper()}")
        ax.set_xlabel("cache size (% of the table's rows)")
        ax.set_ylabel("miss rate (%)")
        ax.set_title(f"Miss rate vs cache size: {trace} trace")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    _save(fig, path)


def plot_scale(result: dict, path: str) -> None:
    """Fig. 9: samples/s against workers and against dim, measured (markers) and projected (lines)."""
    from matplotlib import ticker

    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    proj = [p for p in result.get("projected", []) if isinstance(p, dict) and "samples_per_s" in p]
    measured = [m for m in result.get("measured", []) if isinstance(m, dict) and "samples_per_s" in m]
    modes = list(dict.fromkeys([p.get("mode") for p in proj] + [m.get("mode") for m in measured]))
    colors = {m: f"C{i}" for i, m in enumerate(modes)}
    dashes = ["-", "--", ":", "-."]
    for ax, sweep, key in ((axes[0], "workers", "workers"), (axes[1], "dim", "dim")):
        rows = [p for p in proj if p.get("sweep") == sweep and key in p]
        for j, bw in enumerate(dict.fromkeys(p.get("bandwidth") for p in rows)):
            for mode in modes:
                pts = sorted((p[key], p["samples_per_s"]) for p in rows if p.get("mode") == mode
                             and p.get("bandwidth") == bw)
                if pts:
                    ax.plot(*zip(*pts), dashes[j % len(dashes)], color=colors[mode],
                            label=f"{_mode(str(mode))}, projected, {_bandwidth(str(bw))}")
        fixed = result.get("config", {}).get("dim") if sweep == "workers" else result.get("reference_workers")
        other = "dim" if sweep == "workers" else "workers"
        for mode in modes:
            pts = sorted((m[key], m["samples_per_s"]) for m in measured if m.get("mode") == mode and key in m
                         and (fixed is None or m.get(other) == fixed))
            if pts:
                ax.plot(*zip(*pts), "o", color=colors[mode], ms=8, mec="black",
                        label=f"{_mode(str(mode))}, measured here")
        xs = sorted({p[key] for p in rows} | {m[key] for m in measured if key in m})
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        if xs:
            ax.set_xticks(xs, [str(x) for x in xs])
        ax.minorticks_off()
        ax.yaxis.set_major_locator(ticker.LogLocator(subs=(1, 2, 5)))
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
        projected_at = next((p.get(other) for p in rows), "?")
        ax.set_xlabel("workers" if sweep == "workers" else "embedding dim (floats per row)")
        ax.set_ylabel("samples/s (all workers)")
        ax.set_title(f"Throughput vs {sweep}: projected at {other} {projected_at}, measured at {fixed}",
                     fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    _save(fig, path)


def _save(fig, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    _pyplot().close(fig)


PLOTTERS = {"e2e": plot_e2e, "staleness": plot_staleness, "missrate": plot_missrate, "scale": plot_scale}


def write_plots(records: dict[str, dict], img_dir: str) -> dict[str, str]:
    """A PNG per measured record into ``img_dir``; the paths written, by name."""
    written = {}
    for name, plot in PLOTTERS.items():
        record = records.get(name) or {}
        if record.get("result") is None:
            continue
        path = os.path.join(img_dir, PLOTS[name])
        try:
            plot(record["result"], path)
        except (KeyError, TypeError, ValueError, AttributeError) as e:  # a result of another shape
            print(f"het bench report: no plot for {name} ({type(e).__name__}: {e})", file=sys.stderr)
            continue
        written[name] = path
    return written


def write_report(results_dir: str, doc: str, img_dir: str) -> list[str]:
    """Render the stored results into ``doc``'s region and plots into ``img_dir``; the checks."""
    records = load_results(results_dir)
    plots = write_plots(records, img_dir)
    base = os.path.dirname(os.path.abspath(doc))
    images = {n: os.path.relpath(os.path.abspath(p), base) for n, p in plots.items()}
    text = ""
    if os.path.exists(doc):
        with open(doc) as f:
            text = f.read()
    with open(doc, "w") as f:
        f.write(update_region(text, render(records, images)))
    return all_checks(records)


def add_parser(bsub) -> None:
    r = bsub.add_parser("report", help="run the evaluation suite (--run) and render every stored result into "
                        "the results page beside the paper's figures")
    r.add_argument("--run", action="store_true", help="run the suite first: " + ", ".join(n for n, *_ in SUITE))
    r.add_argument("--quick", action="store_true", help="with --run: the short versions (about 5 minutes in all)")
    r.add_argument("--only", help="with --run: comma-separated benchmarks to run")
    r.add_argument("--timeout", type=float, help="seconds per benchmark before it is stopped "
                   "(default 7200, with --quick 1800)")
    r.add_argument("--results-dir", default=os.path.join("docs", "results"), help="default %(default)s")
    r.add_argument("--doc", default=os.path.join("docs", "RESULTS.md"), help="the page whose report region is "
                   "rewritten (default %(default)s)")
    r.add_argument("--img-dir", default=os.path.join("docs", "img"), help="default %(default)s")
    r.set_defaults(func=cmd_report)


def cmd_report(args) -> None:
    if not os.path.exists(args.doc):  # most likely run outside the repository
        raise ValueError(f"{args.doc}: no such file; run from the repository root or give --doc PATH")
    if args.run:
        only = [n.strip() for n in args.only.split(",")] if args.only else None
        run_suite(args.results_dir, args.quick, only, timeout_s=args.timeout)
    elif args.only or args.quick:
        raise ValueError("--only and --quick choose what --run runs; give --run")
    checks = write_report(args.results_dir, args.doc, args.img_dir)
    print(f"het bench report: wrote the report region of {args.doc} and plots in {args.img_dir}")
    for line in checks:
        print("  " + line)
