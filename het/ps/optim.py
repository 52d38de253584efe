"""Sparse optimizers applied by a PS shard to pushed gradients, one row at a time.

Each follows the torch optimizer a user would otherwise pair with
``nn.Embedding(sparse=True)``: ``SGD`` as ``torch.optim.SGD``, ``Adagrad`` as
``torch.optim.Adagrad`` (per-row sum of squares) and ``Adam`` as ``torch.optim.SparseAdam``
(lazy: only pushed rows move; bias correction uses the pushing worker's step number, as
SparseAdam uses its global step count).
"""

from __future__ import annotations

import math

import torch

from het.config import OptimizerConfig


class SparseOptimizer:
    """Base: holds per-row state tensors; ``apply`` updates ``weight[rows]`` in place."""

    state_names: tuple[str, ...] = ()
    accepts_duplicates = False  # True: `apply` may get repeated rows (summed), no coalescing needed

    def __init__(self, cfg: OptimizerConfig, num_rows: int, dim: int):
        self.cfg = cfg
        self.state = self.initial_state(num_rows, dim)

    def initial_state(self, num_rows: int, dim: int) -> dict[str, torch.Tensor]:
        """The state of ``num_rows`` rows no gradient reached yet."""
        return {n: torch.zeros(num_rows, dim) for n in self.state_names}

    def apply(self, weight: torch.Tensor, rows: torch.Tensor, grads: torch.Tensor, step: int,
              state: dict | None = None) -> None:
        """Update ``weight[rows]`` with ``grads`` (which it may overwrite); ``rows`` are unique
        unless ``accepts_duplicates``. ``state``: the per-row state to use and update instead of
        the optimizer's own (a dynamic table gathers its rows' state). Shape: (n,), (n, D)."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        return dict(self.state)

    def load_state_dict(self, state: dict) -> None:
        for n in self.state_names:
            if state[n].shape != self.state[n].shape:
                raise ValueError(f"optimizer state {n!r}: expected shape {tuple(self.state[n].shape)}, "
                                 f"got {tuple(state[n].shape)}")
            self.state[n] = state[n].clone()


class SGD(SparseOptimizer):
    accepts_duplicates = True  # a sum of steps is the step of the sum

    def apply(self, weight, rows, grads, step, state=None):
        weight.index_add_(0, rows, grads.mul_(-self.cfg.lr))  # grads are the shard's own buffer


class Adagrad(SparseOptimizer):
    state_names = ("sum",)

    def initial_state(self, num_rows, dim):
        return {"sum": torch.full((num_rows, dim), float(self.cfg.initial_accumulator))}

    def apply(self, weight, rows, grads, step, state=None):
        acc = (state or self.state)["sum"]
        acc.index_add_(0, rows, grads * grads)
        std = acc.index_select(0, rows).sqrt_().add_(self.cfg.eps)
        weight.index_add_(0, rows, grads / std, alpha=-self.cfg.lr)


class Adam(SparseOptimizer):
    state_names = ("exp_avg", "exp_avg_sq")

    def apply(self, weight, rows, grads, step, state=None):
        b1, b2 = self.cfg.betas
        m, v = (state or self.state)["exp_avg"], (state or self.state)["exp_avg_sq"]
        old_m, old_v = m.index_select(0, rows), v.index_select(0, rows)
        new_m = old_m.add_((grads - old_m).mul_(1 - b1))  # old + (1 - b1) (g - old), as SparseAdam
        new_v = old_v.add_((grads * grads - old_v).mul_(1 - b2))
        m.index_copy_(0, rows, new_m)
        v.index_copy_(0, rows, new_v)
        step = max(int(step), 1)
        step_size = self.cfg.lr * math.sqrt(1 - b2 ** step) / (1 - b1 ** step)
        weight.index_add_(0, rows, new_m / new_v.sqrt().add_(self.cfg.eps), alpha=-step_size)


_BY_NAME = {"sgd": SGD, "adagrad": Adagrad, "adam": Adam}


def make(cfg: OptimizerConfig, num_rows: int, dim: int) -> SparseOptimizer:
    """The server-side optimizer for a table slice of ``num_rows`` rows of width ``dim``."""
    return _BY_NAME[cfg.name](cfg, num_rows, dim)
