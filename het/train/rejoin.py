"""Workers that rejoin: a dead worker is started again and the worker group re-formed while the
shards serve on, as torchrun's elastic agent does (``torchrun --max-restarts N``, and the local
cluster's ``het train --max-restarts N``, which sets the same environment).

When a worker dies, every other one finds its next collective broken: it flushes its caches to
the shards (they are alive), writes its dense model and optimizer at the last step it finished,
and exits with :data:`REJOIN_EXIT`. The agent starts the whole group again; the new ranks
gather what each machine's rejoin directory holds, the newest dense snapshot is broadcast from
the rank that has it, and training goes on from its step. No row is reloaded: the shards hold
every push made. A group is a restart when any rank's ``TORCHELASTIC_RESTART_COUNT`` is above 0
(torchrun's agents count apart: one whose workers were restarted for a peer machine's failure
counts nothing), and its generation is one more than the newest any record holds.

What is lost is counted: every rank keeps, in its directory, the row updates it has made and not
pushed, rewritten each step (two checksummed slots of a mapped file, so a kill -9 mid-write
leaves the other); a rank that died unflushed lost exactly those (as of its last finished step;
the step in flight is trained again by the group). Rank 0 also snapshots the dense state when a
generation starts and every ``dense_snapshot_s`` seconds: a group with no survivor (one worker)
goes on from there.

A machine's directory (``rejoin_dir``; a local cluster's ``RUN_DIR/rejoin``, under torchrun
``$TMPDIR/het-rejoin-<user>-<run id>-<agent pid>``: the agent that starts the workers again is
their parent, so the name is this job's on this machine) holds ``rank-<r>.gen-<g>.state``, a
record per rank and generation, and ``rank-<r>.pt``, the rank's latest snapshot (its own step
inside); a fresh job (generation 0) clears it. What is read there is trusted only as far as a
file the user alone could have written: the directory must be the user's own with no access
for others (mode 0700; het makes it so, and refuses one that is not), and a snapshot is read
as tensors and plain values only (``torch.load(weights_only=True)``), never as code.
"""

from __future__ import annotations

import contextlib
import getpass
import glob
import os
import pickle
import sys
import tempfile
import time
import zlib

import numpy as np
import torch
import torch.distributed as dist

from het import files
from het.dist.collectives import barrier, gather

REJOIN_EXIT = 75  # EX_TEMPFAIL: this worker left for the group to re-form; nothing of it is lost
FORMAT = 1
_FIELDS = ("generation", "step", "pending", "flushed", "lost", "snapshot_step")
_SLOT = len(_FIELDS) + 2  # the fields, a sequence number, a CRC-32


def restarted() -> bool:
    """Whether this machine's agent started its workers again (torchrun's restart count)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)) > 0


def enabled() -> bool:
    """Whether a dead worker's group will be started again (torchrun's, or the local
    cluster's, ``--max-restarts`` above 0)."""
    return int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", 0)) > 0


def directory(setting: str | None) -> str | None:
    """This machine's rejoin directory: ``setting`` (``rejoin_dir``), or under torchrun
    ``$TMPDIR/het-rejoin-<user>-<run id>``; None when no group will be started again."""
    if not enabled():
        return None
    run = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    return setting or os.path.join(tempfile.gettempdir(), f"het-rejoin-{getpass.getuser()}-{run}-{os.getppid()}")


def own_directory(path: str) -> None:
    """Make ``path`` (mode 0700) or check that it is a directory of this user's, closed to
    everyone else: a ValueError otherwise, naming what it is. Another user's directory, or one
    others may write in, could hold a snapshot or a record planted there."""
    if not os.path.lexists(path):
        os.makedirs(path, mode=0o700, exist_ok=True)
        os.chmod(path, 0o700)  # whatever the umask
    st = os.lstat(path)
    if not os.path.isdir(path) or os.path.islink(path) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise ValueError(f"rejoin directory {path}: expected a directory of this user's (uid {os.geteuid()}) with "
                         f"mode 0700, got {'a link' if os.path.islink(path) else 'one'} of uid {st.st_uid} with mode "
                         f"{st.st_mode & 0o777:o}: refusing to trust what it holds; remove it, chmod 700 it, or give "
                         f"--rejoin-dir")


