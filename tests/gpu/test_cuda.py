"""The cache and the model on a CUDA device (skipped without one). Run on a GPU machine with
`python -m pytest -q tests/gpu` (a few seconds)."""

import pytest
import torch

from het import CacheConfig, Embedding, OptimizerConfig, TableConfig
from het.cache.cache import EmbeddingCache

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")


def test_staleness_zero_matches_torch_with_the_cache_on_the_gpu():
    table = TableConfig("embedding", rows=200, dim=16, optimizer=OptimizerConfig("adagrad", lr=0.05))
    emb = Embedding(tables=table, cache=CacheConfig(capacity=64, staleness=0), device="cuda")
    ref = torch.nn.Embedding(200, 16, sparse=True).cuda()
    with torch.no_grad():
        ref.weight.copy_(emb.read(torch.arange(200, device="cuda")))
    opt = torch.optim.Adagrad(ref.parameters(), lr=0.05)
    g = torch.Generator(device="cuda").manual_seed(0)
    for _ in range(30):
        keys = torch.randint(0, 200, (32, 4), device="cuda", generator=g)
        target = torch.randn(32, 4, 16, device="cuda", generator=g)
        out = emb(keys)
        assert out.device.type == "cuda"
        ((out - target) ** 2).mean().backward()
        opt.zero_grad()
        ((ref(keys) - target) ** 2).mean().backward()
        opt.step()
    assert float((emb.read(torch.arange(200, device="cuda")) - ref.weight.detach()).abs().max()) <= 1e-5


@pytest.mark.parametrize("staleness", [0, 4])
def test_rows_that_decay_match_torch_decayed_every_step_with_the_cache_on_the_gpu(staleness):
    """L2 as a lazy decay (het.decay) under SGD: each slot's step on the GPU; one worker exact at any bound."""
    lr, l2 = 0.1, 0.5
    table = TableConfig("embedding", rows=200, dim=16, optimizer=OptimizerConfig("sgd", lr=lr, l2=l2))
    emb = Embedding(tables=table, cache=CacheConfig(capacity=64, staleness=staleness), device="cuda")
    ref = torch.nn.Embedding(200, 16, sparse=True).cuda()
    with torch.no_grad():
        ref.weight.copy_(emb.read(torch.arange(200, device="cuda")))
    opt = torch.optim.SGD(ref.parameters(), lr=lr)
    g = torch.Generator(device="cuda").manual_seed(0)
    for _ in range(30):
        keys = torch.randint(0, 200, (32, 4), device="cuda", generator=g)
        target = torch.randn(32, 4, 16, device="cuda", generator=g)
        ((emb(keys) - target) ** 2).sum().backward()
        opt.zero_grad()
        ((ref(keys) - target) ** 2).sum().backward()
        with torch.no_grad():
            ref.weight.mul_(1 - lr * l2)
        opt.step()
    assert emb.caches["embedding"].slot_steps.steps.device.type == "cuda"
    assert float((emb.read(torch.arange(200, device="cuda")) - ref.weight.detach()).abs().max()) <= 1e-4


def test_module_to_cuda_moves_the_caches():
    emb = Embedding(100, 8, cache=CacheConfig(capacity=16))
    model = torch.nn.Sequential(emb).to("cuda")
    assert model[0].caches["embedding"].rows.device.type == "cuda"
    assert model(torch.tensor([1, 2], device="cuda")).device.type == "cuda"


def test_cache_miss_rate_is_the_same_on_cpu_and_gpu():
    keys = torch.randint(0, 5000, (100, 512), generator=torch.Generator().manual_seed(1))
    rates = []
    for device in ("cpu", "cuda"):
        cache = EmbeddingCache(TableConfig("t", rows=5000, dim=4), CacheConfig(capacity=500, policy="lfu"), device)
        for batch in keys:
            cache.lookup(torch.unique(batch).to(device))
        rates.append(cache.stats()["miss_rate"])
    assert rates[0] == rates[1]


def test_a_table_a_width_and_its_model_run_on_the_gpu():
    """DeepFM over tables of two widths moved to CUDA as a whole: its lookups, shifts and
    projections there, the rows trained."""
    from het.models import DeepFM
    from het.nn.fields import FieldTables, group_widths, plan_groups

    groups = plan_groups([4, 8, 4], cardinalities=[10, 20, 30], offsets=[0, 10, 30])
    emb = Embedding(tables=[TableConfig(g.table, rows=g.rows, dim=g.width) for g in groups],
                    cache={g.table: CacheConfig(capacity=8) for g in groups})
    model = DeepFM(FieldTables(emb, groups), num_fields=3, dim=group_widths(groups), num_dense=2, hidden=(8,)).to("cuda")
    sparse = torch.tensor([[1, 12, 35], [0, 29, 59]], device="cuda")
    before = emb.read(torch.arange(20, device="cuda"), table="embedding_8").clone()
    out = model(torch.randn(2, 2, device="cuda"), sparse)
    assert out.device.type == "cuda"
    out.sum().backward()
    emb.flush()
    assert not torch.equal(emb.read(torch.arange(20, device="cuda"), table="embedding_8"), before)
