"""`het serve-model` as a client meets it: the same scores as `het predict`, a 4xx for every bad
request (fuzzed), 413 past the limits, a token beyond loopback, Prometheus metrics."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest

from het.bench.predict import trained_export
from jobs import Server
from het.train.config import TrainConfig

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    cfg = TrainConfig.from_dict({"batch": 128, "dim": 16, "eval_samples": 500, "lookahead": 4, "ids": "hashed",
                                 "synthetic": {"cap": 800}})
    _, out, _ = trained_export(cfg, 10, str(tmp))
    return out


def instances(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{**{f"I{i}": float(rng.random() * 3) for i in range(1, 14)},
             **{f"C{i}": int(rng.integers(0, 3)) for i in range(1, 27)}} for _ in range(n)]


def test_http_scores_equal_het_predicts(export_dir):
    from het.export import load_model

    rows = instances(40)
    expected = load_model(export_dir).predict({k: [r[k] for r in rows] for k in rows[0]})
    with Server(export_dir) as server:
        one = [server.predict({"instances": [r]}).json() for r in rows[:5]]
        many = server.predict({"instances": rows}).json()
        assert many["version"] == 0 and len(many["predictions"]) == 40
        assert np.abs(np.array(many["predictions"]) - expected).max() <= 1e-6
        assert np.abs(np.array([o["predictions"][0] for o in one]) - expected[:5]).max() <= 1e-6
        assert server.client.get("/healthz").json()["status"] == "ok"


def test_bad_requests_get_a_4xx_naming_the_field_and_the_server_goes_on(export_dir):
    good = instances(1)[0]
    cases = [
        (b"not json", 400, "body: expected JSON"),
        ({"rows": [good]}, 400, "expected an object {\"instances\": [...]}"),
        ({"instances": []}, 400, "instances: expected a non-empty list"),
        ({"instances": [{k: v for k, v in good.items() if k != "C7"}]}, 400, "instances[0]: missing field 'C7'"),
        ({"instances": [{**good, "C3": {"x": 1}}]}, 400, "instances[0].C3: expected a string, a number or null"),
        ({"instances": [{**good, "I2": "abc"}]}, 400, "instances[0]: I2: 'abc' is not a finite number"),
        ({"instances": [{**good, "C2": 10 ** 30}]}, 400, "C2"),
        ({"instances": [{**good, "extra": 1}]}, 400, "unknown field(s) ['extra']"),
        ({"instances": [good] * 5000}, 413, "at most 4096 a request"),
    ]
    with Server(export_dir) as server:
        for body, status, says in cases:
            r = server.predict(body)
            assert r.status_code == status and says in r.json()["error"], (body if len(str(body)) < 200 else "", r.text)
        r = server.predict(b"x" * (5 << 20))
        assert r.status_code == 413 and "at most 4194304 bytes" in r.json()["error"]
        assert server.predict({"instances": [good]}).status_code == 200  # still serving
        metrics = server.client.get("/metrics").text
        assert 'het_serve_requests_total{code="400",path="/v1/predict"} 8.0' in metrics
        assert 'het_serve_requests_total{code="413",path="/v1/predict"} 2.0' in metrics
        for name in ("het_serve_request_seconds_bucket", "het_serve_batch_rows_bucket", "het_serve_model_version 0.0",
                     "het_serve_update_lag_seconds"):
            assert name in metrics


def fuzzed(rng: random.Random, good: dict) -> bytes:
    """A request that must be refused: wrong types, missing or extra fields, huge arrays, not JSON."""
    kind = rng.randrange(9)
    inst = dict(good)
    field = rng.choice(sorted(good))
    if kind == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(0, 64)))
    if kind == 1:
        del inst[field]
    elif kind == 2:
        inst[field] = rng.choice([{"a": 1}, [1, 2], [[1]], {"nested": {"x": []}}])
    elif kind == 3:
        inst[f"extra{rng.randrange(9)}"] = rng.choice([1, "x", None])
    elif kind == 4:
        return json.dumps({"instances": [inst] * rng.choice([4097, 5000])}).encode()
    elif kind == 5:
        return json.dumps(rng.choice([[], {}, None, 1, "x", {"instances": None}, {"instances": "x"},
                                      {"instances": [1, 2]}, {"instances": [inst], "more": 1}])).encode()
    elif kind == 6:
        inst[rng.choice([f"I{i}" for i in range(1, 14)])] = rng.choice(["abc", "1e999", "nan", "--1", "1,5"])
    elif kind == 7:
        inst[rng.choice([f"C{i}" for i in range(1, 27)])] = rng.choice([-1, 10 ** 6, 1.5, "x", 10 ** 40])
    else:
        return json.dumps({"instances": [inst]})[:rng.randrange(1, 40)].encode()
    return json.dumps({"instances": [inst]}).encode()


def check_fuzz(export_dir, requests: int) -> None:
    rng = random.Random(0)
    good = instances(1)[0]
    with Server(export_dir) as server:
        for _ in range(200):
            server.predict(fuzzed(rng, good))
        before = server.rss()
        codes = {}
        for _ in range(requests):
            r = server.predict(fuzzed(rng, good))
            codes[r.status_code] = codes.get(r.status_code, 0) + 1
        assert all(400 <= c < 500 for c in codes), codes
        assert server.predict({"instances": [good]}).status_code == 200
        assert server.rss() < before + (32 << 20), (before, server.rss())


def test_fuzzed_requests_all_get_a_4xx(export_dir):
    check_fuzz(export_dir, 300)


@pytest.mark.slow
def test_ten_thousand_fuzzed_requests_all_get_a_4xx_and_memory_stays_flat(export_dir):
    check_fuzz(export_dir, 10_000)


def test_a_bind_beyond_loopback_needs_a_token(export_dir, tmp_path):
    out = subprocess.run([sys.executable, "-m", "het", "serve-model", export_dir, "--bind", "0.0.0.0:0"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "without a token" in out.stderr and "Traceback" not in out.stderr
    (tmp_path / "token").write_text("s3cret\n")
    with Server(export_dir, "--token-file", str(tmp_path / "token")) as server:
        body = {"instances": instances(1)}
        assert server.predict(body).status_code == 401
        assert server.predict(body, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert server.predict(body, headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert server.client.get("/metrics").status_code == 401
        assert server.client.get("/healthz").status_code == 200
