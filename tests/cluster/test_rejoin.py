"""A worker killed -9 mid-job: the workers re-form while the shards serve on (het.train.rejoin),
under the local cluster's `--max-restarts` and under torchrun across two emulated hosts."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from het.train.config import TrainConfig
from het.train.rejoin import read_records
from het.train.tasks import make_task
from jobs import alive, het

pytestmark = pytest.mark.cluster

STEPS = 400
ARGS = ["--steps", str(STEPS), "--dim", "8", "--batch", "256", "--synthetic-cap", "20000", "--workers", "2",
        "--max-restarts", "2", "--json", "--quiet"]


def steps_done(log, steps: int) -> int:
    done = re.findall(rf"\| *(\d+)/{steps} \[", log.read_text(errors="replace")) if log.exists() else []
    return int(done[-1]) if done else 0


def run_and_kill(log_dir, victim: str, after_steps: int, args=ARGS, steps=STEPS) -> tuple[dict, dict, dict, str]:
    """The job with ``victim`` (a pids.json name) killed -9 once rank 0 showed ``after_steps``
    steps: its summary, the pids before and after, and the launcher's stderr."""
    cmd = [sys.executable, "-m", "het", "train", *args, "--log-dir", str(log_dir)]
    launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while steps_done(log_dir / "worker-0.log", steps) < after_steps:
            assert time.monotonic() < deadline and launcher.poll() is None, launcher.stderr.read()[-3000:]
            time.sleep(0.1)
        before = json.load(open(log_dir / "pids.json"))
        os.kill(before[victim], signal.SIGKILL)
        out, err = launcher.communicate(timeout=300)
    finally:
        launcher.kill()
    assert launcher.returncode == 0, err[-3000:]
    after = json.load(open(log_dir / "pids.json"))
    assert not any(alive(pid) for pid in after.values())
    return json.loads(out.strip().splitlines()[-1]), before, after, err


def unique_keys(task, step: int, rank: int) -> int:
    return int(task.keys(task.batch(step, rank, 2, "cpu")).unique().numel())


@pytest.mark.slow  # about 23 s
def test_a_killed_worker_rejoins_while_the_shards_serve_on_and_what_it_lost_is_counted(tmp_path):
    s, before, after, err = run_and_kill(tmp_path / "killed", "worker 1", after_steps=150)
    assert "worker 1" in err and "the workers re-form while the shards serve on" in err
    assert (s["steps"], s["worker_restarts"], s["restarts"], s["shard_restarts"]) == (STEPS, 1, 0, 0)
    assert after["PS shard 0"] == before["PS shard 0"]  # the same shard process throughout
    assert after["worker 0"] != before["worker 0"] and after["worker 1"] != before["worker 1"]
    assert 150 <= s["rejoined_at_step"] < STEPS and s["steps_since_rejoin"] == STEPS - s["rejoined_at_step"]
    assert 0.7 < s["auc"] < 1  # against an uninterrupted run's: the slow tests below

    # what the dead worker had not pushed, as its last record says: at most a full cache's
    dead = [r for r in read_records(str(tmp_path / "killed" / "rejoin")) if r["generation"] == 0 and not r["flushed"]]
    assert [r["path"].endswith("rank-1.pt") for r in dead] == [True]
    assert s["updates_lost"] == dead[0]["pending"] > 0
    assert s["updates_lost"] <= s["cache_rows"] * (int(s["staleness"]) + 1)

    # every other update reached the shard once: its clocks add up to the updates the two
    # generations made less those lost, give or take the steps in flight at the kill; and a
    # push the dead worker sent after its last record (of what it held unpushed) reached the
    # shard though counted lost: what it counts lost is at most what was
    cfg = TrainConfig(steps=STEPS, dim=8, batch=256, synthetic={"cap": 20000}, workers=2)
    task = make_task(cfg)
    survivor_end, dead_end, rejoined = s["rejoined_at_step"], dead[0]["step"], s["rejoined_at_step"]
    made = (sum(unique_keys(task, step, 0) for step in range(survivor_end))
            + sum(unique_keys(task, step, 1) for step in range(dead_end))
            + sum(unique_keys(task, step, r) for step in range(rejoined, STEPS) for r in range(2)))
    clocks = torch.load(tmp_path / "killed" / "checkpoint" / "ps" / "shard-0.pt", weights_only=True)
    applied = int(clocks["tables"]["embedding"]["clocks"].sum())
    in_flight = unique_keys(task, survivor_end, 0) + unique_keys(task, dead_end, 1)
    assert -in_flight <= applied - (made - s["updates_lost"]) <= dead[0]["pending"] + in_flight, \
        (applied, made, s["updates_lost"], in_flight)


