"""Training on a stream of partitions (``het train --stream PATTERN``): every row once, in order.

The stream (a :class:`het.data.stream.Source`; partitions: :class:`~het.data.stream.PartitionStream`)
is the job's data, its rows one sequence. Each step trains the next ``W * B`` rows (``W`` ranks of
``B`` rows), rank ``r`` the ``r``-th share. Rank 0 alone looks for partitions; whenever a step
needs rows past those every rank holds, the ranks ask together, and rank 0 says which partitions
hold them (at least every :data:`HEARTBEAT_S` while it waits, keeping the process group alive);
every rank then reads the same partitions in the same order. A step that finds fewer rows than
``W * B`` (training caught up with the data) trains those at once, the ranks sharing them (a
rank may get none), and the next step starts past them: what lands is trained a pass after it
lands, not once a whole step's rows came. Only a step that finds no row waits; before it does,
``on_caught_up`` runs on every rank (the publisher's, which serves every row trained). When a
wait passed ``--stream-idle`` seconds with no partition taken, the job ends.

A checkpoint (and a re-forming group's dense snapshot) holds the stream's
:meth:`StreamSource.position`: the partitions taken, in order, and the rows trained; a job resumed
from it reads those partitions in that order and goes on at the next row, whatever its workers and
batch: every row once across restarts.

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
from het.data.stream_raw import RawPartitions, default_directory
from het.dist.collectives import gather, rank0_object

@dataclass(frozen=True)
class StreamBatch(Batch):
    """A stream's batch: each row's partition beside it (``parts``, the index of the stream's
    partitions), for progressive validation's tally."""

    parts: np.ndarray = None


HEARTBEAT_S = 60.0  # rank 0 tells the others it still waits at least this often (the group's timeout is 600 s)
BINS = 4096
CHUNKS = 8  # a rolling window's chunks


