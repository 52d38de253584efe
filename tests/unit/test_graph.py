"""Graphs: the Planetoid reader, the on-disk format, the edge-list converter, the synthetic
power-law generator and the neighbour sampler."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from het.data.graph import (Graph, convert_edge_list, csr_from_edges, default_shared_dir, load,
                            load_npz, load_planetoid, normalize_features, read_edge_list, save_npz,
                            synthetic_power_law)
from het.data.sampler import NeighborSampler

CORA = default_shared_dir() / "data" / "cora"
needs_cora = pytest.mark.skipif(not (CORA / "ind.cora.x").is_file(), reason=f"no Cora files in {CORA}")


def assert_clean_csr(g: Graph) -> None:
    """Symmetric, no self loops, no duplicates: the edge set equals its transpose, exactly once."""
    src, dst = (t.numpy() for t in g.edges())
    assert not (src == dst).any()
    keys = src * g.num_nodes + dst
    assert len(np.unique(keys)) == len(keys)
    assert np.array_equal(np.sort(keys), np.sort(dst * g.num_nodes + src))


def assert_graphs_equal(a: Graph, b: Graph) -> None:
    for f in dataclasses.fields(Graph):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and torch.equal(x, y), f.name
        else:
            assert x == y, f.name


@pytest.fixture(scope="module")
def cora() -> Graph:
    return load("cora")


@pytest.fixture(scope="module")
def power_law() -> Graph:
    return synthetic_power_law(20_000, 10.0, 8, 32, exponent=2.5, homophily=0.8, seed=3)


# --- Planetoid ---------------------------------------------------------------------------------

@needs_cora
def test_cora_counts_and_standard_split(cora):
    assert (cora.num_nodes, cora.num_edges, cora.num_features, cora.num_classes) == (2708, 5278, 1433, 7)
    assert [int(m.sum()) for m in (cora.train_mask, cora.val_mask, cora.test_mask)] == [140, 500, 1000]
    assert cora.train_mask[:140].all() and cora.val_mask[140:640].all()
    test_ids = np.loadtxt(CORA / "ind.cora.test.index", dtype=np.int64)
    assert torch.equal(cora.test_mask.nonzero().flatten(), torch.from_numpy(np.sort(test_ids)))
    assert torch.bincount(cora.labels[cora.train_mask]).tolist() == [20] * 7
    # the same node order and labels as PyG's Planetoid("Cora")
    assert cora.labels[:10].tolist() == [3, 4, 4, 0, 3, 2, 0, 3, 3, 2]
    assert torch.bincount(cora.labels).tolist() == [351, 217, 418, 818, 426, 298, 180]
    assert cora.degrees().max() == 168 and cora.neighbors(0).tolist() == [633, 1862, 2582]
    assert (cora.labels >= 0).all()
    assert cora.features.dtype == torch.float32 and set(cora.features.unique().tolist()) == {0.0, 1.0}
    assert cora.indptr.dtype == cora.indices.dtype == torch.int64
    assert_clean_csr(cora)


@needs_cora
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # scipy.sparse.csr, named in the pickle
def test_cora_test_rows_follow_test_index_order(cora):
    """tx's i-th row belongs to node test.index[i] (not to the i-th smallest id)."""
    import pickle
    with open(CORA / "ind.cora.tx", "rb") as f:
        tx = pickle.load(f, encoding="latin1").toarray()
    test_ids = np.loadtxt(CORA / "ind.cora.test.index", dtype=np.int64)
    assert np.array_equal(cora.features[test_ids].numpy(), tx)


@needs_cora
def test_planetoid_spec_and_normalisation(cora):
    again = load(f"planetoid:{CORA}")
    assert_graphs_equal(cora, again)
    normed = normalize_features(cora)
    assert torch.allclose(normed.features.sum(1), torch.ones(cora.num_nodes))
    assert cora.features.max() == 1.0  # the original is untouched


