"""The CTR models: shapes with either embedding, training on a planted task, each model's
interaction against a brute-force version, and gradients reaching the embedding rows. GraphSAGE:
the dropout on its node-id rows."""

from types import SimpleNamespace

import pytest
import torch
from torch import nn

import het
from het.models import DCN, DLRM, DeepFM, WideDeep
from het.models.dcn import CrossLayer
from het.models.graphsage import GraphSAGE
from het.models.deepfm import fm_interaction
from het.models.dlrm import dot_interaction

ROWS, FIELDS, DIM, DENSE = 30, 3, 4, 2

# small layers so the tests run fast; the defaults are checked in test_default_sizes_follow_het
MODELS = {
    "wdl": lambda emb: WideDeep(emb, FIELDS, DIM, DENSE, hidden=(16, 16)),
    "deepfm": lambda emb: DeepFM(emb, FIELDS, DIM, DENSE, hidden=(16, 16)),
    "deepfm_first_order": lambda emb: DeepFM(emb, FIELDS, DIM, DENSE, hidden=(16, 16),
                                             first_order=nn.Embedding(ROWS, 1)),
    "dcn": lambda emb: DCN(emb, FIELDS, DIM, DENSE, num_cross=2, hidden=(16, 16)),
    "dlrm": lambda emb: DLRM(emb, FIELDS, DIM, DENSE, bottom=(16,), top=(16,)),
}
EMBEDDINGS = {
    "torch": lambda: nn.Embedding(ROWS, DIM),
    "het": lambda: het.Embedding(ROWS, DIM, optimizer="sgd", lr=0.1, cache=het.CacheConfig(capacity=8)),
}


def batch(b: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, DENSE, generator=g), torch.randint(0, ROWS, (b, FIELDS), generator=g)


@pytest.mark.parametrize("embedding", EMBEDDINGS)
@pytest.mark.parametrize("model", MODELS)
def test_logits_have_shape_batch(model, embedding):
    torch.manual_seed(0)
    dense, sparse = batch(b=7)
    logits = MODELS[model](EMBEDDINGS[embedding]())(dense, sparse)
    assert logits.shape == (7,)
    assert logits.dtype == torch.float32 and bool(torch.isfinite(logits).all())


def test_deepfm_takes_a_het_embedding_as_first_order_term():
    torch.manual_seed(0)
    first = het.Embedding(ROWS, 1, optimizer="sgd", lr=0.1, cache=het.CacheConfig(capacity=8))
    model = DeepFM(EMBEDDINGS["het"](), FIELDS, DIM, DENSE, hidden=(8,), first_order=first)
    dense, sparse = batch()
    before = first.read(torch.arange(ROWS))
    model(dense, sparse).sum().backward()
    changed = (first.read(torch.arange(ROWS)) != before).any(dim=1)
    assert torch.equal(changed, torch.isin(torch.arange(ROWS), sparse))


def test_deepfm_rejects_a_first_order_module_of_the_wrong_width():
    model = DeepFM(nn.Embedding(ROWS, DIM), FIELDS, DIM, DENSE, hidden=(8,), first_order=nn.Embedding(ROWS, 2))
    with pytest.raises(ValueError, match=r"weights \(6, 3, 1\), got \(6, 3, 2\)"):
        model(*batch())


def test_default_sizes_follow_het():
    emb = nn.Embedding(ROWS, DIM)
    for model in (WideDeep(emb, FIELDS, DIM), DeepFM(emb, FIELDS, DIM), DCN(emb, FIELDS, DIM)):
        widths = [m.out_features for m in model.deep if isinstance(m, nn.Linear)]
        assert widths == [256, 256, 256]
    assert len(DCN(emb, FIELDS, DIM).cross) == 3
    dlrm = DLRM(emb, FIELDS, DIM)
    assert [m.out_features for m in dlrm.bottom if isinstance(m, nn.Linear)] == [256, 128, DIM]
    assert [m.out_features for m in dlrm.top if isinstance(m, nn.Linear)] == [256, 128]
    # the logit comes from a plain linear layer: no ReLU clamps it at zero
    for model in (DeepFM(emb, FIELDS, DIM), DCN(emb, FIELDS, DIM), dlrm):
        assert isinstance(model.head, nn.Linear) and model.head.out_features == 1


