"""Training on a stream of partitions (``het train --stream PATTERN``): every row once, in order.

The stream (:class:`het.data.stream.PartitionStream`) is the job's data. Step ``s`` trains the
stream's rows ``s * W * B .. (s + 1) * W * B - 1`` (``W`` ranks of ``B`` rows), rank ``r`` the
``r``-th share: which rows a step trains is a function of the step alone, so a job resumed from a
checkpoint at step ``s`` goes on at the first row no step before it trained, and no row is
trained twice. Rank 0 alone looks for partitions; whenever a step needs rows past those every
rank holds, the ranks wait together for rank 0 to say which partitions hold them (it says so at
least every :data:`HEARTBEAT_S` while it waits, keeping the process group alive), and every rank
then reads the same partitions in the same order. When no partition came for ``--stream-idle``
seconds, the rows left are shared out as the last step (fewer than ``W * B``; a rank may get
none) and the job ends.

Each batch is scored before it trains (the training step's forward is that score: progressive
validation, as in Google's ad click paper): :class:`Progressive` keeps, per partition, the log
loss and a histogram of scores from which the AUC comes (4,096 bins: within 1e-4 of the exact
AUC, tests/unit/test_stream.py), merged across ranks at the end.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from het.data.batch import Batch
from het.data.stream import PartitionStream
from het.dist.collectives import gather, rank0_object

@dataclass(frozen=True)
class StreamBatch(Batch):
    """A stream's batch: each row's partition beside it (``parts``, the index of the stream's
    partitions), for progressive validation's tally."""

    parts: np.ndarray = None


HEARTBEAT_S = 60.0  # rank 0 tells the others it still waits at least this often (the group's timeout is 600 s)
BINS = 4096


class StreamSource:
    """The job's stream, read alike by every rank (see the module).

    Args:
        pattern, idle_s: the stream's glob and its idle seconds (None: wait for ever).
        rank, world: this rank, of how many.
        poll_s: how often rank 0 looks for partitions.

    Attributes:
        num_rows: None: the ids are hashed (a dynamic table).
        num_ids, num_dense, num_fields: the first partition's.
    """

    num_rows = None

    def __init__(self, pattern: str, idle_s: float | None, poll_s: float = 0.5):
        self.pattern, self.idle_s, self.poll_s = pattern, idle_s, poll_s
        self.stream = PartitionStream(pattern, poll_s)
        if not self.stream.wait_for(1, idle_s):  # the first partition gives the columns' widths
            raise ValueError(f"stream {pattern!r}: no complete partition (a directory holding its _SUCCESS) came in "
                             f"{idle_s} s; skipped: {self.stream.skipped or 'none'}")
        first = self.stream.parts[0][1]
        self.num_ids, self.num_dense, self.num_fields = first.num_ids, first.num_dense, first.num_fields
        self.attach(0, 1)

    def attach(self, rank: int, world: int) -> None:
        """Read the stream as rank ``rank`` of ``world``: from its first partition, rank 0's
        choices."""
        self.rank, self.world = rank, world
        if rank != 0:
            self.stream = PartitionStream(self.pattern, self.poll_s)  # to hold rank 0's partitions alone
        self.agreed = 0  # rows every rank holds, in the partitions rank 0 took
        self.ended = False
        self._last_taken = time.monotonic()
        self.stop = lambda: False  # the worker's: a stop asked for (SIGTERM) ends a wait for the stream

    def _agree(self, rows: int) -> None:
        """Every rank holds rank 0's partitions once they hold ``rows`` rows, or once the stream
        ended (no partition for ``idle_s``)."""
        while True:
            if self.rank == 0:
                held = self.stream.rows
                ready = self.stream.wait_for(rows, HEARTBEAT_S if self.idle_s is None else min(HEARTBEAT_S, self.idle_s),
                                             self.stop)
                if self.stop():
                    raise RuntimeError(f"asked to stop while waiting for the stream's rows past {self.stream.rows:,}")
                if self.stream.rows > held:
                    self._last_taken = time.monotonic()
                idle = self.idle_s is not None and time.monotonic() - self._last_taken >= self.idle_s
                said = ([p for p, _ in self.stream.parts], ready, idle)
            else:
                said = None
            paths, ready, idle = rank0_object(said, self.world)
            if self.rank != 0:
                self.stream.adopt(paths)
            if ready or idle:
                self.agreed, self.ended = self.stream.rows, not ready
                return

    def step_rows(self, step: int, size: int) -> tuple[int, int]:
        """The stream rows this rank trains at ``step`` (``lo, hi``), waiting for them; an empty
        span past the stream's end."""
        lo, need = step * self.world * size, (step + 1) * self.world * size
        if need > self.agreed and not self.ended:
            self._agree(need)
        hi = min(need, self.agreed)
        n = max(0, hi - lo)
        return lo + self.rank * n // self.world, lo + (self.rank + 1) * n // self.world

    def step_batch(self, step: int, size: int) -> tuple[Batch, np.ndarray] | None:
        """This rank's batch of ``step`` and each row's partition; None once the stream ended
        before the step (every rank alike)."""
        lo, hi = self.step_rows(step, size)
        if step * self.world * size >= self.agreed:
            return None
        if hi == lo:  # the last step's rows went to the ranks before this one
            first = self.stream.parts[0][1]
            return first.rows_between("train", 0, 0), np.zeros(0, np.int64)
        return self.stream.rows_between(lo, hi), self.stream.partitions_of(lo, hi)

    def batch(self, split: str, index: int, size: int) -> Batch:
        raise ValueError(f"a stream has no {split!r} split: its batches are scored as they come (progressive "
                         f"validation), before each trains")

    def summary(self, steps: int, size: int) -> dict:
        """The stream's part of the job's summary: partitions taken, rows trained over every run
        of the job (a step's rows are a function of the step), what was skipped and why."""
        trained = min(steps * self.world * size, self.agreed)
        return {"partitions": len(self.stream.parts), "rows_trained": trained, "rows": self.agreed,
                "ended": self.ended, "skipped": dict(self.stream.skipped)}


