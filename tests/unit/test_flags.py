"""``het train``'s flags (het.train.flags): one per setting of TrainConfig, each with its help,
its default and the choices of a closed setting; the flags given override the TOML file."""

import dataclasses
import typing

import pytest

from het import cli
from het.choices import Model
from het.config import CacheSettings, ShardConfig, ShardSettings, TableSettings, parse_bytes
from het.train import config, local
from het.train.config import TrainConfig
from het.train.flags import choices_of, config_fields, config_from_args, flag_name
from het.train.tasks import job_tables

EXTRA = {"checkpoint_every": {"checkpoint": "ck"}, "export.every": {"export.dir": "model"},  # settings that need another
         "shard.wal_max": {"ps_wal": True}, "row_l1": {"optimizer": "ftrl"}, "row_l2": {"optimizer": "ftrl"}}


def a_value(key, f, hint):
    """A value of the setting other than its default, and how a flag spells it."""
    choices = choices_of(hint, f)
    default = TrainConfig().__getattribute__(key) if "." not in key else f.default
    if key == "data":
        return "criteo:some-dir", "criteo:some-dir"
    if choices:
        value = next(c for c in choices if c != default)
        return value, value
    if f.metadata.get("kind") == "staleness":
        return 7, "7"
    if f.metadata.get("kind") == "size":
        return "3MiB", "3MiB"
    if f.metadata.get("kind") == "width":
        return "auto", "auto"
    if f.metadata.get("kind") == "widths":
        return {"C1": 8, "C2": 4}, "C1=8,C2=4"
    inner = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    kind = tuple if typing.get_origin(hint) is tuple else inner[0]
    if kind is tuple:
        return (3, 2), "3,2"
    if kind is bool:
        return not f.default, None
    if kind is int:
        return 7, "7"
    if kind is float:
        return 0.25, "0.25"
    return "some-text", "some-text"


def test_every_setting_has_help_and_is_a_flag_and_a_toml_key(tmp_path):
    keys = list(config_fields())
    assert len(keys) > 25
    for key, f, hint in keys:
        assert len(f.metadata.get("help", "")) > 10, f"{key} has no help text"
        value, text = a_value(key, f, hint)
        extra = EXTRA.get(key, {})
        if text is None:  # a bool: --x / --no-x
            argv = ["train", flag_name(key) if value else "--no-" + flag_name(key)[2:]]
        else:
            argv = ["train", flag_name(key), text]
        for k, v in extra.items():
            argv += [flag_name(k)] if v is True else [flag_name(k), v]
        by_flag = config_from_args(cli.parser().parse_args(argv))
        head, _, leaf = key.rpartition(".")
        toml = tmp_path / "job.toml"
        lines = [f"{k} = {_toml(v)}" for k, v in extra.items() if "." not in k]  # top-level keys first
        inner = [f"{k.rpartition('.')[2]} = {_toml(v)}" for k, v in extra.items() if "." in k]
        lines += [f"[{head}]\n" + "\n".join([*inner, f"{leaf} = {_toml(value)}"])] if head else [f"{key} = {_toml(value)}"]
        toml.write_text("\n".join(lines) + "\n")
        by_toml = TrainConfig.load(str(toml))
        if head == "shard" and f.metadata.get("kind") == "size":  # a shard's sizes are bytes once read
            value = parse_bytes(value)
        for cfg in (by_flag, by_toml):
            got = getattr(getattr(cfg, head) if head else cfg, leaf)
            assert got == value, f"{key}: expected {value!r}, got {got!r}"


def _toml(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return "[" + ", ".join(map(str, value)) + "]"
    if isinstance(value, dict):  # an inline table: widths = { C1 = 8 }
        return "{ " + ", ".join(f"{k} = {v}" for k, v in value.items()) + " }"
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)


@pytest.mark.parametrize("model", Model.values())
def test_a_model_gives_the_same_job_whichever_way_it_is_built(model, monkeypatch, capsys):
    """``TrainConfig(model=M)`` is the job ``het train --model M`` runs (its launcher is
    replaced here, to catch the config it is handed)."""
    ran = []
    monkeypatch.setattr(local, "run_local", lambda cfg, *a, **k: ran.append(cfg) or {})
    cli.main(["train", "--model", model, "--quiet", "--json"])
    assert ran == [TrainConfig(model=model)] == [TrainConfig.load(None, {"model": model})]


