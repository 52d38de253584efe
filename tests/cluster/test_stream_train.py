"""het train --stream: partitions landing while a job trains are each trained once, in order,
the last step sharing out the rows left; every batch scored before it trains."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from het.data.stream_synthetic import write_stream
from het.data.synthetic import SyntheticCriteoConfig
from jobs import het

pytestmark = pytest.mark.cluster


def test_partitions_landing_during_the_job_are_each_trained_once_and_scored_first(tmp_path):
    """Two workers of 256 rows a step; 5 partitions of 1,100 rows, the first two there at the
    start, one more every half second: 5,500 rows, not a multiple of 512: the last step shares
    out the rest. The job ends 1.5 s after the last partition."""
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
    assert stream["ended"] and not stream["skipped"] and s["steps"] == 11  # ceil(5,500 / 512)
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


@pytest.mark.slow  # two jobs, one killed: about 15 s
def test_a_stream_job_killed_and_resumed_trains_every_row_once(tmp_path):
    """kill -9 of the launcher while it waits for the stream's next partition, after a
    checkpoint; the job resumed from it goes on at the first row no checkpointed step trained:
    the rows trained over both runs are the rows in the files, and the resumed run scores (so
    trains) exactly the rows after the checkpoint's step."""
    import json
    import os
    import signal
    import time

    from het.train import checkpoint
    from jobs import alive

    out, cfg, ck = tmp_path / "parts", SyntheticCriteoConfig(cap=1000), tmp_path / "ck"
    write_stream(str(out), 3, 0, 1000, 0.05, cfg, say=lambda _: None)  # 3,000 rows: 11 steps of 256, 8 + 3
    flags = ["--stream", str(out / "part-*"), "--batch", "128", "--checkpoint", str(ck), "--checkpoint-every", "4"]
    first = subprocess.Popen([sys.executable, "-m", "het", "train", *flags, "--quiet", "--log-dir", str(tmp_path / "a")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pids = {}
    try:
        deadline = time.monotonic() + 120  # 3,000 rows hold 11 steps: the checkpoint of step 8, then it waits
        while (checkpoint.saved_step(str(ck)) or 0) < 8 and time.monotonic() < deadline and first.poll() is None:
            time.sleep(0.2)
        pids = json.load(open(tmp_path / "a" / "pids.json"))
        first.kill()  # kill -9 mid-stream: nothing flushed, nothing saved after step 8
        first.wait()
        deadline = time.monotonic() + 10  # a worker waiting for the stream leaves on SIGTERM too
        while any(alive(p) for p in pids.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [name for name, p in pids.items() if alive(p)]
    finally:
        first.kill()
        for p in pids.values():
            if alive(p):
                os.kill(p, signal.SIGKILL)
    saved = checkpoint.saved_step(str(ck))
    assert saved == 8 and left == []
    write_stream(str(out), 2, 0, 1000, 0.05, cfg, first=3, say=lambda _: None)  # the stream goes on meanwhile
    s = het("train", *flags, "--resume", str(ck), "--stream-idle", "1", "--json", "--quiet",
            "--log-dir", str(tmp_path / "b"))
    stream = s["stream"]
    assert stream["rows"] == 5000 and stream["rows_trained"] == 5000  # over both runs
    assert stream["progressive"]["rows"] == 5000 - saved * 2 * 128  # this run: the rows after step 8, once
    assert s["steps"] == 20 - saved  # ceil(5,000 / 256) steps in all
