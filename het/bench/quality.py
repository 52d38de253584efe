"""`het bench quality DIR`: het's models beside the tools people compare them with, on one
prepared table and one split, each tuned on validation only.

The split is het's own: the prepared directory's test rows, and the validation rows
:class:`het.data.validation.ValidatedTable` carves from its training rows (``--val-frac``, the
split's seed 0, as ``het train`` does). Every model sees the same rows, the same dense columns
(as prepared: the transforms fitted on the training rows) and the same categorical columns
(each field's hashed keys, numbered 0..n-1 for the peers).

Each model has a grid of the same size (``--grid``, its first points; the first is the
model's default); every point is trained with every seed; the point with the best mean
validation log loss is the model's, and its test AUC over the seeds (mean, spread) is
reported, beside the default point's. Test rows are scored once training and selection are
over, and choose nothing. Peers that are not installed (lightgbm, deepctr-torch: benchmark
extras, ``pip install 'het[bench]'``) are left out, said in ``skipped``.

- ``het``: ``het train --model deepfm`` (or ``--het-model``), its kept model (validation
  every half epoch, the best by log loss); grid over the sparse and dense learning rates.
- ``logreg``: scikit-learn's LogisticRegression on one-hot fields and the dense columns;
  grid over C.
- ``lightgbm``: LightGBM with categorical features, early stopping on validation; grid over
  leaves and learning rate.
- ``deepctr``: DeepCTR-torch's DeepFM (Adam, batch 256), the validation-best epoch; grid
  over the embedding width and its L2.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from het.data.prepared import PreparedDataset
from het.data.validation import ValidatedTable

GRIDS = {
    "het": [{}, {"dim": 32}, {"dense-lr": 0.003}, {"lr": 0.003}, {"lr": 0.05}],
    "logreg": [{"C": 1.0}, {"C": 0.1}, {"C": 10.0}, {"C": 0.01}, {"C": 100.0}],
    "lightgbm": [{"num_leaves": 31, "learning_rate": 0.05}, {"num_leaves": 15, "learning_rate": 0.05},
                 {"num_leaves": 63, "learning_rate": 0.05}, {"num_leaves": 31, "learning_rate": 0.1},
                 {"num_leaves": 127, "learning_rate": 0.02}],
    "deepctr": [{"dim": 8, "l2": 1e-5}, {"dim": 32, "l2": 1e-5}, {"dim": 32, "l2": 1e-3}, {"dim": 16, "l2": 1e-4},
                {"dim": 8, "l2": 1e-3}],
}


class Split:
    """The table's rows as every peer reads them: codes per field, dense columns, labels."""

    def __init__(self, directory: str, val_frac: float):
        data = PreparedDataset(directory)
        table = ValidatedTable(data, val_frac, seed=0)  # the validation rows het train's jobs use
        parts = {"train": data.take("train", table.train_rows), "val": data.take("train", table.val_rows),
                 "test": data.take("test", np.arange(data.rows["test"]))}
        keys = np.concatenate([parts[p].sparse.numpy() for p in parts])
        codes = np.empty_like(keys)
        self.cardinalities = []
        for j in range(keys.shape[1]):  # hashed keys -> 0..n-1 per field (unseen ids of test included)
            _, codes[:, j] = np.unique(keys[:, j], return_inverse=True)
            self.cardinalities.append(int(codes[:, j].max()) + 1)
        sizes = np.cumsum([0] + [len(parts[p].labels) for p in parts])
        self.sparse = {p: codes[sizes[i]:sizes[i + 1]] for i, p in enumerate(parts)}
        self.dense = {p: parts[p].dense.numpy() for p in parts}
        self.labels = {p: parts[p].labels.numpy() for p in parts}
        self.rows = {p: len(self.labels[p]) for p in parts}


def _metrics(y: np.ndarray, p: np.ndarray) -> dict:
    from sklearn.metrics import log_loss, roc_auc_score  # here: sklearn costs every het command's start 1.4 s

    return {"auc": float(roc_auc_score(y, p)), "logloss": float(log_loss(y, np.clip(p, 1e-7, 1 - 1e-7)))}


def run_logreg(split: Split, point: dict, seed: int) -> dict:
    from scipy import sparse
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import OneHotEncoder

    enc = OneHotEncoder(handle_unknown="ignore").fit(split.sparse["train"])
    x = {p: sparse.hstack([enc.transform(split.sparse[p]), sparse.csr_matrix(split.dense[p])]).tocsr()
         for p in split.sparse}
    model = LogisticRegression(C=point["C"], max_iter=2000, random_state=seed).fit(x["train"], split.labels["train"])
    return {p: _metrics(split.labels[p], model.predict_proba(x[p])[:, 1]) for p in ("val", "test")}


