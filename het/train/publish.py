"""Updates for servers that follow a training job: ``het train --publish DIR --publish-every S``.

Rank 0 publishes into ``DIR``, numbered versions in one sequence (a later job publishing into the
same directory goes on from the last number, so its followers keep following):

- ``delta-<v>.het``: every ``every`` seconds (rank 0's clock, told to every rank at a step
  boundary), every rank flushes its cache (as for a checkpoint: the PS then holds every update of
  every worker up to that step), and rank 0 reads the rows the pushes changed since the previous
  version from the shards' own record of changed keys (the CHANGED request,
  :mod:`het.ps.changes`) and writes them with the dense weights as a checksummed array file
  (:mod:`het.arrayfile`), in a thread beside training, under a temporary name renamed when whole.
  Its bytes follow the rows that changed, not the table.
- ``base-<v>/``: a full export (as ``het export`` writes) of the version: at the start, then once
  the deltas written since the last base hold as many bytes as it (a follower starting late reads
  no more than a base's worth of deltas after it), or after ``base_every`` deltas, whichever comes
  first, and in a delta's place when a shard's record of changed keys started
  again (a shard restarted: its record, kept in memory, lost what changed before). Its snapshot (the shards' saves, rank 0's dense model) is taken at the
  step boundary; ``het export`` turns it into the base in a background process at a lower
  priority, and the base appears whole when complete.

Training waits for the flush and for rank 0's read of the changed rows, not for the files (a base
waits for the delta before it and for the last base's export). Old bases and the deltas before
the oldest kept one go.

Source of changed rows, measured against the alternative (docs/RESULTS.md): the shards' record
costs nothing until a publisher asks, then 8 bytes a changed key between two deltas; the
write-ahead log holds every push's gradients (more bytes than the rows, and only under
``--ps-wal``), which a server would have to turn into rows with the optimizer's state.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from het import arrayfile
from het.dist.collectives import barrier, rank0_says
from het.train import checkpoint
from het.train.config import TrainConfig
from het.train.tasks import EMBEDDING_TABLE

FORMAT = "het-delta"
_NAME = re.compile(r"(base|delta)-(\d+)(\.het)?")


def base_name(version: int) -> str:
    return f"base-{version:08d}"


def delta_name(version: int) -> str:
    return f"delta-{version:08d}.het"


class Publisher:
    """The per-step hook of ``het train --publish`` (see the module); rank 0 alone acts."""

    def __init__(self, worker, cfg: TrainConfig):
        self.worker, self.cfg = worker, cfg
        self.dir = os.path.abspath(cfg.publish.dir)
        self.version = 0
        self.deltas_since_base = 0
        self.last = time.monotonic()
        self.base_proc: subprocess.Popen | None = None
        self.writer: threading.Thread | None = None  # the delta being written
        self.base_snapshot = self.base_out = None
        self.base_bytes: int | None = None  # the newest base's bytes on disk, once written
        self.bytes_since_base = 0  # the bytes of the deltas written since the newest base's snapshot
        self.stats = {"deltas": 0, "bases": 0, "delta_bytes": 0, "delta_rows": 0, "failed": [], "records_restarted": 0,
                      "bases_for_size": 0}
        if worker.rank == 0:
            os.makedirs(self.dir, exist_ok=True)
            bases, deltas = listing(self.dir)  # an earlier job's: its followers go on from its last
            self.version = max(bases + deltas, default=-1) + 1
            list(worker.client.changed(EMBEDDING_TABLE))  # the shards start their record of changes
            self._base(worker.step_count)

    def __call__(self, step: int) -> None:
        due = self.worker.rank == 0 and time.monotonic() - self.last >= self.cfg.publish.every
        if rank0_says(due, self.worker.world):  # every rank at the same step boundary
            self.worker.embedding.flush()
            barrier(self.worker.world)
            if self.worker.rank == 0:
                self.publish(step)

    def publish(self, step: int) -> None:
        """A delta of what changed since the last version; a base after every ``base_every``."""
        self.last = time.monotonic()
        self.version += 1
        if not self._delta(self.version, step):
            self._base(step)  # a shard's record started again: this version is a base
            return
        self.deltas_since_base += 1
        if self.base_proc is not None and self.base_proc.poll() is not None:
            self._wait_base()  # written: its bytes known
        outweigh = self.base_bytes is not None and self.bytes_since_base >= self.base_bytes
        if outweigh or self.deltas_since_base >= self.cfg.publish.base_every:
            self.stats["bases_for_size"] += int(outweigh and self.deltas_since_base < self.cfg.publish.base_every)
            self._base(step)

    def finish(self, step: int, base: bool = False) -> dict:
        """The last delta (every cache flushed before), the base in flight waited for; with
        ``base``, a base instead of the delta (the PS's rows were put back to a kept save, which
        the changed-key record does not see)."""
        if self.worker.rank == 0:
            self.version += 1
            if base or not self._delta(self.version, step):
                self._wait_delta()
                self._base(step)
            self._wait_delta()
            self._wait_base()
            self._prune()
        return {"dir": self.dir, "version": self.version, **self.stats}

    # -- deltas ---------------------------------------------------------------------------------
    def _delta(self, version: int, step: int) -> bool:
        """Start writing the delta of ``version``; False (nothing written) when a shard's record of
        changed keys started again since the last delta (the shard restarted: what changed before
        is not in it), and a base must stand for this version."""
        trained_at = time.time()
        started = []
        pieces = list(self.worker.client.changed(EMBEDDING_TABLE, started=started))
        if started:
            self.stats["records_restarted"] += 1
            print(f"het train: the record of changed rows of shard(s) {started} started again (a restart): version "
                  f"{version} is published as a base", file=sys.stderr, flush=True)
            return False
        dim = self.worker.client.tables[EMBEDDING_TABLE].dim
        keys = np.concatenate([k for k, _, _ in pieces]) if pieces else np.zeros(0, np.int64)
        rows = np.concatenate([r for _, r, _ in pieces]) if pieces else np.zeros((0, dim), np.float32)
        clocks = np.concatenate([c for _, _, c in pieces]) if pieces else np.zeros(0, np.int64)
        self.worker.dense.before_forward()  # mode ps: the dense parameters as the PS holds them
        dense = {f"dense.{k}": v.detach().cpu().numpy() for k, v in self.worker.model.state_dict().items()
                 if not k.startswith("embedding.")}
        meta = {"format": FORMAT, "version": version, "step": step, "trained_at": trained_at,
                "table": EMBEDDING_TABLE, "rows": len(keys), "dim": dim}
        self._wait_delta()  # deltas land in order
        self.writer = threading.Thread(target=self._write_delta, name="het-publish",
                                       args=(version, {"keys": keys, "rows": rows, "clocks": clocks, **dense}, meta))
        self.writer.start()
        return True

    def _write_delta(self, version: int, arrays: dict, meta: dict) -> None:
        try:
            size = arrayfile.write(os.path.join(self.dir, delta_name(version)), arrays, meta)
        except OSError as e:  # a full disk: the next base covers what this delta held
            self.stats["failed"].append(f"delta {version}: {e}")
            print(f"het train: delta {version} of {self.dir} failed: {e}", file=sys.stderr, flush=True)
            return
        self.stats["deltas"] += 1
        self.stats["delta_bytes"] += size
        self.bytes_since_base += size
        self.stats["delta_rows"] += meta["rows"]

    def _wait_delta(self) -> None:
        if self.writer is not None:
            self.writer.join()
            self.writer = None

    # -- bases ----------------------------------------------------------------------------------
    def _base(self, step: int) -> None:
        """Snapshot the shards' rows and the dense model as version ``self.version`` and start
        exporting it; the previous base's export is waited for first."""
        self._wait_base()
        self._wait_delta()  # a delta before this base is not one since it
        self.deltas_since_base = self.bytes_since_base = 0
        snapshot = tempfile.mkdtemp(prefix=".snapshot-", dir=self.dir)
        os.rmdir(snapshot)
        checkpoint.write(self.worker, snapshot, step,
                         published={"version": self.version, "trained_at": time.time()})
        out = os.path.join(self.dir, base_name(self.version))
        self.base_snapshot, self.base_out = snapshot, out
        self.base_proc = subprocess.Popen([sys.executable, "-m", "het", "export", snapshot, out, "--quiet", "--json",
                                           "--dtype", self.cfg.export.dtype], stdout=subprocess.DEVNULL,
                                          stderr=subprocess.PIPE, preexec_fn=lambda: os.nice(10))

    def _wait_base(self) -> None:
        if self.base_proc is None:
            return
        _, err = self.base_proc.communicate()
        if self.base_proc.returncode == 0:
            self.stats["bases"] += 1
            self.base_bytes = bytes_under(self.base_out)
        else:
            last = (err.decode(errors="replace").strip().splitlines() or [""])[-1][:300]
            self.stats["failed"].append(last)
            print(f"het train: a base of {self.dir} failed: {last}", file=sys.stderr, flush=True)
        shutil.rmtree(self.base_snapshot, ignore_errors=True)
        self.base_proc = self.base_snapshot = None
        self._prune()

    def _prune(self) -> None:
        """Keep the newest ``keep`` bases and the deltas after the oldest of them."""
        bases, deltas = listing(self.dir)
        kept = bases[-self.cfg.publish.keep:]
        if not kept:
            return
        for v in bases[:-self.cfg.publish.keep]:
            shutil.rmtree(os.path.join(self.dir, base_name(v)), ignore_errors=True)
        for v in deltas:
            if v <= kept[0]:
                os.remove(os.path.join(self.dir, delta_name(v)))


def publisher(worker, cfg: TrainConfig) -> Publisher | None:
    """The job's publisher (None without ``cfg.publish.dir``)."""
    return Publisher(worker, cfg) if cfg.publish.dir else None


def listing(directory: str) -> tuple[list[int], list[int]]:
    """The versions of the bases and of the deltas in ``directory``, each in order."""
    bases, deltas = [], []
    for name in os.listdir(directory):
        m = _NAME.fullmatch(name)
        if m and m.group(1) == "base" and not m.group(3):
            bases.append(int(m.group(2)))
        elif m and m.group(1) == "delta" and m.group(3):
            deltas.append(int(m.group(2)))
    return sorted(bases), sorted(deltas)


def bytes_under(directory: str) -> int:
    """The bytes of the files under ``directory``."""
    return sum(os.path.getsize(os.path.join(root, f)) for root, _, names in os.walk(directory) for f in names)
