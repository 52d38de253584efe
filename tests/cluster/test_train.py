"""`het train`: the local cluster, failures, checkpoints, the gradient rule, torchrun."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from het.data.batch import Batch
from het.ps.client.client import PSClient
from het.ps.local import local_client
from het.train.config import TrainConfig
from het.train.loop import Worker
from het.train.tasks import job_tables
from jobs import alive, het, shared_file

pytestmark = pytest.mark.cluster

SMALL = ["--dim", "8", "--batch", "64", "--synthetic-cap", "2000", "--eval-samples", "4096"]


def test_local_cluster_trains_wide_and_deep_and_reports_the_summary(tmp_path):
    s = het("train", "--steps", "120", "--workers", "2", "--servers", "2", "--dim", "16", "--json",
            "--log-dir", str(tmp_path), "--quiet")
    assert (s["mode"], s["workers"], s["servers"], s["steps"], s["samples"]) == ("het", 2, 2, 120, 120 * 512 * 2)
    assert s["auc"] > 0.65 and s["planted_auc"] > s["auc"] and 0 < s["logloss"] < 0.7
    assert 0.3 < s["hit_rate"] < 1 and s["stale_refreshes"] > 0
    assert set(s["bytes"]) == {"sparse_pull", "sparse_push", "sync", "dense"} and all(s["bytes"].values())
    assert abs(sum(s["time_split"].values()) - 1) < 1e-6
    assert sorted(os.listdir(tmp_path)) == ["pids.json", "ps-0", "ps-1", "server-0.log", "server-1.log",
                                            "summary.json", "tensorboard", "worker-0.log", "worker-1.log"]  # ps-<i>: state dirs
    assert not any(alive(pid) for pid in json.load(open(tmp_path / "pids.json")).values())


@pytest.mark.slow  # the cut is also checked in-process by tests/unit/test_loop.py
def test_the_cache_cuts_sparse_traffic_against_hybrid(tmp_path):
    common = ["--steps", "150", "--json", "--quiet", "--dim", "32", "--synthetic-cap", "20000"]
    het_run = het("train", *common, "--mode", "het", "--staleness", "100", "--log-dir", str(tmp_path / "a"))
    hybrid = het("train", *common, "--mode", "hybrid", "--log-dir", str(tmp_path / "b"))
    assert hybrid["hit_rate"] == 0 and het_run["hit_rate"] > 0.5
    assert het_run["sparse_bytes_per_sample"] < 0.5 * hybrid["sparse_bytes_per_sample"]


@pytest.mark.slow
def test_the_acceptance_job_cuts_sparse_bytes_by_80_percent_against_hybrid(tmp_path):
    """The sparse-traffic cut, as a user runs it: the default data and model, 300 steps. Its fast
    version, in `make test`: tests/unit/test_loop.py."""
    common = ["--model", "wdl", "--data", "synthetic-criteo", "--steps", "300", "--json", "--quiet"]
    het_run = het("train", *common, "--mode", "het", "--staleness", "100", "--log-dir", str(tmp_path / "a"))
    hybrid = het("train", *common, "--mode", "hybrid", "--log-dir", str(tmp_path / "b"))
    assert het_run["auc"] > 0.7 and het_run["hit_rate"] > 0 and het_run["lazy_init"] and hybrid["lazy_init"]
    cut = 1 - het_run["sparse_bytes_per_sample"] / hybrid["sparse_bytes_per_sample"]
    assert cut >= 0.80, f"het sends {cut:.1%} fewer sparse bytes per sample than hybrid, not 80%"


def test_mode_ps_keeps_dense_parameters_on_the_ps(tmp_path):
    s = het("train", "--mode", "ps", "--steps", "40", *SMALL, "--json", "--quiet", "--log-dir", str(tmp_path))
    assert s["time_split"]["allreduce"] == 0 and s["bytes"]["dense"] > 0 and s["hit_rate"] == 0


@pytest.mark.slow  # about 18 s
def test_a_time_limit_ends_a_long_job_with_its_summary_and_a_timeline(tmp_path):
    """--time-limit stops both workers at the same step boundary, as SIGTERM does, but the job
    then evaluates, reports the steps it ran and exits 0; rank 0 samples the shards meanwhile."""
    started = time.monotonic()
    s = het("train", "--steps", "100000", "--time-limit", "8", "--ps-stats-every", "2", *SMALL, "--json", "--quiet",
            "--log-dir", str(tmp_path))
    assert time.monotonic() - started < 60
    assert 0 < s["steps"] < 100000 and s["stopped_at_step"] == s["steps"] and s["samples"] == s["steps"] * 64 * 2
    assert 8 <= s["wall_s"] < 20 and 0 < s["auc"] < 1
    timeline = s["timeline"]
    assert len(timeline) >= 2 and all(e["rss_bytes"] > 0 and e["rows"] > 0 and e["samples_per_s"] > 0 for e in timeline)
    assert [e["t_s"] for e in timeline] == sorted(e["t_s"] for e in timeline) and timeline[-1]["step"] <= s["steps"]
    assert s["ps"]["sampled_peak_rss_bytes"] == max(e["rss_bytes"] for e in timeline)


def start_long_job(tmp_path):
    """A local cluster that would train for hours, once its processes are up; and their pids."""
    # Ctrl-C as from a terminal: a shell that runs the tests as a background job hands its children
    # SIGINT ignored, and Python then installs no KeyboardInterrupt handler
    launcher = subprocess.Popen([sys.executable, "-m", "het", "train", "--steps", "100000", *SMALL, "--quiet",
                                 "--log-dir", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not (tmp_path / "pids.json").exists() and time.monotonic() < deadline and launcher.poll() is None:
        time.sleep(0.2)
    time.sleep(3)  # let training start
    return launcher, json.load(open(tmp_path / "pids.json"))


def test_killing_a_worker_stops_the_job_with_a_clear_message_and_no_orphans(tmp_path):
    launcher, pids = start_long_job(tmp_path)
    try:
        os.kill(pids["worker 1"], signal.SIGKILL)
        _, err = launcher.communicate(timeout=120)
    finally:
        launcher.kill()
    assert launcher.returncode == 1
    assert f"worker 1 (pid {pids['worker 1']}) killed by signal 9" in err
    assert f"Its log: {tmp_path / 'worker-1.log'}" in err
    time.sleep(1)
    assert [name for name, pid in pids.items() if alive(pid)] == []


def wait_for_steps(log, steps: int = 5, timeout_s: float = 120) -> None:
    """Wait until rank 0's progress bar (in its log) shows ``steps`` steps done: the workers are
    then in the training loop, with SIGTERM handled and the PS in use."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = re.findall(r"\| *(\d+)/100000 \[", log.read_text(errors="replace")) if log.exists() else []
        if done and int(done[-1]) >= steps:
            return
        time.sleep(0.2)
    raise AssertionError(f"no {steps} steps in {log} within {timeout_s} s")


def timed_lines(stream) -> list:
    """(time.monotonic(), line) of each line of ``stream`` as it comes, read by a thread."""
    lines = []

    def read():
        for line in stream:
            lines.append((time.monotonic(), line.rstrip("\n")))

    threading.Thread(target=read, daemon=True).start()
    return lines


def kill_all(launcher, pids: dict) -> None:
    """Whatever a test left running: the launcher, then any of its processes still alive."""
    launcher.kill()
    launcher.wait()
    for pid in pids.values():
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_dead_shard_is_named_at_once_and_the_job_ends_within_seconds(tmp_path):
    """kill -9 of a PS shard: the launcher's line naming it and its log comes as soon as the
    death is seen, before the teardown, and the workers blocked on the dead shard act on
    SIGTERM at once (not after a 15 s grace the workers would otherwise sit out)."""
    launcher, pids = start_long_job(tmp_path)
    try:
        wait_for_steps(tmp_path / "worker-0.log")
        lines = timed_lines(launcher.stderr)
        killed = time.monotonic()
        os.kill(pids["PS shard 0"], signal.SIGKILL)
        launcher.wait(60)
        ended = time.monotonic() - killed
        time.sleep(0.2)  # the reader thread reaches the end of the stream
    finally:
        kill_all(launcher, pids)
    named = [t - killed for t, line in lines if f"PS shard 0 (pid {pids['PS shard 0']}) killed by signal 9" in line
             and f"Its log: {tmp_path / 'server-0.log'}" in line]
    print(f"shard killed: its line after {named[0] if named else None} s, the launcher gone after {ended:.2f} s")
    assert launcher.returncode == 1 and len(named) == 1, lines
    assert named[0] < 1.5 and ended < 5.0
    for rank in range(2):
        log = (tmp_path / f"worker-{rank}.log").read_text(errors="replace")
        assert "Traceback" not in log and f"het train: worker {rank} stopped by SIGTERM" in log, log[-2000:]
    assert [name for name, pid in pids.items() if alive(pid)] == []


def test_killing_the_launcher_ends_every_process_within_seconds(tmp_path):
    """kill -9 of the launcher: its shards and workers get SIGTERM (PR_SET_PDEATHSIG), and the
    workers, blocked on the shards that stopped, must give up at once (not wait out the PS
    timeout, about 65 s)."""
    launcher, pids = start_long_job(tmp_path)
    try:
        wait_for_steps(tmp_path / "worker-0.log")
        killed = time.monotonic()
        launcher.kill()
        while any(alive(pid) for pid in pids.values()) and time.monotonic() - killed < 30:
            time.sleep(0.05)
        ended = time.monotonic() - killed
        left = [name for name, pid in pids.items() if alive(pid)]
        if left and "PS shard 0" in left:  # where it waits: its stacks go to its log
            os.kill(pids["PS shard 0"], signal.SIGUSR1)
            time.sleep(1)
    finally:
        kill_all(launcher, pids)
    print(f"launcher killed: every process gone after {ended:.2f} s")
    logs = {p.name: p.read_text(errors="replace")[-3000:] for p in tmp_path.glob("*.log")} if left else {}
    assert left == [] and ended < 5.0, f"still alive after {ended:.1f} s: {left}; logs: {logs}"


def test_ctrl_c_stops_every_process(tmp_path):
    launcher, pids = start_long_job(tmp_path)
    try:
        launcher.send_signal(signal.SIGINT)
        _, err = launcher.communicate(timeout=120)
    finally:
        launcher.kill()
    assert launcher.returncode == 130 and "interrupted" in err
    time.sleep(1)
    assert [name for name, pid in pids.items() if alive(pid)] == []


@pytest.mark.slow  # 35 s of three jobs; the checkpoint's logic: tests/unit/test_checkpoint.py
def test_checkpoint_and_resume_equal_training_straight_through(tmp_path):
    args = ["--staleness", "0", "--optimizer", "sgd", "--lr", "0.5", "--dense-optimizer", "adagrad",
            "--dense-lr", "0.01", *SMALL, "--eval-samples", "0", "--json", "--quiet"]
    het("train", *args, "--steps", "8", "--checkpoint", str(tmp_path / "straight"), "--checkpoint-every", "8",
        "--log-dir", str(tmp_path / "l1"))
    het("train", *args, "--steps", "4", "--checkpoint", str(tmp_path / "half"), "--checkpoint-every", "4",
        "--log-dir", str(tmp_path / "l2"))
    resumed = het("train", *args, "--steps", "8", "--resume", str(tmp_path / "half"), "--checkpoint",
                  str(tmp_path / "resumed"), "--checkpoint-every", "8", "--log-dir", str(tmp_path / "l3"))
    assert resumed["steps"] == 4  # the steps run after the resume
    a = torch.load(tmp_path / "straight" / "worker.pt", weights_only=False)
    b = torch.load(tmp_path / "resumed" / "worker.pt", weights_only=False)
    assert a["step"] == b["step"] == 8
    for name, value in a["model"].items():
        assert torch.allclose(value, b["model"][name], atol=1e-5), name
    assert a["optimizer"]["state"] and a["optimizer"]["state"].keys() == b["optimizer"]["state"].keys()
    rows_a = torch.load(tmp_path / "straight" / "ps" / "shard-0.pt", weights_only=True)["tables"]["embedding"]
    rows_b = torch.load(tmp_path / "resumed" / "ps" / "shard-0.pt", weights_only=True)["tables"]["embedding"]
    assert torch.allclose(rows_a["weight"], rows_b["weight"], atol=1e-5)
    assert torch.equal(rows_a["clocks"], rows_b["clocks"]) and int(rows_a["clocks"].sum()) > 0


@pytest.mark.slow  # reshard's logic: tests/unit/test_reshard.py
def test_a_checkpoint_resharded_resumes_on_another_number_of_servers(tmp_path):
    """1 server for 4 steps, `het reshard` to 2, 4 more steps on 2 servers: the rows equal 8 steps
    straight on 1 (resharded back to 1 to compare)."""
    args = ["--staleness", "0", "--optimizer", "sgd", "--lr", "0.5", *SMALL, "--eval-samples", "0", "--json", "--quiet"]
    het("train", *args, "--steps", "8", "--checkpoint", str(tmp_path / "straight"), "--checkpoint-every", "8",
        "--log-dir", str(tmp_path / "l1"))
    het("train", *args, "--steps", "4", "--checkpoint", str(tmp_path / "half"), "--checkpoint-every", "4",
        "--log-dir", str(tmp_path / "l2"))
    out = subprocess.run([sys.executable, "-m", "het", "reshard", str(tmp_path / "half"), str(tmp_path / "half2"),
                          "--shards", "2"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "--servers 2" in out.stdout, out.stderr
    resumed = het("train", *args, "--steps", "8", "--servers", "2", "--resume", str(tmp_path / "half2"),
                  "--checkpoint", str(tmp_path / "resumed"), "--checkpoint-every", "8", "--log-dir", str(tmp_path / "l3"))
    assert resumed["servers"] == 2 and resumed["steps"] == 4
    subprocess.run([sys.executable, "-m", "het", "reshard", str(tmp_path / "resumed" / "ps"), str(tmp_path / "back"),
                    "--shards", "1"], check=True, capture_output=True, timeout=120)
    rows_a = torch.load(tmp_path / "straight" / "ps" / "shard-0.pt", weights_only=True)["tables"]["embedding"]
    rows_b = torch.load(tmp_path / "back" / "shard-0.pt", weights_only=True)["tables"]["embedding"]
    assert torch.allclose(rows_a["weight"], rows_b["weight"], atol=1e-5)
    assert torch.equal(rows_a["clocks"], rows_b["clocks"]) and int(rows_a["clocks"].sum()) > 0


def test_two_workers_at_staleness_zero_equal_one_process_on_their_concatenated_batches(tmp_path):
    """The gradient-scaling rule: each worker's gradients are divided by the number of workers."""
    steps, batch = 6, 64
    args = ["--staleness", "0", "--optimizer", "sgd", "--lr", "0.5", "--dense-lr", "0.05", "--dim", "8",
            "--batch", str(batch), "--synthetic-cap", "2000", "--eval-samples", "0", "--workers", "2",
            "--dense-compression", "fp32", "--steps", str(steps), "--checkpoint", str(tmp_path / "ckpt"),
            "--checkpoint-every", str(steps), "--json", "--quiet", "--log-dir", str(tmp_path / "logs")]
    het("train", *args)
    cfg = TrainConfig(staleness=0, optimizer="sgd", lr=0.5, dense_lr=0.05, dim=8, batch=2 * batch, eval_samples=0,
                      workers=1, steps=steps, synthetic={"cap": 2000})
    reference = Worker(cfg, local_client(job_tables(cfg)))
    for step in range(steps):
        both = [reference.task.data.batch("train", step * 2 + rank, batch) for rank in range(2)]
        reference.step(Batch.cat(both))
    reference.embedding.flush()
    saved = torch.load(tmp_path / "ckpt" / "worker.pt", weights_only=False)["model"]
    for name, value in reference.model.state_dict().items():
        if not name.startswith("embedding."):
            assert torch.allclose(value, saved[name], atol=1e-6), name
    rows = torch.load(tmp_path / "ckpt" / "ps" / "shard-0.pt", weights_only=True)["tables"]["embedding"]["weight"]
    expected = reference.embedding.read(torch.arange(rows.shape[0]))
    assert torch.allclose(rows, expected, atol=1e-6)
    fresh = local_client(job_tables(cfg))
    assert not torch.allclose(rows, fresh.wait(fresh.pull("embedding", torch.arange(rows.shape[0])))[0])


def test_multi_node_commands_on_loopback_with_torchrun_and_a_secret(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('steps = 30\ndim = 8\nbatch = 64\neval_samples = 4096\n[synthetic]\ncap = 2000\n')
    secret = tmp_path / "secret"
    secret.write_text("correct horse battery staple\n")
    servers = [subprocess.Popen([sys.executable, "-m", "het", "serve", "--config", str(job), "--bind", "127.0.0.1:0",
                                 "--shard-index", str(i), "--num-shards", "2", "--secret-file", str(secret)],
                                stdout=subprocess.PIPE, text=True) for i in range(2)]
    try:
        addresses = [s.stdout.readline().rsplit(" ", 1)[1].strip() for s in servers]
        torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
        out = subprocess.run([torchrun, "--nnodes", "1", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                              "--master-port", str(_free_port()), "-m", "het", "train", "--config", str(job),
                              "--ps", ",".join(addresses).replace("tcp://", ""), "--secret-file", str(secret),
                              "--json", "--quiet"], capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        summary = json.loads(out.stdout.strip().splitlines()[-1])
        assert summary["workers"] == 2 and summary["steps"] == 30 and summary["hit_rate"] > 0
        stats = PSClient.connect(addresses, secret=secret.read_bytes().strip()).stats()
        assert all(s["unauthenticated"] == 0 and s["requests_push_sync"] > 0 for s in stats)
    finally:
        for s in servers:
            s.send_signal(signal.SIGTERM)
        for s in servers:
            s.wait(30)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_the_default_job_at_300_steps(tmp_path):
    """The issue's acceptance command, as a user runs it (dim 128, the full default size). Its
    fast version, in `make test`: tests/unit/test_loop.py."""
    start = time.monotonic()
    s = het("train", "--model", "wdl", "--data", "synthetic-criteo", "--steps", "300", "--json", "--quiet",
            "--log-dir", str(tmp_path))
    assert time.monotonic() - start < 180
    assert s["auc"] > 0.7 and s["hit_rate"] > 0


@pytest.mark.slow  # about 16 s
def test_prepared_criteo_with_malformed_lines_trains_on_the_rest(tmp_path):
    lines = open(shared_file("data", "criteo_kaggle_head1000.tsv")).read().splitlines()
    bad = ["1\t2", lines[5].replace("\t", "\tabc\t", 1), lines[6] + "\textra"]
    (tmp_path / "raw.tsv").write_text("\n".join(lines[:300] + bad + lines[300:]) + "\n")
    prepared = het("data", "prepare", "criteo", str(tmp_path / "raw.tsv"), str(tmp_path / "out"), "--json", "--quiet")
    assert prepared["rows"] == 1000 and prepared["skipped"] == 3
    assert [s["line"] for s in prepared["first_skipped"]] == [301, 302, 303]
    s = het("train", "--data", f"criteo:{tmp_path / 'out'}", "--steps", "15", "--dim", "8", "--batch", "64",
            "--json", "--quiet", "--log-dir", str(tmp_path / "logs"))
    assert s["steps"] == 15 and 0 < s["auc"] < 1 and "planted_auc" not in s


@pytest.mark.slow  # two workers on Cora, 22 s; the graph task in-process: tests/unit/test_tasks.py
def test_graphsage_on_cora(tmp_path):
    shared_file("data", "cora", "ind.cora.x")
    s = het("train", "--model", "graphsage", "--data", "cora", "--json", "--quiet", "--log-dir", str(tmp_path))
    assert s["workers"] == 2 and s["hit_rate"] > 0
    assert s["test_acc"] > 0.74 and s["val_acc"] > 0.7  # published GraphSAGE-style: about 0.80
    v = s["validation"]  # the kept model: the validation best, put back with its rows on the PS
    assert s["best_step"] == v["best_step"] and s["val_acc"] == max(p["val_acc"] for p in v["curve"])


@pytest.mark.slow  # about 40 s
def test_a_killed_shard_is_restarted_from_the_latest_checkpoint(tmp_path):
    """`--max-restarts`: the shard is killed (-9) after the first checkpoint; the launcher
    restarts the job from it, the job ends its steps, and its AUC is an uninterrupted run's."""
    common = ["--steps", "120", *SMALL, "--json", "--quiet", "--staleness", "0"]
    straight = het("train", *common, "--log-dir", str(tmp_path / "straight"))
    ckpt, logs = tmp_path / "ckpt", tmp_path / "restarted"
    launcher = subprocess.Popen([sys.executable, "-m", "het", "train", *common, "--checkpoint", str(ckpt),
                                 "--checkpoint-every", "40", "--max-restarts", "2", "--log-dir", str(logs)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not (ckpt / "worker.pt").exists() and time.monotonic() < deadline and launcher.poll() is None:
            time.sleep(0.05)
        assert (ckpt / "worker.pt").exists(), "no checkpoint was written"
        shard = json.load(open(logs / "pids.json"))["PS shard 0"]
        os.kill(shard, signal.SIGKILL)
        out, err = launcher.communicate(timeout=600)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["restarts"] == 1 and summary["worker_restarts"] == 0  # a job restart: the shard had died
    assert summary["steps"] == 120 and summary["resumed_from_step"] in (40, 80)
    assert f"PS shard 0 (pid {shard}) killed by signal 9" in err and "restart 1 of 2: from the checkpoint" in err
    assert abs(summary["auc"] - straight["auc"]) < 0.01


@pytest.mark.slow  # a job and its resumption: about 40 s
def test_checkpoints_kept_by_the_shards_resume_with_nothing_shared(tmp_path):
    """`--ps-saves-local`: each shard keeps its save in its own state directory and worker.pt names
    it; the checkpoint directory holds no PS rows, resuming (on the same shards' directories)
    equals training straight through, a shard keeps two checkpoints' saves, and het export says
    what to copy."""
    args = ["--staleness", "0", "--optimizer", "sgd", "--lr", "0.5", "--dense-optimizer", "adagrad",
            "--dense-lr", "0.01", *SMALL, "--eval-samples", "0", "--json", "--quiet"]
    het("train", *args, "--steps", "8", "--checkpoint", str(tmp_path / "straight"), "--checkpoint-every", "8",
        "--log-dir", str(tmp_path / "l1"))
    local = ["--ps-saves-local", "--log-dir", str(tmp_path / "l2")]
    het("train", *args, "--steps", "6", "--checkpoint", str(tmp_path / "half"), "--checkpoint-every", "2", *local)
    assert not (tmp_path / "half" / "ps").exists()
    named = torch.load(tmp_path / "half" / "worker.pt", weights_only=False)["ps_named"]
    kept = sorted(os.listdir(tmp_path / "l2" / "ps-0" / "checkpoints"))
    assert len(kept) == 2 and named["name"].split("/")[1] in kept and named["previous"].split("/")[1] in kept
    out = subprocess.run([sys.executable, "-m", "het", "export", str(tmp_path / "half"), str(tmp_path / "x")],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "copy those 1 files into" in out.stderr
    resumed = het("train", *args, "--steps", "8", "--resume", str(tmp_path / "half"), "--checkpoint",
                  str(tmp_path / "resumed"), "--checkpoint-every", "8", *local)
    assert resumed["steps"] == 2
    a = torch.load(tmp_path / "straight" / "worker.pt", weights_only=False)
    b = torch.load(tmp_path / "resumed" / "worker.pt", weights_only=False)
    for name, value in a["model"].items():
        assert torch.allclose(value, b["model"][name], atol=1e-5), name
    rows_a = torch.load(tmp_path / "straight" / "ps" / "shard-0.pt", weights_only=True)["tables"]["embedding"]
    saved = tmp_path / "l2" / "ps-0" / b["ps_named"]["name"] / "shard-0.pt"
    rows_b = torch.load(saved, weights_only=True)["tables"]["embedding"]
    assert torch.allclose(rows_a["weight"], rows_b["weight"], atol=1e-5) and torch.equal(rows_a["clocks"], rows_b["clocks"])


@pytest.mark.slow
@pytest.mark.parametrize("compression", ["fp16", "bf16"])
def test_a_compressed_dense_allreduce_halves_its_bytes_and_still_trains(tmp_path, compression):
    job = ["train", "--steps", "40", "--workers", "2", *SMALL, "--json", "--quiet"]
    plain = het(*job, "--dense-compression", "fp32", "--log-dir", str(tmp_path / "plain"))
    halved = het(*job, "--dense-compression", compression, "--log-dir", str(tmp_path / compression))
    assert halved["bytes"]["dense"] * 2 == pytest.approx(plain["bytes"]["dense"], rel=1e-6)
    assert abs(halved["auc"] - plain["auc"]) < 0.02 and halved["time_split"]["allreduce"] > 0


@pytest.mark.slow
def test_powersgd_sends_low_rank_factors_and_still_trains(tmp_path):
    job = ["train", "--steps", "60", "--workers", "2", *SMALL, "--json", "--quiet"]
    plain = het(*job, "--dense-compression", "fp32", "--log-dir", str(tmp_path / "plain"))
    low = het(*job, "--dense-compression", "powersgd", "--log-dir", str(tmp_path / "powersgd"))
    # 10 steps whole, then rank-4 factors of the 2-D gradients and the biases whole
    assert plain["bytes"]["dense"] / 3 > low["bytes"]["dense"] > plain["bytes"]["dense"] / 6 / 10
    assert abs(low["auc"] - plain["auc"]) < 0.02 and low["time_split"]["allreduce"] > 0
