"""Planetoid-like synthetic graphs as npz files, for GraphSAGE's defaults beyond Cora
(docs/RESULTS.md, "GraphSAGE on Cora"): a Chung-Lu power-law graph (het.data.synthetic_graph),
bag-of-words binary features (class topic words and background words), and Planetoid's split:
20 training nodes per class, 500 validation, 1,000 test.

    python docs/scripts/planetoid_like_graphs.py OUT_DIR
    het train --model graphsage --data npz:OUT_DIR/citeseer_like.npz --workers 1 --seed 0 --json
"""
import os
import sys

import numpy as np
import torch

from het.data.graph import Graph, save_npz, synthetic_power_law


def make(path, nodes, classes, degree, homophily, vocab=500, words=20, topic=0.25, seed=0):
    g = synthetic_power_law(nodes, degree, classes, 0, homophily=homophily, seed=seed)
    rng = np.random.default_rng(seed + 1)
    labels = g.labels.numpy()
    per_class = vocab // (2 * classes)  # half the vocabulary is class topic words
    topic_words = rng.permutation(vocab)[: per_class * classes].reshape(classes, per_class)
    x = np.zeros((nodes, vocab), np.float32)
    for i in range(nodes):
        from_topic = rng.random(words) < topic
        w = np.where(from_topic, topic_words[labels[i], rng.integers(0, per_class, words)], rng.integers(0, vocab, words))
        x[i, w] = 1.0
    order = rng.permutation(nodes)
    train = np.concatenate([order[labels[order] == c][:20] for c in range(classes)])
    rest = order[~np.isin(order, train)]
    masks = []
    for sel in (train, rest[:500], rest[500:1500]):
        m = torch.zeros(nodes, dtype=torch.bool); m[torch.from_numpy(sel)] = True; masks.append(m)
    save_npz(Graph(g.indptr, g.indices, torch.from_numpy(x), g.labels, *masks, num_classes=classes), path)
    print(path, nodes, g.num_edges, classes)


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(out, exist_ok=True)
    # CiteSeer-like: 6 classes, ~3.3k nodes, low degree, lower homophily
    make(os.path.join(out, "citeseer_like.npz"), 3327, 6, 2.8, 0.74)
    # PubMed-like: 3 classes, more nodes (8k, not PubMed's 19.7k, to keep runs short), degree 4.5
    make(os.path.join(out, "pubmed_like.npz"), 8000, 3, 4.5, 0.80)
