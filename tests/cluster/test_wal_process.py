"""`het serve --wal`, as an operator meets it: a shard process killed with -9 and started
again on its state directory answers with every push it acknowledged, also after a write a
crash cut short, and the pushes after such a recovery survive the next kill; one shard at a
time holds a state directory, and one that finds a dead shard's claim says so."""

from __future__ import annotations

import signal

import pytest
import torch

from het.config import OptimizerConfig, ShardConfig, TableConfig
from het.ps.client.client import PSClient
from het.ps.server.process import ServerProcess
from het.ps.server.store import wal

pytestmark = pytest.mark.cluster
CFG = ShardConfig((TableConfig("t", rows=500, dim=4, optimizer=OptimizerConfig("adam", lr=0.01)),))
KEYS = torch.arange(0, 500, 7)


def pushes(client, steps) -> None:
    for step in steps:
        grads = torch.randn(len(KEYS), 4, generator=torch.Generator().manual_seed(step))
        client.wait(client.push("t", KEYS, grads, torch.ones(len(KEYS), dtype=torch.int64), step=step))


def kill(server) -> None:
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait()


def restarted(cfg, state_dir) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """A shard started again on ``state_dir``'s log: every row and clock of table t, its stats."""
    with ServerProcess(cfg, state_dir=str(state_dir), wal=True) as again:
        client = PSClient.connect([again.address])
        rows, clocks = client.wait(client.pull("t", torch.arange(500)))
        stats = client.stats()[0]
        client.close()
    return rows, clocks, stats


def test_a_killed_shard_restarted_on_its_state_directory_lost_nothing_acknowledged(tmp_path):
    cfg = ShardConfig((TableConfig("t", rows=500, dim=4, optimizer=OptimizerConfig("adam", lr=0.01)),))
    keys = torch.arange(0, 500, 7)
    with ServerProcess(cfg, state_dir=str(tmp_path), wal=True) as first:
        client = PSClient.connect([first.address])
        for step in range(1, 30):
            grads = torch.randn(len(keys), 4, generator=torch.Generator().manual_seed(step))
            client.wait(client.push("t", keys, grads, torch.ones(len(keys), dtype=torch.int64), step=step))
        expected = client.wait(client.pull("t", torch.arange(500)))
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait()
        client.close()
    rows, clocks, stats = restarted(cfg, tmp_path)
    assert torch.equal(rows, expected[0]) and torch.equal(clocks, expected[1])
    assert stats["wal_replayed"] == 29