class StateFile:
    """One rank's record: two slots of a mapped file, each its fields, a sequence number and a
    CRC-32; a write fills the older slot, so a process killed while writing leaves the newer."""

    def __init__(self, path: str, create: bool = False):
        self.path = path
        if create:
            files.write_file(path, lambda f: f.write(bytes(2 * _SLOT * 8)))
        self.slots = np.memmap(path, dtype=np.int64, mode="r+" if create else "r", shape=(2, _SLOT))
        self.seq = max((int(self.slots[i, -2]) for i in range(2)), default=0)

    def write(self, **fields) -> None:
        values = [int(fields[k]) for k in _FIELDS]
        self.seq += 1
        slot = self.slots[self.seq % 2]
        slot[:-2] = values
        slot[-2] = self.seq
        slot[-1] = zlib.crc32(np.asarray(values + [self.seq], dtype=np.int64).tobytes())

    def read(self) -> dict | None:
        """The newest intact slot's fields (None: neither slot intact, or never written)."""
        best = None
        for slot in np.array(self.slots):
            seq, crc = int(slot[-2]), int(slot[-1])
            if seq and zlib.crc32(slot[:-1].tobytes()) == crc and (best is None or seq > best[0]):
                best = (seq, dict(zip(_FIELDS, (int(v) for v in slot[:-2]))))
        return None if best is None else best[1]


class Rejoin:
    """One rank's part: its record each step, its snapshots, and the start of a generation.

    Args:
        worker: the rank's :class:`het.train.loop.Worker`.
        directory: this machine's rejoin directory (None: rejoining is off).
        snapshot_s: seconds between rank 0's dense snapshots.
    """

    def __init__(self, worker, directory: str | None, snapshot_s: float = 30.0):
        self.worker, self.directory, self.snapshot_s = worker, directory, snapshot_s
        self.generation = 0
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self.lost, self.rejoined_at = 0, None
        self.snapshot_step, self._snapshot_time = -1, 0.0
        self.state: StateFile | None = None

    def __bool__(self) -> bool:
        return self.directory is not None

    def begin(self, resume) -> int:
        """The step to train from: a rejoining group's newest dense snapshot, else ``resume()``
        (a checkpoint's step, or 0). Every rank calls it."""
        if not self:
            return resume()
        if self.local_rank == 0:
            own_directory(self.directory)
        mine, skipped = read_records(self.directory, skipped=True) if self.local_rank == 0 else ([], [])
        for line in skipped:
            _say(f"het train: worker {self.worker.rank}: {line}")
        everyone = gather((restarted(), mine), self.worker.world)
        records = [(holder, r) for holder, (_, rs) in enumerate(everyone) for r in rs]
        if any(again for again, _ in everyone):
            self.generation = 1 + max((r["generation"] for _, r in records), default=0)
        elif self.local_rank == 0:  # a fresh job: what an earlier one left goes
            for path in glob.glob(os.path.join(self.directory, "rank-*")):
                os.remove(path)
        barrier(self.worker.world)
        start = self._restore(records) if self.generation else None
        if start is None:
            start = resume()
        own_directory(self.directory)
        self.state = StateFile(self._path(f".gen-{self.generation}.state"), create=True)
        if self.worker.rank == 0:
            self.snapshot(start)
        self._record(start, pending=0, flushed=0)
        return start

    def __call__(self, step: int) -> None:
        """After each step: this rank's unpushed updates; rank 0's snapshot when it is due."""
        if self.state is None:
            return
        if self.worker.rank == 0 and time.monotonic() - self._snapshot_time >= self.snapshot_s:
            self.snapshot(step)
        self._record(step, pending=self.worker.embedding.pending_updates(), flushed=0)

    def snapshot(self, step: int) -> None:
        """This rank's dense model and optimizer as they are after ``step`` steps."""
        w = self.worker
        state = {"format": FORMAT, "step": step, "generation": self.generation, "lost": self.lost,
                 "model": {k: v for k, v in w.model.state_dict().items() if not k.startswith("embedding.")},
                 "optimizer": w.dense.state_dict()}
        if w.task.progressive is not None:  # a stream's place: its steps differ in rows (het.train.streaming)
            state["stream"] = w.task.data.position(step, w.cfg.batch)
        files.write_file(self._path(".pt"), lambda f: torch.save(state, f))
        self.snapshot_step, self._snapshot_time = step, time.monotonic()

    @contextlib.contextmanager
    def guard(self, step_of):
        """Around training: a collective broken by a peer's death (a RuntimeError, with several
        workers) flushes this rank's caches, snapshots its dense state at ``step_of()`` and
        exits :data:`REJOIN_EXIT` for the group to re-form."""
        try:
            yield
        except RuntimeError as e:
            if self.state is None or self.worker.world == 1:
                raise
            step = step_of()
            reason = (str(e).strip().splitlines() or [""])[0][:200]
            _say(f"het train: worker {self.worker.rank} lost its group after step {step} ({reason}); "
                 f"flushing its cache for the group to re-form")
            self.worker.embedding.flush()
            self.snapshot(step)
            self._record(step, pending=0, flushed=1)
            raise SystemExit(REJOIN_EXIT) from None

    def summary(self, start: int, steps: int) -> dict:
        """What the job's summary says of rejoining."""
        out = {"worker_restarts": self.generation, "updates_lost": self.lost}
        if self.rejoined_at is not None:
            out.update(rejoined_at_step=self.rejoined_at, steps=start + steps, steps_since_rejoin=steps)
        return out

    # -- internals ----------------------------------------------------------------------------
    def _path(self, suffix: str) -> str:
        return os.path.join(self.directory, f"rank-{self.worker.rank}{suffix}")

    def _record(self, step: int, pending: int, flushed: int) -> None:
        self.state.write(generation=self.generation, step=step, pending=pending, flushed=flushed, lost=self.lost,
                         snapshot_step=self.snapshot_step)

    def _restore(self, records: list[tuple[int, dict]]) -> int | None:
        """From every machine's ``records`` (each with the new rank that read it): count what
        the ranks that died unflushed lost; load the newest snapshot, broadcast from the rank
        whose machine holds it. None: no snapshot."""
        w = self.worker
        self.lost = lost_updates([r for _, r in records], self.generation)
        # the last generation's snapshots (a rank's file holds its newest), else any older one
        snaps = [(r["generation"] == self.generation - 1, r["snapshot_step"], -holder, r["path"])
                 for holder, r in records if r["snapshot_step"] >= 0]
        if not snaps:
            _say(f"het train: worker {w.rank}: no dense snapshot to rejoin from in {self.directory}")
            return None
        _, _, holder, path = max(snaps)
        box = [_read_snapshot(path) if w.rank == -holder else None]
        if w.world > 1:
            dist.broadcast_object_list(box, src=-holder)
        state = box[0]
        missing, unexpected = w.model.load_state_dict(state["model"], strict=False)
        if unexpected or any(not k.startswith("embedding.") for k in missing):
            raise ValueError(f"{path} does not fit this model: missing {missing}, unexpected {unexpected}")
        w.dense.load_state_dict(state["optimizer"])
        w.embedding.resume_at(int(state["step"]))
        if state.get("stream") and w.task.progressive is not None:
            w.task.data.resume(state["stream"], int(state["step"]))
        self.rejoined_at = int(state["step"])
        if w.rank == 0:
            _say(f"het train: the workers re-formed (generation {self.generation}) at step {self.rejoined_at}; "
                 f"{self.lost:,} row updates lost in all")
        return self.rejoined_at


