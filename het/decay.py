"""L2 on embedding rows as a decay, applied lazily: a row's value at any step without touching
the rows no step read.

Under ``OptimizerConfig.l2`` (every optimizer but FTRL, whose L2 is in its closed form), each
step ``t`` multiplies every row by ``1 - lr_t * l2`` (``lr_t``: the table's lr at ``t``, its
schedule's), then the optimizer steps the rows pushed: decoupled weight decay, as AdamW's, and
under SGD exactly the gradient of ``l2 / 2 * |row|^2``. Decaying every row of a huge table every
step is out of the question, and needless: a row no step touched between steps ``a`` and ``b``
is its value at ``a`` times ``prod_{a < i <= b} (1 - lr_i * l2)``. So each row keeps the step it
was last brought to (the shard's optimizer state ``decayed``, a worker cache's slot), and is
brought forward only where it is read or pushed (the standard lazy-update identity; Bottou,
"Stochastic Gradient Descent Tricks", 2012). The products come from the sums of their
logarithms in float64, in closed form past the step where the schedule settles.

Example:
    >>> import torch
    >>> from het.config import OptimizerConfig
    >>> d = RowDecay(OptimizerConfig("adagrad", lr=0.1, l2=0.5))
    >>> [round(f, 8) for f in d.factor(torch.tensor([0, 3, 5]), 5).tolist()]  # 5, 2 and 0 steps of 0.95
    [0.77378094, 0.9025, 1.0]
"""

from __future__ import annotations

import numpy as np
import torch

DECAYED = "decayed"  # the shard's optimizer state: the step a row was last brought to (one float a row)


class RowDecay:
    """The decay of an optimizer's rows, step by step (see the module).

    Args:
        opt: the table's :class:`~het.optimizer.OptimizerConfig`: its lr, l2 and schedule.
    """

    def __init__(self, opt):
        self.rate = float(opt.lr * opt.l2) if opt.decays else 0.0
        self.schedule = opt.schedule
        self.settles = self.schedule.settles if self.schedule.active else 0
        self._logs: np.ndarray | None = None  # log of the share kept through steps 0..settles

    @property
    def active(self) -> bool:
        return self.rate > 0

    def kept_log(self, steps: torch.Tensor) -> torch.Tensor:
        """``log prod_{1 <= i <= t} (1 - lr_i * l2)`` for each step ``t`` (0 for t <= 0), float64.
        Shape: (n,) -> (n,)."""
        if self._logs is None:
            i = np.arange(1, self.settles + 1)
            factors = self.schedule.factors(i) if len(i) else np.ones(0)
            self._logs = np.concatenate([[0.0], np.cumsum(np.log1p(-self.rate * factors))])
        t = steps.to("cpu", torch.int64).clamp(min=0)
        within = torch.from_numpy(self._logs)[t.clamp(max=self.settles)]
        after = float(np.log1p(-self.rate * (self.schedule.factor(self.settles + 1) if self.schedule.active else 1.0)))
        return within + (t - self.settles).clamp(min=0).double() * after

    def factor(self, since: torch.Tensor, to) -> torch.Tensor:
        """What rows last brought to steps ``since`` are multiplied by to be at step ``to`` (an int
        or one a row): 1 where ``to`` is not past ``since`` (a row is never brought back).
        Float64, on ``since``'s device. Shape: (n,) -> (n,)."""
        since = since.to(torch.int64)
        to = torch.as_tensor(to, dtype=torch.int64, device=since.device)
        upto = torch.maximum(since, to)
        return torch.exp(self.kept_log(upto) - self.kept_log(since)).to(since.device)

    def bring(self, rows: torch.Tensor, since: torch.Tensor, to) -> torch.Tensor:
        """``rows`` last brought to steps ``since``, brought to step ``to``, in their dtype.
        Shape: (n, D), (n,) -> (n, D)."""
        return rows * self.factor(since, to).to(rows.dtype)[:, None]
