"""The job's timeline (rank 0's samples of the shards' STATS), its figures in the summary, and
the time limit, in process: one worker against in-process shards."""

import pytest

from het import cli
from het.ps.local import local_client
from het.train.cli import format_summary
from het.train.config import TrainConfig
from het.train.flags import config_from_args
from het.train.loop import Worker
from het.train.summary import ps_summary
from het.train.tasks import job_tables
from het.train.timeline import Timeline

SMALL = dict(dim=8, batch=64, workers=1, eval_samples=0, synthetic={"cap": 2000})


def test_the_flags_of_the_time_limit_and_the_sampling():
    parse = cli.parser().parse_args
    cfg = config_from_args(parse(["train", "--time-limit", "5", "--ps-stats-every", "2.5"]))
    assert (cfg.time_limit_s, cfg.ps_stats_every) == (5.0, 2.5)
    assert config_from_args(parse(["train", "--time-limit-s", "none"])).time_limit_s is None
    assert (TrainConfig().time_limit_s, TrainConfig().ps_stats_every) == (None, 10.0)
    with pytest.raises(ValueError, match="time_limit_s must be > 0"):
        TrainConfig(time_limit_s=0)
    with pytest.raises(ValueError, match="ps_stats_every must be >= 0"):
        TrainConfig(ps_stats_every=-1)


def test_samples_fall_on_the_grid_of_every_s_and_never_without_it():
    now, calls = [0.0], []
    timeline = Timeline(lambda: calls.append(1) or [{"rss_bytes": 5, "tables": {"t": {"rows": 9}}}], every_s=10,
                        samples_per_step=10, step=100, clock=lambda: now[0])
    for t, step in ((9.9, 101), (10.2, 102), (15, 103), (31, 110), (39, 111), (40.5, 112)):
        now[0] = t
        timeline.after_step(step)
    assert [(e["t_s"], e["step"]) for e in timeline.entries] == [(10.2, 102), (31, 110), (40.5, 112)]
    assert timeline.entries[0]["samples_per_s"] == pytest.approx(2 * 10 / 10.2)  # since the start, at step 100
    assert timeline.entries[1]["samples_per_s"] == pytest.approx(8 * 10 / 20.8)
    assert timeline.last["rows"] == 9 and len(calls) == 3
    never = Timeline(lambda: calls.append(1), every_s=0, samples_per_step=10, clock=lambda: now[0])
    now[0] = 1e6
    assert never.after_step(5) is None and never.entries == [] and len(calls) == 3


def test_a_time_limit_stops_training_at_a_step_boundary_with_a_timeline():
    cfg = TrainConfig(steps=100_000, time_limit_s=1.0, ps_stats_every=0.25, **SMALL)
    worker = Worker(cfg, local_client(job_tables(cfg), lazy_init=cfg.lazy_init))
    run = worker.train(cfg.steps, progress=False)
    assert worker.out_of_time and not worker.stop and 0 < worker.step_count < cfg.steps
    assert 1.0 <= run["wall_s"] < 10
    timeline = run["timeline"]
    assert len(timeline) >= 3 and all(e["rss_bytes"] > 0 and e["rows"] > 0 for e in timeline)
    assert [e["t_s"] for e in timeline] == sorted(e["t_s"] for e in timeline) and timeline[-1]["t_s"] < 3
    assert all(e["samples_per_s"] > 0 for e in timeline) and timeline[-1]["step"] <= worker.step_count
    ps = ps_summary(worker.client.stats(), timeline)
    assert ps["sampled_peak_rss_bytes"] == max(e["rss_bytes"] for e in timeline) > 0
    assert (ps["rows_on_disk"], ps["disk_bytes"], ps["disk_reads"], ps["disk_writes"]) == (0, 0, 0, 0)


def test_without_a_time_limit_every_step_runs_and_no_sample_is_taken():
    cfg = TrainConfig(steps=5, ps_stats_every=0, **SMALL)
    worker = Worker(cfg, local_client(job_tables(cfg), lazy_init=cfg.lazy_init))
    run = worker.train(cfg.steps, progress=False)
    assert (worker.step_count, worker.out_of_time, run["timeline"]) == (5, False, [])


def test_the_summary_names_rows_on_disk_only_when_there_are_some():
    summary = {"mode": "het", "staleness": "100", "workers": 1, "servers": 1, "steps": 10, "wall_s": 2.0,
               "samples_per_s": 5120.0, "hit_rate": 0.5, "sparse_bytes_per_sample": 900.0,
               "time_split": {"compute": 0.8, "wait_ps": 0.1, "allreduce": 0.1}}
    shards = [{"tables": {"t": {"rows": 10, "bytes": 2_000_000, "rows_in_memory": 4, "rows_on_disk": 6,
                                "disk_bytes": 3_000_000, "disk_reads": 7, "disk_writes": 8}}, "peak_rss_bytes": 10**9}]
    ps = ps_summary(shards)
    assert {k: ps[k] for k in ("rows_in_memory", "rows_on_disk", "disk_bytes", "disk_reads", "disk_writes")} == \
        {"rows_in_memory": 4, "rows_on_disk": 6, "disk_bytes": 3_000_000, "disk_reads": 7, "disk_writes": 8}
    line = format_summary({**summary, "ps": ps}).splitlines()[-1]
    assert line.strip() == "PS: 10 rows stored (2 MB): 4 in memory, 6 on disk (3 MB on disk); shards' peak RSS 1,000 MB"
    ps = ps_summary([{"tables": {"t": {"rows": 10, "bytes": 2_000_000}}, "peak_rss_bytes": 10**9}])
    assert "disk" not in format_summary({**summary, "ps": ps})
