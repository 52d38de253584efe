"""Fields of several widths: a PS table a width, the lookup that splits a batch among them, the
models' projections, and the widths ``auto`` and ``widths`` give (tests/unit/test_export.py: their
exports score as training)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from het import CacheConfig, Embedding, OptimizerConfig, TableConfig
from het.models import DCN, DLRM, DeepFM, WideDeep
from het.nn.fields import FieldTables, group_widths, plan_groups
from het.train.config import TrainConfig
from het.train.tasks import job_tables, make_task
from het.train.widths import auto_width

MODELS = [WideDeep, DeepFM, DCN, DLRM]


@pytest.mark.parametrize("model", MODELS)
def test_one_width_given_a_field_at_a_time_is_the_model_of_one_width(model):
    """Equal widths as a tuple build the same parameters, in the same order, and the same logits."""
    emb = nn.Embedding(50, 4)
    torch.manual_seed(3)
    one = model(emb, num_fields=3, dim=4, num_dense=2, **({"hidden": (8,)} if model in (WideDeep, DeepFM, DCN)
                                                          else {"bottom": (8,), "top": (8,)}))
    torch.manual_seed(3)
    each = model(emb, num_fields=3, dim=(4, 4, 4), num_dense=2, **({"hidden": (8,)} if model in (WideDeep, DeepFM, DCN)
                                                                    else {"bottom": (8,), "top": (8,)}))
    a, b = one.state_dict(), each.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    dense, sparse = torch.randn(5, 2), torch.randint(0, 50, (5, 3))
    assert torch.equal(one(dense, sparse), each(dense, sparse))


@pytest.mark.parametrize("model", MODELS)
def test_a_model_reads_a_group_a_width_and_projects_only_where_fields_are_paired(model):
    groups = plan_groups([4, 8, 4], cardinalities=[10, 20, 30], offsets=[0, 10, 30])
    tables = nn.ModuleDict({g.table: nn.Embedding(g.rows, g.width) for g in groups})
    m = model(FieldTables(tables, groups), num_fields=3, dim=group_widths(groups), num_dense=2)
    out = m(torch.randn(6, 2), torch.tensor([[1, 12, 35]] * 6))
    assert out.shape == (6,) and torch.isfinite(out).all()
    projected = [n for n, _ in m.named_parameters() if "fields.project" in n]
    if model in (DeepFM, DLRM):  # the FM term and the dot products pair fields at the widest width
        assert projected == ["fields.project.0.weight"]
        assert m.fields.project[0].weight.shape == (8, 4)
    else:
        assert projected == []
    with pytest.raises(ValueError, match=r"field rows of shapes \[\(2, 4\)\], the model expects \[\(2, 4\), \(1, 8\)\]"):
        m.fields.flat(torch.zeros(1, 2, 4))


def test_a_fixed_table_a_width_holds_its_fields_keys_only():
    groups = plan_groups([8, 16, 8], bag_sizes=[2, 1, 1], cardinalities=[3, 5, 2], offsets=[0, 3, 8])
    narrow, wide = groups
    assert (narrow.table, narrow.columns, narrow.rows, wide.columns, wide.rows) == ("embedding_8", (0, 1, 3), 5, (2,), 5)
    keys = torch.tensor([[0, 2, 7, 9]])  # field 0's keys 0 and 2, field 1's 7, field 2's 9
    split = FieldTables(nn.ModuleDict({g.table: nn.EmbeddingBag(g.rows, g.width) for g in groups}), groups,
                        pooled=True).split(keys)
    assert split["embedding_8"].tolist() == [[0, 2, 4]] and split["embedding_16"].tolist() == [[4]]


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_tables_of_several_widths_at_staleness_zero_match_torch_embeddings(optimizer):
    """DeepFM over a het table a width (announced and prefetched by the routed batch, as the
    trainer does) against the same DeepFM over nn.Embedding tables: the same rows and logits."""
    lr = 0.05
    groups = plan_groups([4, 8, 4], cardinalities=[10, 20, 30], offsets=[0, 10, 30])
    tables = [TableConfig(g.table, rows=g.rows, dim=g.width, optimizer=OptimizerConfig(optimizer, lr=lr))
              for g in groups]
    emb = Embedding(tables=tables, num_shards=2,
                    cache={g.table: CacheConfig(capacity=12, staleness=0, ways=4, lookahead=2) for g in groups})
    ref_tables = nn.ModuleDict({g.table: nn.Embedding(g.rows, g.width, sparse=True) for g in groups})
    with torch.no_grad():
        for g in groups:
            ref_tables[g.table].weight.copy_(emb.read(torch.arange(g.rows), table=g.table))
    models = []
    for source in (emb, ref_tables):  # the same dense parameters: the lookups draw no random numbers
        torch.manual_seed(0)
        models.append(DeepFM(FieldTables(source, groups), num_fields=3, dim=group_widths(groups), num_dense=2,
                             hidden=(8,)))
    het_model, ref_model = models
    dense_opt = torch.optim.SGD(het_model.parameters(), lr=0.01)
    ref_dense = torch.optim.SGD([p for n, p in ref_model.named_parameters() if not n.startswith("embedding.")], lr=0.01)
    ref_sparse = (torch.optim.SGD if optimizer == "sgd" else torch.optim.Adagrad)(ref_tables.parameters(), lr=lr)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(16, 2, generator=g),
                torch.stack([torch.randint(lo, lo + n, (16,), generator=g) for lo, n in ((0, 10), (10, 20), (30, 30))], 1),
                torch.randint(0, 2, (16,), generator=g).float()) for _ in range(30)]
    loss_fn = nn.BCEWithLogitsLoss()
    for i, (dense, sparse, labels) in enumerate(batches):
        if i + 1 < len(batches):
            emb.announce(batches[i + 1][1])  # the whole batch's keys, routed to each table
        got = het_model(dense, sparse)
        want = ref_model(dense, sparse)
        assert torch.allclose(got, want, atol=1e-5), i
        dense_opt.zero_grad(), ref_dense.zero_grad(), ref_sparse.zero_grad()
        loss_fn(got, labels).backward()
        loss_fn(want, labels).backward()
        dense_opt.step(), ref_dense.step(), ref_sparse.step()
        emb.push_due()
    emb.flush()
    for grp in groups:
        gap = (emb.read(torch.arange(grp.rows), table=grp.table) - ref_tables[grp.table].weight.detach()).abs().max()
        assert gap <= 1e-5, grp.table
    assert all(s["lookups"] > 0 for s in emb.stats().values())


def test_auto_gives_a_width_a_field_from_its_ids_and_a_table_a_width():
    cfg = TrainConfig(dim="auto", synthetic={"cap": 2000}, steps=1)
    task = make_task(cfg)
    cards = task.data.cardinalities
    assert list(task.dim) == sorted(task.dim) and sorted(task.dim) == sorted(auto_width(c) for c in cards)
    tables = {t.name: t for t in job_tables(cfg, task)}
    assert set(tables) == {f"embedding_{w}" for w in set(task.dim)}
    for grp in task.groups:  # a fixed table of its own fields' keys only
        assert tables[grp.table].rows == sum(cards[f] for f in grp.fields) and tables[grp.table].dim == grp.width
    assert sum(t.rows for t in tables.values()) == task.data.num_rows


def test_widths_name_fields_and_a_wrong_name_is_refused_naming_the_fields():
    task = make_task(TrainConfig(widths={"C3": 32}, dim=8, synthetic={"cap": 500}, steps=1))
    assert task.dim == (8,) * 25 + (32,) and task.groups[1].fields == (2,)
    with pytest.raises(ValueError, match=r"widths: no field 'user' in the data; its fields: C1, C2, C3"):
        make_task(TrainConfig(widths={"user": 32}, synthetic={"cap": 500}, steps=1))
    one = make_task(TrainConfig(widths={"C3": 8}, dim=8, synthetic={"cap": 500}, steps=1))
    assert one.groups is None and one.dim == 8  # one width after all: one table, as ever


def test_auto_on_a_graph_is_one_width_from_its_nodes():
    task = make_task(TrainConfig(model="graphsage", data="synthetic-graph:3000", dim="auto", steps=1))
    assert task.dim == auto_width(3000) == 32 and task.groups is None


def test_a_prepared_table_counts_each_fields_ids_and_auto_sizes_by_them(tmp_path):
    from het.data.table import TableDataset, TableSpec, prepare_table
    from het.train.widths import field_ids, widths_of

    rng = np.random.default_rng(0)
    n = 3000
    with open(tmp_path / "t.csv", "w") as f:
        f.write("y,price,city,user\n")
        for i in range(n):
            f.write(f"{i % 2},{rng.random():.3f},c{rng.integers(0, 3)},u{rng.integers(0, 2000)}\n")
    prepare_table(str(tmp_path / "t.csv"), str(tmp_path / "out"), TableSpec("y", ("price",), ("city", "user")),
                  test_fraction=0.0, progress=False)
    data = TableDataset(str(tmp_path / "out"))
    keys = data.batch("train", 0, data.rows["train"]).sparse.numpy()
    exact = [len(np.unique(keys[:, j])) for j in range(2)]
    assert data.meta["field_ids"] == exact and exact[0] == 3 and exact[1] > 1000
    assert widths_of(TrainConfig(data=f"table:{tmp_path / 'out'}", dim="auto"), data) == [auto_width(e) for e in exact]
    del data.meta["field_ids"]  # a table prepared before the count: counted on its training split instead
    assert field_ids(data) == exact


def test_ids_counted_on_a_training_split_not_a_multiple_of_the_block_count_every_row_once():
    from het.data.batch import Batch
    from het.train.widths import field_ids

    class Rows:  # batch i of size k holds rows i*k .., wrapping, as prepared data's batches do
        num_fields, rows = 2, {"train": 70_001}

        def batch(self, split, index, size):
            at = (index * size + torch.arange(size)) % self.rows["train"]
            return Batch(torch.zeros(size, 0), torch.stack([at, at % 7], 1), torch.zeros(size))

    ids = field_ids(Rows())  # beyond 4,096 ids a sketch, within a few percent; a row counted twice or never: -6%
    assert ids[1] == 7 and abs(ids[0] - 70_001) < 0.03 * 70_001, ids


@pytest.mark.cluster
def test_a_checkpoint_resumed_with_other_widths_is_refused_naming_both(tmp_path):
    import subprocess
    import sys

    from jobs import het

    job = ("--workers", "1", "--synthetic-cap", "500", "--batch", "64", "--eval-samples", "0", "--quiet",
           "--log-dir", str(tmp_path / "logs"))
    het("train", *job, "--dim", "auto", "--steps", "4", "--checkpoint", str(tmp_path / "ck"), "--checkpoint-every",
        "4", "--json")
    out = subprocess.run([sys.executable, "-m", "het", "train", *job, "--dim", "16", "--steps", "8", "--resume",
                          str(tmp_path / "ck")], capture_output=True, text=True, timeout=300)
    said = (tmp_path / "logs" / "worker-0.log").read_text()
    assert out.returncode != 0 and "exited with code 2: het train: error:" in out.stderr, out.stderr[-2000:]
    assert "holds fields in tables embedding_" in said and "this job puts them in one table" in said, said[-2000:]
    assert "Traceback" not in said + out.stderr
