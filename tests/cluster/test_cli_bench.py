"""`het bench`'s commands through the CLI: their JSON contracts, on tiny inputs."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from het.cache.cache import EmbeddingCache
from het.config import CacheConfig, TableConfig
from het.data.zipf import zipf_keys

pytestmark = pytest.mark.cluster


def het(*args, timeout=300):
    out = subprocess.run([sys.executable, "-m", "het", *args], capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr
    return out.stdout


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def in_process_misses(trace: np.ndarray, batch: int, capacity: int, policy: str) -> tuple[int, int]:
    """Misses and lookups of het's cache (32 ways, as the bench) driven here over ``trace`` cut
    into de-duplicated steps of ``batch`` keys."""
    cache = EmbeddingCache(TableConfig("t", rows=int(trace.max()) + 1, dim=4),
                           CacheConfig(capacity=capacity, policy=policy, ways=32))
    for i in range(0, len(trace), batch):
        cache.lookup(torch.unique(torch.from_numpy(trace[i:i + batch])))
    return cache.counters["misses"], cache.counters["lookups"]


def test_bench_cache_on_a_trace_file(tmp_path):
    """The miss rate printed is the in-process cache's on the same trace, policy and capacity."""
    trace = np.random.default_rng(0).zipf(1.3, 20_000).astype(np.int64) % 5000
    np.save(tmp_path / "trace.npy", trace)
    result = last_json(het("bench", "cache", "--trace", str(tmp_path / "trace.npy"), "--batch", "512",
                           "--capacity", "400", "--policy", "lru", "--dim", "16", "--belady", "--json"))
    misses, lookups = in_process_misses(trace, 512, 400, "lru")
    assert (result["misses"], result["lookups"]) == (misses, lookups)
    assert result["miss_rate"] == pytest.approx(misses / lookups, abs=1e-12) and 0 < result["miss_rate"] < 1
    assert result["keys_per_s"] > 0
    assert 0 < result["belady_miss_rate"] <= result["miss_rate"]
    assert 1 - result["static_oracle_hit_rate"] <= result["miss_rate"] + 0.05
    batches = [np.unique(trace[i:i + 512]).size for i in range(0, trace.size, 512)]
    assert result["lookups"] == sum(batches)


def test_bench_cache_on_a_zipf_stream():
    """The generated stream is zipf_keys(keys, alpha, batch * batches, seed): the miss rate printed
    is the in-process cache's on that stream."""
    result = last_json(het("bench", "cache", "--alpha", "1.05", "--keys", "20000", "--capacity-frac", "0.1",
                           "--policy", "lfu", "--dim", "8", "--batches", "20", "--batch", "256", "--json"))
    assert result["capacity"] == 2000 and result["policy"] == "lfu"
    misses, lookups = in_process_misses(zipf_keys(20000, 1.05, 256 * 20, seed=0), 256, 2000, "lfu")
    assert (result["misses"], result["lookups"]) == (misses, lookups)
    assert result["miss_rate"] == pytest.approx(misses / lookups, abs=1e-12) and 0 < result["miss_rate"] < 1


