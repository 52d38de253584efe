"""``het demo``: het.Embedding trained against a real PS shard process, with its hit rate.

The data is planted: every sample has ``fields`` categorical keys drawn from a power law, each
key has a hidden weight, and the label is drawn from the sigmoid of their sum. A small model
(het.Embedding -> MLP) learns it; the PS shard runs in its own process on 127.0.0.1 and the
worker's cache holds 10% of the table.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from het.config import CacheConfig, OptimizerConfig, ShardConfig, TableConfig
from het.data.zipf import Zipf
from het.nn.embedding import Embedding
from het.ps.client.client import PSClient
from het.ps.server.process import ServerProcess
from het.staleness import staleness_flag


class PlantedKeys:
    """Samples of ``fields`` Zipf keys with labels from hidden per-key weights."""

    def __init__(self, num_keys: int, fields: int, alpha: float = 1.05, seed: int = 0):
        self.fields, self.seed = fields, seed
        self.zipf = Zipf(num_keys, alpha, seed)
        self.weights = np.random.default_rng(seed).normal(0, 1.0, num_keys)

    def batch(self, size: int, step: int) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        """Keys (size, fields), labels (size,) and the planted logits (size,) of batch ``step``."""
        rng = np.random.default_rng((self.seed, step))
        keys = self.zipf.sample(size * self.fields, rng).reshape(size, self.fields)
        logits = self.weights[keys].sum(1) * (2.0 / math.sqrt(self.fields))
        labels = (rng.random(size) < 1 / (1 + np.exp(-logits))).astype(np.float32)
        return torch.from_numpy(keys), torch.from_numpy(labels), logits


class TinyCTR(nn.Module):
    """Embeddings of every field, concatenated, through an MLP to one logit."""

    def __init__(self, embedding: nn.Module, fields: int, dim: int):
        super().__init__()
        self.embedding = embedding
        self.mlp = nn.Sequential(nn.Linear(fields * dim, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, keys: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.embedding(keys).flatten(1)).squeeze(1)  # (B, F, D) -> (B,)


def run(steps: int = 600, batch: int = 512, staleness: float = 10, num_keys: int = 100_000,
        fields: int = 8, dim: int = 16) -> dict:
    torch.manual_seed(0)
    data = PlantedKeys(num_keys, fields)
    table = TableConfig("keys", rows=num_keys, dim=dim, optimizer=OptimizerConfig("adagrad", lr=0.05))
    with ServerProcess(ShardConfig((table,))) as server:
        print(f"het demo: PS shard process at {server.address}; cache holds 10% of {num_keys:,} rows, "
              f"staleness {staleness}")
        client = PSClient.connect([server.address])
        cache = CacheConfig(capacity=num_keys // 10, policy="lfu", staleness=staleness)
        model = TinyCTR(Embedding(tables=table, client=client, cache=cache), fields, dim)
        opt = torch.optim.Adam(model.mlp.parameters(), lr=1e-3)
        loss_fn = nn.BCEWithLogitsLoss()
        start = time.perf_counter()
        bar = tqdm(range(steps), desc="het demo", unit="step", mininterval=0.5)
        for step in bar:
            keys, labels, _ = data.batch(batch, step)
            loss = loss_fn(model(keys), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            stats = model.embedding.stats()["keys"]
            bar.set_postfix(loss=f"{loss.item():.4f}", hit_rate=f"{stats['hit_rate']:.3f}", refresh=False)
        wall = time.perf_counter() - start
        model.embedding.flush()
        from sklearn.metrics import roc_auc_score  # here: sklearn costs 1.5 s of every het command's start

        with torch.no_grad():
            keys, labels, planted = data.batch(8192, 2**62)  # held out: no training step is 2^62
            auc = float(roc_auc_score(labels.numpy(), model(keys).numpy()))
            planted_auc = float(roc_auc_score(labels.numpy(), planted))
        ps = client.stats()[0]
        client.close()
    stats = model.embedding.stats()["keys"]
    result = {"steps": steps, "batch": batch, "staleness": staleness, "wall_s": wall,
              "samples_per_s": steps * batch / wall, "auc": auc, "planted_auc": planted_auc, "hit_rate": stats["hit_rate"],
              "stale_refreshes": stats.get("stale_refreshes", 0), "evictions": stats.get("evictions", 0),
              "ps_bytes_out": ps["bytes_out"], "ps_bytes_in": ps["bytes_in"]}
    print(f"het demo: {steps} steps in {wall:.1f} s ({result['samples_per_s']:,.0f} samples/s); "
          f"held-out AUC {auc:.3f} (the planted model's own: {planted_auc:.3f}); cache hit rate {stats['hit_rate']:.1%}; "
          f"PS sent {ps['bytes_out'] / 1e6:.1f} MB, received {ps['bytes_in'] / 1e6:.1f} MB")
    return result


def add_parser(sub) -> None:
    """Register ``het demo`` on the ``het`` command's subparsers."""
    d = sub.add_parser("demo", help="train het.Embedding against a local shard process and show its hit rate")
    d.add_argument("--steps", type=int, default=600)
    d.add_argument("--batch", type=int, default=512)
    d.add_argument("--staleness", type=staleness_flag, default=10, help="the bound s: an integer or inf")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=_main)


def _main(args) -> None:
    import json

    result = run(steps=args.steps, batch=args.batch, staleness=args.staleness)
    if args.json:
        print(json.dumps(result, sort_keys=True, default=str))
