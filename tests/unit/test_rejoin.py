"""Workers that rejoin (het.train.rejoin), in process: a rank's records survive a write cut
short, what a dead rank had not pushed is counted, and a new generation takes up the newest
dense snapshot at its step. The group re-formed across processes: tests/cluster/test_rejoin.py."""

import os

import numpy as np
import pytest
import torch

from het.ps.local import local_client
from het.train import rejoin
from het.train.config import TrainConfig
from het.train.loop import Worker
from het.train.rejoin import Rejoin, StateFile, lost_updates, read_records
from het.train.tasks import job_tables

CFG = TrainConfig(steps=40, dim=8, batch=64, staleness=100, synthetic={"cap": 2000})


@pytest.fixture
def restarts(monkeypatch):
    """torchrun's environment for a job allowed 2 restarts; returns a setter of the generation."""
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "2")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    return lambda g: monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", str(g))


def test_a_record_written_halfway_leaves_the_one_before(tmp_path):
    state = StateFile(str(tmp_path / "r.state"), create=True)
    assert state.read() is None  # never written
    fields = dict(generation=0, step=7, pending=120, flushed=0, lost=0, snapshot_step=0)
    state.write(**fields)
    state.write(**fields | {"step": 8, "pending": 130})
    assert StateFile(state.path).read()["step"] == 8
    slots = np.memmap(state.path, dtype=np.int64, mode="r+", shape=(2, 8))
    slots[state.seq % 2, 1] = 9  # a kill -9 between the fields and their checksum: the newer slot is torn
    slots.flush()
    assert StateFile(state.path).read() == fields | {"step": 7, "pending": 120}


def test_what_is_lost_is_the_unflushed_ranks_pending_updates_of_the_last_generation():
    records = [{"generation": 1, "lost": 5, "pending": 40, "flushed": 0},
               {"generation": 1, "lost": 5, "pending": 0, "flushed": 1},
               {"generation": 0, "lost": 0, "pending": 9, "flushed": 0}]  # counted when generation 1 began
    assert lost_updates(records, 2) == 45
    assert lost_updates(records[1:], 2) == 5
    assert lost_updates([], 1) == 0


def test_rejoining_is_off_unless_restarts_are_allowed(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCHELASTIC_MAX_RESTARTS", raising=False)
    assert rejoin.directory(str(tmp_path)) is None
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "1")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job7")
    assert rejoin.directory(str(tmp_path)) == str(tmp_path)
    assert rejoin.directory(None).endswith(f"-job7-{os.getppid()}")  # this job: its agent starts it again


def _train(worker, hook, start: int, steps: int) -> None:
    for step in range(start, start + steps):
        worker.step(worker.upcoming.batch(step, end=start + steps))
        hook(step + 1)


def test_a_new_generation_takes_up_the_dense_snapshot_and_counts_the_lost_updates(tmp_path, restarts):
    restarts(0)
    client = local_client(job_tables(CFG), lazy_init=CFG.lazy_init)
    first = Worker(CFG, client)
    (tmp_path / "rank-3.gen-0.state").write_bytes(b"an earlier job's")
    r0 = Rejoin(first, str(tmp_path), snapshot_s=1e9)
    assert r0.begin(lambda: 0) == 0
    assert sorted(os.listdir(tmp_path)) == ["rank-0.gen-0.state", "rank-0.pt"]  # the earlier job's cleared
    _train(first, r0, 0, 12)
    r0.snapshot(12)  # as a survivor or the periodic snapshot would
    _train(first, r0, 12, 3)  # then the worker dies, unflushed, after step 15
    pending = first.embedding.pending_updates()
    assert pending > 0
    dense = {k: v.clone() for k, v in first.model.state_dict().items() if not k.startswith("embedding.")}
    r0.snapshot(15)
    [record] = read_records(str(tmp_path))
    assert (record["generation"], record["step"], record["pending"], record["flushed"]) == (0, 15, pending, 0)

    restarts(1)
    second = Worker(CFG, client)
    r1 = Rejoin(second, str(tmp_path))
    assert r1.begin(lambda: pytest.fail("a rejoining group does not resume a checkpoint")) == 15
    assert r1.lost == pending and r1.rejoined_at == 15
    for k, v in second.model.state_dict().items():
        if k in dense:
            assert torch.equal(v, dense[k]), k
    assert second.embedding._outbox["embedding"].step == 15  # pushes carry the job's step (Adam's bias)
    assert r1.summary(15, 25) == {"worker_restarts": 1, "updates_lost": pending, "rejoined_at_step": 15,
                                  "steps": 40, "steps_since_rejoin": 25}


