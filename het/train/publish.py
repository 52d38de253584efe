"""Updates for servers that follow a training job: ``het train --publish DIR --publish-every S``.

Rank 0 publishes into ``DIR`` numbered versions in one sequence (a later job publishing into
the same directory goes on from the last number, so its followers keep following), as files
:mod:`het.train.published` describes:

- ``delta-<v>.het`` every ``every`` seconds: the rows the pushes changed since the version
  before, read from the shards' own record of changed keys (the CHANGED request,
  :mod:`het.ps.server.changes`), in the table's precision (``dtype`` to choose another), with the dense
  weights. Its bytes follow the rows that changed, not the table.
- ``base-<v>/``, a full export: the first from a snapshot (the shards' rows, saved without
  their optimizer state, and the dense model, exported by ``het export`` in a process of its
  own; deltas wait for it, as followers do); every later one from the base before it and the deltas since (:mod:`het.export.compact`,
  a process of its own at a lower priority, while deltas go on), started after the delta that
  brings the deltas since the last base within one such delta of its bytes, or after
  ``base_every`` deltas. The newest ``keep`` bases stay, with the deltas after the oldest of
  them. With ``keep`` 1 the directory holds at most the newest base, the deltas since, the base
  being made and the delta being written: a delta that would bring the deltas since the newest
  base past its bytes waits for the base being made (or for one made then). A follower starting
  late reads a base and less than a base's worth of deltas.

What a version holds depends on ``consistency``:

- ``flush``: every rank flushes its cache at the same step boundary (one broadcast of rank 0's
  clock a step, a barrier at each version), so a version holds every update up to its step;
- ``bounded``: nothing stops; rank 0 reads the shards as they are and puts its own copies of the
  rows it updated and has not pushed over them (taken at the step boundary, a copy of its cache's
  dirty rows): a version is rank 0's view of the model, as its steps and evaluations read it.
  A copy stands only until a later version reads the shards' row again (the next one that does
  not take the copy again, the last one at the latest), so followers end on the shards' rows.
  Every row then lacks at most ``staleness`` updates of each other worker (the caches' write
  rule, :mod:`het.staleness`), which the delta's manifest says (``"view": "rank 0"``); the
  follower's AUC against the trainer's is in docs/RESULTS.md. The last version of a job is
  flushed in both.

The shards are read and the delta written by a thread beside training, with its own connection
to the shards, one version at a time: training waits for none of it, and a version comes due
only once the one before is out. A shard whose record of changed keys started again (a restart:
the record lives in memory) makes the next version a base from a snapshot, as does a delta that
could not be written (a full disk): followers never apply a delta that leaves rows out.

Source of changed rows, measured against the alternative (docs/RESULTS.md): the shards' record
costs nothing until a publisher asks, then 8 bytes a changed key between two deltas; the
write-ahead log holds every push's gradients (more bytes than the rows, and only under
``--ps-wal``), which a server would have to turn into rows with the optimizer's state.
"""

from __future__ import annotations

import json
import math
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import torch

from het.dist.collectives import barrier, rank0_says
from het.process import lower_priority
from het.train import checkpoint
from het.train.config import TrainConfig
from het.train.published import (base_name, bytes_under, delta_arrays, delta_name, encode_rows, listing,  # noqa: F401 - the
                                  write_delta)  # directory's names, read here by the freshness benchmark
from het.train.streaming import stream_rows