@pytest.mark.parametrize("model", MODELS)
def test_training_on_a_planted_task_lowers_the_loss(model):
    # label 1 exactly when key 7 is in field 0, which it is half the time; dense features are noise
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    dense = torch.randn(128, DENSE, generator=g)
    sparse = torch.randint(8, ROWS, (128, FIELDS), generator=g)
    planted = torch.rand(128, generator=g) < 0.5
    sparse[planted, 0] = 7
    labels = planted.float()
    net = MODELS[model](nn.Embedding(ROWS, DIM))
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    losses = []
    for _ in range(60):
        loss = nn.functional.binary_cross_entropy_with_logits(net(dense, sparse), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    # below 0.8x its start, and well below chance (ln 2 = 0.69): DeepFM's FM term starts large
    assert losses[-1] < 0.8 * losses[0] and losses[-1] < 0.5, losses[::10]


@pytest.mark.parametrize("model", MODELS)
def test_gradients_reach_only_the_rows_used(model):
    torch.manual_seed(0)
    dense, sparse = batch()
    used = torch.isin(torch.arange(ROWS), sparse)
    assert not used.all()  # some rows stay out of the batch

    plain = nn.Embedding(ROWS, DIM)
    MODELS[model](plain)(dense, sparse).sum().backward()
    assert torch.equal(plain.weight.grad.ne(0).any(dim=1), used)

    emb = EMBEDDINGS["het"]()
    before = emb.read(torch.arange(ROWS))
    MODELS[model](emb)(dense, sparse).sum().backward()
    emb.flush()
    after = emb.read(torch.arange(ROWS))
    assert torch.equal((after != before).any(dim=1), used)


def test_fm_term_equals_the_sum_over_field_pairs():
    rows = torch.randn(4, 5, 3, dtype=torch.float64)
    expect = torch.zeros(4, dtype=torch.float64)
    for i in range(5):
        for j in range(i + 1, 5):
            expect += (rows[:, i] * rows[:, j]).sum(dim=1)
    assert torch.allclose(fm_interaction(rows), expect)


def test_deepfm_logit_is_first_plus_fm_plus_deep_plus_dense_terms():
    torch.manual_seed(0)
    emb, first = nn.Embedding(ROWS, DIM), nn.Embedding(ROWS, 1)
    model = DeepFM(emb, FIELDS, DIM, DENSE, hidden=(8,), first_order=first)
    dense, sparse = batch()
    rows = emb(sparse)
    deep = model.head(torch.relu(model.deep[0](torch.cat([rows.flatten(1), dense], dim=1))))
    expect = first(sparse).sum(dim=(1, 2)) + fm_interaction(rows) + deep[:, 0] + model.dense_linear(dense)[:, 0]
    assert torch.allclose(model(dense, sparse), expect, atol=1e-6)


def test_dlrm_interaction_equals_every_pairwise_dot_product():
    torch.manual_seed(0)
    emb = nn.Embedding(ROWS, DIM)
    model = DLRM(emb, FIELDS, DIM, DENSE, bottom=(8,), top=(8,))
    dense, sparse = batch()
    vectors = torch.cat([model.bottom(dense)[:, None], emb(sparse)], dim=1)  # (B, F + 1, D)
    expect = [(vectors[:, i] * vectors[:, j]).sum(dim=1)
              for i in range(FIELDS + 1) for j in range(i + 1, FIELDS + 1)]
    assert torch.allclose(dot_interaction(vectors, model.pairs), torch.stack(expect, dim=1), atol=1e-6)
    # and that is what the top MLP sees, next to the bottom output
    top_in = torch.cat([vectors[:, 0], torch.stack(expect, dim=1)], dim=1)
    assert torch.allclose(model(dense, sparse), model.head(model.top(top_in))[:, 0], atol=1e-6)


def test_cross_layer_equals_the_formula():
    torch.manual_seed(0)
    layer = CrossLayer(3)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([0.5, -1.0, 2.0]))
        layer.bias.copy_(torch.tensor([0.1, 0.2, 0.3]))
    x0 = torch.tensor([[1.0, 2.0, 3.0]])
    x = torch.tensor([[2.0, 0.0, 1.0]])
    # x . w = 1 + 0 + 2 = 3; x0 * 3 + b + x
    assert torch.allclose(layer(x0, x), torch.tensor([[3.0 + 0.1 + 2.0, 6.0 + 0.2 + 0.0, 9.0 + 0.3 + 1.0]]))
    assert sum(p.numel() for p in layer.parameters()) == 2 * 3  # a weight vector, not a matrix