def test_planetoid_with_citeseer_style_gap(tmp_path):
    """Test ids with holes (CiteSeer): the gap nodes get zero features, label -1, no split."""
    sp = pytest.importorskip("scipy.sparse")
    import pickle
    ally = np.array([[1, 0], [0, 1], [1, 0]], np.int32)
    allx = sp.csr_matrix(np.ones((3, 3), np.float32))
    parts = {"x": allx[:2], "y": ally[:2], "allx": allx, "ally": ally,
             "tx": sp.csr_matrix(np.array([[2, 0, 0], [3, 0, 0]], np.float32)),
             "ty": np.array([[0, 1], [1, 0]], np.int32),
             "graph": {0: [1, 5], 1: [0], 2: [], 3: [], 4: [], 5: [0, 5]}}
    for k, v in parts.items():
        with open(tmp_path / f"ind.toy.{k}", "wb") as f:
            pickle.dump(v, f)
    (tmp_path / "ind.toy.test.index").write_text("5\n3\n")  # tx row 0 is node 5; node 4 is the gap
    g = load_planetoid(tmp_path)
    assert g.num_nodes == 6 and g.num_edges == 2 and g.num_classes == 2
    assert g.features[:, 0].tolist() == [1, 1, 1, 3, 0, 2]
    assert g.labels.tolist() == [0, 1, 0, 0, -1, 1]
    assert g.train_mask.nonzero().flatten().tolist() == [0, 1]
    assert g.val_mask.nonzero().flatten().tolist() == [2]  # range(len(y), len(y) + 500) within allx
    assert g.test_mask.nonzero().flatten().tolist() == [3, 5]


def test_planetoid_refuses_code_in_pickles(tmp_path):
    import pickle

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))
    with open(tmp_path / "ind.bad.x", "wb") as f:
        pickle.dump(Evil(), f)
    with pytest.raises(pickle.UnpicklingError, match="builtins.print"):
        load_planetoid(tmp_path, "bad")


def test_load_rejects_unknown_specs_listing_the_forms():
    with pytest.raises(ValueError, match="'cora', 'planetoid:DIR', 'npz:PATH', 'synthetic-graph' or 'synthetic-graph:NODES'"):
        load("reddit")
    with pytest.raises(ValueError, match="unknown graph"):
        load("npz:")


def test_het_shared_overrides_the_shared_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HET_SHARED", str(tmp_path))
    assert default_shared_dir() == tmp_path
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "data" / "cora")):
        load("cora")


# --- Graph validation and the on-disk format ----------------------------------------------------

def tiny(**changes) -> Graph:
    fields = dict(indptr=torch.tensor([0, 1, 3, 4]), indices=torch.tensor([1, 0, 2, 1]), features=None,
                  labels=torch.tensor([0, 1, 0]), train_mask=torch.tensor([True, False, False]),
                  val_mask=torch.tensor([False, True, False]), test_mask=torch.tensor([False, False, True]),
                  num_classes=2)
    return Graph(**{**fields, **changes})


@pytest.mark.parametrize("changes, message", [
    (dict(indices=torch.tensor([1, 0, 2, 2])), "self loops"),
    (dict(indptr=torch.tensor([0, 2, 3, 4]), indices=torch.tensor([1, 1, 0, 1])), "duplicates"),
    (dict(indptr=torch.tensor([0, 1, 2, 2]), indices=torch.tensor([1, 2])), "symmetric"),
    (dict(indices=torch.tensor([1, 0, 3, 1])), "must lie in 0 .. 2"),
    (dict(indptr=torch.tensor([0, 1, 3, 5])), "end at len"),
    (dict(labels=torch.tensor([0, 2, 0])), "labels must lie in -1 .. 1"),
    (dict(labels=torch.tensor([-1, 1, 0])), "train_mask holds unlabelled node 0"),
    (dict(val_mask=torch.tensor([True, True, False])), "disjoint"),
    (dict(test_mask=torch.tensor([False, True])), r"test_mask must have shape \(3,\)"),
    (dict(features=torch.zeros(2, 4)), r"features must have shape \(3, F\)"),
    (dict(indices=torch.tensor([1.0, 0, 2, 1])), "indices must hold integers"),
])
def test_graph_rejects_invalid_parts(changes, message):
    with pytest.raises(ValueError, match=message):
        tiny(**changes)


def test_npz_round_trip(tmp_path, power_law):
    path = tmp_path / "g.npz"
    save_npz(power_law, path)
    assert_graphs_equal(power_law, load_npz(path))
    assert_graphs_equal(power_law, load(f"npz:{path}"))
    bare = tiny()  # no features
    save_npz(bare, tmp_path / "bare.npz")
    assert_graphs_equal(bare, load_npz(tmp_path / "bare.npz"))