@pytest.mark.slow  # two jobs, about 30 s; the default run kills shard processes on their logs above and below
@pytest.mark.parametrize("wal_max", [None, "256KiB"])
def test_a_job_whose_shard_is_killed_and_restarted_from_its_log_loses_no_update(tmp_path, wal_max):
    """`het train --ps-wal`: the shard is killed (-9) mid-job; the launcher starts it again on
    its address from its log, the workers re-send what it had not answered, and at s = 0 with
    SGD the final rows equal an uninterrupted run's: no update lost or applied twice. With
    ``--shard-wal-max`` the kill comes after the log was rebased, a few records past its base."""
    import json
    import os
    import random
    import subprocess
    import sys
    import time

    common = ["--steps", "60", "--dim", "8", "--batch", "64", "--synthetic-cap", "2000", "--eval-samples", "0",
              "--staleness", "0", "--optimizer", "sgd", "--lr", "0.5", "--json", "--quiet", "--ps-wal",
              "--checkpoint-every", "60"]
    runs = {}
    for name in ("straight", "killed"):
        logs, ckpt = tmp_path / name, tmp_path / f"{name}-ckpt"
        bound = ["--shard-wal-max", wal_max] if wal_max and name == "killed" else []
        launcher = subprocess.Popen([sys.executable, "-m", "het", "train", *common, *bound, "--log-dir", str(logs),
                                     "--checkpoint", str(ckpt)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)
        try:
            if name == "killed":  # at a random point of the job: after 20 to 80 of its ~120 pushes
                at, deadline = random.randint(20, 80), time.monotonic() + 300
                base = logs / "ps-0" / "wal" / "base.pt"  # with wal_max: the log was rebased (read no log the
                while time.monotonic() < deadline and launcher.poll() is None and (  # shard may cut meanwhile)
                        not (logs / "pids.json").exists() or (not base.exists() if wal_max else
                                                              sum(1 for _ in wal.read_log(str(logs / "ps-0" / "wal"))) < at)):
                    time.sleep(0.02)
                time.sleep(random.uniform(0, 0.3) if wal_max else 0)
                os.kill(json.load(open(logs / "pids.json"))["PS shard 0"], 9)
            out, err = launcher.communicate(timeout=600)
        finally:
            if launcher.poll() is None:
                launcher.kill()
        assert launcher.returncode == 0, err
        runs[name] = (json.loads(out.strip().splitlines()[-1]), torch.load(ckpt / "ps" / "shard-0.pt"), err)
    summary, killed, err = runs["killed"]
    assert summary["shard_restarts"] == 1 and "restarting it on" in err, err
    straight = runs["straight"][1]["tables"]
    for name, table in killed["tables"].items():
        assert torch.allclose(table["weight"], straight[name]["weight"], atol=1e-6)
        assert torch.equal(table["clocks"], straight[name]["clocks"])


def test_after_a_write_cut_short_the_pushes_of_the_restarted_shard_survive_the_next_kill(tmp_path):
    with ServerProcess(CFG, state_dir=str(tmp_path), wal=True) as first:
        client = PSClient.connect([first.address])
        pushes(client, range(1, 10))
        kill(first)
        client.close()
    with open(tmp_path / "wal" / "log", "ab") as f:  # the kill came in the middle of a write
        f.write(wal.MAGIC + b"\x10\x00\x00\x00\xff\x7f\x00")
    log = tmp_path / "second.log"
    with ServerProcess(CFG, state_dir=str(tmp_path), wal=True, log_path=str(log)) as second:
        client = PSClient.connect([second.address])
        pushes(client, range(10, 20))
        expected = client.wait(client.pull("t", torch.arange(500)))
        kill(second)
        client.close()
    with ServerProcess(CFG, state_dir=str(tmp_path), wal=True) as third:
        client = PSClient.connect([third.address])
        rows, clocks = client.wait(client.pull("t", torch.arange(500)))
        stats = client.stats()[0]
        client.close()
    assert torch.equal(rows, expected[0]) and torch.equal(clocks, expected[1]) and stats["wal_replayed"] == 19
    said = log.read_text()
    assert "het serve: removed " in said and "a write cut short at byte" in said
    assert "het serve: took over " in said and "which ended without a clean stop" in said


def test_a_second_shard_on_a_held_state_directory_refuses_to_start_in_one_line(tmp_path):
    import subprocess
    import sys

    with ServerProcess(CFG, state_dir=str(tmp_path), wal=True) as first:
        out = subprocess.run([sys.executable, "-m", "het", "serve", "--table", "t:500:4", "--state-dir", str(tmp_path),
                              "--wal", "--bind", "127.0.0.1:0"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert out.stderr.startswith(f"het serve: error: {tmp_path} is in use by another shard "
                                     f"(pid {first.proc.pid} listening on {first.address}): refused"), out.stderr
        client = PSClient.connect([first.address])  # the first serves on, its log its own
        pushes(client, range(1, 3))
        client.close()


@pytest.mark.slow
def test_the_default_jobs_log_stays_under_twice_wal_max_over_1000_steps(tmp_path):
    """`het train --ps-wal --shard-wal-max 64MiB`: the log (and the one set aside while a base is
    written) sampled every second never holds more than 128 MiB; about 1.3 GB pass through it."""
    from jobs import het

    summary = het("train", "--steps", "1000", "--ps-wal", "--shard-wal-max", "64MiB", "--ps-stats-every", "1",
                  "--json", "--quiet", "--log-dir", str(tmp_path))
    sizes = [e["wal_log_bytes"] for e in summary["timeline"]]
    assert len(sizes) >= 20 and max(sizes) <= 128 << 20, sizes
    assert summary["steps"] == 1000 and summary["auc"] > 0.78


def test_a_supervised_shard_killed_comes_back_on_its_address_and_loses_nothing(tmp_path):
    """`het serve --wal --supervise`: the shard is killed (-9); the supervisor starts it again on
    the same address and state directory, the client re-sends what it had not answered, and
    the rows equal those of a shard that never died. SIGTERM ends supervisor and shard."""
    import json
    import os
    import subprocess
    import sys
    import time

    from het.ps.server.server import ServerThread

    state = tmp_path / "state"
    supervisor = subprocess.Popen([sys.executable, "-m", "het", "serve", "--table", "t:500:4", "--optimizer", "adam",
                                   "--lr", "0.01", "--state-dir", str(state), "--wal", "--supervise", "2",
                                   "--bind", "127.0.0.1:0"], stdout=subprocess.PIPE, text=True)
    try:
        address = supervisor.stdout.readline().rsplit(" ", 1)[1].strip()
        client = PSClient.connect([address], reconnect_s=60)
        pushes(client, range(1, 15))
        first = json.loads((state / "lock").read_text())["pid"]
        os.kill(first, signal.SIGKILL)
        pushes(client, range(15, 30))  # the first of them waits for the shard to come back
        rows = client.wait(client.pull("t", torch.arange(500)))
        assert client.stats()[0]["wal_replayed"] >= 14
        assert json.loads((state / "lock").read_text())["pid"] != first
        client.close()
        supervisor.send_signal(signal.SIGTERM)
        out, _ = supervisor.communicate(timeout=60)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
    assert supervisor.returncode == 0 and "restarting it on 127.0.0.1:" in out and "restart 1 of 2" in out
    with ServerThread(CFG) as reference:
        client = PSClient.connect([reference.address])
        pushes(client, range(1, 30))
        expected = client.wait(client.pull("t", torch.arange(500)))
        client.close()
    assert torch.equal(rows[0], expected[0]) and torch.equal(rows[1], expected[1])


@pytest.mark.slow  # two jobs: about 23 s
def test_a_job_run_again_in_its_log_directory_starts_from_fresh_rows(tmp_path):
    """`het train --ps-wal --log-dir D` twice: the second job's shard does not replay the first's
    log (a job not resuming starts from the initial rows), so one worker gives the same AUC."""
    from jobs import het

    job = ["train", "--steps", "20", "--workers", "1", "--dim", "8", "--batch", "64", "--synthetic-cap", "2000",
           "--eval-samples", "2048", "--ps-wal", "--json", "--quiet", "--log-dir", str(tmp_path)]
    first, second = het(*job), het(*job)
    assert second["auc"] == first["auc"]


def test_a_stats_request_to_a_restarted_shard_is_sent_again_not_refused(tmp_path):
    """The first request after a shard came back is a STATS (a TensorBoard point, say): it names
    the dead process's nonce, and is sent again to the new one, as pushes are."""
    with ServerProcess(CFG, state_dir=str(tmp_path), wal=True) as first:
        address = first.address
        client = PSClient.connect([address], reconnect_s=60)
        pushes(client, range(1, 4))
        kill(first)
    with ServerProcess(CFG, bind=address.removeprefix("tcp://"), state_dir=str(tmp_path), wal=True):
        stats = client.stats()[0]
        assert stats["wal_replayed"] == 3
        client.close()


@pytest.mark.parametrize("args, says", [
    (["--wal", "--supervise"], "--supervise needs --wal and --state-dir"),
    (["--supervise", "-1"], "expected how many restarts at most"),
    (["--metrics-port", "70000"], "expected a port, 0 to 65535"),
])
def test_het_serve_refuses_a_bad_supervise_or_metrics_flag_in_one_line(args, says):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "het", "serve", "--table", "t:8:4", *args], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and says in out.stderr and "Traceback" not in out.stderr


def test_a_supervised_shard_that_never_listened_is_not_started_again(tmp_path):
    """Its port is taken: the same start would fail again, so the supervisor ends with its code."""
    import socket
    import subprocess
    import sys

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "het", "serve", "--table", "t:8:4", "--state-dir", str(tmp_path),
                              "--wal", "--supervise", "--bind", f"127.0.0.1:{port}"], capture_output=True, text=True,
                             timeout=120)
    assert out.returncode == 2 and "cannot listen on" in out.stderr and "restarting" not in out.stdout


