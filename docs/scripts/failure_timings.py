"""How fast a local `het train` job notices a failure: kill -9 its PS shard, then
(in a second job) its launcher, and time the launcher's line, its exit, and the last process gone.
Run from the repository root: `.venv/bin/python docs/scripts/failure_timings.py shard` (or `launcher`)."""
import json, os, signal, subprocess, sys, threading, time, tempfile

SMALL = ["--dim", "8", "--batch", "64", "--synthetic-cap", "2000", "--eval-samples", "4096"]

def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"

def start(log_dir):
    p = subprocess.Popen([sys.executable, "-m", "het", "train", "--steps", "100000", *SMALL, "--quiet",
                          "--log-dir", log_dir], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    def read():
        for line in p.stderr:
            lines.append((time.monotonic(), line.rstrip()))
    threading.Thread(target=read, daemon=True).start()
    path = os.path.join(log_dir, "pids.json")
    while not os.path.exists(path):
        time.sleep(0.1)
    time.sleep(float(os.environ.get("WARM", 15)))
    return p, json.load(open(path)), lines

def shard_death():
    d = tempfile.mkdtemp()
    p, pids, lines = start(d)
    t0 = time.monotonic()
    os.kill(pids["PS shard 0"], signal.SIGKILL)
    gone = {}
    while p.poll() is None:
        for n, q in pids.items():
            if n not in gone and not alive(q):
                gone[n] = round(time.monotonic() - t0, 2)
        time.sleep(0.02)
    print("gone:", gone, "t0", time.time() - (time.monotonic() - t0))
    end = time.monotonic() - t0
    time.sleep(0.5)
    first = next((t - t0 for t, l in lines if "PS shard 0" in l), None)
    print(f"shard kill -9: launcher exit after {end:.1f} s (rc {p.returncode}); its line after "
          f"{first if first is None else round(first, 1)} s; lines: {[l for _, l in lines]}; "
          f"alive: {[n for n, q in pids.items() if alive(q)]}")

def launcher_death():
    d = tempfile.mkdtemp()
    p, pids, lines = start(d)
    t0 = time.monotonic()
    p.kill()
    gone = {}
    while any(alive(q) for q in pids.values()) and time.monotonic() - t0 < 120:
        for n, q in pids.items():
            if n not in gone and not alive(q):
                gone[n] = round(time.monotonic() - t0, 2)
        time.sleep(0.02)
    print("gone:", gone, "t0", time.time() - (time.monotonic() - t0))
    print(f"launcher kill -9: every process gone after {time.monotonic() - t0:.1f} s; "
          f"alive: {[n for n, q in pids.items() if alive(q)]}")
    for q in pids.values():
        if alive(q):
            os.kill(q, signal.SIGKILL)

{"shard": shard_death, "launcher": launcher_death}[sys.argv[1]]()
