"""``het serve``'s flags (het.serve): generated from ShardConfig, TableConfig and
OptimizerConfig, so the shard a command line asks for is the configs' with the flags given."""

import argparse
import dataclasses
import json

import pytest

from het import cli
from het.config import OptimizerConfig, ShardConfig, TableConfig
from het.ps.server.process import JobShard
from het.serve import shard_config
from het.train.config import TrainConfig
from het.train.tasks import job_tables

# Every flag README and the tests use, with a value: each must keep working.
FLAGS = [["--bind", "127.0.0.1:0"], ["--secret-file", "s"], ["--table", "t:8:2"], ["--admit-after", "2"],
         ["--admit-counters", "64"], ["--expire-after", "5"], ["--max-rows", "9"], ["--optimizer", "adagrad"],
         ["--lr", "0.1"], ["--seed", "3"], ["--shard-index", "1"], ["--num-shards", "2"], ["--state-dir", "d"],
         ["--encrypt"], ["--wal"], ["--wal-fsync-s", "0.5"], ["--max-keys", "1024"], ["--config", "job.toml"],
         ["--memory", "2GiB"], ["--memory-policy", "lfu"], ["--no-page-in"], ["--threads", "2"],
         ["--shard-config", "{}"], ["--job-shard", "{}"]]


def parse(*argv) -> argparse.Namespace:
    return cli.parser().parse_args(["serve", *argv])


@pytest.mark.parametrize("flag", FLAGS, ids=lambda f: f[0])
def test_every_flag_of_before_still_parses(flag):
    args = parse(*flag)
    assert args.func.__name__ == "cmd_serve"


def test_no_flag_gives_the_configs_defaults():
    cfg = shard_config(parse("--table", "user:100:8", "--table", "ids:dynamic:4"))
    fixed, dynamic = cfg.tables
    assert cfg == ShardConfig((TableConfig("user", 100, 8), TableConfig("ids", None, 4)))
    assert (fixed.optimizer, dynamic.admit_counters) == (OptimizerConfig(), TableConfig("t", None, 1).admit_counters)


def test_the_flags_given_set_the_fields_they_name():
    cfg = shard_config(parse("--table", "user:100:8", "--table", "ids:dynamic:4", "--optimizer", "adam",
                             "--lr", "0.1", "--betas", "0.8,0.9", "--seed", "3", "--admit-after", "2",
                             "--expire-after", "5", "--shard-index", "1", "--num-shards", "2", "--max-keys", "1024",
                             "--memory", "2GiB", "--memory-policy", "lfu", "--no-page-in"))
    opt = OptimizerConfig("adam", lr=0.1, betas=(0.8, 0.9))
    assert cfg == ShardConfig((TableConfig("user", 100, 8, optimizer=opt, seed=3),  # dynamic settings: dynamic only
                               TableConfig("ids", None, 4, optimizer=opt, seed=3, admit_after=2, expire_after=5)),
                              index=1, num_shards=2, max_keys=1024, memory=2 << 30, memory_policy="lfu",
                              page_in=False)


@pytest.mark.parametrize("toml", ['[shard]\nmemory = "64MiB"\nmemory_policy = "lfu"\n',
                                  'ps_memory = "64MiB"\nps_memory_policy = "lfu"\n'])  # the old keys too
def test_a_jobs_toml_gives_its_tables_and_shard_settings_and_the_flags_win(tmp_path, toml):
    job = tmp_path / "job.toml"
    job.write_text("steps = 1\n" + toml)
    cfg = shard_config(parse("--config", str(job), "--shard-index", "1", "--num-shards", "2"))
    assert cfg.tables == tuple(job_tables(TrainConfig.load(str(job))))
    assert (cfg.index, cfg.num_shards, cfg.memory, cfg.memory_policy) == (1, 2, 64 << 20, "lfu")
    assert shard_config(parse("--config", str(job), "--memory-policy", "lru")).memory_policy == "lru"


def test_a_launchers_json_is_the_shard_config_it_was_made_from():
    cfg = ShardConfig((TableConfig("t", None, 4, optimizer=OptimizerConfig("adagrad")),), index=1, num_shards=3,
                      memory=1 << 20, memory_policy="lfu", page_in=False)
    d = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    d["tables"] = [t.to_dict() for t in cfg.tables]
    assert shard_config(parse("--shard-config", json.dumps(d))) == cfg


@pytest.mark.parametrize("argv, message", [
    (["--memory-policy", "mru"], "argument --memory-policy: expected one of lru, lfu, got 'mru'"),
    (["--optimizer", "rmsprop"], "argument --optimizer: expected one of sgd, adagrad, rowwise_adagrad, adam, ftrl, got "
                                 "'rmsprop'"),
    (["--memory", "lots"], "argument --memory: expected a size such as 2GiB, 256MiB or 4096 (bytes) or none, got "
                           "'lots'"),
])
def test_a_bad_value_is_named_with_what_was_expected(argv, message, capsys):
    with pytest.raises(ValueError, match=r"betas must be two numbers \(Adam's two decay rates\), got \(0.9,\)"):
        shard_config(parse("--table", "t:8:2", "--betas", "0.9"))  # parsed, then refused by the config
    with pytest.raises(SystemExit):
        parse("--table", "t:8:2", *argv)
    assert message in capsys.readouterr().err


def test_help_shows_each_generated_flags_default(capsys):
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    text = "".join(capsys.readouterr().out.split())
    for expected in ("--max-keysMAX_KEYS", "(default:262144)", "--admit-countersADMIT_COUNTERS", "(default:4194304)",
                     "--memorySIZE", "--memory-policy{lru,lfu}", "--page-in,--no-page-in,--prefetch,--no-prefetch",
                     "--optimizer{sgd,adagrad,rowwise_adagrad,adam,ftrl}", "thetables'learningrate(default:0.01)"):
        assert expected in text, expected


def test_a_launchers_job_gives_the_shard_the_jobs_tables_and_settings_at_its_place():
    """A local job's launcher hands each shard the job's config (het.ps.server.process.JobShard):
    the shard makes the tables the workers expect, so the launcher loads neither torch nor data."""
    job = TrainConfig(shard={"memory": "64MiB", "memory_policy": "lfu", "wal_max": "1MiB"}, ps_wal=True, steps=1)
    spec = dataclasses.asdict(JobShard(job.to_dict(), 1, 2))
    cfg = shard_config(parse("--job-shard", json.dumps(spec)))
    assert cfg == ShardConfig(tuple(job_tables(job)), index=1, num_shards=2, memory=64 << 20,
                              memory_policy="lfu", wal_max=1 << 20)


@pytest.mark.parametrize("flag, text, message", [
    ("--shard-config", "{bad", r"--shard-config: expected a JSON object \(a shard's config"),
    ("--shard-config", "[1]", r"--shard-config: expected a JSON object .* got list '\[1\]'"),
    ("--shard-config", '{"tables": 5}', r"--shard-config: expected a shard's config .* got keys \['tables'\]"),
    ("--shard-config", '{"tables": [{"x": 1}]}', r"unexpected keyword argument 'x'"),
    ("--job-shard", "{}", r"--job-shard: expected job \(a job's config\), index and num_shards \(integers\), got \{\}"),
    ("--job-shard", '{"job": {}, "index": "1", "num_shards": 2}', r"--job-shard: expected job .* got \{\"job\""),
])
def test_a_malformed_json_config_is_refused_naming_the_flag_and_what_it_takes(flag, text, message):
    with pytest.raises(ValueError, match=message):
        shard_config(parse(flag, text))
