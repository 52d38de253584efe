"""Closed choices (het.choices): each an enum defined once; configs take the strings users write
and write the same strings back (JSON, TOML, saves and checkpoints); every table keyed by a
choice covers it exactly."""

import json

import pytest
import torch

from het import choices
from het.choices import DENSE_OPTIMIZERS, GRAPH_MODELS, Choice, Model, Optimizer, Policy, PushDtype
from het.config import CacheConfig, OptimizerConfig, ShardConfig, TableConfig
from het.ps.local import local_client
from het.train.config import TrainConfig

ENUMS = [c for c in vars(choices).values() if isinstance(c, type) and issubclass(c, Choice) and c is not Choice]


def only_plain(value) -> bool:
    """Whether ``value`` holds strings only as plain ``str`` (no enum member), however nested."""
    if isinstance(value, dict):
        return all(only_plain(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(only_plain(v) for v in value)
    return not isinstance(value, Choice)


@pytest.mark.parametrize("enum", ENUMS, ids=lambda e: e.__name__)
def test_a_member_is_its_string_wherever_a_string_goes(enum):
    for member in enum:
        assert member == member.value and {member.value: 1}[member] == 1
        assert (str(member), f"{member}", repr(member)) == (member.value, member.value, repr(member.value))
        assert json.dumps([member]) == json.dumps([member.value]) and enum(member.value) is member


def test_configs_take_strings_and_hold_members():
    cfg = TrainConfig(mode="ps", cache={"policy": "lru"}, optimizer="rowwise_adagrad", push_dtype="bf16", ids="hashed")
    assert cfg.cache.policy is Policy.LRU and cfg.optimizer is Optimizer.ROWWISE_ADAGRAD and cfg.push_dtype is PushDtype.BF16
    assert CacheConfig(policy="lru", local_update="full").local_update == "full"
    assert ShardConfig((TableConfig("t", 4, 2),), memory_policy="lfu").memory_policy is Policy.LFU
    with pytest.raises(ValueError, match=r"policy must be one of \('lru', 'lfu'\), got 'LRU'"):
        CacheConfig(policy="LRU")


def test_to_dict_writes_the_same_plain_strings(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('mode = "hybrid"\noptimizer = "adam"\npush_dtype = "bf16"\n[cache]\npolicy = "lru"\n')
    cfg = TrainConfig.load(str(job))
    d = cfg.to_dict()
    assert only_plain(d) and (d["mode"], d["cache"]["policy"], d["optimizer"], d["push_dtype"]) == ("hybrid", "lru", "adam",
                                                                                          "bf16")
    assert type(d["mode"]) is str and TrainConfig.from_dict(json.loads(json.dumps(d))) == cfg
    table = TableConfig("t", rows=None, dim=4, optimizer=OptimizerConfig("adagrad"))
    assert only_plain(table.to_dict()) and type(table.to_dict()["optimizer"]["name"]) is str


def test_a_save_holds_plain_strings_and_loads_without_trusting_pickles(tmp_path):
    """The shards' saves are read with ``torch.load(weights_only=True)``: an enum member there
    would be refused; a checkpoint's config is plain data too."""
    table = TableConfig("t", rows=8, dim=2, optimizer=OptimizerConfig("adagrad", lr=0.1))
    client = local_client([table])
    [path] = client.save(str(tmp_path / "ps"))
    saved = torch.load(path, weights_only=True)
    assert only_plain(saved) and client.load(str(tmp_path / "ps"))
    torch.save({"config": TrainConfig(cache={"policy": "lru"}).to_dict()}, tmp_path / "worker.pt")
    assert torch.load(tmp_path / "worker.pt", weights_only=True)["config"]["cache"]["policy"] == "lru"


def test_every_table_keyed_by_a_choice_covers_it_exactly():
    from het.cache.policy import POLICIES
    from het.train.loop import TORCH_OPTIMIZERS
    from het.train.tasks import CTR_MODELS

    assert set(POLICIES) == set(Policy)
    assert set(TORCH_OPTIMIZERS) == set(DENSE_OPTIMIZERS)
    assert set(CTR_MODELS) | set(GRAPH_MODELS) == set(Model) and not set(CTR_MODELS) & set(GRAPH_MODELS)
    for name in Optimizer:
        OptimizerConfig(name)  # each has a shard-side optimizer: het.ps.server.store.optim.make
        local_client([TableConfig("t", rows=2, dim=2, optimizer=OptimizerConfig(name))])


def test_precisions_are_named_in_one_vocabulary_and_old_spellings_read_saying_so(capsys, monkeypatch):
    """Rows, pushes, the dense AllReduce and an export name precisions as Precision does, with
    its bytes; push_dtype's ``f32`` and dense_compression's ``none`` read as ``fp32``."""
    from het.choices import EXPORT_DTYPES, DenseCompression, Precision, RowDtype
    from het.train.sections import ExportConfig

    precisions = set(Precision.values())
    for named in (RowDtype.values(), PushDtype.values(), set(DenseCompression.values()) - {"powersgd"},
                  EXPORT_DTYPES, ExportConfig.__dataclass_fields__["dtype"].metadata["choices"]):
        assert set(named) <= precisions, named
    assert [PushDtype(p).bytes for p in PushDtype.values()] == [Precision(p).bytes for p in PushDtype.values()]
    monkeypatch.setattr(choices, "_SAID", set())
    cfg = TrainConfig.from_dict({"push_dtype": "f32", "dense_compression": "none"})
    assert (cfg.push_dtype, cfg.dense_compression) == ("fp32", "fp32")
    assert capsys.readouterr().err.splitlines() == [
        "het: PushDtype 'f32' is spelled 'fp32'; the old spelling will be removed",
        "het: DenseCompression 'none' is spelled 'fp32'; the old spelling will be removed"]
    with pytest.raises(ValueError, match="push_dtype: expected one of"):
        TrainConfig.from_dict({"push_dtype": "f16"})
