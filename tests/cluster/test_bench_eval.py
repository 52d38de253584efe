"""`het bench staleness` and `het bench scale`: their JSON contracts and sanity, on tiny jobs
(local clusters on 127.0.0.1, a few seconds a run)."""

import json
import math
import os
import subprocess
import sys

import pytest

from het.bench import scale, staleness

pytestmark = pytest.mark.cluster

TINY = """dim = 8
batch = 64
eval_samples = 4096
[synthetic]
cap = 2000
"""


def het(*args, timeout=300):
    out = subprocess.run([sys.executable, "-m", "het", *args], capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return str(path)


@pytest.mark.slow  # about 24 s
def test_bench_staleness_reports_auc_per_bound_beside_the_planted_auc(tiny, tmp_path):
    r = het("bench", "staleness", "--config", tiny, "--stalenesses", "0,inf", "--steps", "20", "--workers", "2",
            "--log-dir", str(tmp_path / "logs"), "--json")
    assert r["bench"] == "staleness" and r["config"]["workers"] == 2 and r["config"]["steps"] == 20
    assert [x["staleness"] for x in r["results"]] == [0, "inf"]
    for x in r["results"]:
        assert set(x) == {"staleness", *staleness.RESULT_KEYS}
        assert 0 < x["auc"] < 1 and 0 < x["planted_auc"] < 1 and x["logloss"] > 0
        assert x["samples"] == 20 * 64 * 2 and 0 <= x["hit_rate"] <= 1 and x["samples_per_s"] > 0
    assert r["results"][0]["planted_auc"] == r["results"][1]["planted_auc"]  # one held-out set
    assert sorted(os.listdir(tmp_path / "logs")) == ["s0", "sinf"]
    table = staleness.format_table(r)
    assert "planted" in table and "inf" in table


@pytest.mark.slow  # about 25 s
def test_bench_scale_measures_checks_and_projects(tiny, tmp_path):
    """Two runs: W0 = 2 workers at dims 8 and 16 (prediction at other measured W is unit-tested)."""
    r = het("bench", "scale", "--config", tiny, "--workers", "2", "--modes", "het:100", "--dims", "8,16",
            "--steps", "20", "--project-workers", "1,2,4,8,32", "--project-dims", "8,16,64",
            "--project-bandwidths", "none,1gbit", "--dim-workers", "4", "--log-dir", str(tmp_path), "--json")
    assert r["bench"] == "scale" and r["cores"] == os.cpu_count() and "CPU" in r["note"]
    assert [(m["workers"], m["dim"]) for m in r["measured"]] == [(2, 8), (2, 16)]
    assert all(m["cpu_bound"] == (m["workers"] * m["threads"] > r["cores"]) for m in r["measured"])
    w0, params = r["reference_workers"], r["model"]["params"]["het:100"]
    assert w0 == 2 and params["dims_measured"] == [8, 16] and "t(W)" in r["model"]["formula"]

    # the check: measured beside predicted at the measured W (the model at the measured link)
    assert [(c["workers"], c["reference"]) for c in r["check"]] == [(2, True)]
    c = r["check"][0]
    assert c["rel_error"] == pytest.approx((c["predicted_samples_per_s"] - c["measured_samples_per_s"])
                                           / c["measured_samples_per_s"])
    free_w0 = next(p for p in r["projected"] if p["sweep"] == "workers" and p["bandwidth"] == "none"
                   and p["workers"] == 2)
    assert c["predicted_uncontended_samples_per_s"] == pytest.approx(free_w0["samples_per_s"])

    # the projection is the formula, recomputed here from the published parameters
    rows = [p for p in r["projected"] if p["sweep"] == "workers"]
    assert len(rows) == 2 * 5 and len([p for p in r["projected"] if p["sweep"] == "dim"]) == 2 * 3
    for p in rows:
        rate = math.inf if p["bandwidth"] == "none" else 1.25e8
        w, d = p["workers"], p["dim"]
        line = {k: max(0.0, params[k]["a"] + params[k]["b"] * d) for k in scale.FIELDS}
        ring = 2 * (w - 1) / w
        b = line["ps_bytes_per_worker_step"]
        t = (line["t_compute_s"] + line["ps_overhead_s"] + ring * line["allreduce_overhead_s_per_ring"]
             + max(b / rate, w * b / rate) + ring * 4 * p["dense_params"] / rate)
        assert p["step_s"] == pytest.approx(t) and p["samples_per_s"] == pytest.approx(w * 64 / t)
    free = [p["samples_per_s"] for p in rows if p["bandwidth"] == "none" and p["workers"] >= 2]
    assert free == sorted(free) and free[0] < free[-1]  # more workers, more samples/s on a free link
    by = {(p["bandwidth"], p["workers"]): p["samples_per_s"] for p in rows}
    assert all(by["1gbit", w] < by["none", w] for w in (1, 2, 4, 8, 32))
    assert "projected samples/s by workers" in scale.format_report(r)


@pytest.mark.slow  # about 14 s
def test_the_latency_variable_reaches_every_worker_of_a_local_cluster(tmp_path):
    """At s = 0 (no prefetch) every step waits for a PS round trip: 2 x 25 ms at least."""
    env = dict(os.environ, HET_PS_LATENCY_MS="25")
    out = subprocess.run([sys.executable, "-m", "het", "train", "--steps", "20", "--workers", "1", "--dim", "8",
                          "--batch", "64", "--synthetic-cap", "2000", "--eval-samples", "0", "--staleness", "0",
                          "--quiet", "--json", "--log-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["wall_s"] >= 20 * 2 * 0.025


@pytest.mark.parametrize("args, message", [
    (["staleness", "--stalenesses", "0,soon"], "got 'soon' in '0,soon'"),
    (["scale", "--workers", "0,2"], "--workers expects comma-separated positive integers"),
    (["scale", "--modes", "het,fast"], "expected a mode hybrid, ps or het[:STALENESS], got 'fast'"),
    (["scale", "--project-bandwidths", "none,fast"], "bandwidth 'fast' is not a rate tc understands"),
])
def test_bad_bench_input_gets_a_clear_error_before_anything_runs(args, message):
    out = subprocess.run([sys.executable, "-m", "het", "bench", *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr
