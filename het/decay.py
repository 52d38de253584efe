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

import functools

import numpy as np
import torch

DECAYED = "decayed"  # the shard's optimizer state: the step a row was last brought to (steps_of)
_SPLIT = 1 << 24  # a step in two float32s, each exact below 2^24: high and low parts (exact below 2^48)


class RowDecay:
    """The decay of an optimizer's rows, step by step (see the module).

    Args:
        opt: the table's :class:`~het.optimizer.OptimizerConfig`: its lr, l2 and schedule.
    """

    def __init__(self, opt):
        self.rate = float(opt.lr * opt.l2) if opt.decays else 0.0
        self.schedule = opt.schedule
        self.settles = self.schedule.settles if self.schedule.active else 0
        self._logs: dict = {}  # by device: log of the share kept through steps 0..settles (_logs_of)

    @property
    def active(self) -> bool:
        return self.rate > 0

    def kept_log(self, steps: torch.Tensor) -> torch.Tensor:
        """``log prod_{1 <= i <= t} (1 - lr_i * l2)`` for each step ``t`` (0 for t <= 0), float64.
        Shape: (n,) -> (n,)."""
        logs = self._logs.get(steps.device)
        if logs is None:
            logs = self._logs[steps.device] = torch.tensor(_logs_of(self.rate, self.schedule, self.settles),
                                                           device=steps.device)
        t = steps.to(torch.int64).clamp(min=0)
        within = logs[t.clamp(max=self.settles)]
        after = float(np.log1p(-self.rate * (self.schedule.factor(self.settles + 1) if self.schedule.active else 1.0)))
        return within + (t - self.settles).clamp(min=0).double() * after

    def factor(self, since: torch.Tensor, to) -> torch.Tensor:
        """What rows last brought to steps ``since`` are multiplied by to be at step ``to`` (an int
        or one a row): 1 where ``to`` is not past ``since`` (a row is never brought back).
        Float64, on ``since``'s device. Shape: (n,) -> (n,)."""
        since = since.to(torch.int64)
        to = torch.as_tensor(to, dtype=torch.int64, device=since.device)
        upto = torch.maximum(since, to)
        if not self.settles:  # one rate every step: its power
            return torch.pow(1.0 - self.rate, (upto - since).double())
        return torch.exp(self.kept_log(upto) - self.kept_log(since))

    def bring(self, rows: torch.Tensor, since: torch.Tensor, to) -> torch.Tensor:
        """``rows`` last brought to steps ``since``, brought to step ``to``, in their dtype.
        Shape: (n, D), (n,) -> (n, D)."""
        return rows * self.factor(since, to).to(rows.dtype)[:, None]


@functools.lru_cache(maxsize=8)
def _logs_of(rate: float, schedule, settles: int) -> np.ndarray:
    """``log prod_{1 <= i <= t} (1 - rate * factor(i))`` for t in 0..settles (float64), made once
    a process for every table, cache and export of the same decay."""
    i = np.arange(1, settles + 1)
    factors = schedule.factors(i) if len(i) else np.ones(0)
    logs = np.concatenate([[0.0], np.cumsum(np.log1p(-rate * factors))])
    logs.flags.writeable = False
    return logs


def steps_of(state) -> torch.Tensor:
    """The steps a ``decayed`` state holds (float32 pairs: high and low parts). Shape: (n, 2) -> (n,) int64."""
    state = torch.as_tensor(state)
    return state[:, 0].to(torch.int64) * _SPLIT + state[:, 1].to(torch.int64)


def state_of(steps: torch.Tensor) -> torch.Tensor:
    """:func:`steps_of`'s inverse: steps (below 2^48) as ``decayed`` state. Shape: (n,) -> (n, 2) float32."""
    return torch.stack([steps // _SPLIT, steps % _SPLIT], 1).to(torch.float32)