def run_lightgbm(split: Split, point: dict, seed: int) -> dict:
    import lightgbm as lgb

    x = {p: np.hstack([split.sparse[p], split.dense[p]]) for p in split.sparse}
    fields = list(range(split.sparse["train"].shape[1]))
    model = lgb.LGBMClassifier(n_estimators=5000, subsample=0.8, subsample_freq=1, colsample_bytree=0.8,
                               random_state=seed, verbose=-1, **point)
    model.fit(x["train"], split.labels["train"], eval_set=[(x["val"], split.labels["val"])],
              categorical_feature=fields, callbacks=[lgb.early_stopping(100, verbose=False)])
    return {p: _metrics(split.labels[p], model.predict_proba(x[p])[:, 1]) for p in ("val", "test")}


def run_deepctr(split: Split, point: dict, seed: int, max_epochs: int = 30, patience: int = 3) -> dict:
    import torch
    from deepctr_torch.inputs import DenseFeat, SparseFeat
    from deepctr_torch.models import DeepFM

    torch.manual_seed(seed)
    nf, nd = split.sparse["train"].shape[1], split.dense["train"].shape[1]
    columns = ([SparseFeat(f"C{j}", split.cardinalities[j], embedding_dim=point["dim"]) for j in range(nf)]
               + [DenseFeat(f"I{j}", 1) for j in range(nd)])
    with contextlib.redirect_stdout(io.StringIO()):
        model = DeepFM(columns, columns, l2_reg_embedding=point["l2"], seed=seed, device="cpu")
    model.compile("adam", "binary_crossentropy")
    quiet = contextlib.redirect_stdout(io.StringIO())  # DeepCTR prints its progress to stdout
    x = {p: {**{f"C{j}": split.sparse[p][:, j] for j in range(nf)}, **{f"I{j}": split.dense[p][:, j] for j in range(nd)}}
         for p in split.sparse}
    best, best_state, since = math.inf, None, 0
    for _ in range(max_epochs):  # the validation-best epoch, as early stopping with restored weights
        with quiet:
            model.fit(x["train"], split.labels["train"], batch_size=256, epochs=1, verbose=0)
        loss = _metrics(split.labels["val"], model.predict(x["val"], 4096).ravel())["logloss"]
        if loss < best:
            best, best_state, since = loss, {k: v.clone() for k, v in model.state_dict().items()}, 0
        else:
            since += 1
            if since >= patience:
                break
    model.load_state_dict(best_state)
    return {p: _metrics(split.labels[p], model.predict(x[p], 4096).ravel()) for p in ("val", "test")}