def test_bench_cache_rejects_a_float_trace(tmp_path):
    np.save(tmp_path / "bad.npy", np.zeros(10))
    out = subprocess.run([sys.executable, "-m", "het", "bench", "cache", "--trace", str(tmp_path / "bad.npy"),
                          "--batch", "4", "--capacity", "2", "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "expected a 1-D integer array of keys, got float64" in out.stderr


@pytest.mark.slow  # about 19 s
def test_bench_ps_reports_both_bandwidths():
    result = last_json(het("bench", "ps", "--json", "--seconds", "0.3", "--rows", "2000", "--batch", "256",
                           "--curve", "--dynamic", "--rounds", "2"))
    assert result["rows_per_s"] > 0 and result["bytes_per_s"] > 0 and result["zmq_bytes_per_s"] > 0
    assert 0 < result["curve_fraction"] == result["zmq_curve_bytes_per_s"] / result["zmq_bytes_per_s"]
    # the dynamic shard held every row, and beside each its clock and last step (8 B), its key (8 B)
    # and the index's share: 16 B in the reference's runs, 5 B a bucket in the native hash table
    # fixed and dynamic measured in turn: the median of the rounds' ratios, the last round's
    # dynamic figures
    fractions = result["dynamic_fractions"]
    assert len(fractions) == 2 and min(fractions) > 0
    assert result["dynamic_fraction"] == sum(fractions) / 2
    besides = result["dynamic_shard_bytes"] / 2000 - 4 * 128
    assert 16 + 5 < besides <= 32, besides
    # where a step goes: the shard's handling and the client's waits are parts of the step
    assert 0 < result["shard_busy_ms_per_step"] < result["ms_per_step"]
    assert 0 < result["wait_pull_ms_per_step"] + result["wait_push_ms_per_step"] < result["ms_per_step"]
    assert result["client_cpu_ms_per_step"] > 0 and result["shard_cpu_ms_per_step"] > 0
    # the CPU bound: the round trip's time over the step's least time on these cores
    assert result["cpu_ms_per_step"] == result["client_cpu_ms_per_step"] + result["shard_cpu_ms_per_step"]
    assert result["cpu_bound_ps_fraction"] == pytest.approx(
        result["zmq_ms_per_round_trip"] * result["cores"] / result["cpu_ms_per_step"])
    assert result["zmq_client_cpu_ms_per_round_trip"] > 0 and result["zmq_echo_cpu_ms_per_round_trip"] > 0
    assert result["zmq_ms_per_round_trip"] * result["zmq_round_trips"] >= 1e3 * 0.3  # it ran --seconds at least
    # the step's CPU over raw ZeroMQ's, of one round trip and of the step's own two messages
    assert result["cpu_over_zmq"] == pytest.approx(result["cpu_ms_per_step"] / result["zmq_cpu_ms_per_round_trip"])
    # the PS and raw ZeroMQ in turn, round by round: the figures are the median round's
    assert len(result["cpu_over_zmq_rounds"]) == 2 and result["cpu_over_zmq"] in result["cpu_over_zmq_rounds"]
    assert result["zmq_pull_push_cpu_ms_per_step"] > 0
    assert result["cpu_over_zmq_pull_push"] == result["cpu_ms_per_step"] / result["zmq_pull_push_cpu_ms_per_step"]
    assert "exchanges" not in result and "dynamic_exchanges" not in result
    # of each process's CPU, the thread making or answering requests: a part of it
    for main, whole in (("client_main_cpu_ms_per_step", "client_cpu_ms_per_step"),
                        ("shard_main_cpu_ms_per_step", "shard_cpu_ms_per_step"),
                        ("zmq_client_main_cpu_ms_per_round_trip", "zmq_client_cpu_ms_per_round_trip"),
                        ("zmq_echo_main_cpu_ms_per_round_trip", "zmq_echo_cpu_ms_per_round_trip")):
        assert 0 < result[main] <= result[whole], (main, result[main], result[whole])


def test_demo_trains_against_a_shard_process_and_reports_its_hit_rate():
    result = last_json(het("demo", "--steps", "60", "--batch", "256", "--json"))
    assert result["steps"] == 60 and result["hit_rate"] > 0.2
    assert 0.5 < result["auc"] <= 1 and result["planted_auc"] > result["auc"] - 0.05


@pytest.mark.parametrize("args, message", [
    (["train", "--mode", "fast"], "argument --mode: expected one of het, hybrid, ps, got 'fast'"),
    (["train", "--config", "/nonexistent/job.toml"], "No such file or directory: '/nonexistent/job.toml'"),
    (["train", "--model", "graphsage", "--data", "synthetic-criteo"], "model 'graphsage' takes data"),
    (["train", "--staleness", "-3"], "expected an integer >= 0 or 'inf'"),
])
def test_bad_training_input_gets_a_clear_error_and_no_traceback(args, message):
    out = subprocess.run([sys.executable, "-m", "het", *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr


def test_bench_profile_ranks_a_workers_functions_per_step():
    result = last_json(het("bench", "profile", "--steps", "6", "--warmup", "2", "--top", "4", "--dim", "8",
                           "--batch", "64", "--synthetic-cap", "2000", "--cache-lookahead", "3", "--json"))
    assert result["bench"] == "profile" and result["steps"] == 6 and result["config"]["cache.lookahead"] == 3
    assert result["s_per_step"] > 0 and result["flush_s"] > 0 and 0 < result["hit_rate"] < 1
    # after the window: the 3 steps that push idle rows and the last one, timed apart
    assert result["tail_steps"] == 4 and result["tail_s_per_step"] > 0
    for key in ("tottime", "cumtime"):
        rows = result[f"by_{key}"]
        assert len(rows) == 4
        times = [r[f"{key}_ms_per_step"] for r in rows]
        assert times == sorted(times, reverse=True) and times[0] > 0
    # the whole step is under the train loop, so it leads the cumulative ranking
    assert result["by_cumtime"][0]["function"].startswith("het/train/loop.py")
    # het's share: part of the step, the in-process shard's answers part of het's
    assert 0 < result["shard_ms_per_step"] < result["het_ms_per_step"] < 1e3 * result["s_per_step"]
    assert 0 < result["worker_het_fraction"] < result["het_fraction"] < 1


def test_bench_profile_says_so_when_the_job_stops_before_its_window_ends():
    out = subprocess.run([sys.executable, "-m", "het", "bench", "profile", "--steps", "50", "--warmup", "2",
                          "--time-limit-s", "0.01", "--dim", "8", "--batch", "64", "--synthetic-cap", "2000"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "before the 52 the profile needs (warm-up 2, then 50)" in out.stderr


def test_bench_profile_refuses_zero_steps():
    out = subprocess.run([sys.executable, "-m", "het", "bench", "profile", "--steps", "0"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode != 0 and "steps >= 1" in out.stderr


@pytest.mark.slow  # the floor's model: tests/unit/test_bench_floor.py
def test_bench_floor_times_the_plain_model_and_het_in_turn():
    r = last_json(het("bench", "floor", "--steps", "10", "--rounds", "1", "--dim", "8", "--batch",
                      "64", "--synthetic-cap", "2000", "--json"))
    assert r["steps"] == 10 and r["batch"] == 64 and len(r["floor_ms_per_step"]) == len(r["het_ms_per_step"]) == 1
    assert r["floor_ms_per_step"][0] > 0 and r["het_ms_per_step"][0] > 0
    assert r["median_ratio"] == pytest.approx(r["floor_ms_per_step"][0] / r["het_ms_per_step"][0])