def read_records(directory: str, skipped: bool = False):
    """Every intact rank record in ``directory``, with its snapshot's path; with ``skipped``,
    also a line for each record that could not be read, and why."""
    out, passed = [], []
    for path in sorted(glob.glob(os.path.join(directory, "rank-*.state"))):
        size = os.path.getsize(path)
        if size != 2 * _SLOT * 8:  # not a record het wrote whole
            passed.append(f"rejoin record {path} holds {size} bytes, a record {2 * _SLOT * 8}: cut short or "
                          f"not het's; skipped (what its rank had not pushed is not counted)")
            continue
        record = StateFile(path).read()
        if record is None:
            passed.append(f"rejoin record {path}: neither slot intact; skipped")
        else:
            snapshot = path.rsplit(".gen-", 1)[0] + ".pt"
            if not os.path.exists(snapshot):
                record["snapshot_step"] = -1
            out.append(record | {"path": snapshot})
    return (out, passed) if skipped else out


def lost_updates(records: list[dict], generation: int) -> int:
    """The row updates lost in all, by generation ``generation``'s start: those lost before
    (each record carries the count its generation started with), and the unpushed ones of the
    previous generation's ranks that did not flush.

    Example:
        >>> lost_updates([{"generation": 1, "lost": 5, "pending": 40, "flushed": 0},
        ...               {"generation": 1, "lost": 5, "pending": 0, "flushed": 1},
        ...               {"generation": 0, "lost": 0, "pending": 9, "flushed": 0}], 2)
        45
    """
    before = max((r["lost"] for r in records), default=0)
    return before + sum(r["pending"] for r in records if r["generation"] == generation - 1 and not r["flushed"])


def _read_snapshot(path: str) -> dict:
    files.check_zip(path)
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")  # tensors and plain values: no code
    except pickle.UnpicklingError as e:
        raise ValueError(f"{path}: not a rejoin snapshot het wrote ({str(e).splitlines()[0][:200]})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(f"{path}: rejoin snapshot format {state.get('format') if isinstance(state, dict) else '?'}, "
                         f"expected {FORMAT}")
    return state


def _say(line: str) -> None:
    with contextlib.suppress(OSError):
        print(line, file=sys.stderr, flush=True)
