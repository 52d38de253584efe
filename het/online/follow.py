"""A server following a training job (``het serve-model --follow DIR``): the newest base in
``DIR`` (an export, ``base-<version>/``) and every delta after it (``delta-<version>.het``, the
rows pushes changed and the dense weights: :mod:`het.train.publish`), applied in order, each
made a new :class:`het.online.live.Version` and swapped in whole.

A delta is written under a temporary name and renamed when complete, and its arrays carry
checksums: one that is cut off or damaged is never applied. It is skipped, counted and named,
and the follower applies no later delta (they would leave out its rows) until a newer base
comes. A follower started late, or again after a crash, catches up from the newest base.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time

from het import arrayfile
from het.export.model import load_model
from het.online.live import Live, Overlay, OverlaidTable, Version
from het.train.published import base_name, delta_name, read_delta

BASE, DELTA = re.compile(r"base-(\d+)"), re.compile(r"delta-(\d+)\.het")


def base_dir(directory: str, version: int) -> str:
    return os.path.join(directory, base_name(version))


def delta_path(directory: str, version: int) -> str:
    return os.path.join(directory, delta_name(version))


def scan(directory: str) -> tuple[list[int], list[int]]:
    """The complete bases' and the deltas' versions in ``directory``, ascending."""
    names = os.listdir(directory) if os.path.isdir(directory) else []
    bases = sorted(int(m.group(1)) for m in map(BASE.fullmatch, names)
                   if m and os.path.isfile(os.path.join(directory, m.group(0), "export.json")))
    deltas = sorted(int(m.group(1)) for m in map(DELTA.fullmatch, names) if m)
    return bases, deltas


def newest_base(directory: str) -> Version:
    """The newest complete base of ``directory`` as a version (ValueError: none yet)."""
    tried: set[int] = set()
    for _ in range(5):  # a base goes only once a newer one is whole: a base gone while read means a newer one
        bases, _ = scan(directory)
        for number in reversed([b for b in bases if b not in tried]):  # damaged or going away: the one before
            try:
                model = load_model(base_dir(directory, number))
            except (ValueError, OSError) as e:
                tried.add(number)
                _say(f"base {number} cannot be loaded ({e}): trying another")
                continue
            published = model.manifest.get("published") or {}
            return Version(number, float(published.get("trained_at", time.time())), model)
    raise ValueError(f"{directory}: no complete base (base-<version>/ holding export.json) to follow yet")


class Follower:
    """Applies what ``directory`` publishes to ``live``, polling every ``poll_s`` seconds.

    Args:
        live: the served versions (its current one a base of ``directory``, or any export).
        directory: where the training job publishes (``het train --publish DIR``).
        metrics: :class:`het.online.app.Metrics` (applied and skipped counts, lags), or None.
    """

    def __init__(self, live: Live, directory: str, poll_s: float = 0.5, metrics=None):
        self.live, self.directory, self.poll_s, self.metrics = live, directory, poll_s, metrics
        self.base = live.current  # the base the current version's overlay is over
        self.broken_after: int | None = None  # a delta past this one was skipped: wait for a base
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Follower:
        self._thread = threading.Thread(target=self._loop, name="het-follow", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
            except Exception as e:  # noqa: BLE001 - the follower must outlive a bad poll
                _say(f"following {self.directory}: {type(e).__name__}: {e}")
            self._stop.wait(self.poll_s)

    def poll(self) -> int:
        """Apply what is new; the number of versions applied."""
        bases, deltas = scan(self.directory)
        applied = 0
        if bases and bases[-1] > self.live.current.number:
            self._take_base()
            applied += 1
        for number in deltas:
            current = self.live.current.number
            if number <= current:
                continue
            if number != current + 1 or self.broken_after is not None:
                break  # a gap (a delta not written, or skipped): the next base fills it
            if not self._apply(number):
                break
            applied += 1
        return applied

    def _take_base(self) -> None:
        version = newest_base(self.directory)
        if version.number <= self.live.current.number:
            return
        self.base = version
        self.broken_after = None
        self._swap(version, "base")

    def _apply(self, number: int) -> bool:
        path = delta_path(self.directory, number)
        try:
            meta, tables, dense = read_delta(path, number)
            unknown = sorted(set(tables) - set(self.base.model.tables))
            if unknown:
                raise ValueError(f"rows of tables {unknown}, which its base {self.base.number} lacks")
        except FileNotFoundError:  # removed by the publisher: a newer base holds it
            return False
        except (arrayfile.ArrayFileError, ValueError, KeyError) as e:
            self.broken_after = number - 1
            if self.metrics is not None:
                self.metrics.skipped.inc()
            _say(f"skipped delta {number}: {e}; waiting for the next base")
            return False
        layers = ({name: Overlay.of(keys, rows) for name, (keys, rows) in tables.items()}, *self.live.current.layers)
        model = self.base.model.variant(self._overlaid(layers), dense or None)
        version = Version(number, float(meta["trained_at"]), model, layers)
        self._swap(version, "delta")
        if len(layers) > 1:  # merged after the swap: the same version, its rows in one overlay
            merged = version.compacted()
            if self.live.current is version:
                self.live.swap(Version(number, version.trained_at, model.variant(self._overlaid((merged,))),
                                       (merged,), version.applied_at))
        return True

    def _overlaid(self, layers: tuple) -> dict:
        """The base's tables, each with its rows of ``layers`` (newest first) over it."""
        return {name: OverlaidTable(table, tuple(layer[name] for layer in layers if name in layer))
                for name, table in self.base.model.tables.items()}

    def _swap(self, version: Version, kind: str) -> None:
        self.live.swap(version)
        if self.metrics is not None:
            self.metrics.applied.labels(kind).inc()
            self.metrics.apply_lag.observe(max(0.0, time.time() - version.trained_at))


def _say(line: str) -> None:
    print(f"het serve-model: {line}", file=sys.stderr, flush=True)
