"""The projection model of ``het bench scale`` and the parsers of the evaluation benches, on
made-up measurements: no processes."""

import math

import pytest
import torch

from het.bench import scale
from het.dist.dense import DENSE_ROW, PSDense, dense_table, ps_dense_bytes
from het.ps.local import local_client
from het.staleness import parse_stalenesses
from het.train.config import TrainConfig
from het.train.tasks import dense_params, make_task


def fake_run(mode="het:100", workers=2, dim=16, steps=100, wall_s=2.0, split=(0.6, 0.3, 0.1), bps=1000.0,
             batch=64):
    compute, wait, allreduce = split
    return {"mode": mode, "workers": workers, "dim": dim, "steps": steps, "wall_s": wall_s, "batch": batch,
            "time_split": {"compute": compute, "wait_ps": wait, "allreduce": allreduce},
            "sparse_bytes_per_sample": bps, "samples_per_s": workers * batch * steps / wall_s}


def test_the_fit_point_reproduces_its_measurement_over_loopback():
    run = fake_run()
    params = scale.mode_params([run], math.inf, servers=1, dense={16: 5000})
    p = scale.predict("het", params, 2, 16, math.inf, 5000)
    assert p["samples_per_s"] == pytest.approx(run["samples_per_s"])
    assert p["compute_s"] == pytest.approx(0.6 * 2.0 / 100)
    # at W = 1 the AllReduce term vanishes; beyond W0 it grows by ring(W) / ring(W0)
    t1, t8 = (scale.predict("het", params, w, 16, math.inf, 5000)["step_s"] for w in (1, 8))
    assert t1 == pytest.approx(0.9 * 0.02) and t8 == pytest.approx(0.9 * 0.02 + 0.1 * 0.02 * scale.ring(8))


def test_the_wire_terms_follow_the_formula():
    run = fake_run(split=(0.9, 0.1, 0.0), workers=1)  # W0 = 1: no AllReduce measured
    rate, params_count = 1.25e8, 100_000
    params = scale.mode_params([run], math.inf, servers=2, dense={16: params_count})
    t_c, o_ps, b = 0.9 * 0.02, 0.1 * 0.02, 1000.0 * 64
    for w in (1, 2, 4, 32):
        expected = t_c + o_ps + max(b / rate, w * b / (2 * rate)) + 2 * (w - 1) / w * 4 * params_count / rate
        got = scale.predict("hybrid", params, w, 16, rate, params_count)
        assert got["step_s"] == pytest.approx(expected)
        assert got["samples_per_s"] == pytest.approx(w * 64 / expected)
    # mode ps: no AllReduce, the dense table rides the PS link
    ps_params = scale.mode_params([{**run, "mode": "ps"}], math.inf, servers=2, dense={16: params_count})
    ps_bytes = b + ps_dense_bytes(params_count)
    assert ps_params["ps_bytes_per_worker_step"]["a"] == pytest.approx(ps_bytes)
    assert scale.predict("ps", ps_params, 4, 16, rate, params_count)["step_s"] == pytest.approx(
        t_c + o_ps + 4 * ps_bytes / (2 * rate))


def test_quantities_are_rising_lines_in_the_dim():
    runs = [fake_run(dim=16, wall_s=2.0, bps=1000), fake_run(dim=64, wall_s=4.0, bps=3000)]
    params = scale.mode_params(runs, math.inf, servers=1, dense={16: 1, 64: 1})
    assert scale.at(params["ps_bytes_per_worker_step"], 40) == pytest.approx(2000 * 64)
    assert scale.at(params["t_compute_s"], 112) == pytest.approx(0.6 * 6.0 / 100)  # extrapolated
    noisy = scale.mode_params([fake_run(dim=16, wall_s=3.0), fake_run(dim=64, wall_s=2.0)],
                              math.inf, servers=1, dense={16: 1, 64: 1})
    assert noisy["t_compute_s"]["b"] == 0 and noisy["t_compute_s"]["a"] == pytest.approx(0.6 * 2.5 / 100)


def test_contention_counts_worker_threads_against_the_cores(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert [scale.contention(w, 1, cores=2) for w in (1, 2, 3, 4)] == [1.0, 1.0, 1.5, 2.0]
    assert scale.contention(4, 1, cores=16) == 1.0  # 3 threads each: 12 <= 16


def test_dense_params_match_the_model_the_worker_trains():
    cfg = TrainConfig(dim=8, synthetic={"cap": 2000})
    model = make_task(cfg).build_model(torch.nn.Embedding(1, 8))
    model.embedding = torch.nn.Identity()
    assert dense_params(cfg) == sum(p.numel() for p in model.parameters())


def test_dense_ps_bytes_match_what_mode_ps_counts():
    model = torch.nn.Sequential(torch.nn.Linear(30, 20), torch.nn.Linear(20, 1))
    numel = sum(p.numel() for p in model.parameters())
    dense = PSDense(model, local_client([dense_table(numel, 0.1)]), world=1, rank=0)
    dense.before_forward()
    model(torch.zeros(2, 30)).sum().backward()
    dense.after_backward()
    rows = -(-numel // DENSE_ROW)
    # both ways the rows' floats and their keys (0, 1, ...: delta-coded, a byte each past the first's 0);
    # the first step's clocks (0) and counts (1) in a byte each, the built marks a bit each
    built_bits = -(-rows // 8)
    assert rows > 1 and dense.counters()["dense"] == rows * (2 * 4 * DENSE_ROW + 2 * 1 + 1 + 1) + built_bits
    assert ps_dense_bytes(numel) == rows * (2 * 4 * DENSE_ROW + 2 * 1 + 2 + 1) + built_bits  # clocks past 255 take two


@pytest.mark.parametrize("text, message", [
    ("0,fast", "got 'fast' in '0,fast'"), ("-1", "got '-1'"), ("", "got ''")])
def test_bad_staleness_lists_are_refused(text, message):
    with pytest.raises(ValueError, match=message):
        parse_stalenesses(text)


def test_bad_integer_lists_are_refused():
    with pytest.raises(ValueError, match="--workers expects comma-separated positive integers, e.g. 1,2,4, got '1,0'"):
        scale.parse_ints("1,0", "--workers")


def test_the_formula_in_the_json_is_the_docstring_s():
    assert "t(W)       = t_c + o_ps + ring(W) o_ar + wire_ps(W) + wire_ar(W)" in scale.FORMULA
    assert scale.FORMULA.splitlines()[0].startswith("From the runs of a mode")
