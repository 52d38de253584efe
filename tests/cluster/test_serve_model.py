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
from hypothesis import HealthCheck, assume, example, given, settings, strategies as st
import numpy as np
import pytest

from het.bench.predict import trained_export
from jobs import Server
from het.train.config import TrainConfig

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    cfg = TrainConfig.from_dict({"batch": 128, "dim": 16, "eval_samples": 500, "cache": {"lookahead": 4}, "ids": "hashed",
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


def test_an_export_of_a_table_a_width_serves_the_scores_het_predict_gives(tmp_path):
    from het.export import load_model

    cfg = TrainConfig.from_dict({"model": "deepfm", "batch": 128, "dim": "auto", "eval_samples": 500,
                                 "lookahead": 4, "ids": "hashed", "synthetic": {"cap": 800}})
    _, out, _ = trained_export(cfg, 10, str(tmp_path))
    rows = instances(20)
    model = load_model(out)
    assert len(model.tables) > 1
    expected = model.predict({k: [r[k] for r in rows] for k in rows[0]})
    with Server(out) as server:
        got = server.predict({"instances": rows}).json()["predictions"]
    assert np.abs(np.array(got) - expected).max() <= 1e-6


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


# ---- in process: every body, alone and batched -------------------------------------------------

@pytest.fixture(scope="module")
def app_parts(export_dir):
    from het.export import load_model
    from het.online.app import Limits, Metrics, make_app
    from het.online.live import Live, first_version
    from het.online.scorer import Scorer

    live = Live(first_version(load_model(export_dir)))
    metrics = Metrics(live)
    scorer = Scorer(live, batching=True, max_wait_s=0.0)
    app = make_app(live, scorer, metrics, limits=Limits(body_timeout_s=0.5))
    yield live, scorer, app
    scorer.close()


dense_values = st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False, width=64),
                         st.integers(-10 ** 40, 10 ** 40), st.sampled_from(["1.5", "abc", "1e39", "", " 2 ", "-0"]),
                         st.booleans())
id_values = st.one_of(st.none(), st.integers(-5, 900), st.sampled_from(["3", "x", "1.5", ""]), st.floats(-2, 2),
                      st.booleans(), st.just([1, 2]))


def instance_of(draw_dense, draw_ids):
    """A valid instance with up to three of its fields drawn from anything (so most reach the model)."""
    good = instances(1)[0]
    dense = st.dictionaries(st.sampled_from([f"I{i}" for i in range(1, 14)]), draw_dense, max_size=2)
    ids = st.dictionaries(st.sampled_from([f"C{i}" for i in range(1, 27)]), draw_ids, max_size=2)
    return st.tuples(dense, ids).map(lambda d: {**good, **d[0], **d[1]})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests=st.lists(st.lists(instance_of(dense_values, id_values), min_size=1, max_size=3), min_size=1,
                         max_size=4))
@example(requests=[[instances(1)[0]], [{**instances(1)[0], "I1": 2**53 + 1}]])  # past 2^53: no float64 holds it
@example(requests=[[instances(1)[0], {**instances(1)[0], "I1": 2**53 + 1, "C1": None}]])
def test_a_request_is_accepted_alike_alone_and_in_any_batch(app_parts, requests):
    from het.online.requests import BadRequest, instances_of

    live, scorer, _ = app_parts
    inputs = live.current.model.inputs
    checked = []
    for r in requests:  # what the endpoint refuses before batching never reaches the scorer
        try:
            checked.append(instances_of(json.dumps({"instances": r}).encode(), inputs, 4096))
        except BadRequest as e:
            assert e.status == 400 and ("instances[" in str(e) or "body" in str(e))
    assume(checked)
    alone = [scorer._run([r])[0] for r in checked]
    together = scorer._run(checked)
    for a, b in zip(alone, together):
        assert isinstance(a, BadRequest) == isinstance(b, BadRequest), (a, b)
        if isinstance(a, BadRequest):
            assert str(a) == str(b) and "instances[" in str(a)
        else:
            assert np.isfinite(a[0]).all() and np.allclose(a[0], b[0], atol=1e-6)