class Progressive:
    """Progressive validation's tally (see the module): per partition, rows, the log loss's sum
    and histograms of the scores of positives and negatives."""

    def __init__(self):
        self.parts: dict[int, np.ndarray] = {}  # partition -> (3, BINS): positives, negatives; [2, 0]: loss sum

    def add(self, logits: torch.Tensor, labels: torch.Tensor, parts: np.ndarray) -> None:
        """Score one batch (its logits before it trains). Shape: (n,), (n,), (n,)."""
        if not len(parts):
            return
        logits, labels = logits.detach().double().cpu().reshape(-1), labels.detach().double().cpu().reshape(-1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="none").numpy()
        bins = np.minimum((torch.sigmoid(logits).numpy() * BINS).astype(np.int64), BINS - 1)
        positive = labels.numpy() > 0.5
        for p in np.unique(parts):
            at = parts == p
            tally = self.parts.setdefault(int(p), np.zeros((3, BINS)))
            tally[0] += np.bincount(bins[at & positive], minlength=BINS)
            tally[1] += np.bincount(bins[at & ~positive], minlength=BINS)
            tally[2, 0] += loss[at].sum()

    def merged(self, world: int) -> dict[int, np.ndarray]:
        """Every rank's tallies summed (every rank calls it)."""
        out: dict[int, np.ndarray] = {}
        for tallies in gather(self.parts, world):
            for p, t in tallies.items():
                out[p] = out.get(p, 0) + t
        return out

    @staticmethod
    def metrics(tallies: dict[int, np.ndarray], names: list[str]) -> dict:
        """AUC and log loss per partition and over all of them, from merged tallies."""
        every = sum(tallies.values()) if tallies else np.zeros((3, BINS))
        per = [{"partition": names[p], "rows": int(t[:2].sum()), **_metrics(t)} for p, t in sorted(tallies.items())]
        return {"rows": int(every[:2].sum()), **_metrics(every), "by_partition": per}


def _metrics(t: np.ndarray) -> dict:
    """AUC (ties within a bin count half) and mean log loss of one tally."""
    pos, neg = t[0], t[1]
    n = pos.sum() + neg.sum()
    below = np.concatenate([[0.0], np.cumsum(neg)[:-1]])  # negatives in lower bins
    auc = float((pos * (below + neg / 2)).sum() / (pos.sum() * neg.sum())) if pos.sum() and neg.sum() else float("nan")
    return {"auc": auc, "logloss": float(t[2, 0] / n) if n else float("nan")}


def stream_summary(task, steps: int, scored: dict) -> dict:
    """The summary's ``stream``: :meth:`StreamSource.summary` and the progressive metrics."""
    source = task.data
    names = [path for path, _ in source.stream.parts]
    return {**source.summary(steps, task.cfg.batch), "progressive": Progressive.metrics(scored, names)}
