"""``het bench report``: run the evaluation suite, and render its results beside the paper's.

``het bench report --run [--quick] [--only e2e,missrate]`` runs each benchmark of :data:`SUITE`
as a subprocess of the ``het`` CLI with ``--json`` and stores ``<results>/<name>.json``:
``{"name", "command", "quick", "machine", "started", "seconds", "result"}`` (``result`` is the
benchmark's JSON, or None with ``error`` and ``returncode`` when it failed). Then, as
``het bench report`` alone does, it renders every stored result: one table per paper figure,
headed by the command and the machine, the paper's numbers beside, the checks the issues ask
for, and PNG plots; the markdown replaces only the region of the results page between
:data:`BEGIN` and :data:`END` (appended at the end if absent).

By default results live in ``docs/results/``, the page is ``docs/RESULTS.md`` and the plots go
to ``docs/img/``; with ``--run --quick`` all three are under ``runs/bench-quick/``, so a quick
run never replaces the committed results. The report is rendered from the stored files alone:
the markdown by :mod:`het.bench.report_md`, the plots by :mod:`het.bench.report_plots`.

The rendering functions are pure: result dicts in, markdown strings or PNG files out.
"""

from __future__ import annotations

import datetime
import glob
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import deque

from het.bench.report_md import (
    BEGIN,
    END,
    PAPER_FRACS,
    all_checks,
    checks_missrate,
    render,
    update_region,
)
from het.bench.report_plots import PLOTS, write_plots

__all__ = ["BEGIN", "END", "PAPER_FRACS", "PLOTS", "SUITE", "all_checks", "checks_missrate", "load_results",
           "render", "run_suite", "update_region", "write_plots", "write_report"]
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
    # SIGINT must reach the benchmark even when this runs as a background job (which ignores it)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
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
    r.add_argument("--results-dir", help="default docs/results (with --quick: runs/bench-quick/results, so "
                   "a quick run never replaces the committed full results)")
    r.add_argument("--doc", help="the page whose report region is rewritten (default docs/RESULTS.md; with "
                   "--quick runs/bench-quick/RESULTS.md)")
    r.add_argument("--img-dir", help="default docs/img (with --quick runs/bench-quick/img)")
    r.set_defaults(func=cmd_report)


QUICK_DIR = os.path.join("runs", "bench-quick")


def cmd_report(args) -> None:
    if not os.path.isdir("het") and not args.doc:  # most likely run outside the repository
        raise ValueError("run from the repository root (docs/ and runs/ are found from there) or give --doc PATH")
    quick = args.quick and args.run
    args.results_dir = args.results_dir or (os.path.join(QUICK_DIR, "results") if quick else os.path.join("docs", "results"))
    args.img_dir = args.img_dir or (os.path.join(QUICK_DIR, "img") if quick else os.path.join("docs", "img"))
    if not args.doc:
        args.doc = os.path.join(QUICK_DIR, "RESULTS.md") if quick else os.path.join("docs", "RESULTS.md")
        if quick and not os.path.exists(args.doc):
            os.makedirs(QUICK_DIR, exist_ok=True)
            with open(args.doc, "w") as f:
                f.write("# het bench report --run --quick\n\nShort runs: for a look, not for the record "
                        "(docs/RESULTS.md holds the full suite).\n")
    if not os.path.exists(args.doc):
        raise ValueError(f"{args.doc}: no such file; give --doc PATH of an existing page")
    if args.run:
        only = [n.strip() for n in args.only.split(",")] if args.only else None
        run_suite(args.results_dir, args.quick, only, timeout_s=args.timeout)
    elif args.only or args.quick:
        raise ValueError("--only and --quick choose what --run runs; give --run")
    checks = write_report(args.results_dir, args.doc, args.img_dir)
    print(f"het bench report: wrote the report region of {args.doc} and plots in {args.img_dir}")
    for line in checks:
        print("  " + line)