def test_npz_edge_index_form_written_by_hand(tmp_path):
    """The form users convert Reddit / ogbn-mag into: an edge list, labels, no masks."""
    edges = np.array([[0, 1, 1, 3, 2], [1, 0, 2, 3, 4]])
    labels = np.array([0, 1, 1, 0, -1, 1, 0, 1, 0, 1])
    np.savez(tmp_path / "g.npz", edge_index=edges, labels=labels, features=np.ones((10, 2)))
    g = load_npz(tmp_path / "g.npz")
    assert g.num_nodes == 10 and g.num_edges == 3 and g.num_classes == 2
    assert g.neighbors(1).tolist() == [0, 2] and g.neighbors(3).tolist() == []
    assert_clean_csr(g)
    masks = torch.stack([g.train_mask, g.val_mask, g.test_mask]).long()
    assert masks.sum(0).max() == 1 and masks.sum().item() == 9 and not masks[:, 4].any()
    np.savez(tmp_path / "v2.npz", format_version=2, edge_index=edges)
    with pytest.raises(ValueError, match="format_version 2"):
        load_npz(tmp_path / "v2.npz")


# --- the edge-list converter -------------------------------------------------------------------

def test_edge_list_converter(tmp_path):
    (tmp_path / "edges.txt").write_text(
        "# a toy graph\n"
        "0 1\n"
        "1 0\n"          # the reverse of an edge already given
        "1\t2   # tab-separated, trailing comment\n"
        "\n"
        "2 2\n"          # a self loop
        "0 1\n"          # a duplicate
        "3 0\n")
    (tmp_path / "labels.txt").write_text("0\n1\n1\n0\n0\n")  # node 4 is isolated
    g = convert_edge_list(tmp_path / "edges.txt", tmp_path / "g.npz", labels=tmp_path / "labels.txt",
                          split=(0.6, 0.2, 0.2), seed=1)
    assert g.indptr.tolist() == [0, 2, 4, 5, 6, 6]
    assert g.indices.tolist() == [1, 3, 0, 2, 1, 0]
    assert g.num_edges == 3 and g.labels.tolist() == [0, 1, 1, 0, 0]
    assert [int(m.sum()) for m in (g.train_mask, g.val_mask, g.test_mask)] == [3, 1, 1]
    assert_graphs_equal(g, load_npz(tmp_path / "g.npz"))
    again = read_edge_list(tmp_path / "edges.txt", labels=tmp_path / "labels.txt",
                           split=(0.6, 0.2, 0.2), seed=1)
    assert_graphs_equal(g, again)


def test_edge_list_node_label_pairs_and_num_nodes(tmp_path):
    (tmp_path / "e.txt").write_text("0 1\n")
    (tmp_path / "l.txt").write_text("# node label\n5 1\n0 0\n")
    g = read_edge_list(tmp_path / "e.txt", num_nodes=8, labels=tmp_path / "l.txt", split=(1.0, 0.0, 0.0))
    assert g.num_nodes == 8 and g.labels.tolist() == [0, -1, -1, -1, -1, 1, -1, -1]
    assert g.train_mask.nonzero().flatten().tolist() == [0, 5]
    with pytest.raises(ValueError, match="num_nodes=1 but the inputs mention 2 nodes"):
        read_edge_list(tmp_path / "e.txt", num_nodes=1)


@pytest.mark.parametrize("bad", ["3 x", "3", "1 2 3", "-1 2", "1.5 2"])
def test_edge_list_bad_line_is_named(tmp_path, bad):
    (tmp_path / "e.txt").write_text(f"# header\n0 1\n\n{bad}\n2 3\n")
    with pytest.raises(ValueError, match="line 4: expected two non-negative integer node ids"):
        read_edge_list(tmp_path / "e.txt")


def test_csr_from_edges_matches_a_python_reference():
    rng = np.random.default_rng(0)
    src, dst = rng.integers(0, 30, 200), rng.integers(0, 30, 200)
    indptr, indices = csr_from_edges(src, dst, 30)
    expected = [sorted({int(d) for s, d in zip(src, dst) if s == v and d != v}
                       | {int(s) for s, d in zip(src, dst) if d == v and s != v}) for v in range(30)]
    assert [indices[indptr[v]:indptr[v + 1]].tolist() for v in range(30)] == expected


