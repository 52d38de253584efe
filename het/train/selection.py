"""Validation and the kept model: the job ends with the model of its best validation score.

Every ``validation.every`` steps all ranks score the validation split together
(:meth:`het.train.loop.Worker.evaluate`). An evaluation better than every one before it keeps
the model as it is then: every cache flushed, each shard saves its rows, clocks and optimizer
state under a name in its own state directory (the save before it removed), and every rank
copies its dense model and optimizer state in memory. After ``patience`` evaluations without
a better one the job stops. When training ends, the last step is scored too, and a kept model
better than it is put back (the shards load their save, every cache forgets its copies) and
scored on validation again (the summary's ``validation.restored``, equal to its first score): the
test metrics, the checkpoint, the export and the last publication are then the kept model's.

What keeping costs is one flush and one shard save an improvement, reported in the summary's
``validation`` (``keeps``, ``keep_s``).
"""

from __future__ import annotations

import copy
import math
import time

from het.dist.collectives import barrier

# a metric and whether larger is better
METRICS = {"logloss": ("logloss", False), "auc": ("auc", True), "val_acc": ("val_acc", True)}


def eval_every(cfg, task, world: int) -> int:
    """Steps between validations: ``cfg.validation.every``, or by default twice an epoch on a
    prepared table, every 10 steps on a graph, never on synthetic data (an endless stream)."""
    if cfg.validation.every is not None:
        return cfg.validation.every
    if cfg.is_graph:
        return 10
    per_epoch = task.steps_per_epoch(world)
    if per_epoch is None or task.data.rows.get("val", 0) == 0:
        return 0
    return max(1, per_epoch // 2)


class Keeper:
    """The per-step hook of validation and the kept model (see the module docstring)."""

    def __init__(self, worker, every: int, samples: int):
        self.worker, self.every, self.samples = worker, every, samples
        cfg = worker.cfg
        self.metric, self.larger = METRICS["val_acc" if cfg.is_graph else cfg.validation.select]
        self.patience = cfg.validation.patience
        self.best: tuple[float, int] | None = None  # (score, step)
        self.points: list[dict] = []  # every validation: the summary's curve
        self.since_best = 0
        self.keeps, self.keep_s = 0, 0.0
        self._dense: tuple[dict, dict] | None = None
        self._saved: str | None = None  # the shards' save of the kept model
        self.restored: dict | None = None  # the validation metrics of the model put back, scored again

    def __bool__(self) -> bool:
        return self.every > 0

    def __call__(self, step: int) -> None:
        if step % self.every == 0:
            self.validate(step)

    def validate(self, step: int) -> None:
        """Score the validation split at ``step`` (all ranks), keep the model if it is the best."""
        if self.points and self.points[-1]["step"] == step:
            return
        metrics = self.worker.evaluate(self.samples, split="val")
        self.points.append({"step": step, **metrics})
        score = metrics.get(self.metric, math.nan)
        if self.best is None or self._better(score, self.best[0]):
            self.best, self.since_best = (score, step), 0
            self._keep(step)
        else:
            self.since_best += 1
            if self.patience and self.since_best >= self.patience:
                self.worker.early_stop = True

    def _better(self, score: float, best: float) -> bool:
        if math.isnan(score):
            return False
        return math.isnan(best) or (score > best if self.larger else score < best)

    def _keep(self, step: int) -> None:
        start = time.perf_counter()
        w = self.worker
        w.embedding.flush()
        barrier(w.world)
        if w.rank == 0:
            name = f"kept/step-{step}-{w.client.link.session[:8]}"
            w.client.save_named(name, drop=self._saved)
            self._saved = name
        model = {k: v for k, v in w.model.state_dict().items() if not k.startswith("embedding.")}
        self._dense = (copy.deepcopy(model), copy.deepcopy(w.dense.state_dict()))
        barrier(w.world)
        self.keeps, self.keep_s = self.keeps + 1, self.keep_s + time.perf_counter() - start

    def finish(self, last_step: int) -> int:
        """After the final flush: score the last step, put the kept model back if it was better;
        returns the step of the model the job ends with."""
        self.validate(last_step)
        best_step = self.best[1]
        if best_step != last_step:
            w = self.worker
            if w.rank == 0:
                w.client.load_named(self._saved)
            model_state, dense_state = self._dense
            w.model.load_state_dict(model_state, strict=False)
            w.dense.load_state_dict(dense_state)
            w.embedding.forget()  # the caches' copies are of the last step's rows
            w.embedding.resume_at(best_step)  # rows that decay (het.decay) are read at the kept step
            barrier(w.world)
            # scored again, the model put back must give its validation metrics exactly
            self.restored = w.evaluate(self.samples, split="val")
        return best_step

    def summary(self, last_step: int) -> dict:
        """The summary's ``validation``: the kept step, its validation metrics, the curve."""
        best = next(p for p in self.points if p["step"] == self.best[1])
        return {"best_step": self.best[1], "last_step": last_step, "select": self.metric,
                "stopped_early": bool(self.worker.early_stop), "keeps": self.keeps, "keep_s": self.keep_s,
                **{f"val_{k}": v for k, v in best.items() if k != "step" and not k.startswith("val_")},
                **{k: v for k, v in best.items() if k.startswith("val_")}, "curve": self.points,
                "restored": self.restored}
