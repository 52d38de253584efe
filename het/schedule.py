"""Learning-rate schedules: a linear warmup, then a linear or cosine decay to a floor, as a pure
function of the step. The dense optimizer and the shards' sparse optimizers read the same one
(:attr:`het.optimizer.OptimizerConfig.schedule`), the shards at the step each push carries."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

DECAYS = ("none", "linear", "cosine")


@dataclass(frozen=True)
class Schedule:
    """``factor(step)`` multiplies the learning rate at ``step`` (1, 2, ...): ``step / warmup``
    during the first ``warmup`` steps, then 1 (``decay`` none), or falling from 1 to ``floor``
    at step ``steps``, linearly or along a half cosine.

    Example:
        >>> s = Schedule(warmup=10, decay="cosine", steps=110, floor=0.1)
        >>> [round(s.factor(t), 3) for t in (1, 5, 10, 60, 110, 200)]
        [0.1, 0.5, 1.0, 0.55, 0.1, 0.1]
        >>> Schedule().factor(7)
        1.0
    """

    warmup: int = 0
    decay: str = "none"
    steps: int = 0
    floor: float = 0.0

    def __post_init__(self):
        if not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"schedule warmup must be an int >= 0 (steps), got {self.warmup!r}")
        if self.decay not in DECAYS:
            raise ValueError(f"schedule decay must be one of {DECAYS}, got {self.decay!r}")
        if self.decay != "none" and (not isinstance(self.steps, int) or self.steps <= self.warmup):
            raise ValueError(f"a {self.decay} decay needs its last step past the warmup's {self.warmup}, got "
                             f"{self.steps!r}")
        if not 0 <= self.floor <= 1:
            raise ValueError(f"schedule floor must lie in [0, 1] (a share of the lr), got {self.floor!r}")

    @property
    def active(self) -> bool:
        return bool(self.warmup) or self.decay != "none"

    def factor(self, step: int) -> float:
        step = max(int(step), 1)
        if step <= self.warmup:
            return step / self.warmup
        if self.decay == "none":
            return 1.0
        t = min(1.0, (step - self.warmup) / (self.steps - self.warmup))
        shape = 1 - t if self.decay == "linear" else 0.5 * (1 + math.cos(math.pi * t))
        return self.floor + (1 - self.floor) * shape

    def factors(self, steps: np.ndarray) -> np.ndarray:
        """:meth:`factor` of each of ``steps``, at once (float64). Shape: (n,) -> (n,).

        Example:
            >>> s = Schedule(warmup=10, decay="cosine", steps=110, floor=0.1)
            >>> np.round(s.factors(np.array([1, 5, 10, 60, 110, 200])), 3).tolist()
            [0.1, 0.5, 1.0, 0.55, 0.1, 0.1]
        """
        step = np.maximum(np.asarray(steps, np.float64), 1.0)
        out = np.ones_like(step)
        if self.warmup:
            out = np.where(step <= self.warmup, step / self.warmup, out)
        if self.decay != "none":
            t = np.minimum(1.0, (step - self.warmup) / (self.steps - self.warmup))
            shape = 1 - t if self.decay == "linear" else 0.5 * (1 + np.cos(np.pi * t))
            out = np.where(step > self.warmup, self.floor + (1 - self.floor) * shape, out)
        return out

    @property
    def settles(self) -> int:
        """The step after which :meth:`factor` stays what it is (0: it never moves)."""
        return self.steps if self.decay != "none" else self.warmup
