"""A job's config: what it accepts and the defaults it takes from its model."""

import pytest

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