def test_pushes_acknowledged_after_a_failed_log_write_survive_a_kill(tmp_path):
    """A file-size limit cuts a log write short (as a full disk does): that push is refused and
    its fragment cut off, so the pushes acknowledged after the limit is lifted are all there
    when the shard is killed (-9) and started again."""
    import os
    import resource

    log_path = tmp_path / "wal" / "log"
    acknowledged, refused = [], []
    with ServerProcess(CFG, state_dir=str(tmp_path), wal=True) as first:
        client = PSClient.connect([first.address])
        pushes(client, range(1, 6))
        acknowledged += range(1, 6)
        limit = os.path.getsize(log_path) + 3000  # a record is about 2.4 kB: the second write past it is cut
        resource.prlimit(first.proc.pid, resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
        for step in range(6, 12):
            try:
                pushes(client, [step])
                acknowledged.append(step)
            except Exception as e:  # refused: not acknowledged, not applied
                refused.append((step, str(e)))
        resource.prlimit(first.proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        pushes(client, range(12, 18))
        acknowledged += range(12, 18)
        expected = client.wait(client.pull("t", torch.arange(500)))
        kill(first)
        client.close()
    assert refused and "write-ahead log" in refused[0][1] and len(acknowledged) >= 12
    rows, clocks, stats = restarted(CFG, tmp_path)
    assert torch.equal(rows, expected[0]) and torch.equal(clocks, expected[1])
    assert stats["wal_replayed"] == len(acknowledged)
