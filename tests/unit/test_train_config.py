"""A job's config (het.train.config): what it accepts, the defaults it takes from its model,
and its errors, one line each."""

import math
import subprocess
import sys

import pytest

from het import cli
from het.train.config import TrainConfig


@pytest.mark.parametrize("data, ok", [("synthetic-graph", True), ("synthetic-graph:600", True), ("cora", True),
                                      ("npz:g.npz", True), ("synthetic-graph:", False), ("synthetic-criteo", False)])
def test_graph_jobs_take_every_graph_spec_the_loader_reads(data, ok):
    if ok:
        assert TrainConfig(model="graphsage", data=data).data == data
    else:
        with pytest.raises(ValueError, match="model 'graphsage' takes data"):
            TrainConfig(model="graphsage", data=data)


def test_a_jobs_defaults_follow_its_model_and_flags_still_win(tmp_path):
    assert TrainConfig.load(None, {}).lr == 0.05
    assert TrainConfig.load(None, {"model": "deepfm"}).lr == 0.01
    assert TrainConfig.load(None, {"model": "deepfm", "lr": 0.05}).lr == 0.05
    job = tmp_path / "job.toml"
    job.write_text('model = "deepfm"\nlr = 0.02\n')
    assert TrainConfig.load(str(job), {}).lr == 0.02
    graph = TrainConfig.load(None, {"model": "graphsage"})
    assert (graph.data, graph.lr, graph.optimizer) == ("cora", 0.001, "adam")


def test_the_lookahead_window_spans_16384_samples_whatever_the_batch(tmp_path):
    assert [TrainConfig(batch=b).cache.lookahead for b in (512, 128, 100, 4096, 1)] == [32, 128, 164, 4, 1024]
    assert TrainConfig(batch=128, cache={"lookahead": 5}).cache.lookahead == 5
    assert TrainConfig(cache={"lookahead": 0}).cache.lookahead == 0
    assert TrainConfig(model="graphsage", batch=16).cache.lookahead == 0  # GraphSAGE keeps it off
    job = tmp_path / "job.toml"
    job.write_text("batch = 256\n")
    assert TrainConfig.load(str(job), {}).cache.lookahead == 64
    assert TrainConfig.load(str(job), {"cache.lookahead": 8}).cache.lookahead == 8
    with pytest.raises(ValueError, match="steps >= 0, batch > 0 and dim > 0 expected"):
        TrainConfig(batch=0)  # refused by the batch's own check, not by the window's arithmetic