def run_het(directory: str, point: dict, seed: int, model: str, val_frac: float, extra: list[str]) -> dict:
    flags = [f"--{k}={v}" for k, v in point.items()]
    with tempfile.TemporaryDirectory(prefix="het-quality-") as logs:
        out = subprocess.run([sys.executable, "-m", "het", "train", "--model", model, "--data", f"table:{directory}",
                              "--seed", str(seed), "--val-frac", str(val_frac), "--json", "--quiet",
                              "--log-dir", logs, *flags, *extra], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"het train failed: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
    s = json.loads(out.stdout.strip().splitlines()[-1])
    v = s["validation"]
    return {"val": {"auc": v["val_auc"], "logloss": v["val_logloss"]}, "test": {"auc": s["auc"], "logloss": s["logloss"]},
            "best_step": s["best_step"], "steps": s["steps"]}


def _available(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec({"lightgbm": "lightgbm", "deepctr": "deepctr_torch"}.get(name, "sklearn")) is not None


def run(directory: str, models: list[str], seeds: int, grid: int, val_frac: float, het_model: str,
        het_extra: list[str], progress: bool = True) -> dict:
    """Every model's grid, every seed; the selected and the default points' figures."""
    split = Split(directory, val_frac)
    out = {"data": os.path.abspath(directory), "rows": split.rows, "seeds": seeds, "grid": grid,
           "val_frac": val_frac, "models": {}, "skipped": {}}
    for name in models:
        if not _available(name):
            out["skipped"][name] = "not installed (pip install 'het[bench]')"
            continue
        points = []
        for point in GRIDS[name][:grid]:
            runs, start = [], time.perf_counter()
            for seed in range(seeds):
                if name == "het":
                    runs.append(run_het(directory, point, seed, het_model, val_frac, het_extra))
                else:
                    runs.append(globals()[f"run_{name}"](split, point, seed))
            points.append({"point": point, "runs": runs, "seconds": time.perf_counter() - start,
                           **_summary(runs)})
            if progress:
                print(f"quality: {name} {point}: val logloss {points[-1]['val_logloss']:.4f}, "
                      f"test auc {points[-1]['test_auc']:.4f} +- {points[-1]['test_auc_std']:.4f}",
                      file=sys.stderr, flush=True)
        chosen = min(points, key=lambda p: p["val_logloss"])
        out["models"][name] = {"chosen": chosen, "default": points[0], "points": points}
    return out


def _summary(runs: list[dict]) -> dict:
    val = [r["val"]["logloss"] for r in runs]
    auc = [r["test"]["auc"] for r in runs]
    return {"val_logloss": float(np.mean(val)), "val_auc": float(np.mean([r["val"]["auc"] for r in runs])),
            "test_auc": float(np.mean(auc)), "test_auc_std": float(np.std(auc)),
            "test_logloss": float(np.mean([r["test"]["logloss"] for r in runs]))}


def table(result: dict) -> str:
    """The result as a Markdown table: each model's chosen point and its default's."""
    lines = ["| model | chosen on validation | test AUC (mean +- sd) | default's test AUC |", "|---|---|---|---|"]
    for name, m in result["models"].items():
        c, d = m["chosen"], m["default"]
        lines.append(f"| {name} | {c['point'] or 'defaults'} | {c['test_auc']:.4f} +- {c['test_auc_std']:.4f} | "
                     f"{d['test_auc']:.4f} +- {d['test_auc_std']:.4f} |")
    return "\n".join(lines)


def plot(result: dict, path: str) -> None:
    """Each model's test AUC (mean and spread over the seeds), at its chosen point and its
    default's, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["models"])
    metric = "acc" if result.get("metric") == "accuracy" else "auc"
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for k, (which, color) in enumerate((("default", "#bbbbbb"), ("chosen", "#3366aa"))):
        means = [result["models"][n][which][f"test_{metric}"] for n in names]
        spreads = [result["models"][n][which][f"test_{metric}_std"] for n in names]
        ax.bar([i + 0.38 * k for i in range(len(names))], means, 0.36, yerr=spreads, color=color,
               label="defaults" if which == "default" else "chosen on validation", capsize=3)
    values = [result["models"][n][w][f"test_{metric}"] for n in names for w in ("default", "chosen")]
    ax.set_ylim(min(values) - 0.01 * (1 + 4 * (metric == "acc")), max(values) + 0.012 * (1 + 4 * (metric == "acc")))
    ax.set_xticks([i + 0.19 for i in range(len(names))], names)
    ax.set_ylabel("test accuracy" if metric == "acc" else "test AUC")
    ax.set_title(f"{os.path.basename(result['data'].rstrip('/'))}: {result['seeds']} seeds, grid of {result['grid']}")
    ax.legend(loc="upper left", fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def add_parser(bsub) -> None:
    p = bsub.add_parser("quality", help="het's model beside logistic regression, LightGBM and DeepCTR-torch's "
                        "DeepFM on one prepared table (or GraphSAGE beside logistic regression and SGC on a "
                        "graph), each tuned on validation")
    p.add_argument("data", help="a directory of `het data prepare table`, or a graph (cora, planetoid:DIR, npz:PATH)")
    p.add_argument("--models", default=None, help="comma-separated: het, logreg, lightgbm, deepctr (default: all); "
                   "on a graph het, logreg, sgc")
    p.add_argument("--seeds", type=int, default=3, help="seeds a grid point is trained with")
    p.add_argument("--grid", type=int, default=4, help=f"points of each model's grid (at most {len(GRIDS['het'])})")
    p.add_argument("--val-frac", type=float, default=0.1, help="the validation share of the training rows")
    p.add_argument("--het-model", default="deepfm", help="het train --model")
    p.add_argument("--het-args", default="", help="more het train flags, e.g. '--steps 2000'")
    p.add_argument("--plot", default=None, metavar="PNG", help="draw the test AUCs here")
    p.add_argument("--json", action="store_true", help="the last line of stdout is the result as JSON")
    p.set_defaults(func=cmd)


def cmd(args) -> dict:
    from het.bench import quality_graph

    graph = not os.path.isdir(args.data) and (args.data == "cora" or args.data.split(":")[0] in
                                               ("planetoid", "npz", "synthetic-graph"))
    grids = quality_graph.GRIDS if graph else GRIDS
    models = [m.strip() for m in (args.models or ",".join(grids)).split(",") if m.strip()]
    unknown = sorted(set(models) - set(grids))
    if unknown or not 1 <= args.grid <= len(grids["het"]) or args.seeds < 1:
        raise SystemExit(f"het bench quality: expected models among {sorted(grids)}, 1 <= --grid <= "
                         f"{len(grids['het'])} and --seeds >= 1, got {models}, {args.grid}, {args.seeds}")
    try:
        result = quality_graph.run(args.data, models, args.seeds, args.grid, args.het_args.split()) if graph else \
            run(args.data, models, args.seeds, args.grid, args.val_frac, args.het_model, args.het_args.split())
    except (ValueError, OSError, RuntimeError) as e:
        raise SystemExit(f"het bench quality: {e}") from None
    print(quality_graph.table(result) if graph else table(result))
    if args.plot:
        plot(result, args.plot)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    return result