def train_help(capsys) -> str:
    with pytest.raises(SystemExit) as e:
        cli.main(["train", "--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


def test_help_lists_the_choices_of_every_closed_setting(capsys):
    text = " ".join(train_help(capsys).split())  # argparse wraps lines: compare words
    for flag, choices in (("--model", "{wdl,deepfm,dcn,dlrm,graphsage}"), ("--mode", "{het,hybrid,ps}"),
                          ("--cache-policy", "{lru,lfu}"), ("--push-dtype", "{fp32,bf16}"),
                          ("--dense-optimizer", "{sgd,adagrad,adam}"), ("--ids", "{encoded,hashed}"),
                          ("--optimizer", "{sgd,adagrad,rowwise_adagrad,adam,ftrl}")):
        assert f"{flag} {choices}" in text, flag


def test_help_gives_each_settings_help_and_default(capsys):
    text = "".join(train_help(capsys).split())  # argparse wraps lines, at hyphens too: compare the rest
    for key, f, _ in config_fields():
        assert "".join(f.metadata["help"].split()) in text, key
    assert "".join("the cache's replacement policy (default: lfu)".split()) in text
    assert "".join("the sparse learning rate (default: 0.05; deepfm 0.01; graphsage 0.001)".split()) in text


def test_tensorboard_dir_is_also_spelled_tensorboard():
    args = cli.parser().parse_args(["train", "--tensorboard", "tb", "--tensorboard-every", "5"])
    cfg = config_from_args(args)
    assert (cfg.tensorboard_dir, cfg.tensorboard_every) == ("tb", 5)


def test_a_shard_setting_is_a_shard_flag_and_its_old_spelling_still_works_saying_so_once(capsys, monkeypatch):
    monkeypatch.setattr(config, "_SAID", set())  # said once a process: this test's process may have said them
    new = config_from_args(cli.parser().parse_args(["train", "--shard-memory", "1GiB", "--no-shard-page-in"]))
    assert (new.shard.memory, new.shard.page_in) == (1 << 30, False) and capsys.readouterr().err == ""
    old = config_from_args(cli.parser().parse_args(["train", "--ps-memory", "1GiB", "--no-ps-page-in",
                                                    "--ps-memory-policy", "lfu"]))
    assert old.shard == dataclasses.replace(new.shard, memory_policy="lfu")
    err = capsys.readouterr().err.splitlines()
    assert sorted(err) == ["het: ps_memory is spelled shard.memory (flag --shard-memory); the old spelling will be removed",
                           "het: ps_memory_policy is spelled shard.memory_policy (flag --shard-memory-policy); the old "
                           "spelling will be removed",
                           "het: ps_page_in is spelled shard.page_in (flag --shard-page-in); the old spelling will be "
                           "removed"]


def test_every_shard_setting_reaches_a_jobs_shards():
    """A field of ShardSettings is a job's [shard] key and reaches the shards' ShardConfig with
    no other declaration: each set to a value other than its default is read back there."""
    hints = typing.get_type_hints(ShardSettings)
    values = {f.name: a_value("shard." + f.name, f, hints[f.name])[0] for f in dataclasses.fields(ShardSettings)}
    cfg = TrainConfig(ids="hashed", ps_wal=True, shard=values)
    shard = ShardConfig(tuple(job_tables(cfg)), **local.shard_options(cfg))
    for f in dataclasses.fields(ShardSettings):
        expected = parse_bytes(values[f.name]) if f.metadata.get("kind") == "size" else values[f.name]
        assert getattr(shard, f.name) == expected != f.default, f.name


def test_every_table_setting_reaches_a_jobs_tables():
    """A field of TableSettings is a job's [table] key and reaches each of the job's tables with
    no other declaration: each set to a value other than its default is read back there."""
    hints = typing.get_type_hints(TableSettings)
    values = {f.name: a_value("table." + f.name, f, hints[f.name])[0] for f in dataclasses.fields(TableSettings)}
    tables = job_tables(TrainConfig(ids="hashed", widths={"C1": 8}, table=values))
    assert len(tables) == 2
    for t in tables:
        for f in dataclasses.fields(TableSettings):
            assert getattr(t, f.name) == values[f.name] != f.default, f.name


def test_a_table_setting_is_a_table_flag_and_its_old_spelling_still_works_saying_so_once(capsys, monkeypatch):
    monkeypatch.setattr(config, "_SAID", set())
    new = config_from_args(cli.parser().parse_args(["train", "--table-row-dtype", "bf16", "--table-admit-after", "3"]))
    assert (new.table.row_dtype, new.table.admit_after) == ("bf16", 3) and capsys.readouterr().err == ""
    old = config_from_args(cli.parser().parse_args(["train", "--row-dtype", "bf16", "--admit-after", "3"]))
    assert old.table == new.table
    assert sorted(capsys.readouterr().err.splitlines()) == [
        "het: admit_after is spelled table.admit_after (flag --table-admit-after); the old spelling will be removed",
        "het: row_dtype is spelled table.row_dtype (flag --table-row-dtype); the old spelling will be removed"]
    assert TrainConfig.from_dict({"row_dtype": "fp16"}).table.row_dtype == "fp16"  # a TOML key of the old spelling


def test_every_cache_setting_reaches_a_workers_caches():
    """A field of CacheSettings is a job's [cache] key and reaches each of a worker's caches with
    no other declaration: each set to a value other than its default is read back there."""
    from het.ps.local import local_client
    from het.train.loop import Worker

    hints = typing.get_type_hints(CacheSettings)
    values = {f.name: a_value("cache." + f.name, f, hints[f.name])[0] for f in dataclasses.fields(CacheSettings)}
    cfg = TrainConfig(batch=64, dim=4, synthetic={"cap": 500}, eval_samples=0, workers=1, cache=values)
    worker = Worker(cfg, local_client(job_tables(cfg)))
    assert worker.embedding.caches
    for cache in worker.embedding.caches.values():
        for f in dataclasses.fields(CacheSettings):
            assert getattr(cache.cfg, f.name) == values[f.name] != f.default, f.name


def test_a_cache_setting_is_a_cache_flag_and_its_old_spelling_still_works_saying_so_once(capsys, monkeypatch):
    monkeypatch.setattr(config, "_SAID", set())
    new = config_from_args(cli.parser().parse_args(["train", "--cache-policy", "lru", "--cache-lookahead", "4",
                                                    "--cache-frac", "0.2"]))
    assert (new.cache.policy, new.cache.lookahead, new.cache.frac) == ("lru", 4, 0.2)
    assert capsys.readouterr().err == ""
    old = config_from_args(cli.parser().parse_args(["train", "--policy", "lru", "--lookahead", "4", "--cache-frac",
                                                    "0.2"]))
    assert old.cache == new.cache
    assert sorted(capsys.readouterr().err.splitlines()) == [
        "het: lookahead is spelled cache.lookahead (flag --cache-lookahead); the old spelling will be removed",
        "het: policy is spelled cache.policy (flag --cache-policy); the old spelling will be removed"]
    assert TrainConfig.from_dict({"cache_frac": 0.3}).cache.frac == 0.3  # a TOML key of the old spelling
