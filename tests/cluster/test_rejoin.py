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

STEPS = 600
ARGS = ["--steps", str(STEPS), "--dim", "8", "--batch", "256", "--synthetic-cap", "20000", "--workers", "2",
        "--max-restarts", "2", "--json", "--quiet"]


def steps_done(log) -> int:
    done = re.findall(rf"\| *(\d+)/{STEPS} \[", log.read_text(errors="replace")) if log.exists() else []
    return int(done[-1]) if done else 0


def run_and_kill(log_dir, victim: str, after_steps: int) -> tuple[dict, dict, dict, str]:
    """The job with ``victim`` (a pids.json name) killed -9 once rank 0 showed ``after_steps``
    steps: its summary, the pids before and after, and the launcher's stderr."""
    cmd = [sys.executable, "-m", "het", "train", *ARGS, "--log-dir", str(log_dir)]
    launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while steps_done(log_dir / "worker-0.log") < after_steps:
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


def test_a_killed_worker_rejoins_while_the_shards_serve_on_and_what_it_lost_is_counted(tmp_path):
    straight = het("train", *ARGS, "--log-dir", str(tmp_path / "straight"))
    s, before, after, err = run_and_kill(tmp_path / "killed", "worker 1", after_steps=200)
    assert "worker 1" in err and "the workers re-form while the shards serve on" in err
    assert (s["steps"], s["worker_restarts"], s["restarts"], s["shard_restarts"]) == (STEPS, 1, 0, 0)
    assert after["PS shard 0"] == before["PS shard 0"]  # the same shard process throughout
    assert after["worker 0"] != before["worker 0"] and after["worker 1"] != before["worker 1"]
    assert 200 <= s["rejoined_at_step"] < STEPS and s["steps_since_rejoin"] == STEPS - s["rejoined_at_step"]
    assert abs(s["auc"] - straight["auc"]) < 0.003, (s["auc"], straight["auc"])

    # what the dead worker had not pushed, as its last record says: at most a full cache's
    dead = [r for r in read_records(str(tmp_path / "killed" / "rejoin")) if r["generation"] == 0 and not r["flushed"]]
    assert [r["path"].endswith("rank-1.pt") for r in dead] == [True]
    assert s["updates_lost"] == dead[0]["pending"] > 0
    assert s["updates_lost"] <= s["cache_rows"] * (int(s["staleness"]) + 1)

    # every other update reached the shard once: its clocks add up to the updates the two
    # generations made less those lost, give or take the steps in flight at the kill
    cfg = TrainConfig(steps=STEPS, dim=8, batch=256, synthetic={"cap": 20000}, workers=2)
    task = make_task(cfg)
    survivor_end, dead_end, rejoined = s["rejoined_at_step"], dead[0]["step"], s["rejoined_at_step"]
    made = (sum(unique_keys(task, step, 0) for step in range(survivor_end))
            + sum(unique_keys(task, step, 1) for step in range(dead_end))
            + sum(unique_keys(task, step, r) for step in range(rejoined, STEPS) for r in range(2)))
    clocks = torch.load(tmp_path / "killed" / "checkpoint" / "ps" / "shard-0.pt", weights_only=True)
    applied = int(clocks["tables"]["embedding"]["clocks"].sum())
    in_flight = unique_keys(task, survivor_end, 0) + unique_keys(task, dead_end, 1)
    assert abs(applied - (made - s["updates_lost"])) <= in_flight, (applied, made, s["updates_lost"], in_flight)
