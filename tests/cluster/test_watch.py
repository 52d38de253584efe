"""Watching a job while it runs: a shard's Prometheus metrics, a job's TensorBoard scalars."""

import re
import urllib.request

import numpy as np
import pytest
import torch
import conftest

from het import CacheConfig, Embedding, OptimizerConfig, PSClient, ServerProcess, ShardConfig, TableConfig
from het.ps.protocol.messages import PSError
from jobs import het

pytestmark = pytest.mark.cluster

TABLE = TableConfig("t", rows=1000, dim=4, optimizer=OptimizerConfig("adagrad", lr=0.1))
SMALL = ["--dim", "8", "--batch", "64", "--synthetic-cap", "2000", "--eval-samples", "4096"]


def scrape(url: str) -> dict[str, float]:
    """Every sample of a /metrics page: ``{'name{labels}': value}``."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def test_a_shards_metrics_move_while_it_serves(tmp_path):
    with ServerProcess(ShardConfig((TABLE,)), log_path=str(tmp_path / "shard.log"), metrics_port=0) as server:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/metrics", server.metrics_url)
        before = scrape(server.metrics_url)
        assert not any(k.startswith("het_shard_requests_total") for k in before)  # nothing asked yet
        client = PSClient.connect([server.address])
        emb = Embedding(tables=TABLE, client=client, cache=CacheConfig(capacity=64, staleness=0))
        for step in range(20):
            keys = torch.randint(0, 1000, (50,), generator=torch.Generator().manual_seed(step))
            emb(keys).sum().backward()
            emb.push_due()
        emb.flush()
        conftest.raw_request(server.address, [b"\x00\x01garbage"])  # refused, counted, the shard goes on
        client.stats()  # a request after the refusal: the shard still serves
        after = _until(server.metrics_url, lambda m: m.get('het_shard_refusals_total{reason="errors"}', 0) >= 1)
        pushes = sum(v for k, v in after.items() if k.startswith("het_shard_requests_total{op=\"push"))
        assert pushes >= 20
        assert after['het_shard_table_rows{table="t"}'] == TABLE.rows
        assert after["het_shard_rows_in_total"] > before.get("het_shard_rows_in_total", 0)
        assert after["het_shard_bytes_in_total"] > before["het_shard_bytes_in_total"]
        assert after['het_shard_refusals_total{reason="errors"}'] == 1
        assert after["het_shard_sessions"] >= 1 and after["het_shard_rss_bytes"] > 10 << 20
        latency = {k: v for k, v in after.items() if k.startswith("het_shard_request_seconds_count")}
        assert sum(latency.values()) >= pushes and 'het_shard_request_seconds_count{op="undecoded"}' in latency
        # a job's own figures ride on its STATS (a stream's progressive AUC): kept, served, replaced
        client.stats(report={"stream_auc_window": 0.75, "stream_logloss_window": 0.5})
        reported = _until(server.metrics_url, lambda m: m.get("het_job_stream_auc_window") == 0.75)
        assert reported["het_job_stream_auc_window"] == 0.75 and reported["het_job_stream_logloss_window"] == 0.5
        with pytest.raises(PSError, match="meta\\['report'\\] must map"):
            client.stats(report={"stream auc": float("nan")})
        client.stats(report={"stream_auc_window": 0.8})
        assert _until(server.metrics_url, lambda m: m.get("het_job_stream_auc_window") == 0.8)[
            "het_job_stream_auc_window"] == 0.8
        client.close()


def _until(url: str, done, timeout_s: float = 10.0) -> dict:
    """Scrape until ``done(samples)``: the shard hands its STATS over at most once a second."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        samples = scrape(url)
        if done(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.2)


@pytest.mark.slow  # about 13 s
def test_a_jobs_tensorboard_has_every_scalar_every_ten_steps(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    summary = het("train", "--steps", "60", "--workers", "2", *SMALL, "--eval-curve", "20", "--json", "--quiet",
                  "--log-dir", str(tmp_path))
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    trained = {"train/loss", "train/samples_per_s", "cache/hit_rate", "cache/stale_refreshes", "cache/evictions",
               "cache/drift", "bytes_per_sample/sparse_pull", "bytes_per_sample/sparse_push",
               "bytes_per_sample/sync", "bytes_per_sample/dense", "time/wait_ps_s", "time/allreduce_s",
               "time/compute_s", "ps/rows", "ps/rows_in_memory", "ps/rows_on_disk", "ps/disk_bytes",
               "ps/rss_bytes", "ps/wal_log_bytes"}
    assert trained <= tags, trained - tags
    for tag in trained - {"cache/drift"}:  # drift: at the points where some row was refreshed
        assert [e.step for e in events.Scalars(tag)] == list(range(10, 61, 10)), tag
    assert [e.step for e in events.Scalars("eval/auc")] == [20, 40, 60]
    assert events.Scalars("eval/auc")[-1].value == pytest.approx(summary["auc"])
    assert np.isfinite([e.value for e in events.Scalars("train/loss")]).all()
    assert all(0 < e.value <= 1 for e in events.Scalars("cache/hit_rate"))
    assert all(e.value > 0 for e in events.Scalars("ps/rows"))
