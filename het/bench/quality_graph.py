"""`het bench quality GRAPH`: het's GraphSAGE beside the models people compare node classifiers
with, on the graph's own split (Planetoid's: 20 labelled nodes a class, 500 for validation, 1,000
for test), each tuned on validation accuracy only; test nodes score once, after the choice.

- ``het``: ``het train --model graphsage --data GRAPH``, its kept model (the validation best);
  grid over the dropouts, the aggregator, the weight decay and the width.
- ``logreg``: scikit-learn's LogisticRegression on the node features alone (no graph); grid
  over C.
- ``sgc``: the same on the features propagated twice over the graph with self loops,
  ``(D^-1/2 (A + I) D^-1/2)^2 X`` (SGC, Wu et al. 2019: GCN's accuracy on citation graphs from a
  linear model); grid over C.

Features are row-normalised, as het's GraphSAGE and GCN read them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time

import numpy as np

GRIDS = {
    "het": [{}, {"graph-dropout": 0.5, "graph-embedding-dropout": 0.5}, {"graph-aggregator": "mean", "weight-decay": 0},
            {"weight-decay": 1e-3}, {"graph-hidden": 64}],
    # row-normalised features are small: the inverse penalty C reaches higher than on raw ones
    "logreg": [{"C": 1.0}, {"C": 10.0}, {"C": 100.0}, {"C": 1000.0}, {"C": 0.1}],
    "sgc": [{"C": 1.0}, {"C": 10.0}, {"C": 100.0}, {"C": 1000.0}, {"C": 0.1}],
}
SPLITS = ("train", "val", "test")


class GraphSplit:
    """A graph's features (row-normalised), propagated features, labels and split masks."""

    def __init__(self, spec: str):
        from scipy import sparse

        from het.data.graph import load, normalize_features

        g = normalize_features(load(spec))
        self.features = g.features.numpy()
        self.labels = g.labels.numpy()
        self.masks = {p: m.numpy() for p, m in zip(SPLITS, (g.train_mask, g.val_mask, g.test_mask))}
        n = g.num_nodes
        adj = sparse.csr_matrix((np.ones(len(g.indices)), g.indices.numpy(), g.indptr.numpy()), shape=(n, n))
        adj = adj + sparse.identity(n, format="csr")
        scale = sparse.diags(1 / np.sqrt(np.asarray(adj.sum(1)).ravel()))
        norm = scale @ adj @ scale
        self.propagated = np.asarray(norm @ (norm @ self.features))
        self.rows = {p: int(m.sum()) for p, m in self.masks.items()}


def _accuracy(model, x: np.ndarray, split: GraphSplit) -> dict:
    return {p: {"acc": float((model.predict(x[split.masks[p]]) == split.labels[split.masks[p]]).mean())}
            for p in ("val", "test")}


def run_logreg(split: GraphSplit, point: dict, seed: int, x: np.ndarray | None = None) -> dict:
    from sklearn.linear_model import LogisticRegression

    x = split.features if x is None else x
    train = split.masks["train"]
    model = LogisticRegression(C=point["C"], max_iter=3000, random_state=seed).fit(x[train], split.labels[train])
    return _accuracy(model, x, split)


def run_sgc(split: GraphSplit, point: dict, seed: int) -> dict:
    return run_logreg(split, point, seed, split.propagated)


def run_het(spec: str, point: dict, seed: int, extra: list[str]) -> dict:
    flags = [f"--{k}={v}" for k, v in point.items()]
    with tempfile.TemporaryDirectory(prefix="het-quality-") as logs:
        out = subprocess.run([sys.executable, "-m", "het", "train", "--model", "graphsage", "--data", spec,
                              "--seed", str(seed), "--json", "--quiet", "--log-dir", logs, *flags, *extra],
                             capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"het train failed: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
    s = json.loads(out.stdout.strip().splitlines()[-1])
    return {"val": {"acc": s["validation"]["val_acc"]}, "test": {"acc": s["test_acc"]},
            "best_step": s["validation"]["best_step"], "steps": s["steps"]}


def run(spec: str, models: list[str], seeds: int, grid: int, extra: list[str], progress: bool = True) -> dict:
    """Every model's grid, every seed; the point of best mean validation accuracy, and the default's."""
    split = GraphSplit(spec)
    out = {"data": spec, "rows": split.rows, "seeds": seeds, "grid": grid, "metric": "accuracy", "models": {},
           "skipped": {}}
    for name in models:
        points = []
        for point in GRIDS[name][:grid]:
            start = time.perf_counter()
            runs = [run_het(spec, point, seed, extra) if name == "het" else globals()[f"run_{name}"](split, point, seed)
                    for seed in range(seeds)]
            test = [r["test"]["acc"] for r in runs]
            points.append({"point": point, "runs": runs, "seconds": time.perf_counter() - start,
                           "val_acc": float(np.mean([r["val"]["acc"] for r in runs])),
                           "test_acc": float(np.mean(test)), "test_acc_std": float(np.std(test))})
            if progress:
                print(f"quality: {name} {point}: val acc {points[-1]['val_acc']:.4f}, test acc "
                      f"{points[-1]['test_acc']:.4f} +- {points[-1]['test_acc_std']:.4f}", file=sys.stderr, flush=True)
        chosen = max(points, key=lambda p: p["val_acc"])  # the first of equals: the default wins a tie
        out["models"][name] = {"chosen": chosen, "default": points[0], "points": points}
    return out


def table(result: dict) -> str:
    """The result as a Markdown table: each model's chosen point and its default's."""
    lines = ["| model | chosen on validation | val acc | test acc (mean +- sd) | default's test acc |",
             "|---|---|---|---|---|"]
    for name, m in result["models"].items():
        c, d = m["chosen"], m["default"]
        lines.append(f"| {name} | {c['point'] or 'defaults'} | {c['val_acc']:.4f} | {c['test_acc']:.4f} +- "
                     f"{c['test_acc_std']:.4f} | {d['test_acc']:.4f} +- {d['test_acc_std']:.4f} |")
    return "\n".join(lines)