# --- the synthetic power-law graph -------------------------------------------------------------

def test_synthetic_power_law_shape_degrees_and_homophily(power_law):
    g = power_law
    assert g.num_nodes == 20_000 and g.num_classes == 8 and g.features.shape == (20_000, 32)
    assert_clean_csr(g)
    deg = g.degrees().double()
    assert abs(deg.mean().item() - 10.0) <= 1.5
    assert deg.max() >= 20 * deg.mean()              # heavy tail: hubs
    assert deg.median() < deg.mean()                 # most nodes below the mean
    top = deg.sort(descending=True).values
    assert top[:2000].sum() / top.sum() > 0.3        # the top 10% of nodes hold > 30% of the edges
    src, dst = g.edges()
    assert abs((g.labels[src] == g.labels[dst]).double().mean().item() - 0.8) < 0.05
    assert [int(m.sum()) for m in (g.train_mask, g.val_mask, g.test_mask)] == [12_000, 4_000, 4_000]


def test_synthetic_features_separate_classes(power_law):
    g = power_law
    x, y = g.features, g.labels
    centroids = torch.stack([x[g.train_mask & (y == c)].mean(0) for c in range(g.num_classes)])
    predicted = torch.cdist(x[g.test_mask], centroids).argmin(1)
    assert (predicted == y[g.test_mask]).double().mean() > 0.5  # chance is 1/8


@pytest.mark.parametrize("homophily", [0.0, 0.5, 1.0])
def test_synthetic_homophily_is_what_was_asked(homophily):
    g = synthetic_power_law(3000, 6.0, 4, 0, homophily=homophily, seed=1)
    src, dst = g.edges()
    assert g.features is None
    assert abs((g.labels[src] == g.labels[dst]).double().mean().item() - homophily) < 0.05


def test_synthetic_is_deterministic_by_seed():
    a, b = (synthetic_power_law(2000, 8.0, 4, 8, seed=5) for _ in range(2))
    assert_graphs_equal(a, b)
    c = synthetic_power_law(2000, 8.0, 4, 8, seed=6)
    assert not torch.equal(a.labels, c.labels) and not torch.equal(a.features, c.features)


@pytest.mark.parametrize("kwargs, message", [
    (dict(exponent=2.0), "exponent must be > 2"),
    (dict(homophily=1.5), "homophily"),
    (dict(mean_degree=0), "mean_degree"),
    (dict(num_classes=0), "num_classes"),
])
def test_synthetic_rejects_bad_parameters(kwargs, message):
    args = {**dict(num_nodes=100, mean_degree=4.0, num_classes=3, feature_dim=2), **kwargs}
    with pytest.raises(ValueError, match=message):
        synthetic_power_law(**args)


# --- the neighbour sampler ---------------------------------------------------------------------

def check_blocks(g: Graph, blocks, seeds: torch.Tensor, fanouts) -> None:
    """Every sampled edge is real; degree = min(fanout, degree); no repeats; prefix; chaining."""
    assert len(blocks) == len(fanouts)
    assert torch.equal(blocks.output_nodes, seeds)
    assert torch.equal(blocks.input_nodes, blocks[0].src_nodes)
    for layer, block in enumerate(blocks):
        fanout = fanouts[len(fanouts) - 1 - layer]  # fanouts run from the seeds outwards
        src, dst = block.src_nodes[block.edge_src], block.dst_nodes[block.edge_dst]
        assert len(torch.unique(block.src_nodes)) == block.num_src        # src nodes distinct
        assert torch.isin(dst * g.num_nodes + src,                         # every edge is real
                          g.edges()[0] * g.num_nodes + g.edges()[1]).all()
        degrees = g.degrees()[block.dst_nodes]
        expected = degrees.clamp(max=fanout) if fanout > 0 else degrees
        assert torch.equal(block.in_degrees(), expected)
        pairs = block.edge_dst * block.num_src + block.edge_src
        assert len(torch.unique(pairs)) == len(pairs)                      # no repeated neighbour
        # every src node beyond the dst prefix is someone's neighbour
        assert torch.equal(torch.unique(block.edge_src[block.edge_src >= block.dst_count]),
                           torch.arange(block.dst_count, block.num_src))
        if layer + 1 < len(blocks):
            assert torch.equal(block.dst_nodes, blocks[layer + 1].src_nodes)  # blocks chain