@pytest.mark.parametrize("toml, message", [
    ('steps = "abc"', "steps: expected an integer, got 'abc' (str)"),
    ("workers = 1.0", "workers: expected an integer, got 1.0 (float)"),
    ("staleness = true", "staleness: expected an integer >= 0 or 'inf', got True (bool)"),
    ("staleness = 1.5", "staleness: expected an integer >= 0 or 'inf', got 1.5 (float)"),
    ("dense_lr = inf", "dense_lr: expected a finite number, got inf"),
    ("batch = 512.0", "batch: expected an integer, got 512.0 (float)"),
    ("prefetch = 1", "prefetch: expected true or false, got 1 (int)"),
    ('mode = "fast"', "mode: expected one of ('het', 'hybrid', 'ps'), got 'fast'"),
    ("[synthetic]\ncap = \"x\"", "synthetic.cap: expected an integer, got 'x' (str)"),
    ("[graph]\nfanouts = [10, 1.5]", "graph.fanouts: expected a list of integers, got [10, 1.5] (list)"),
    ("steps_typo = 3", "unknown config keys ['steps_typo']"),
])
def test_a_wrong_typed_toml_value_is_one_line_and_exit_code_2(toml, message, tmp_path, capsys):
    job = tmp_path / "job.toml"
    job.write_text(toml + "\n")
    with pytest.raises(SystemExit) as e:
        cli.main(["train", "--config", str(job)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_a_wrong_typed_toml_value_prints_no_traceback(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text("workers = 1.0\n")
    run = subprocess.run([sys.executable, "-m", "het", "train", "--config", str(job)], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip() == f"het train: error: {job}: workers: expected an integer, got 1.0 (float)"


def test_strict_types_when_built_in_python():
    with pytest.raises(ValueError, match="steps: expected an integer, got '3'"):
        TrainConfig(steps="3")
    with pytest.raises(ValueError, match="cache.lookahead: expected an integer, got True"):
        TrainConfig(cache={"lookahead": True})
    assert TrainConfig(lr=1).lr == 1.0 and isinstance(TrainConfig(lr=1).lr, float)  # an int is a number
    assert TrainConfig(staleness="inf").staleness == math.inf and TrainConfig(staleness=5.0).staleness == 5
    assert TrainConfig.from_dict(TrainConfig(model="graphsage").to_dict()) == TrainConfig(model="graphsage")


def test_graphsage_dropouts_follow_the_share_of_nodes_labelled_unless_set():
    """More dropout with few labelled nodes (Planetoid's 20 a class), half otherwise."""
    cfg = TrainConfig(model="graphsage")
    assert cfg.graph.dropouts(140 / 2708) == (0.8, 0.9) and cfg.graph.dropouts(0.6) == (0.5, 0.5)
    set_ = TrainConfig(model="graphsage", graph={"dropout": 0.3, "embedding_dropout": 0.0})
    assert set_.graph.dropouts(0.05) == (0.3, 0.0)
    with pytest.raises(ValueError, match="graph.embedding_dropout must lie in"):
        TrainConfig(model="graphsage", graph={"embedding_dropout": 1.0})


def test_hashed_ids_are_refused_for_a_graph_with_a_clear_error():
    with pytest.raises(ValueError, match="ids 'hashed' applies to CTR data; graphsage reads a graph's node ids"):
        TrainConfig(model="graphsage", ids="hashed")
    assert TrainConfig(model="graphsage", table={"admit_after": 2}).table.admit_after == 2


@pytest.mark.parametrize("settings, message", [
    ({"shard": {"wal_max": "64MiB"}}, "shard.wal_max bounds the shards' log: it needs ps_wal"),
    ({"ps_wal": True, "shard": {"wal_max": "0"}}, "wal_max must be a number of bytes > 0"),
    ({"ps_wal": True, "shard": {"wal_max": "lots"}}, "wal_max: "),
    ({"tensorboard_every": -1}, "tensorboard_every must be >= 0"),
    ({"powersgd_rank": 0}, "powersgd_rank must be >= 1"),
    ({"dense_snapshot_s": 0}, "dense_snapshot_s must be > 0"),
    ({"ps_metrics_port": 65535, "servers": 2}, "ps_metrics_port must be a port .* room for 2 shards, got 65535"),
])
def test_watching_and_log_settings_out_of_range_are_refused_naming_them(settings, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig.load(None, settings, {})


@pytest.mark.parametrize("optimizer,local_update", [("sgd", "sgd"), ("adagrad", "full"), ("adam", "row")])
def test_a_cache_slot_takes_at_most_what_cache_memory_counts(optimizer, local_update):
    """cache.memory caps a cache of cache.frac rows by cache_slot_bytes a slot: a real cache's
    tensors, each optimizer's local update, stay within it; cache.rows is the user's to choose."""
    import torch

    from het.cache.cache import EmbeddingCache
    from het.config import CacheConfig, OptimizerConfig, TableConfig

    cfg = TrainConfig(dim=24, optimizer=optimizer, cache={"local_update": local_update, "memory": "1MiB"})
    rows = cfg.cache_rows_for(10**9)
    assert rows == (1 << 20) // cfg.cache_slot_bytes
    cache = EmbeddingCache(TableConfig("t", rows=10**9, dim=24, optimizer=OptimizerConfig(optimizer, lr=0.1)),
                           CacheConfig(capacity=rows, staleness=10, lookahead=4, local_update=local_update))
    held = sum(v.nbytes for v in vars(cache).values() if isinstance(v, torch.Tensor))
    assert rows * 8 * 24 < held <= 1 << 20  # at least its rows and pending gradients
    assert TrainConfig(cache={"rows": 10**8, "memory": "1MiB"}).cache_rows_for(10**9) == 10**8
