"""CPU seconds of every process (and busy thread) a command starts: run it, read each process's
and thread's utime + stime from /proc every 0.2 s while it runs, and print the wall time, the
total, each process over 0.3 s with its command line, and each thread over 1 s. What a process
used after its last reading is not counted (at most 0.2 s of it). The command's output goes to
/tmp/process_cpu.out. Linux only.
Run from the repository root, e.g. publishing's cost (docs/RESULTS.md):
`python3 docs/scripts/process_cpu.py .venv/bin/het train --steps 2000 --eval-samples 0 --json --publish /tmp/pub --publish-every 10`."""
import os
import subprocess
import sys
import time

CLK = os.sysconf("SC_CLK_TCK")


def descendants(pid: int, found: set) -> None:
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                for child in map(int, f.read().split()):
                    found.add(child)
                    descendants(child, found)
    except OSError:  # ended meanwhile
        pass


def cpu_s(stat_path: str) -> tuple[str, float]:
    """(comm, utime + stime in seconds) of one /proc stat file."""
    with open(stat_path) as f:
        s = f.read()
    fields = s[s.rindex(")") + 2:].split()
    return s[s.index("(") + 1:s.rindex(")")], (int(fields[11]) + int(fields[12])) / CLK


def main(argv: list[str]) -> None:
    procs, threads, cmds = {}, {}, {}
    with open("/tmp/process_cpu.out", "w") as out:
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    start = time.time()
    while p.poll() is None:
        tree = {p.pid}
        descendants(p.pid, tree)
        for pid in tree:
            try:
                if not cmds.get(pid):  # read again until the child has exec'd
                    with open(f"/proc/{pid}/cmdline") as f:
                        cmds[pid] = f.read().replace("\0", " ")[:120]
                procs[pid] = cpu_s(f"/proc/{pid}/stat")[1]  # dead threads' time included
                for task in os.listdir(f"/proc/{pid}/task"):
                    threads[(pid, int(task))] = cpu_s(f"/proc/{pid}/task/{task}/stat")
            except OSError:
                pass
        time.sleep(0.2)
    print(f"wall {time.time() - start:.1f} s, cpu {sum(procs.values()):.1f} s")
    for pid, cpu in sorted(procs.items(), key=lambda x: -x[1]):
        if cpu > 0.3:
            print(f"{cpu:7.1f}  {pid}  {cmds.get(pid, '?')}")
    print("threads:")
    for (pid, tid), (comm, cpu) in sorted(threads.items(), key=lambda x: -x[1][1]):
        if cpu > 1.0:
            print(f"{cpu:7.1f}  {pid}/{tid} {comm}")


if __name__ == "__main__":
    main(sys.argv[1:])