@pytest.mark.parametrize("fanouts", [(10, 5), (3,), (2, 2, 2), (-1, 4)])
def test_sampler_blocks_are_valid(power_law, fanouts):
    seeds = torch.randperm(power_law.num_nodes, generator=torch.Generator().manual_seed(0))[:256]
    blocks = NeighborSampler(power_law, fanouts, seed=1).sample(seeds)
    check_blocks(power_law, blocks, seeds, fanouts)


@needs_cora
def test_sampler_on_cora_including_hubs(cora):
    hubs = cora.degrees().argsort(descending=True)[:20]
    seeds = torch.cat([hubs, torch.tensor([v for v in range(100, 120) if v not in hubs.tolist()])])
    check_blocks(cora, NeighborSampler(cora, (10, 5)).sample(seeds), seeds, (10, 5))


def test_sampler_handles_isolated_seeds():
    g = tiny(indptr=torch.tensor([0, 1, 2, 2]), indices=torch.tensor([1, 0]))  # node 2 isolated
    blocks = NeighborSampler(g, (10, 5)).sample(torch.tensor([2, 0]))
    check_blocks(g, blocks, torch.tensor([2, 0]), (10, 5))
    assert blocks[-1].in_degrees().tolist() == [0, 1]
    assert blocks.input_nodes.tolist() == [2, 0, 1]
    empty = NeighborSampler(g, (2,)).sample(torch.tensor([2]))
    assert empty[0].num_src == 1 and len(empty[0].edge_src) == 0


def test_sampler_is_uniform_without_replacement():
    """Taking 2 of a hub's 6 neighbours: each of the 15 pairs about equally often."""
    n = 7
    g = tiny(indptr=torch.tensor([0, 6, 7, 8, 9, 10, 11, 12]),
             indices=torch.tensor([1, 2, 3, 4, 5, 6, 0, 0, 0, 0, 0, 0]),
             labels=torch.zeros(n, dtype=torch.long), train_mask=torch.zeros(n, dtype=torch.bool),
             val_mask=torch.zeros(n, dtype=torch.bool), test_mask=torch.zeros(n, dtype=torch.bool))
    sampler = NeighborSampler(g, (2,), seed=0)
    counts = {}
    for _ in range(3000):
        block = sampler.sample(torch.tensor([0]))[0]
        pair = tuple(sorted(block.src_nodes[block.edge_src].tolist()))
        counts[pair] = counts.get(pair, 0) + 1
    assert len(counts) == 15 and min(counts.values()) > 140 and max(counts.values()) < 260  # mean 200


def test_sampler_rejects_bad_seeds_and_fanouts(power_law):
    sampler = NeighborSampler(power_law, (2,))
    with pytest.raises(ValueError, match="distinct"):
        sampler.sample(torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="seeds must lie in 0 .. 19999"):
        sampler.sample(torch.tensor([20_000]))
    with pytest.raises(ValueError, match="integer"):
        sampler.sample(torch.tensor([1.0]))
    with pytest.raises(ValueError, match="fanouts"):
        NeighborSampler(power_law, (10, 0))


def test_access_trace(power_law):
    sampler = NeighborSampler(power_law, (10, 5))
    trace = sampler.access_trace(batch_size=1000, num_batches=15, seed=2)  # 12 batches an epoch
    assert len(trace) == 15 and all(t.dtype == torch.int64 and t.dim() == 1 for t in trace)
    assert all(len(t) >= 1000 and len(torch.unique(t)) == len(t) for t in trace[:12])
    assert all(len(torch.unique(t)) == len(t) for t in trace)
    train = power_law.train_mask.nonzero().flatten()
    seeds = torch.cat([t[:1000] for t in trace[:12]])  # the seeds lead each batch's inputs
    assert torch.equal(seeds.sort().values, train)     # one epoch covers the train nodes once
    again = NeighborSampler(power_law, (10, 5), seed=99).access_trace(1000, 15, seed=2)
    assert all(torch.equal(a, b) for a, b in zip(trace, again))
