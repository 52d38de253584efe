"""``het bench stream``: training online on a drifting stream against a model frozen halfway.

Writes ``--partitions`` partitions of synthetic Criteo whose planted model turns ``--drift``
radians a partition (``het data stream-synthetic``), then:

- **online**: ``het train --stream`` over all of them, in order, one pass: each batch scored
  before it trains (progressive validation), per partition;
- **frozen**: ``het train --stream`` over the first ``--frozen-after`` partitions only, its
  checkpoint exported, and that model, trained no more, scoring every later partition.

Both on the same rows of the later partitions: what learning as the data lands is worth when the
world drifts (Monolith's case for syncing serving minutes behind the data). Also the planted
model's own AUC at each partition's angle: the ceiling.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch


def _train(pattern: str, logs: str, extra: list[str]) -> dict:
    out = subprocess.run([sys.executable, "-m", "het", "train", "--stream", pattern, "--stream-idle", "1", "--json",
                          "--quiet", "--log-dir", logs, *extra], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"het train failed: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _auc(labels: np.ndarray, scores: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score  # here: sklearn costs every het command's start 1.4 s

    return float(roc_auc_score(labels, scores))


def run(partitions: int, frozen_after: int, rows: int, drift: float, cap: int, seed: int, extra: list[str],
        directory: str | None = None, say=print) -> dict:
    """Both runs on the same stream; the AUC of each partition by each (see the module)."""
    import het
    from het.data.prepared import PreparedDataset
    from het.data.stream_synthetic import partition_name, write_stream
    from het.data.synthetic import SyntheticCriteo, SyntheticCriteoConfig
    from het.export.writer import export

    cfg = SyntheticCriteoConfig(cap=cap, seed=seed)
    with tempfile.TemporaryDirectory(prefix="het-bench-stream-") as tmp:
        out = directory or os.path.join(tmp, "parts")
        paths = write_stream(out, partitions, 0, rows, drift, cfg, say=lambda _: None)
        say(f"het bench stream: {partitions} partitions of {rows:,} rows in {out}; online ...")
        online = _train(os.path.join(out, "part-*"), os.path.join(tmp, "online"), extra)
        first = os.path.join(tmp, "first")  # the first partitions alone, as links
        os.makedirs(first)
        for p in paths[:frozen_after]:
            os.symlink(os.path.abspath(p), os.path.join(first, os.path.basename(p)))
        say(f"het bench stream: frozen after {frozen_after} partitions ...")
        ck, ex = os.path.join(tmp, "ck"), os.path.join(tmp, "export")
        frozen_run = _train(os.path.join(first, "part-*"), os.path.join(tmp, "frozen"), [*extra, "--checkpoint", ck])
        export(ck, ex, progress=False)
        model, data = het.load_model(ex), SyntheticCriteo(cfg)
        frozen, planted = [], []
        for p in range(partitions):
            batch = PreparedDataset(paths[p]).rows_between("train", 0, rows)
            labels = batch.labels.numpy()
            planted.append(_auc(labels, data.planted_logits(batch.sparse, batch.dense, p * drift)))
            if p >= frozen_after:
                with torch.no_grad():
                    frozen.append(_auc(labels, model.logits(batch.dense, batch.sparse).numpy()))
    by_part = {os.path.basename(p["partition"]): p["auc"] for p in online["stream"]["progressive"]["by_partition"]}
    online_auc = [by_part[partition_name(p)] for p in range(partitions)]
    later = online_auc[frozen_after:]
    return {"partitions": partitions, "frozen_after": frozen_after, "rows": rows, "drift": drift, "cap": cap,
            "online_auc": online_auc, "frozen_auc": frozen, "planted_auc": planted,
            "later": {"online": float(np.mean(later)), "frozen": float(np.mean(frozen)),
                      "online_wins": int(sum(o > f for o, f in zip(later, frozen))), "of": len(frozen)},
            "online_rows_trained": online["stream"]["rows_trained"],
            # the online job's table over the stream (--table-admit-after and --table-expire-after at work): rows by step
            "online_table": {"rows_by_step": [(e["step"], e["rows"]) for e in online.get("timeline", [])],
                             **{k: online["ps"].get(k, 0) for k in ("rows", "admitted", "expired", "refused_updates")}},
            "online_window": online["stream"]["progressive"]["window"],
            "frozen_rows_trained": frozen_run["stream"]["rows_trained"]}


def plot(result: dict, path: str) -> None:
    """The three curves by partition."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n, k = result["partitions"], result["frozen_after"]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(range(1, n + 1), result["planted_auc"], ":", color="grey", label="planted model (the ceiling)")
    ax.plot(range(1, n + 1), result["online_auc"], "o-", label="online: each batch scored, then trained")
    ax.plot(range(k + 1, n + 1), result["frozen_auc"], "s--", label=f"frozen after partition {k}")
    ax.axvline(k + 0.5, color="lightgrey")
    ax.set_xlabel(f"partition (the planted model turns {result['drift']} rad a partition)")
    ax.set_ylabel("AUC on the partition")
    ax.legend(loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def add_parser(bsub) -> None:
    p = bsub.add_parser("stream", help="online training on a drifting stream against a model frozen halfway")
    p.add_argument("--partitions", type=int, default=24, help="partitions of the stream (default 24)")
    p.add_argument("--frozen-after", type=int, default=12, help="partitions the frozen model trains on (default 12)")
    p.add_argument("--rows", type=int, default=20_000, help="rows a partition (default 20,000)")
    p.add_argument("--drift", type=float, default=0.05, help="radians the planted model turns a partition")
    p.add_argument("--cap", type=int, default=100_000, help="every field's cardinality at most this")
    p.add_argument("--seed", type=int, default=0, help="the data's seed")
    p.add_argument("--dir", default=None, help="write the partitions here (default: a temporary directory)")
    p.add_argument("--het-args", default="", help="more het train flags for both runs, e.g. '--batch 256'")
    p.add_argument("--plot", default=None, help="write the curves to this PNG")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(func=_main)


def _main(args) -> None:
    if not 1 <= args.frozen_after < args.partitions or args.rows < 1:
        raise SystemExit(f"het bench stream: expected 1 <= --frozen-after < --partitions and --rows >= 1, got "
                         f"{args.frozen_after}, {args.partitions}, {args.rows}")
    say = (lambda line: print(line, file=sys.stderr)) if args.json else print
    result = run(args.partitions, args.frozen_after, args.rows, args.drift, args.cap, args.seed, args.het_args.split(),
                 args.dir, say)
    if args.plot:
        plot(result, args.plot)
    if args.json:
        print(json.dumps(result))
    else:
        later = result["later"]
        print(f"partitions {args.frozen_after + 1}-{args.partitions}: online AUC {later['online']:.4f}, frozen "
              f"{later['frozen']:.4f}; online ahead on {later['online_wins']} of {later['of']}")
