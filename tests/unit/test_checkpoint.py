"""What interrupted checkpoint saves leave behind (``DIR.tmp-STEP``, ``DIR.old-STEP``) is removed
at the next save and when a job starts, unless it may be the newest checkpoint; checkpoints whose
shards keep their own saves."""

from types import SimpleNamespace

import torch

from het.config import TableConfig
from het.ps.local import local_client
from het.train import checkpoint, local
from het.train.config import TrainConfig
from damage import flip_in_largest_member


def fake_worker() -> SimpleNamespace:
    """What checkpoint.save reads of a worker: one rank, a local PS, a dense model."""
    return SimpleNamespace(rank=0, world=1, cfg=TrainConfig(), model=torch.nn.Linear(2, 1),
                           embedding=SimpleNamespace(flush=lambda: None), dense=SimpleNamespace(state_dict=dict),
                           client=local_client([TableConfig("t", rows=4, dim=2)]))


def leftovers(tmp_path) -> list[str]:
    """Each checkpoint of a test and what saves left beside it."""
    return sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("ck"))


def interrupted(tmp_path, *names) -> None:
    for name in names:
        (tmp_path / name / "ps").mkdir(parents=True)


def test_a_save_removes_what_interrupted_saves_left(tmp_path):
    worker = fake_worker()
    checkpoint.save(worker, str(tmp_path / "ck"), 4)
    interrupted(tmp_path, "ck.tmp-6", "ck.old-5")  # a save cut short at step 6, one cut after its swap
    (tmp_path / "ck.tmp-notes").mkdir()  # not a save's: kept
    checkpoint.save(worker, str(tmp_path / "ck"), 8)
    assert leftovers(tmp_path) == ["ck", "ck.tmp-notes"]
    assert torch.load(tmp_path / "ck" / "worker.pt", weights_only=False)["step"] == 8


def test_a_job_start_removes_what_interrupted_saves_left(tmp_path, monkeypatch):
    checkpoint.save(fake_worker(), str(tmp_path / "ck"), 4)
    interrupted(tmp_path, "ck.tmp-6")
    monkeypatch.setattr(local, "LocalCluster", lambda *a, **k: SimpleNamespace(run=dict))
    local.run_local(TrainConfig(checkpoint=str(tmp_path / "ck"), checkpoint_every=2), str(tmp_path / "logs"))
    assert leftovers(tmp_path) == ["ck"]


def test_a_save_cut_between_its_two_renames_is_kept(tmp_path):
    """No DIR, but DIR.old-N (the previous checkpoint) and DIR.tmp-M (the new one, whole):
    either may be what the user resumes from, so neither is removed."""
    interrupted(tmp_path, "ck.old-4", "ck.tmp-8")
    assert checkpoint.remove_stale(str(tmp_path / "ck")) == []
    assert leftovers(tmp_path) == ["ck.old-4", "ck.tmp-8"]
    interrupted(tmp_path, "ck2.tmp-2")  # a first save cut short: nothing whole to keep
    assert checkpoint.remove_stale(str(tmp_path / "ck2")) == [str(tmp_path / "ck2.tmp-2")]


def test_a_damaged_checkpoint_is_refused_naming_the_file_and_loads_nothing(tmp_path):
    import pytest

    from het.ps.protocol.messages import PSError

    worker = fake_worker()
    worker.client.wait(worker.client.push("t", torch.tensor([1]), torch.ones(1, 2), torch.ones(1, dtype=torch.int64)))
    checkpoint.save(worker, str(tmp_path / "ck"), 4)
    checkpoint.record_evaluation(str(tmp_path / "ck"), 4, {"auc": 0.75})
    fresh = fake_worker()
    fresh.embedding.resume_at = lambda step: None
    flip_in_largest_member(tmp_path / "ck" / "ps" / "shard-0.pt")
    with pytest.raises(PSError, match=r"shard-0\.pt: .*bytes .*damaged"):
        checkpoint.restore(fresh, str(tmp_path / "ck"))
    assert fresh.client.wait(fresh.client.pull("t", torch.tensor([1])))[1].tolist() == [0]
    flip_in_largest_member(tmp_path / "ck" / "worker.pt")
    with pytest.raises(ValueError, match=r"worker\.pt: .*damaged"):
        checkpoint.restore(fresh, str(tmp_path / "ck"))
    evaluation = tmp_path / "ck" / checkpoint.EVALUATION
    evaluation.write_text(evaluation.read_text().replace("0.75", "0.95"))
    with pytest.raises(ValueError, match="evaluation.json: does not match its checksum"):
        checkpoint.read_checked_json(evaluation.read_text(), str(evaluation))


def test_a_worker_that_cannot_see_the_shards_directories_leaves_their_saves_with_them(tmp_path, monkeypatch):
    """Machines sharing no storage: the checkpoint holds worker.pt naming the shards' own saves,
    each shard keeps the last two, and a restore loads them back."""
    import os

    worker = fake_worker()
    worker.embedding.resume_at = lambda step: None
    worker.dense.load_state_dict = lambda state: None
    state_dir = worker.client._state_dirs()[0]
    monkeypatch.setattr(worker.client, "sees_state_dirs", lambda: False)
    push = lambda: worker.client.wait(worker.client.push("t", torch.tensor([1]), torch.ones(1, 2),  # noqa: E731
                                                         torch.ones(1, dtype=torch.int64)))
    for step in (4, 8, 12):
        push()
        checkpoint.save(worker, str(tmp_path / "ck"), step)
    assert sorted(os.listdir(tmp_path / "ck")) == ["worker.pt"]
    named = torch.load(tmp_path / "ck" / "worker.pt", weights_only=False)["ps_named"]
    kept = sorted(os.listdir(os.path.join(state_dir, "checkpoints")))
    assert len(kept) == 2 and {named["name"], named["previous"]} == {f"checkpoints/{k}" for k in kept}
    push()
    assert worker.client.wait(worker.client.pull("t", torch.tensor([1])))[1].tolist() == [4]
    assert checkpoint.restore(worker, str(tmp_path / "ck")) == 12
    assert worker.client.wait(worker.client.pull("t", torch.tensor([1])))[1].tolist() == [3]
