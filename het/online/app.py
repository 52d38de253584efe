"""The HTTP API of ``het serve-model``, on FastAPI:

- ``POST /v1/predict``: ``{"instances": [{column: value, ...}, ...]}`` of raw values ->
  ``{"predictions": [...], "version": N}``; a body it cannot use gets a 4xx naming the field and
  what was expected (413 past the size limits), and the server goes on serving;
- ``GET /healthz``: ``{"status": "ok", "version": N, "lag_s": ...}``;
- ``GET /metrics``: Prometheus' text format (prometheus-client): requests and errors by code, a
  latency histogram, batch sizes, the model's version and its update lag.

With a token (``het serve-model --token-file``, required to bind beyond loopback), predict and
metrics need ``Authorization: Bearer TOKEN``; health does not (load balancers ask it).

Every answer is counted by path and status, the framework's own (404, 405) included; a body not
sent whole within ``Limits.body_timeout_s`` gets 408, and a client that goes away mid-body is
counted (499, nginx's "client closed request") without a log line.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from dataclasses import dataclass

from fastapi import FastAPI, Request
from starlette.requests import ClientDisconnect
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from het.online.live import Live
from het.online.requests import BadRequest, instances_of
from het.online.scorer import Scorer

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


@dataclass(frozen=True)
class Limits:
    """What one request may hold: bytes of body and instances."""

    max_body_bytes: int = 4 << 20
    max_instances: int = 4096
    body_timeout_s: float = 10.0  # a body not sent whole within this is answered 408


class Metrics:
    """The server's Prometheus metrics, in a registry of their own."""

    def __init__(self, live: Live):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("het_serve_requests", "Requests answered, by path and HTTP status",
                                ["path", "code"], registry=r)
        self.latency = Histogram("het_serve_request_seconds", "Time from a request's arrival to its answer",
                                 ["path"], buckets=LATENCY_BUCKETS, registry=r)
        self.batch_rows = Histogram("het_serve_batch_rows", "Rows scored in one forward pass",
                                    buckets=BATCH_BUCKETS, registry=r)
        self.instances = Counter("het_serve_instances", "Instances scored", registry=r)
        self.version = Gauge("het_serve_model_version", "The version of the model answering", registry=r)
        self.version.set_function(lambda: live.current.number)
        self.lag = Gauge("het_serve_update_lag_seconds", "Now minus the time training made the served version",
                         registry=r)
        self.lag.set_function(live.lag_s)
        self.applied = Counter("het_serve_updates_applied", "Deltas and bases applied", ["kind"], registry=r)
        self.skipped = Counter("het_serve_updates_skipped", "Deltas or bases skipped: incomplete, damaged or out of "
                                                            "order", registry=r)
        self.apply_lag = Histogram("het_serve_apply_lag_seconds", "A version's lag when it was applied",
                                   buckets=(0.5, 1, 2, 5, 10, 15, 20, 30, 60, 120, 300), registry=r)


def make_app(live: Live, scorer: Scorer, metrics: Metrics, token: bytes | None = None,
             limits: Limits = Limits()) -> FastAPI:
    """The FastAPI application serving ``live``."""
    app = FastAPI(title="het serve-model", docs_url=None, redoc_url=None, openapi_url=None)
    paths = ("/v1/predict", "/healthz", "/metrics")

    @app.middleware("http")
    async def count(request: Request, call_next):
        response = await call_next(request)
        path = request.url.path if request.url.path in paths else "other"
        metrics.requests.labels(path, str(response.status_code)).inc()
        return response

    def authorized(request: Request) -> bool:
        if token is None:
            return True
        given = request.headers.get("authorization", "")
        return given.startswith("Bearer ") and hmac.compare_digest(given[7:].encode(), token)

    @app.post("/v1/predict")
    async def predict(request: Request) -> Response:
        start = time.perf_counter()
        try:
            if not authorized(request):
                raise BadRequest(401, "unauthorized: this server needs Authorization: Bearer TOKEN")
            try:
                body = await asyncio.wait_for(_body(request, limits.max_body_bytes), limits.body_timeout_s)
            except asyncio.TimeoutError:
                raise BadRequest(408, f"body: not sent whole within {limits.body_timeout_s:g} s") from None
            except ClientDisconnect:
                raise BadRequest(499, "body: the client went away before sending it whole") from None
            instances = instances_of(body, live.current.model.inputs, limits.max_instances)
            predictions, version = await scorer.score(instances)
            metrics.instances.inc(len(instances))
            response = JSONResponse({"predictions": predictions, "version": version})
        except BadRequest as e:
            response = JSONResponse({"error": str(e)}, status_code=e.status)
        metrics.latency.labels("/v1/predict").observe(time.perf_counter() - start)
        return response

    @app.get("/healthz")
    async def healthz() -> Response:
        v = live.current
        return JSONResponse({"status": "ok", "version": v.number, "lag_s": live.lag_s(),
                             "model": v.model.manifest["model"]["name"]})

    @app.get("/metrics")
    async def prometheus(request: Request) -> Response:
        if not authorized(request):
            return JSONResponse({"error": "unauthorized: this server needs Authorization: Bearer TOKEN"}, 401)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


async def _body(request: Request, limit: int) -> bytes:
    """The request's body, refused (413) past ``limit`` bytes before more of it is read."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise BadRequest(400, f"content-length: expected a number of bytes, got {declared[:40]!r}")
        if int(declared) > limit:
            raise BadRequest(413, f"body: at most {limit} bytes, the request declares {declared}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BadRequest(413, f"body: at most {limit} bytes, got more")
        chunks.append(chunk)
    return b"".join(chunks)