class Publisher:
    """The per-step hook of ``het train --publish`` (see the module); rank 0 alone acts.

    Args:
        worker: the rank's worker.
        cfg: the job's config (``cfg.publish``).
        connect: makes a new client of the job's shards for the thread beside training; None:
            every version is published at its step boundary by the calling thread.
    """

    def __init__(self, worker, cfg: TrainConfig, connect=None):
        self.worker, self.cfg, self.connect = worker, cfg, connect
        self.pub = cfg.publish
        self.consistency = self.pub.consistency or ("flush" if cfg.staleness == math.inf else "bounded")
        self.dir = os.path.abspath(self.pub.dir)
        self.rows_dtype = str(self.pub.dtype or cfg.table.row_dtype)
        self.client = None  # the thread's own connection, made on its first version
        self.tables = list(worker.embedding.tables)  # the embedding tables: one, or one a width
        self.buffers = {n: [None] for n in self.tables}  # each table's rows of the version being written, kept
        self.viewed = {n: np.zeros(0, np.int64) for n in self.tables}  # the keys the newest delta took from rank 0
        self.job: threading.Thread | None = None  # the version being published
        self.version = 0  # the newest version published (or being made a base)
        self.last = time.monotonic()
        self.base = None  # (process, version, directory, snapshot): the snapshot being exported
        self.compactor: subprocess.Popen | None = None  # the process compacting this job's bases
        self.compaction = None  # (version, directory): the base it is making
        self.base_version: int | None = None  # the newest base written
        self.base_bytes: int | None = None
        self.deltas: list[tuple[int, int, dict]] = []  # (version, bytes, manifest) of the deltas since it
        self.snapshot_due = False  # the next version must be a base from a snapshot
        self.published_step = -1  # the step of the newest version started
        self.finishing = False
        self.stats = {"consistency": self.consistency, "rows_dtype": self.rows_dtype, "deltas": 0, "bases": 0,
                      "bases_compacted": 0, "compact_s": 0.0, "bases_for_size": 0, "delta_bytes": 0,
                      "delta_rows": 0, "failed": [], "records_restarted": 0}
        if worker.rank == 0:
            os.makedirs(self.dir, exist_ok=True)
            bases, deltas = listing(self.dir)  # an earlier job's: its followers go on from its last
            self.version = max(bases + deltas, default=-1)
            for name in self.tables:  # the shards start their record of changes
                list(worker.client.changed(name))
            self._snapshot_base(worker.step_count, self.version + 1)

    def __call__(self, step: int) -> None:
        due = self.worker.rank == 0 and time.monotonic() - self.last >= self.pub.every and self._idle()
        if self.consistency == "bounded":
            if due:
                self._start(step)
        elif rank0_says(due, self.worker.world):  # every rank at the same step boundary
            self.worker.embedding.flush()
            barrier(self.worker.world)
            if self.worker.rank == 0:
                self._start(step)

    def publish(self, step: int) -> None:
        """Publish a version of step ``step`` now, on this thread (rank 0; caches as they are)."""
        self._join()
        self._start(step, inline=True)

    def caught_up(self, step: int) -> None:
        """A stream's training caught up with its data at ``step`` (every rank alike, before it
        waits for the next partition, :mod:`het.train.streaming`): every cache flushed and, on
        rank 0, a version of every update up to ``step`` published at once unless the newest
        holds them. What lands is so served one pass over it and one follower poll later, not up
        to a publish interval later, and no worker's updates wait in its cache meanwhile."""
        self.worker.embedding.flush()
        barrier(self.worker.world)
        if self.worker.rank == 0 and step > self.published_step:
            self.publish(step)

    def finish(self, step: int, base: bool = False) -> dict:
        """The last version (every cache flushed before), waited for; with ``base``, a base from
        a snapshot (the PS's rows were put back to a kept save, which the record of changed keys
        does not see)."""
        if self.worker.rank == 0:
            self._join()
            self.snapshot_due |= base
            self.finishing = True  # the last delta starts no base: followers have it, a later job goes on
            self._start(step, inline=True)
            self._wait_base()
            self._wait_compaction()
            if self.compactor is not None:
                self.compactor.stdin.close()
                self.compactor.wait()
            if self.client is not None:
                self.client.close()
        return {"dir": self.dir, "version": self.version, **self.stats}

    # -- at a step boundary (rank 0) ------------------------------------------------------------
    def _idle(self) -> bool:
        if self.job is not None and self.job.is_alive():
            return False
        self._join()
        return True

    def _join(self) -> None:
        if self.job is not None:
            self.job.join()
            self.job = None

    def _start(self, step: int, inline: bool = False) -> None:
        self.last, self.published_step = time.monotonic(), step
        version = self.version + 1
        if self.snapshot_due:
            self._snapshot_base(step, version)
            return
        view = ({n: self.worker.embedding.unpushed(n) for n in self.tables} if self.consistency == "bounded"
                else None)
        args = (version, step, {"trained_at": time.time(), **stream_rows(self.worker.task, step)}, self._dense(), view,
                inline or self.connect is None)
        if args[-1]:
            self._publish(*args)
        else:
            self.job = threading.Thread(target=self._publish_beside, args=args, name="het-publish", daemon=True)
            self.job.start()

    def _dense(self) -> dict:
        """The dense weights now, copied (training goes on changing them in place)."""
        self.worker.dense.before_forward()  # mode ps: the dense parameters as the PS holds them
        return {k: v.detach().cpu().numpy().copy() for k, v in self.worker.model.state_dict().items()
                if not k.startswith("embedding.")}

    def _snapshot_base(self, step: int, version: int) -> None:
        """Snapshot the shards' rows and the dense model as ``version`` and export it in a process
        of its own (the bases before waited for)."""
        self._wait_base()
        self._wait_compaction()
        self.viewed = {n: np.zeros(0, np.int64) for n in self.tables}  # a snapshot holds the shards' rows only
        snapshot = tempfile.mkdtemp(prefix=".snapshot-", dir=self.dir)
        os.rmdir(snapshot)
        published = {"version": version, "trained_at": time.time(), **stream_rows(self.worker.task, step)}
        checkpoint.write(self.worker, snapshot, step, rows_only=True, published=published)  # no optimizer state: 2x, not 3x
        out = os.path.join(self.dir, base_name(version))
        proc = subprocess.Popen([sys.executable, "-m", "het", "export", snapshot, out, "--quiet", "--json", "--dtype",
                                 self.cfg.export.dtype], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.base = (proc, version, out, snapshot)  # at training's priority: deltas and followers wait for it
        self.version, self.snapshot_due = version, False
        self.base_version = self.base_bytes = None
        self.deltas = []

    def _wait_base(self, block: bool = True) -> None:
        """The snapshot being exported, waited for (``block``) or taken if done."""
        if self.base is None or (not block and self.base[0].poll() is None):
            return
        proc, version, out, snapshot = self.base
        self.base = None
        self._based(proc, version, out, self.deltas)
        shutil.rmtree(snapshot, ignore_errors=True)

    def _wait_compaction(self, block: bool = True) -> None:
        """The base being compacted, waited for (``block``) or taken if done."""
        if self.compaction is None:
            return
        pipe = self.compactor.stdout
        if not block and not select.select([pipe], [], [], 0)[0]:
            return
        version, out = self.compaction
        self.compaction = None
        line = pipe.readline()
        answer = json.loads(line) if line else {"ok": False, "error": "the compacting process ended"}
        if not line:
            self.compactor.wait()
            self.compactor = None
        if not answer["ok"]:
            self._failed(f"base {version} of {self.dir}", answer["error"][:300])
            return
        self.stats["bases"] += 1
        self.stats["bases_compacted"] += 1
        self.stats["compact_s"] = round(self.stats["compact_s"] + answer["seconds"], 3)
        self.base_version, self.base_bytes = version, bytes_under(out)
        self.deltas = [d for d in self.deltas if d[0] > version]
        self._prune()

    def _based(self, proc: subprocess.Popen, version: int, out: str, deltas_after: list) -> None:
        """A snapshot's export ended: on success it is the newest base."""
        _, err = proc.communicate()
        if proc.returncode != 0:
            self._failed(f"base {version} of {self.dir}", (err.decode(errors="replace").strip().splitlines() or [""])[-1][:300])
            self.snapshot_due = True  # no base to compact from: a snapshot again
            return
        self.stats["bases"] += 1
        self.base_version, self.base_bytes, self.deltas = version, bytes_under(out), deltas_after
        self._prune()

    # -- beside training ------------------------------------------------------------------------
    def _publish_beside(self, version: int, *args) -> None:
        """:meth:`_publish` on the thread beside training: whatever it raises is reported, and
        the next version is a base from a snapshot (the rows it read may be in no delta)."""
        try:
            self._publish(version, *args)
        except Exception as e:  # noqa: BLE001 - training goes on; followers get a whole base next
            self._failed(f"version {version} of {self.dir}", f"{type(e).__name__}: {e}")
            self.snapshot_due = True

    def _publish(self, version: int, step: int, made: dict, dense: dict, view, inline: bool) -> None:
        """Read the rows changed since the last version and write them as ``version``'s delta,
        rank 0's unpushed copies (``view``: keys, rows, clocks a table; None under ``flush``) over
        the shards' rows; start a base of it once the deltas since the last base near its size."""
        client = self.worker.client if inline else self._client()
        started = []
        pieces = {name: list(client.changed(name, started=started)) for name in self.tables}
        if started:
            self.stats["records_restarted"] += 1
            print(f"het train: the record of changed rows of shard(s) {started} started again (a restart): version "
                  f"{version} is published as a base", file=sys.stderr, flush=True)
            self.snapshot_due = True
            if inline:
                self._snapshot_base(step, version)
            return
        tables, viewed = {}, {}
        for name, got in pieces.items():
            mine = None if view is None else view[name]
            viewed[name] = np.zeros(0, np.int64) if mine is None else mine[0].numpy()
            got += self._reread(client, name, got, viewed[name])
            keys, rows, clocks = delta_arrays(got, mine, client.tables[name].dim, self.buffers[name])
            tables[name] = (keys, encode_rows(rows, self.rows_dtype), clocks)
        rows = sum(len(t[0]) for t in tables.values())
        meta = {"version": version, "step": step, **made, "rows": rows,
                "rows_dtype": self.rows_dtype, **self._behind(inline)}
        size = sum(a.nbytes for t in tables.values() for a in t) + sum(a.nbytes for a in dense.values())
        self._wait_base()  # followers have nothing to apply deltas to before the first base
        self._make_room(size)
        self.version = version
        try:
            size = write_delta(os.path.join(self.dir, delta_name(version)), tables, dense, meta)
        except OSError as e:  # a full disk: a base from a snapshot stands for the next version
            self._failed(f"delta {version} of {self.dir}", str(e))
            self.snapshot_due = True
            return
        self.deltas.append((version, size, meta))
        self.viewed = viewed
        self.stats.update(deltas=self.stats["deltas"] + 1, delta_bytes=self.stats["delta_bytes"] + size,
                          delta_rows=self.stats["delta_rows"] + rows)
        near = self.base_bytes is not None and self._since() + size > self.base_bytes  # the next would pass it
        if (self.compaction is None and self.base_version is not None and not self.finishing
                and (near or len(self.deltas) >= self.pub.base_every)):
            self.stats["bases_for_size"] += int(near and len(self.deltas) < self.pub.base_every)
            self._compact()

    def _reread(self, client, name: str, pieces: list, viewed: np.ndarray, most: int = 1 << 16) -> list:
        """Table ``name``'s rows on the shards of the keys the newest delta took from rank 0's copies
        and this one neither changed nor takes from them again: a copy stands only until the
        shards' row is read again (at the latest in the last, flushed version), so no follower
        keeps one for good. As pieces like ``client.changed``'s."""
        known = np.concatenate([k for k, _, _ in pieces] + [viewed])
        keys = self.viewed[name][~np.isin(self.viewed[name], known)]
        out = []
        for lo in range(0, len(keys), most):
            rows, clocks = client.wait(client.pull(name, torch.from_numpy(keys[lo:lo + most])))
            out.append((keys[lo:lo + most], rows.numpy(), clocks.numpy()))
        return out

    def _since(self) -> int:
        """The bytes of the deltas since the newest base."""
        return sum(size for _, size, _ in self.deltas)

    def _make_room(self, size: int) -> None:
        """Before a delta of ``size`` bytes: keep the deltas since the newest base within its bytes,
        so that with the base being made the directory holds at most three bases' (a delta larger
        than a base alone excepted). The base being made is taken once done, or waited for when the
        delta would pass; with none being made, one is made of the deltas so far and waited for."""
        size += 1 << 16  # the file's header and manifest, beside its arrays
        fits = self.base_bytes is None or self._since() + size <= self.base_bytes
        self._wait_compaction(block=not fits)
        if not fits and self.deltas and self._since() + size > self.base_bytes:
            self._compact()
            self._wait_compaction()

    def _client(self):
        if self.client is None:
            self.client = self.connect()
        return self.client

    def _behind(self, flushed: bool) -> dict:
        """How far a version's rows may be behind training, for its manifest."""
        if flushed or self.consistency == "flush":
            return {"consistency": "flush"}
        return {"consistency": "bounded", "staleness": self.cfg.staleness, "workers": self.worker.world,
                "view": "rank 0"}

    def _compact(self) -> None:
        """Start making the newest delta's version a base: the newest base with the deltas since
        applied, by the job's compacting process (:mod:`het.export.compact`, at a lower priority)."""
        version, _, meta = self.deltas[-1]
        if self.compactor is None:
            self.compactor = subprocess.Popen([sys.executable, "-m", "het.export.compact", "--serve"], text=True,
                                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            lower_priority(self.compactor.pid, 19)  # the lowest that still makes progress on a machine
            # training keeps busy (SCHED_IDLE could starve it, and a delta may wait for the base it makes)
        out = os.path.join(self.dir, base_name(version))
        job = {"base": os.path.join(self.dir, base_name(self.base_version)), "out": out,
               "deltas": [os.path.join(self.dir, delta_name(v)) for v, _, _ in self.deltas],
               "published": {"version": version, **{k: meta[k] for k in ("trained_at", "step", "stream_rows")
                                                    if k in meta}}}
        try:
            self.compactor.stdin.write(json.dumps(job) + "\n")
            self.compactor.stdin.flush()
        except BrokenPipeError:  # it ended: the next base starts another
            self._failed(f"base {version} of {self.dir}", "the compacting process ended")
            self.compactor = None
            return
        self.compaction = (version, out)

    def _failed(self, what: str, why: str) -> None:
        self.stats["failed"].append(f"{what}: {why}")
        print(f"het train: {what} failed: {why}", file=sys.stderr, flush=True)

    def _prune(self) -> None:
        """Keep the newest ``keep`` bases and the deltas after the oldest of them."""
        bases, deltas = listing(self.dir)
        kept = bases[-self.pub.keep:]
        if not kept:
            return
        for v in bases[:-self.pub.keep]:
            shutil.rmtree(os.path.join(self.dir, base_name(v)), ignore_errors=True)
        for v in deltas:
            if v <= kept[0]:
                os.remove(os.path.join(self.dir, delta_name(v)))


def publisher(worker, cfg: TrainConfig, connect=None) -> Publisher | None:
    """The job's publisher (None without ``cfg.publish.dir``)."""
    return Publisher(worker, cfg, connect) if cfg.publish.dir else None

