"""`het train` checks the job before it starts any process (het.train.local.check_job): what a
worker would find wrong only after every shard and worker started is one line and exit code 2
at once."""

import pytest
import torch

from het import cli
from het.train import local
from het.train.checkpoint import FORMAT


@pytest.fixture
def nothing_starts(monkeypatch):
    """The launcher, replaced: a job that gets this far has started its processes."""
    def started(*args, **kwargs):
        raise AssertionError("the job's processes were started")

    monkeypatch.setattr(local, "LocalCluster", started)


def checkpoint(directory, shards: int = 1):
    """A directory shaped as checkpoint.save writes one (contents are not read by the checks)."""
    (directory / "ps").mkdir(parents=True)
    torch.save({"format": FORMAT, "step": 1}, directory / "worker.pt")
    for i in range(shards):
        (directory / "ps" / f"shard-{i}.pt").write_bytes(b"")
    return directory


def refused(args, tmp_path, capsys) -> str:
    """Run `het train ARGS`: it must exit 2 with one line, and no log directory made."""
    with pytest.raises(SystemExit) as e:
        cli.main(["train", *args, "--quiet", "--log-dir", str(tmp_path / "logs")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("het train: error: "), err
    assert not (tmp_path / "logs").exists()
    return err


def test_resuming_a_missing_directory_is_refused_before_launch(tmp_path, capsys, nothing_starts):
    err = refused(["--resume", str(tmp_path / "nowhere")], tmp_path, capsys)
    assert f"resume: no checkpoint at '{tmp_path / 'nowhere'}': expected {tmp_path / 'nowhere' / 'worker.pt'}" in err


def test_resuming_a_directory_without_worker_pt_is_refused_before_launch(tmp_path, capsys, nothing_starts):
    (tmp_path / "empty").mkdir()
    err = refused(["--resume", str(tmp_path / "empty")], tmp_path, capsys)
    assert f"expected {tmp_path / 'empty' / 'worker.pt'}" in err


def test_resuming_on_more_servers_than_the_checkpoint_has_shards_names_het_reshard(tmp_path, capsys, nothing_starts):
    ck = checkpoint(tmp_path / "ck", shards=1)
    err = refused(["--resume", str(ck), "--servers", "2"], tmp_path, capsys)
    assert f"resume: '{ck}' holds a PS of 1 shard file(s) in {ck / 'ps'}, and this job has 2 servers" in err
    assert f"`het reshard {ck} NEW --shards 2`" in err


def test_a_checkpoint_under_a_file_is_refused_before_launch(tmp_path, capsys, nothing_starts):
    (tmp_path / "file").write_text("")
    target = tmp_path / "file" / "ck"
    err = refused(["--checkpoint", str(target), "--checkpoint-every", "5"], tmp_path, capsys)
    assert f"checkpoint: cannot write {str(target)!r}: {tmp_path / 'file'} is not a directory" in err


@pytest.mark.parametrize("args, message", [
    (["--data", "criteo:{tmp}/none"], "data 'criteo:{tmp}/none': {tmp}/none holds no meta.json: prepare it first"),
    (["--model", "graphsage", "--data", "planetoid:{tmp}/none"], "data 'planetoid:{tmp}/none': no directory {tmp}/none"),
    (["--model", "graphsage", "--data", "npz:{tmp}/g.npz"], "data 'npz:{tmp}/g.npz': no file {tmp}/g.npz"),
])
def test_missing_data_is_named_before_launch(args, message, tmp_path, capsys, nothing_starts):
    err = refused([a.format(tmp=tmp_path) for a in args], tmp_path, capsys)
    assert message.format(tmp=tmp_path) in err


@pytest.mark.parametrize("args, message", [
    (["--dense-lr", "inf"], "dense_lr: expected a finite number, got inf"),
    (["--lr", "nan"], "lr: expected a finite number, got nan"),
])
def test_non_finite_rates_are_refused_before_launch(args, message, tmp_path, capsys, nothing_starts):
    assert message in refused(args, tmp_path, capsys)


def test_a_float_batch_in_the_toml_is_refused_before_launch(tmp_path, capsys, nothing_starts):
    (tmp_path / "job.toml").write_text("batch = 64.0\n")
    assert "batch: expected an integer, got 64.0 (float)" in refused(["--config", str(tmp_path / "job.toml")],
                                                                     tmp_path, capsys)
