"""A job's defaults: by model, on a prepared table, and those counted in samples, not steps."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Samples:
    """A default in steps that spans ``samples`` samples at the job's batch: ``ceil(samples /
    batch)`` steps, from 1 to ``most``.

    Example:
        >>> window = Samples(16_384)
        >>> window.steps(512), window.steps(128), window.steps(100_000)
        (32, 128, 1)
    """

    samples: int
    most: int = 1024

    def steps(self, batch: int) -> int:
        return max(1, min(self.most, -(-self.samples // batch)))

    def __str__(self) -> str:
        return f"{self.samples:,} samples' worth of steps, {self.steps(512)} at batch 512"


# A job's defaults by model, for the fields whose default is None (``section.key``: a nested table's).
# The lookahead window spans 16,384 samples, whatever the batch: 32 steps at batch 512 (12.8%
# fewer sparse bytes at the same samples/s on loopback), 128 at batch 128, the same stretch of
# the data to choose victims by (docs/RESULTS.md, "Lookahead")
_CTR_DEFAULTS = {"data": "synthetic-criteo", "staleness": 100, "steps": 1000, "batch": 512, "dim": 128,
                 "optimizer": "adagrad", "lr": 0.05, "dense_lr": 0.001, "weight_decay": 0.0, "eval_samples": 65_536,
                 "cache.lookahead": Samples(16_384)}
MODEL_DEFAULTS = {
    "wdl": _CTR_DEFAULTS, "dcn": _CTR_DEFAULTS, "dlrm": _CTR_DEFAULTS,
    # DeepFM's FM term sums 325 pairwise dot products of the fields' rows: at the CTR sparse lr of
    # 0.05 (Adagrad) its logits blow up early and it ends far below the others (AUC 0.742 after 1M
    # samples, 0.792 at 0.01; docs/RESULTS.md, "Workloads").
    "deepfm": {**_CTR_DEFAULTS, "lr": 0.01},
    # GraphSAGE on Cora-sized graphs: a step's global batch covers Cora's 140 training nodes;
    # eval_samples only switches the final evaluation on (every node is scored).
    "graphsage": {"data": "cora", "staleness": 10, "steps": 200, "batch": 140, "dim": 16, "optimizer": "adam",
                  "lr": 0.001, "dense_lr": 0.01, "weight_decay": 5e-4, "eval_samples": 1, "cache.lookahead": 0},
}

# CTR models on a prepared table (table:DIR, criteo:DIR) take these before their model's: the
# widths and dense optimizer the open CTR benchmarks default to (BARS/FuxiCTR: rows of 10-16,
# Adam at 1e-3 for the dense layers). On Adult they cut validation log loss from 0.322 to 0.297
# at 1,000 steps (docs/RESULTS.md, "Model quality against peers"); synthetic data keeps its own.
TABLE_DEFAULTS = {"dim": 16, "dense_optimizer": "adam", "dense_lr": 0.001}