class StreamSource:
    """The job's stream, read alike by every rank (see the module).

    Args:
        pattern, idle_s: the stream's glob and its idle seconds (None: wait for ever).
        prepared, schema: where raw partitions are prepared (None: :func:`default_directory`),
            and their schema TOML (None: inferred from the first): :mod:`het.data.stream_raw`.
        rank, world: this rank, of how many.
        poll_s: how often rank 0 looks for partitions.

    Attributes:
        num_rows: None: the ids are hashed (a dynamic table).
        num_ids, num_dense, num_fields: the first partition's.
    """

    num_rows = None

    def __init__(self, pattern: str, idle_s: float | None, poll_s: float = 0.5, prepared: str | None = None,
                 schema: str | None = None):
        self.pattern, self.idle_s, self.poll_s = pattern, idle_s, poll_s
        self.raw = RawPartitions(prepared or default_directory(pattern), schema)  # raw partitions' preparations
        self.stream = PartitionStream(pattern, poll_s, self.raw)
        # the first partition gives the columns' widths; one refused (damaged, a schema that does not
        # fit) is said at once rather than waited past
        refused = lambda: bool(self.stream.skipped) and not self.stream.parts  # noqa: E731
        if not self.stream.wait_for(1, idle_s, refused):
            raise ValueError(f"stream {pattern!r}: no complete partition (a directory holding its _SUCCESS, or a CSV, "
                             f"TSV or Parquet file under its final name) was taken in {idle_s} s; refused: "
                             f"{self.stream.skipped or 'none'}")
        first = self.stream.parts[0][1]
        self.num_ids, self.num_dense, self.num_fields = first.num_ids, first.num_dense, first.num_fields
        self.attach(0, 1)

    @classmethod
    def of(cls, stream) -> StreamSource:
        """The source of a job's ``[stream]`` (:class:`het.train.sections.StreamConfig`)."""
        return cls(stream.pattern, stream.idle, prepared=stream.prepared, schema=stream.schema)

    def attach(self, rank: int, world: int) -> None:
        """Read the stream as rank ``rank`` of ``world``: from its first partition, rank 0's
        choices."""
        self.rank, self.world = rank, world
        if rank != 0:
            self.stream = PartitionStream(self.pattern, self.poll_s, self.raw)  # to hold rank 0's partitions alone
        self.agreed = 0  # rows every rank holds, in the partitions rank 0 took
        self.base_row, self.base_step = 0, 0  # step `base_step` trains from stream row `base_row` (a resumed job's)
        self._made = None  # (step, its first row, this rank's lo, hi): the last step's rows
        self.ended = False
        self.stop = lambda: False  # the worker's: a stop asked for (SIGTERM) ends a wait for the stream
        # called on every rank with the step about to wait, when the stream holds no row it needs:
        # training caught up with the data (the publisher's: a version of every row trained, now)
        self.on_caught_up = None

    def _agree(self, rows: int, lo: int, step: int) -> None:
        """Every rank holds rank 0's partitions once they hold ``rows`` rows, or some past row
        ``lo`` (training caught up with the stream: those are trained now, in a smaller step,
        not held back until a whole step's rows came), or once the stream ended (a wait of
        ``idle_s`` with no partition). Before it waits, ``on_caught_up(step)``."""
        first, self._last_taken = True, time.monotonic()  # idle: waited that long with no partition taken
        while True:
            if self.rank == 0:
                held = self.stream.rows
                wait = 0.0 if first else HEARTBEAT_S if self.idle_s is None else min(HEARTBEAT_S, self.idle_s)
                ready = self.stream.wait_for(rows if first else lo + 1, wait, self.stop)
                if self.stop():
                    raise RuntimeError(f"asked to stop while waiting for the stream's rows past {self.stream.rows:,}")
                if self.stream.rows > held:
                    self._last_taken = time.monotonic()
                idle = self.idle_s is not None and time.monotonic() - self._last_taken >= self.idle_s
                said = ([p for p, _ in self.stream.parts], self.stream.rows > lo, idle)
            else:
                said = None
            paths, some, idle = rank0_object(said, self.world)
            if self.rank != 0:
                self.stream.adopt(paths)
            self.agreed = self.stream.rows
            if some or idle:
                self.ended = not some
                return
            if first and self.on_caught_up is not None:
                self.on_caught_up(step)
            first = False

    def ends(self) -> list[int]:
        """Each taken partition's last row plus one, in the stream."""
        return [int(e) for e in np.cumsum([data.rows["train"] for _, data in self.stream.parts])]

    def first_row(self, step: int, size: int) -> int:
        """The stream row step ``step`` (of batches of ``size`` a rank) starts from."""
        return self.base_row + (step - self.base_step) * self.world * size

    def position(self, step: int, size: int) -> dict:
        """Where the stream stands after ``step`` steps, for a checkpoint: the partitions taken,
        in order, and the rows trained."""
        return {"partitions": [path for path, _ in self.stream.parts],
                "rows": min(self.first_row(step, size), self.agreed)}

    def resume(self, position: dict, step: int) -> None:
        """Go on from a checkpoint's :meth:`position` at ``step``: the partitions it had taken,
        in its order (one that landed since, before the last of them, is out of order), and the
        first row no step before trained, whatever the workers and batch were."""
        self.stream = PartitionStream(self.pattern, self.poll_s, self.raw)
        self.stream.adopt(list(position["partitions"]))
        self.agreed, self.ended = self.stream.rows, False
        self.base_row, self.base_step, self._made = int(position["rows"]), step, None

    def step_rows(self, step: int, size: int) -> tuple[int, int, int]:
        """The stream rows step ``step`` trains: the first, and this rank's share (``lo, hi``),
        waiting for them. A step short of ``W * size`` rows (the stream's head, or its end)
        takes what there is, and the next step starts past it."""
        if self._made is not None and self._made[0] == step:  # asked again: the same rows
            return self._made[1:]
        first = self.first_row(step, size)
        need = first + self.world * size
        if need > self.agreed and not self.ended:
            self._agree(need, first, step)
        end = min(need, self.agreed)
        n = max(0, end - first)
        if 0 < n < self.world * size and not self.ended:  # caught up: the next step goes on from here
            self.base_row, self.base_step = end, step + 1
        self._made = (step, first, first + self.rank * n // self.world, first + (self.rank + 1) * n // self.world)
        return self._made[1:]

    def step_batch(self, step: int, size: int) -> tuple[Batch, np.ndarray] | None:
        """This rank's batch of ``step`` and each row's partition; None once the stream ended
        before the step (every rank alike)."""
        first, lo, hi = self.step_rows(step, size)
        if first >= self.agreed:
            return None
        if hi == lo:  # a short step's rows went to the ranks before this one
            first = self.stream.parts[0][1]
            return first.rows_between("train", 0, 0), np.zeros(0, np.int64)
        return self.stream.rows_between(lo, hi), self.stream.partitions_of(lo, hi)

    def batch(self, split: str, index: int, size: int) -> Batch:
        raise ValueError(f"a stream has no {split!r} split: its batches are scored as they come (progressive "
                         f"validation), before each trains")

    def summary(self, steps: int, size: int) -> dict:
        """The stream's part of the job's summary: partitions taken, rows trained over every run
        of the job (from its place in the checkpoint resumed from), what was skipped and why."""
        trained = min(self.first_row(steps, size), self.agreed)
        return {"partitions": len(self.stream.parts), "rows_trained": trained, "rows": self.agreed,
                "ended": self.ended, "skipped": dict(self.stream.skipped)}


class Progressive:
    """Progressive validation's tally (see the module): per partition, rows, the log loss's sum
    and histograms of the scores of positives and negatives; and the same over this rank's
    latest rows (a rolling window of about ``window`` rows, in :data:`CHUNKS` chunks: the
    oldest chunk leaves as a new one fills), which is what a dashboard follows while the job runs.

    Example:
        >>> p = Progressive(window=8)
        >>> p.add(torch.tensor([2.0, -2.0, 1.0, -1.0]), torch.tensor([1.0, 0.0, 1.0, 0.0]), np.zeros(4, np.int64))
        >>> p.window_metrics()["auc"], p.window_metrics()["rows"]
        (1.0, 4)
    """

    def __init__(self, window: int = 100_000):
        self.parts: dict[int, np.ndarray] = {}  # partition -> (3, BINS): positives, negatives; [2, 0]: loss sum
        self.chunk = max(1, window // CHUNKS)  # rows a chunk of the window holds
        self.chunks: list[np.ndarray] = [np.zeros((3, BINS))]  # the window, oldest first; the last filling
        self.filling = 0  # rows in the last chunk
        self.added = 0  # rows this rank scored in this run
        # rank 0, from the checkpoint a job resumed from: the partitions earlier runs scored whole
        # (their metrics) and their tallies summed: the summary spans every run of the job
        self.done: dict[int, dict] = {}
        self.before = np.zeros((3, BINS))

    def add(self, logits: torch.Tensor, labels: torch.Tensor, parts: np.ndarray) -> None:
        """Score one batch (its logits before it trains). Shape: (n,), (n,), (n,)."""
        if not len(parts):
            return
        self.added += len(parts)
        logits, labels = logits.detach().double().cpu().reshape(-1), labels.detach().double().cpu().reshape(-1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="none").numpy()
        bins = np.minimum((torch.sigmoid(logits).numpy() * BINS).astype(np.int64), BINS - 1)
        positive = labels.numpy() > 0.5
        for p in np.unique(parts):
            at = parts == p
            _tally(self.parts.setdefault(int(p), np.zeros((3, BINS))), bins[at], positive[at], loss[at])
        done = 0
        while done < len(parts):  # the window: the rows in order, into its newest chunk
            take = min(len(parts) - done, self.chunk - self.filling)
            at = slice(done, done + take)
            _tally(self.chunks[-1], bins[at], positive[at], loss[at])
            self.filling, done = self.filling + take, done + take
            if self.filling == self.chunk:  # full: the oldest chunk leaves
                self.chunks, self.filling = [*self.chunks[-(CHUNKS - 1):], np.zeros((3, BINS))], 0

    def window_metrics(self) -> dict:
        """AUC, log loss and rows of this rank's rolling window."""
        t = self.window()
        return {"rows": int(t[:2].sum()), **_metrics(t)}

    def window(self) -> np.ndarray:
        """This rank's window, summed. Shape: (3, BINS)."""
        return np.sum(self.chunks, axis=0)

    def merged(self, world: int) -> dict:
        """Every rank's tallies summed (every rank calls it): ``parts`` (partition -> tally),
        ``window`` (the ranks' windows: the job's latest rows) and ``added`` (rows scored in
        this run); with what earlier runs scored (``done``, ``before``: rank 0's)."""
        parts: dict[int, np.ndarray] = {}
        window, added = np.zeros((3, BINS)), 0
        for theirs in gather({"parts": self.parts, "window": self.window(), "added": self.added}, world):
            for p, t in theirs["parts"].items():
                parts[p] = parts.get(p, 0) + t
            window += theirs["window"]
            added += theirs["added"]
        return {"parts": parts, "window": window, "added": added, "done": self.done, "before": self.before}

    def carry(self, world: int, rows: int, ends: list[int]) -> dict:
        """What a checkpoint after stream row ``rows`` keeps for the runs resumed from it (every
        rank calls it; rank 0's is whole): the partitions scored whole by then as their metrics,
        their tallies summed, the tallies of the partitions not yet whole, and the window."""
        m = self.merged(world)
        whole = {p: t for p, t in m["parts"].items() if ends[p] <= rows}
        tensor = torch.from_numpy  # a checkpoint holds tensors and plain values: torch.load(weights_only=True) reads it
        return {"done": {**self.done, **{p: {"rows": int(t[:2].sum()), **_metrics(t)} for p, t in whole.items()}},
                "before": tensor(self.before + sum(whole.values(), np.zeros((3, BINS)))),
                "open": {p: tensor(t) for p, t in m["parts"].items() if p not in whole}, "window": tensor(m["window"])}

    def resume_from(self, carried: dict, rank: int) -> None:
        """Go on from :meth:`carry`'s (rank 0 holds it; the other ranks start empty)."""
        if rank == 0:
            self.done, self.before = dict(carried["done"]), carried["before"].numpy().copy()
            self.parts = {int(p): t.numpy().copy() for p, t in carried["open"].items()}
            self.chunks, self.filling = [carried["window"].numpy().copy(), np.zeros((3, BINS))], 0

    @staticmethod
    def metrics(merged: dict, names: list[str]) -> dict:
        """AUC and log loss per partition, over all of them and over the window, from
        :meth:`merged` tallies: over every run of the job resumed from a checkpoint
        (``rows_this_run``: the rows this run scored)."""
        tallies = merged["parts"]
        every = merged["before"] + sum(tallies.values(), np.zeros((3, BINS)))
        per = [{"partition": names[p], **m} for p, m in sorted(merged["done"].items())]
        per += [{"partition": names[p], "rows": int(t[:2].sum()), **_metrics(t)} for p, t in sorted(tallies.items())]
        window = merged["window"]
        return {"rows": int(every[:2].sum()), **_metrics(every), "by_partition": per,
                "rows_this_run": int(merged["added"]), "window": {"rows": int(window[:2].sum()), **_metrics(window)}}


def _tally(t: np.ndarray, bins: np.ndarray, positive: np.ndarray, loss: np.ndarray) -> None:
    """Add rows (their score bins, labels and losses) to tally ``t``."""
    t[0] += np.bincount(bins[positive], minlength=BINS)
    t[1] += np.bincount(bins[~positive], minlength=BINS)
    t[2, 0] += loss.sum()


def _metrics(t: np.ndarray) -> dict:
    """AUC (ties within a bin count half) and mean log loss of one tally."""
    pos, neg = t[0], t[1]
    n = pos.sum() + neg.sum()
    below = np.concatenate([[0.0], np.cumsum(neg)[:-1]])  # negatives in lower bins
    auc = float((pos * (below + neg / 2)).sum() / (pos.sum() * neg.sum())) if pos.sum() and neg.sum() else float("nan")
    return {"auc": auc, "logloss": float(t[2, 0] / n) if n else float("nan")}


def stream_rows(task, step: int) -> dict:
    """A stream job's rows trained by ``step`` (the step now: a stream's steps differ in rows),
    for a published version's manifest (``stream_rows``: what its follower serves); {} for
    another job."""
    if getattr(task, "progressive", None) is None:
        return {}
    return {"stream_rows": task.data.position(step, task.cfg.batch)["rows"]}


def stream_summary(task, steps: int, scored: dict) -> dict:
    """The summary's ``stream``: :meth:`StreamSource.summary` and the progressive metrics."""
    source = task.data
    names = [path for path, _ in source.stream.parts]
    return {**source.summary(steps, task.cfg.batch), "progressive": Progressive.metrics(scored, names)}