def test_dcn_stacks_its_cross_layers_on_x0():
    torch.manual_seed(0)
    emb = nn.Embedding(ROWS, DIM)
    model = DCN(emb, FIELDS, DIM, DENSE, num_cross=2, hidden=(8,))
    dense, sparse = batch()
    x0 = torch.cat([emb(sparse).flatten(1), dense], dim=1)
    x = x0
    for layer in model.cross:
        x = x0 * (x @ layer.weight)[:, None] + layer.bias + x
    expect = model.head(torch.cat([x, model.deep(x0)], dim=1))[:, 0]
    assert torch.allclose(model(dense, sparse), expect, atol=1e-6)


def _sage_inputs(model: GraphSAGE, nodes: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """What the first SAGE layer reads (after the dropouts) in one forward pass over a block
    in which every input node is also a destination with no edges."""
    seen = []
    hook = model.layers[0].register_forward_pre_hook(lambda _, args: seen.append(args[0].detach()))
    block = SimpleNamespace(dst_count=len(nodes), edge_src=torch.zeros(0, dtype=torch.long),
                            edge_dst=torch.zeros(0, dtype=torch.long))
    model(nodes, features, [block])
    hook.remove()
    return seen[0]


def test_graphsage_embedding_dropout_drops_id_coordinates_only_in_training():
    torch.manual_seed(0)
    emb, nodes, features = nn.Embedding(ROWS, DIM), torch.arange(ROWS), torch.rand(ROWS, 3) + 1
    rows = emb(nodes).detach()
    model = GraphSAGE(emb, DIM, in_features=3, num_classes=2, layers=1, dropout=0.0, embedding_dropout=0.5)

    h = _sage_inputs(model.train(), nodes, features)
    ids, feats = h[:, :DIM], h[:, DIM:]
    kept = ids != 0
    assert 0.3 < kept.float().mean() < 0.7  # about half of the 120 id coordinates survive
    assert torch.allclose(ids[kept], 2 * rows[kept])  # the survivors scaled by 1 / (1 - p)
    assert torch.equal(feats, features)  # the features are not the embedding's dropout's business

    assert torch.equal(_sage_inputs(model.eval(), nodes, features), torch.cat([rows, features], dim=1))
    plain = GraphSAGE(emb, DIM, in_features=3, num_classes=2, layers=1, dropout=0.0)  # the default: off
    assert torch.equal(_sage_inputs(plain.train(), nodes, features), torch.cat([rows, features], dim=1))


@pytest.mark.parametrize("p", [-0.1, 1.0])
def test_graphsage_refuses_an_embedding_dropout_outside_0_1(p):
    with pytest.raises(ValueError, match="embedding_dropout must lie in"):
        GraphSAGE(nn.Embedding(ROWS, DIM), DIM, in_features=0, num_classes=2, embedding_dropout=p)


def test_the_gcn_aggregator_is_one_weight_over_the_mean_of_a_node_and_its_neighbours():
    from types import SimpleNamespace

    from het.models.graphsage import SAGELayer

    torch.manual_seed(0)
    layer = SAGELayer(4, 3, "gcn")
    h = torch.randn(5, 4)
    # node 0 hears from 2, 3 and 4; node 1 from none (its own input alone)
    block = SimpleNamespace(dst_count=2, edge_src=torch.tensor([2, 3, 4]), edge_dst=torch.tensor([0, 0, 0]))
    out = layer(h, block)
    assert torch.allclose(out[0], layer.self_lin(h[[0, 2, 3, 4]].mean(0)), atol=1e-6)
    assert torch.allclose(out[1], layer.self_lin(h[1]), atol=1e-6)
    assert layer.neigh_lin is None
    with pytest.raises(ValueError, match="aggregator must be one of"):
        SAGELayer(4, 3, "max")
