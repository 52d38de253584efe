"""A shard's Prometheus metrics (``het serve --metrics-port P``): requests by op, latency
histograms, refusals by reason, rows, memory, disk, WAL bytes and sessions, and the figures the
training job reports (``het_job_<name>``: a stream's progressive AUC and log loss), in the text
format prometheus-client serves at ``/metrics``.

The serve loop owns the shard, so the HTTP thread never reads it: the loop hands over a copy of
its STATS at most every ``every_s`` seconds (:meth:`ShardMetrics.refresh`) and the collector
reads the copy. Latencies are observed by the loop as it answers (a histogram's observe is
thread-safe).
"""

from __future__ import annotations

import threading
import time

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

LATENCY_BUCKETS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 2.0)

# STATS counters exposed as het_shard_refusals_total{reason}: requests answered with an error
REFUSALS = ("errors", "unauthenticated", "replays", "stale", "oversized", "refused_pushes", "pushes_again", "expired")
# STATS counters exposed as counters of their own, with their help
COUNTERS = {
    "bytes_in": "Bytes of requests received", "bytes_out": "Bytes of replies sent",
    "rows_in": "Rows pushes changed", "rows_out": "Rows replies carried",
    "busy_s": "Seconds spent answering requests", "paged_in_rows": "Rows brought from disk into DRAM",
    "wal_records": "Pushes logged", "wal_bytes": "Bytes written to the write-ahead log",
    "wal_fsyncs": "Times the log was forced to disk", "wal_replayed": "Pushes replayed from the log at start",
    "wal_rebases": "Times the log outgrew wal_max: the tables written as its base, the log started afresh",
}
# per table gauges (STATS "tables"), with their help
TABLE_GAUGES = {
    "rows": "Rows stored", "rows_in_memory": "Rows in DRAM", "rows_on_disk": "Rows on disk only",
    "bytes": "Bytes held in DRAM (rows, optimizer state, clocks, index)", "disk_bytes": "Bytes on disk",
}


class ShardMetrics:
    """The metrics of one shard, in a registry of their own.

    Example:
        >>> m = ShardMetrics(every_s=0)
        >>> m.observe("pull", 0.0004)
        >>> m.refresh(lambda: {"requests_pull": 3, "errors": 1, "rss_bytes": 10, "sessions": 2,
        ...                    "tables": {"t": {"rows": 5}}})
        >>> b"het_shard_requests_total{op=\\"pull\\"} 3.0" in m.text()
        True
        >>> b"het_shard_table_rows{table=\\"t\\"} 5.0" in m.text()
        True
    """

    def __init__(self, every_s: float = 1.0):
        self.registry = CollectorRegistry()
        self.latency = Histogram("het_shard_request_seconds", "Time to answer one request, by op", ["op"],
                                 buckets=LATENCY_BUCKETS, registry=self.registry)
        self.every_s = every_s
        self._snapshot: dict = {}
        self._taken = -float("inf")
        self._lock = threading.Lock()
        self.registry.register(_Collector(self))
        self._server = None

    def observe(self, op: str, seconds: float) -> None:
        self.latency.labels(op).observe(seconds)

    def refresh(self, stats) -> None:
        """Take ``stats()`` (the shard's STATS) if the last copy is ``every_s`` old."""
        now = time.monotonic()
        if now - self._taken >= self.every_s:
            snapshot = stats()
            with self._lock:
                self._snapshot, self._taken = snapshot, now

    def snapshot(self) -> dict:
        with self._lock:
            return self._snapshot

    def text(self) -> bytes:
        from prometheus_client import generate_latest
        return generate_latest(self.registry)

    def serve(self, host: str, port: int) -> int:
        """Serve ``/metrics`` over HTTP from a thread; the port bound (``port`` 0: a free one)."""
        server, _ = start_http_server(port, addr=host, registry=self.registry)
        self._server = server
        return server.server_address[1]

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class _Collector:
    """Metric families from the last copy of the shard's STATS."""

    def __init__(self, metrics: ShardMetrics):
        self.metrics = metrics

    def collect(self):
        s = self.metrics.snapshot()
        requests = CounterMetricFamily("het_shard_requests", "Requests answered, by op", labels=["op"])
        for name, value in sorted(s.items()):
            if name.startswith("requests_"):
                requests.add_metric([name.removeprefix("requests_")], value)
        yield requests
        refusals = CounterMetricFamily("het_shard_refusals", "Requests refused or failed, by reason",
                                       labels=["reason"])
        for reason in REFUSALS:
            refusals.add_metric([reason], s.get(reason, 0))
        yield refusals
        for name, help_text in COUNTERS.items():
            yield CounterMetricFamily(f"het_shard_{_unit(name)}", help_text, value=s.get(name, 0))
        for name, help_text in (("rss_bytes", "Resident memory of the shard's process"),
                                ("peak_rss_bytes", "Peak resident memory of the shard's process"),
                                ("sessions", "Client sessions the shard remembers"),
                                ("wal_log_bytes", "Bytes in the write-ahead log now"),
                                ("uptime_s", "Seconds since the shard started")):
            yield GaugeMetricFamily(f"het_shard_{_unit(name)}", help_text, value=s.get(name, 0))
        for name, value in sorted(s.get("reported", {}).items()):  # the job's own figures (STATS' report)
            yield GaugeMetricFamily(f"het_job_{name}", "Reported by the training job's rank 0 with its STATS request",
                                    value=value)
        tables = s.get("tables", {})
        for name, help_text in TABLE_GAUGES.items():
            family = GaugeMetricFamily(f"het_shard_table_{name}", help_text, labels=["table"])
            for table, stats in sorted(tables.items()):
                family.add_metric([table], stats.get(name, 0))
            yield family


def _unit(name: str) -> str:
    """Prometheus spells units out: ``busy_s`` -> ``busy_seconds``."""
    return name[:-2] + "_seconds" if name.endswith("_s") else name