@pytest.mark.slow  # the default job twice: about 3 minutes
def test_the_default_job_with_a_worker_killed_ends_as_an_uninterrupted_one(tmp_path):
    args = ["--steps", "300", "--max-restarts", "2", "--json", "--quiet"]
    straight = het("train", *args, "--log-dir", str(tmp_path / "straight"))
    s, before, after, _ = run_and_kill(tmp_path / "killed", "worker 1", after_steps=120, args=args, steps=300)
    assert (s["steps"], s["worker_restarts"], s["restarts"]) == (300, 1, 0)
    assert after["PS shard 0"] == before["PS shard 0"]
    assert 0 < s["updates_lost"] <= s["cache_rows"] * 101
    assert abs(s["auc"] - straight["auc"]) < 0.003, (s["auc"], straight["auc"])
    print(json.dumps({"killed": {k: s[k] for k in ("auc", "rejoined_at_step", "updates_lost", "wall_s")},
                      "straight": {k: straight[k] for k in ("auc", "wall_s")}}))


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def _torchrun_pair(net, tmp_path, job, secret, address: str, tag: str) -> list:
    """torchrun on hosts h0 and h1 (one worker each, static rendezvous on h0, 2 restarts), each
    with its own rejoin directory: two machines that share nothing. (torchrun's c10d rendezvous
    re-forms too, but one restart in a few then reads a stale peer address and spends every
    restart: the agent's, not het's.)"""
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    env = dict(os.environ, GLOO_SOCKET_IFNAME="eth0", OMP_NUM_THREADS="1")
    procs = []
    for i in range(2):
        host = f"h{i}"
        cmd = [torchrun, "--nnodes", "2", "--nproc-per-node", "1", "--master-addr", net.address("h0"),
               "--master-port", "29400", "--node-rank", str(i), "--rdzv-id", tag,
               "--local-addr", net.address(host), "--max-restarts", "2", "--monitor-interval", "0.5",
               "-m", "het", "train", "--config", str(job), "--ps", address, "--secret-file", str(secret),
               "--rejoin-dir", str(tmp_path / tag / host), "--json", "--quiet"]
        procs.append(net.popen(host, cmd, env=env, stdout=open(tmp_path / f"{tag}-{host}.out", "w"),
                               stderr=open(tmp_path / f"{tag}-{host}.err", "w")))
    return procs


def _summary(tmp_path, tag: str) -> dict:
    lines = [line for i in range(2) for line in (tmp_path / f"{tag}-h{i}.out").read_text().splitlines()
             if line.startswith("{")]
    assert len(lines) == 1, lines  # rank 0's, on whichever host it was
    return json.loads(lines[0])


@pytest.mark.slow  # two torchrun jobs on two emulated hosts: about 2 minutes
def test_under_torchrun_across_two_hosts_a_killed_worker_rejoins(tmp_path):
    from het.bench.netns import EmulatedNetwork, cleanup_stale, unavailable_reason

    reason = unavailable_reason()
    if reason:
        pytest.skip(f"cannot emulate a network here: {reason}")
    cleanup_stale()
    job = tmp_path / "job.toml"
    job.write_text("steps = 400\ndim = 8\nbatch = 256\neval_samples = 8192\n[synthetic]\ncap = 20000\n")
    secret = tmp_path / "secret"
    secret.write_text("correct horse battery staple\n")
    with EmulatedNetwork(["ps", "h0", "h1"], bandwidth=None) as net:
        def shard():  # a fresh one per job: each trains from the initial rows
            proc = net.popen("ps", [sys.executable, "-m", "het", "serve", "--config", str(job), "--bind",
                                    f"{net.address('ps')}:0", "--secret-file", str(secret)],
                             stdout=subprocess.PIPE, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
            return proc, proc.stdout.readline().rsplit(" ", 1)[1].strip().replace("tcp://", "")

        first, address = shard()
        straight = _torchrun_pair(net, tmp_path, job, secret, address, "straight")
        assert [p.wait(300) for p in straight] == [0, 0], (tmp_path / "straight-h1.err").read_text()[-3000:]
        first.terminate()
        second, address = shard()
        killed = _torchrun_pair(net, tmp_path, job, secret, address, "killed")
        deadline = time.monotonic() + 300
        while not any(r["step"] >= 100 for r in read_records(str(tmp_path / "killed" / "h1"))):
            assert time.monotonic() < deadline and killed[1].poll() is None
            time.sleep(0.2)
        [worker] = _children(killed[1].pid)
        os.kill(worker, signal.SIGKILL)
        codes = [p.wait(120) for p in killed]
        assert codes == [0, 0], (tmp_path / "killed-h0.err").read_text()[-3000:]
        assert second.poll() is None  # the same shard process throughout, never restarted
    s, base = _summary(tmp_path, "killed"), _summary(tmp_path, "straight")
    assert (s["steps"], s["workers"], s["worker_restarts"]) == (400, 2, 1)
    assert 100 <= s["rejoined_at_step"] < 400 and s["updates_lost"] > 0
    assert abs(s["auc"] - base["auc"]) < 0.003, (s["auc"], base["auc"])
