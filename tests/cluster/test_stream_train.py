"""het train --stream: partitions landing while a job trains are each trained once, in order,
the last step sharing out the rows left; every batch scored before it trains."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from het.data.stream_synthetic import write_stream
from het.data.synthetic import SyntheticCriteoConfig
from jobs import het, write_csv

pytestmark = pytest.mark.cluster


def test_partitions_landing_during_the_job_are_each_trained_once_and_scored_first(tmp_path):
    """Two workers of 256 rows a step; 5 partitions of 1,100 rows, the first two there at the
    start, one more every half second: 5,500 rows, not a multiple of 512: a step that finds
    fewer rows than its 512 (training caught up with the stream) trains those and the next goes
    on past them. The job ends after waiting 1.5 s for a partition."""
    out, cfg = tmp_path / "parts", SyntheticCriteoConfig(cap=1000)
    write_stream(str(out), 2, 0, 1100, 0.05, cfg, say=lambda _: None)
    writer = threading.Thread(target=write_stream, args=(str(out), 3, 0.5, 1100, 0.05, cfg),
                              kwargs={"first": 2, "say": lambda _: None})
    writer.start()
    try:
        s = het("train", "--stream", str(out / "part-*"), "--stream-idle", "1.5", "--batch", "256", "--json",
                "--quiet", "--log-dir", str(tmp_path / "log"))
    finally:
        writer.join()
    stream = s["stream"]
    assert stream["partitions"] == 5 and stream["rows"] == 5500 and stream["rows_trained"] == 5500
    assert stream["ended"] and not stream["skipped"] and s["steps"] >= 11  # ceil(5,500 / 512), more when caught up
    scored = stream["progressive"]
    assert scored["rows"] == 5500 and [p["rows"] for p in scored["by_partition"]] == [1100] * 5
    assert [p["partition"].rsplit("/", 1)[1] for p in scored["by_partition"]] == [f"part-0000{i}" for i in range(5)]
    assert 0.5 < scored["auc"] < 1 and 0 < scored["logloss"] < 1
    assert "auc" not in s  # no test split: the stream's batches, scored before they train, are its evaluation


def test_a_stream_job_refuses_what_it_cannot_have_beside_it(tmp_path):
    from het.train.config import TrainConfig

    with pytest.raises(ValueError, match="stream is the job's data"):
        TrainConfig.from_dict({"stream": {"pattern": "p*"}, "data": "synthetic-criteo"})
    with pytest.raises(ValueError, match="scored batch by batch"):
        TrainConfig.from_dict({"stream": {"pattern": "p*"}, "eval_samples": 1000})
    out = subprocess.run([sys.executable, "-m", "het", "train", "--stream", str(tmp_path / "none-*"), "--stream-idle",
                          "0.5", "--quiet", "--log-dir", str(tmp_path / "log")], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and "no complete partition" in out.stderr and "Traceback" not in out.stderr
    (tmp_path / "in").mkdir()  # a first partition refused (its schema names a column it lacks): said at once
    write_csv(tmp_path / "in" / "part-0.csv", 50)
    (tmp_path / "schema.toml").write_text('label = "clicked"\ndense = ["price"]\nsparse = ["shop"]\n')
    out = subprocess.run([sys.executable, "-m", "het", "train", "--stream", str(tmp_path / "in" / "*.csv"),
                          "--stream-schema", str(tmp_path / "schema.toml"), "--stream-prepared", str(tmp_path / "p"),
                          "--quiet", "--log-dir", str(tmp_path / "log2")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "refused" in out.stderr and "sparse column(s) ['shop'] not found" in out.stderr


@pytest.mark.slow  # two jobs and an export: about 25 s
def test_online_training_keeps_up_with_a_drift_that_a_frozen_model_loses_to():
    """het bench stream, small: the planted model turns 0.4 rad a partition; after 3 partitions
    the frozen model scores worse partition by partition, the online one keeps learning."""
    from het.bench.stream import run

    r = run(partitions=6, frozen_after=3, rows=4000, drift=0.4, cap=1000, seed=0, extra=["--batch", "256"],
            say=lambda _: None)
    assert r["online_rows_trained"] == 24000 and r["frozen_rows_trained"] == 12000
    assert r["frozen_auc"][-1] < r["frozen_auc"][0] - 0.02  # the world moved away from the frozen model
    assert r["later"]["online"] > r["later"]["frozen"] and r["later"]["online_wins"] >= 2


@pytest.mark.slow  # two jobs, one killed: about 30 s each
@pytest.mark.parametrize("victim", ["launcher", "worker 1"])
def test_a_stream_job_killed_mid_partition_and_resumed_trains_every_row_once(tmp_path, victim):
    """kill -9 of the launcher, or of a worker (its job then stops), in the middle of a
    partition, after a checkpoint; the job resumed from it goes on at the first row no
    checkpointed step trained: the rows trained over both runs are the rows in the files, and
    the resumed run scores (so trains) exactly the rows after the checkpoint's."""
    import json
    import signal

    import torch

    from het.train import checkpoint
    from jobs import alive

    out, cfg, ck = tmp_path / "parts", SyntheticCriteoConfig(cap=1000), tmp_path / "ck"
    write_stream(str(out), 1, 0, 100_000, 0.05, cfg, say=lambda _: None)  # 391 steps of 256
    flags = ["--stream", str(out / "part-*"), "--batch", "128", "--checkpoint", str(ck), "--checkpoint-every", "20"]
    first = subprocess.Popen([sys.executable, "-m", "het", "train", *flags, "--quiet", "--log-dir", str(tmp_path / "a")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pids = {}
    try:
        deadline = time.monotonic() + 120
        while (checkpoint.saved_step(str(ck)) or 0) < 40 and time.monotonic() < deadline and first.poll() is None:
            time.sleep(0.05)
        pids = json.load(open(tmp_path / "a" / "pids.json"))
        if victim == "launcher":
            first.kill()  # nothing flushed, nothing saved after the checkpoint
        else:
            os.kill(pids[victim], signal.SIGKILL)  # the launcher sees it and stops the job
        first.wait(60)
        deadline = time.monotonic() + 10  # the others leave on SIGTERM, or on their group's loss
        while any(alive(p) for p in pids.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [name for name, p in pids.items() if alive(p)]
    finally:
        first.kill()
        for p in pids.values():
            if alive(p):
                os.kill(p, signal.SIGKILL)
    saved = checkpoint.saved_step(str(ck))
    trained = torch.load(ck / "worker.pt", weights_only=False)["stream"]["rows"]  # rows its steps trained
    assert left == [] and saved >= 40 and trained == saved * 2 * 128 < 100_000  # killed mid-partition
    write_stream(str(out), 2, 0, 1000, 0.05, cfg, first=1, say=lambda _: None)  # the stream goes on meanwhile
    s = het("train", *flags, "--resume", str(ck), "--stream-idle", "1", "--json", "--quiet",
            "--log-dir", str(tmp_path / "b"))
    stream = s["stream"]
    assert stream["rows"] == 102_000 and stream["rows_trained"] == 102_000  # over both runs
    scored = stream["progressive"]  # this run scored (so trained) the rows after the checkpoint's, once
    assert scored["rows_this_run"] == 102_000 - trained and scored["rows"] == 102_000  # with the first run's
    assert [p["rows"] for p in scored["by_partition"]] == [100_000, 1000, 1000]  # the first split across the runs


def test_a_stream_job_publishes_what_it_trained_while_it_waits_for_the_next_partition(tmp_path):
    """--publish beside --stream: when training catches up with the stream, every cache is
    flushed and a version of every row trained is published at once (the publish interval here
    is a minute: no version comes from it), so a follower serves a partition before the next
    one lands; the last version holds every row."""
    from het.bench.landing import _rows
    from het.bench.serve import _instances
    from het.online.follow import newest_base, scan

    out, cfg, pub = tmp_path / "parts", SyntheticCriteoConfig(cap=1000), tmp_path / "pub"
    write_stream(str(out), 2, 0, 1000, 0.05, cfg, say=lambda _: None)
    seen, scores = [], []  # (version, stream rows) of each version there when the third partition lands; scores of the first

    def land_later():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(_rows(str(pub), v) for v in scan(str(pub))[1]):
            time.sleep(0.1)
        seen.extend((v, _rows(str(pub), v)) for v in scan(str(pub))[1])
        write_stream(str(out), 1, 0, 1000, 0.05, cfg, first=2, say=lambda _: None)  # at once: the job waits 3 s
        empty = newest_base(str(pub)).model  # the first base: before any push, a table of no rows
        rows = _instances(empty, 8)
        scores.append(empty.predict({k: [r[k] for r in rows] for k in rows[0]}))

    writer = threading.Thread(target=land_later)
    writer.start()
    try:
        s = het("train", "--stream", str(out / "part-*"), "--stream-idle", "3", "--batch", "100", "--publish",
                str(pub), "--publish-every", "60", "--ps-stats-every", "0.2", "--tensorboard-every", "5", "--json",
                "--quiet", "--log-dir", str(tmp_path / "log"))
    finally:
        writer.join()
    assert s["stream"]["rows_trained"] == 3000 and s["steps"] == 15
    assert seen and max(rows for _, rows in seen) == 2000  # the first two partitions, served before the third
    assert len(scores) == 1 and np.all((scores[0] > 0) & (scores[0] < 1))
    bases, deltas = scan(str(pub))
    assert s["published"]["version"] == max(bases + deltas) and _rows(str(pub), max(bases + deltas)) == 3000
    assert s["published"]["consistency"] == "bounded"
    # the rolling window of the rows scored last, in the summary and the timeline (what the shards report)
    window = s["stream"]["progressive"]["window"]
    assert window["rows"] == 3000 and abs(window["auc"] - s["stream"]["progressive"]["auc"]) < 1e-9
    assert any("progressive" in e for e in s["timeline"])
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "log" / "tensorboard"))
    events.Reload()
    auc = events.Scalars("stream/auc_window")
    assert [e.step for e in auc] == [5, 10, 15] and all(0 < e.value < 1 for e in auc)
    assert [e.step for e in events.Scalars("stream/logloss_window")] == [5, 10, 15]


def test_a_stream_resumed_with_another_batch_goes_on_at_its_row_and_skips_a_late_partition(tmp_path):
    """The checkpoint holds the partitions taken and the rows trained: a job resumed from it with
    another batch size trains from the next row, and a partition that landed meanwhile ahead of
    a taken one in path order is skipped, not slipped in (its rows would shift every later row)."""
    out, cfg, ck = tmp_path / "parts", SyntheticCriteoConfig(cap=1000), tmp_path / "ck"
    write_stream(str(out), 2, 0, 1000, 0.05, cfg, say=lambda _: None)
    first = het("train", "--stream", str(out / "part-*"), "--stream-idle", "0", "--batch", "128", "--checkpoint",
                str(ck), "--json", "--quiet", "--log-dir", str(tmp_path / "a"))
    assert first["stream"]["rows_trained"] == 2000
    late = tmp_path / "late"
    write_stream(str(late), 1, 0, 1000, 0.05, cfg, first=0, say=lambda _: None)  # part-00000 of another stream
    os.rename(late / "part-00000", out / "part-00000a")  # sorts between the two taken
    write_stream(str(out), 1, 0, 1000, 0.05, cfg, first=2, say=lambda _: None)
    s = het("train", "--stream", str(out / "part-*"), "--stream-idle", "1", "--batch", "100", "--resume", str(ck),
            "--json", "--quiet", "--log-dir", str(tmp_path / "b"))
    stream = s["stream"]
    assert stream["partitions"] == 3 and stream["rows"] == 3000 and stream["rows_trained"] == 3000
    assert stream["progressive"]["rows_this_run"] == 1000 and s["steps"] == 5  # the third partition's rows, once
    scored = stream["progressive"]  # over both runs: the first run's partitions kept by the checkpoint
    assert scored["rows"] == 3000 and [p["rows"] for p in scored["by_partition"]] == [1000] * 3
    assert [p["auc"] for p in scored["by_partition"][:2]] == [p["auc"] for p in first["stream"]["progressive"][
        "by_partition"]]
    assert list(stream["skipped"]) == [str(out / "part-00000a")] and "out of order" in stream["skipped"][
        str(out / "part-00000a")]


def test_a_stream_of_csv_files_trains_and_its_export_scores_raw_rows(tmp_path):
    """CSV files renamed into place, one landing during the job: each prepared as taken (the
    columns inferred from the first), trained once; the export of the checkpoint reads raw
    values with the first partition's transforms."""
    from het.export import load_model

    out, ck, ex = tmp_path / "in", tmp_path / "ck", tmp_path / "ex"
    out.mkdir()
    for i in range(2):
        write_csv(tmp_path / f"{i}.csv", 600, seed=i)
        os.rename(tmp_path / f"{i}.csv", out / f"part-{i}.csv")

    def land_later():
        time.sleep(1.0)
        write_csv(tmp_path / "2.csv", 600, seed=2)
        os.rename(tmp_path / "2.csv", out / "part-2.csv")

    writer = threading.Thread(target=land_later)
    writer.start()
    try:
        s = het("train", "--stream", str(out / "part-*.csv"), "--stream-idle", "3", "--stream-prepared",
                str(tmp_path / "prepared"), "--batch", "50", "--checkpoint", str(ck), "--json", "--quiet",
                "--log-dir", str(tmp_path / "log"))
    finally:
        writer.join()
    assert s["stream"]["partitions"] == 3 and s["stream"]["rows_trained"] == 1800 and not s["stream"]["skipped"]
    assert s["stream"]["progressive"]["by_partition"][2]["auc"] > 0.6  # price tells the label
    het("export", str(ck), str(ex), "--json")
    model = load_model(str(ex))
    scores = model.predict({"price": [-2.0, 2.0], "city": ["paris", "nowhere"], "ad": ["ad1", "ad7"]})
    assert np.all((scores > 0) & (scores < 1)) and scores[1] > scores[0]


@pytest.mark.slow  # about 40 s
def test_a_stream_job_whose_worker_dies_re_forms_at_its_rows(tmp_path):
    """--max-restarts: a worker killed -9 mid-partition, the workers re-form from the dense
    snapshot while the shards serve on, and go on at that snapshot's row, a short step before
    it included (the rows of a step are not a function of the step alone once training caught
    up with the stream): every row trained, the re-formed group scoring exactly those after it."""
    import json
    import signal

    from het.train import checkpoint

    out, cfg, ck = tmp_path / "parts", SyntheticCriteoConfig(cap=1000), tmp_path / "ck"
    write_stream(str(out), 1, 0, 1000, 0.05, cfg, say=lambda _: None)  # 3 steps of 256 and a short one of 232

    def land_later():  # once the job caught up (a second after step 2's checkpoint: steps take ms), a long one
        deadline = time.monotonic() + 120
        while (checkpoint.saved_step(str(ck)) or 0) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1)
        write_stream(str(out), 1, 0, 100_000, 0.05, cfg, first=1, say=lambda _: None)

    writer = threading.Thread(target=land_later)
    writer.start()
    log = tmp_path / "log"
    job = subprocess.Popen([sys.executable, "-m", "het", "train", "--stream", str(out / "part-*"), "--stream-idle",
                            "5", "--batch", "128", "--checkpoint", str(ck), "--checkpoint-every", "2",
                            "--max-restarts", "2", "--dense-snapshot-s", "0.5", "--json", "--quiet", "--log-dir",
                            str(log)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while (checkpoint.saved_step(str(ck)) or 0) < 60 and time.monotonic() < deadline and job.poll() is None:
            time.sleep(0.05)
        os.kill(json.load(open(log / "pids.json"))["worker 1"], signal.SIGKILL)
        out_text, err = job.communicate(timeout=300)
    finally:
        job.kill()
        writer.join()
    assert job.returncode == 0, err[-3000:]
    s = json.loads(out_text.strip().splitlines()[-1])
    assert s["worker_restarts"] == 1 and 60 <= s["rejoined_at_step"]
    assert s["stream"]["rows"] == 101_000 and s["stream"]["rows_trained"] == 101_000
    at = 1000 + (s["rejoined_at_step"] - 4) * 256  # the snapshot's row: four steps took the first 1,000
    assert s["stream"]["progressive"]["rows_this_run"] == 101_000 - at


@pytest.mark.slow  # a job, its server and five partitions: about 40 s
def test_het_bench_landing_serves_each_partition_after_it_lands():
    """het bench landing, small: every partition landing during the job is served, each by a
    version holding its last row, within seconds here (a poll, a pass, a flush and a delta)."""
    from het.bench.landing import run

    r = run(partitions=5, every_s=4.0, rows=3000, drift=0.05, extra=["--workers", "1", "--dim", "16"],
            say=lambda _: None)
    assert r["rows_trained"] == 15000 and r["landing_to_served_s"]["never"] == 0
    assert r["measured"] >= 2 and r["measured"] + len(r["before_serving_s"]) == 5
    assert 0 < r["landing_to_served_s"]["max"] < 4.0  # before the next partition lands
    assert r["scores_moved"] > 0 and r["published"]["consistency"] == "bounded"
    assert sorted(rows for _, rows in r["served_at_s"].values() if rows is not None)[-1] == 15000
