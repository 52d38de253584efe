"""Exports of the model while it trains (``het train --export DIR --export-every N``).

Every ``N`` steps (``export.every``, and at the last step) every rank flushes its cache and the job writes a
snapshot, a checkpoint of that step beside the export (``DIR.snapshot-STEP``); then rank 0 runs
``het export`` on it in a background process, at a lower priority, and removes the snapshot once
the export is in place. Training goes on meanwhile: it pauses only for the flush and the
shards' save. An export still running when the next one is due is waited for first; the job's
end waits for the last.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

from het.process import lower_priority
from het.train import checkpoint
from het.train.config import TrainConfig


class Exporter:
    """The per-step hook that exports every ``cfg.export_every`` steps (see the module)."""

    def __init__(self, worker, cfg: TrainConfig):
        self.worker, self.cfg = worker, cfg
        self.out = os.path.abspath(cfg.export.dir)
        self.proc: subprocess.Popen | None = None
        self.snapshot: str | None = None
        self.log = None
        self.written, self.failed = 0, []
        self.step: int | None = None  # the step of the model exported last

    def __call__(self, step: int) -> None:
        if step % self.cfg.export.every == 0 or step == self.cfg.steps:
            self.export(step)

    def export(self, step: int) -> None:
        """Snapshot the model at ``step`` (every rank) and start exporting it (rank 0)."""
        self.wait()
        self.step = step
        snapshot = f"{self.out}.snapshot-{step}"
        checkpoint.save(self.worker, snapshot, step)
        if self.worker.rank != 0:
            return
        self.snapshot = snapshot
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-m", "het", "export", snapshot, self.out, "--dtype",
                                      self.cfg.export.dtype, "--quiet", "--json"], stdout=self.log,
                                     stderr=subprocess.STDOUT)
        lower_priority(self.proc.pid, 10)  # the export shares the machine with training: training first

    def wait(self) -> None:
        """Wait for the export in flight, if any; a failed one is counted and named."""
        if self.proc is None:
            return
        code = self.proc.wait()
        self.log.seek(0)
        last = (self.log.read().decode(errors="replace").strip().splitlines() or [""])[-1]
        self.log.close()
        if code == 0:
            self.written += 1
        else:
            self.failed.append(f"{os.path.basename(self.snapshot)}: {last[:300]}")
            print(f"het train: the export of {self.snapshot} failed: {last[:300]}", file=sys.stderr, flush=True)
        shutil.rmtree(self.snapshot, ignore_errors=True)
        self.proc = self.snapshot = self.log = None

    def summary(self) -> dict:
        return {"dir": self.out, "written": self.written, "failed": self.failed}


def exporter(worker, cfg: TrainConfig) -> Exporter | None:
    """The job's exporter (None without ``cfg.export.every``)."""
    if not cfg.export.dir or not cfg.export.every:
        return None
    return Exporter(worker, cfg)


class Outputs:
    """What a job writes for use beyond training while it trains: exports (``[export]``) and
    publications for servers (``[publish]``, :mod:`het.train.publish`)."""

    def __init__(self, worker, cfg: TrainConfig, connect=None):
        from het.train.publish import publisher

        # connect: a new client of the job's shards, for the publisher's thread beside training
        self.exports, self.publishes = exporter(worker, cfg), publisher(worker, cfg, connect)
        self.hooks = [h for h in (self.exports, self.publishes) if h is not None]

    def finish(self, step: int, kept: int | None = None) -> dict:
        """After the last step (every cache flushed): the last publication, and the export in
        flight waited for; the summary's entries. ``kept``: the step of the model the job ends
        with, when validation put an earlier one back: it is exported and published whole."""
        kept = step if kept is None else kept
        out = {}
        if self.publishes is not None:
            out["published"] = self.publishes.finish(kept, base=kept != step)
        if self.exports is not None:
            if self.exports.step != kept or kept != step:
                self.exports.export(kept)
            self.exports.wait()
            out["exports"] = self.exports.summary()
        return out
