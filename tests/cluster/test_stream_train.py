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