def test_a_group_with_no_snapshot_resumes_as_a_fresh_start_would(tmp_path, restarts):
    restarts(1)
    worker = Worker(CFG, local_client(job_tables(CFG), lazy_init=CFG.lazy_init))
    r = Rejoin(worker, str(tmp_path))
    assert r.begin(lambda: 0) == 0 and r.rejoined_at is None
    assert r.summary(0, 40) == {"worker_restarts": 1, "updates_lost": 0}


def test_a_damaged_snapshot_is_refused_not_loaded(tmp_path, restarts):
    restarts(0)
    client = local_client(job_tables(CFG), lazy_init=CFG.lazy_init)
    r0 = Rejoin(Worker(CFG, client), str(tmp_path))
    r0.begin(lambda: 0)
    from damage import flip_in_largest_member

    flip_in_largest_member(tmp_path / "rank-0.pt")
    restarts(1)
    with pytest.raises(Exception, match="rank-0.pt"):
        Rejoin(Worker(CFG, client), str(tmp_path)).begin(lambda: 0)


def test_a_planted_snapshot_is_never_run_as_code(tmp_path, restarts):
    import pickle

    restarts(0)
    client = local_client(job_tables(CFG), lazy_init=CFG.lazy_init)
    Rejoin(Worker(CFG, client), str(tmp_path)).begin(lambda: 0)
    ran = tmp_path.parent / "ran"

    class Planted:
        def __reduce__(self):
            return (os.mkdir, (str(ran),))

    torch.save({"format": 1, "step": 5, "model": Planted()}, tmp_path / "rank-0.pt")
    assert pickle.loads(pickle.dumps(Planted())) is None and ran.exists()  # it would run, unpickled in full
    os.rmdir(ran)
    restarts(1)
    with pytest.raises(ValueError, match="rank-0.pt: not a rejoin snapshot het wrote"):
        Rejoin(Worker(CFG, client), str(tmp_path)).begin(lambda: 0)
    assert not ran.exists()


@pytest.mark.parametrize("mode", [0o777, 0o755, 0o710])
def test_a_rejoin_directory_others_can_reach_is_refused(tmp_path, restarts, mode):
    restarts(1)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, mode)
    worker = Worker(CFG, local_client(job_tables(CFG), lazy_init=CFG.lazy_init))
    with pytest.raises(ValueError, match=f"mode 0700, got one of uid {os.geteuid()} with mode {mode:o}"):
        Rejoin(worker, str(shared)).begin(lambda: 0)
    fresh = tmp_path / "fresh"
    Rejoin(worker, str(fresh)).begin(lambda: 0)
    assert os.stat(fresh).st_mode & 0o777 == 0o700


def test_a_record_cut_short_is_named_not_skipped_silently(tmp_path, restarts, capsys):
    restarts(0)
    client = local_client(job_tables(CFG), lazy_init=CFG.lazy_init)
    Rejoin(Worker(CFG, client), str(tmp_path)).begin(lambda: 0)
    record = tmp_path / "rank-0.gen-0.state"
    record.write_bytes(record.read_bytes()[:20])
    restarts(1)
    Rejoin(Worker(CFG, client), str(tmp_path)).begin(lambda: 0)
    err = capsys.readouterr().err
    assert f"rejoin record {record} holds 20 bytes, a record 128: cut short" in err
