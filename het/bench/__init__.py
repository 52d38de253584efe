"""Benchmarks behind ``het bench``; each prints one JSON object with ``--json``."""

from __future__ import annotations

import importlib

# Each module registers its own ``het bench NAME`` through its add_parser(bsub).
BENCHES = ("cache", "ps", "memory", "e2e", "staleness", "scale", "missrate", "profile", "tiers", "predict", "serve",
           "freshness", "floor", "index", "quality", "start", "stream", "landing",
           "report")


def add_parser(sub) -> None:
    """Register ``het bench`` and every benchmark under it on the ``het`` command's subparsers."""
    b = sub.add_parser("bench", help="benchmarks; each prints one JSON object with --json")
    bsub = b.add_subparsers(dest="bench", required=True)
    for name in BENCHES:
        importlib.import_module(f"het.bench.{name}").add_parser(bsub)