bodies = st.one_of(
    st.binary(max_size=60),
    st.lists(instance_of(dense_values, id_values), min_size=1, max_size=3).map(lambda r: json.dumps({"instances": r})),
    st.recursive(st.none() | st.integers(), lambda c: st.lists(c, max_size=2), max_leaves=50).map(
        lambda v: json.dumps({"instances": v})),
    st.integers(1, 5000).map(lambda depth: "[" * depth + "]" * depth),
    st.sampled_from(['{"instances": [{"I1": NaN}]}', '{"instances": [{"I1": Infinity}]}', '{"instances": [1e999]}']),
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies)
def test_every_body_gets_a_200_with_finite_scores_or_a_4xx_naming_what_was_wrong(app_parts, body):
    from fastapi.testclient import TestClient

    with TestClient(app_parts[2], raise_server_exceptions=False) as client:
        r = client.post("/v1/predict", content=body if isinstance(body, bytes) else body.encode())
    assert r.status_code == 200 or 400 <= r.status_code < 500, (body[:200], r.status_code, r.text[:300])
    if r.status_code == 200:
        assert all(np.isfinite(r.json()["predictions"]))
    else:
        error = r.json()["error"]
        assert error.startswith(("body", "instances")), error


def test_a_slow_body_gets_408_and_unknown_paths_are_counted(app_parts):
    from fastapi.testclient import TestClient

    def slowly():
        yield b'{"instances": '
        time.sleep(1.0)  # past the 0.5 s the server gives a body
        yield b"[]}"

    with TestClient(app_parts[2], raise_server_exceptions=False) as client:
        r = client.post("/v1/predict", content=slowly())
        assert r.status_code == 408 and "not sent whole within 0.5 s" in r.json()["error"]
        assert client.get("/nowhere").status_code == 404
        assert client.get("/v1/predict").status_code == 405
        text = client.get("/metrics").text
    for line in ('code="408",path="/v1/predict"', 'code="404",path="other"', 'code="405",path="/v1/predict"'):
        assert line in text, line


@pytest.mark.parametrize("change, says", [
    ('"I1": NaN', "NaN is not JSON"), ('"I1": Infinity', "Infinity is not JSON"),
    ('"I1": 1e39', "instances[0].I1: 1e+39 is past float32's range"),
    ('"I1": 10000000000000000000000000000000000000000', "past float32's range"),
    ('"I1": "1e39"', "instances[0]: I1: '1e39' is not a finite number"),
    ('"I1": 9007199254740993', "instances[0].I1: Integer value 9007199254740993 not in range"),  # past 2^53
    ('"C1": true', "instances[0].C1: expected a string, a number or null, got a boolean"),
    ('"I1": false', "instances[0].I1: expected a string, a number or null, got a boolean")])
def test_values_the_model_cannot_take_are_refused_naming_the_field(app_parts, change, says):
    from fastapi.testclient import TestClient

    good = json.dumps({"instances": instances(1)})
    field = change.split(":")[0]
    start = good.index(field + ":")
    body = good[:start] + change + good[good.index(",", start):]
    with TestClient(app_parts[2], raise_server_exceptions=False) as client:
        r = client.post("/v1/predict", content=body.encode())
        deep = client.post("/v1/predict", content=b"[" * 5000 + b"]" * 5000)
    assert r.status_code == 400 and says in r.json()["error"], r.text
    assert deep.status_code == 400 and "nested too deep" in deep.json()["error"]


def test_a_client_gone_mid_body_is_counted_without_a_traceback(export_dir):
    import socket

    with Server(export_dir) as server:
        host, port = server.url.removeprefix("http://").rsplit(":", 1)
        for _ in range(3):
            with socket.create_connection((host, int(port))) as s:
                s.sendall(b"POST /v1/predict HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                          b"content-length: 5000\r\n\r\n" + b'{"instances": [' + b" " * 100)
            time.sleep(0.2)
        assert server.predict({"instances": instances(1)}).status_code == 200  # serving on
        metrics = server.client.get("/metrics").text
        server.stop()
        err = server.proc.stderr.read()
    assert "Traceback" not in err, err[-2000:]
    assert 'het_serve_requests_total{code="499",path="/v1/predict"} 3.0' in metrics, metrics[:3000]
