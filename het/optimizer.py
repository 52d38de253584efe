"""The sparse optimizer a PS shard applies to pushed gradients: its config."""

from __future__ import annotations

import math
from dataclasses import dataclass

from het.choices import Optimizer
from het.schedule import Schedule
from het.settings import FLOAT32_MAX, require, setting


@dataclass(frozen=True)
class OptimizerConfig:
    """The sparse optimizer a PS shard applies to pushed gradients.

    Args:
        name: ``"sgd"``, ``"adagrad"`` or ``"adam"``; the same update rules as
            ``torch.optim.SGD``, ``torch.optim.Adagrad`` and ``torch.optim.SparseAdam``.
        lr: learning rate.
        eps: added to the denominator (Adagrad, Adam).
        betas: Adam's moment decay rates.
        initial_accumulator: Adagrad's starting sum of squares.
        l1, beta: FTRL-Proximal's L1 on the rows (per coordinate, giving exact zeros) and its
            learning-rate offset; ``lr`` is its alpha (McMahan et al. 2013).
        l2: L2 on the rows. FTRL's in its closed form; under the other optimizers every row
            decays by ``1 - lr * l2`` each step (at the step's lr; decoupled from the gradient, as
            AdamW's), applied lazily per row (:mod:`het.decay`), equal to decaying every row
            every step. Under SGD that is the gradient of ``l2 / 2 * |row|^2``.

    Example:
        >>> OptimizerConfig("adam", lr=0.01).eps, OptimizerConfig("adagrad").eps  # torch's defaults
        (1e-08, 1e-10)
        >>> OptimizerConfig("rmsprop")
        Traceback (most recent call last):
        ...
        ValueError: optimizer must be one of ('sgd', 'adagrad', 'rowwise_adagrad', 'adam', 'ftrl'), got 'rmsprop'
    """

    name: Optimizer = setting(Optimizer.SGD, "the tables' optimizer")
    lr: float = setting(0.01, "the tables' learning rate")
    eps: float | None = setting(None, "added to the optimizer's denominator (Adagrad, Adam; default: torch's)")
    betas: tuple[float, float] = setting((0.9, 0.999), "Adam's moment decay rates, e.g. 0.9,0.999")
    initial_accumulator: float = setting(0.0, "Adagrad's starting sum of squares")
    l1: float = setting(0.0, "FTRL's L1 on the rows, per coordinate (exact zeros)")
    l2: float = setting(0.0, "L2 on the rows: FTRL's, or a decay of every row by 1 - lr * l2 a step")
    beta: float = setting(0.0, "FTRL's beta: its per-coordinate rate is lr / (beta + sqrt(sum of squares))")
    schedule: Schedule = setting(help="the lr's warmup and decay by the step a push carries", factory=Schedule)

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", Optimizer.parse(self.name, "optimizer"))
        for name in ("l1", "l2", "beta"):
            value = getattr(self, name)
            require(math.isfinite(value) and value >= 0, f"{name} must be a number >= 0, got {value}")
        if isinstance(self.schedule, dict):
            object.__setattr__(self, "schedule", Schedule(**self.schedule))
        require(not (self.name == Optimizer.FTRL and self.schedule.active),
                 "FTRL's lr is its alpha, fixed by its closed form: a schedule applies to the other optimizers")
        require(self.name == Optimizer.FTRL or not (self.l1 or self.beta),
                 f"l1 and beta are FTRL's (optimizer ftrl); {self.name} takes neither, got l1 {self.l1}, "
                 f"beta {self.beta}")
        require(math.isfinite(self.lr) and self.lr > 0, f"lr must be a positive number, got {self.lr}")
        require(self.name == Optimizer.FTRL or self.lr * self.l2 < 1,
                 f"l2 decays every row by 1 - lr * l2 a step, which must stay above 0: got lr {self.lr} times "
                 f"l2 {self.l2}")
        if self.eps is None:
            # torch's defaults: Adagrad 1e-10, SparseAdam 1e-8 (row-wise Adagrad as Adagrad).
            object.__setattr__(self, "eps", 1e-10 if "adagrad" in self.name else 1e-8)
        require(self.eps >= 0, f"eps must be >= 0, got {self.eps}")
        require(len(self.betas) == 2, f"betas must be two numbers (Adam's two decay rates), got {self.betas}")
        b1, b2 = self.betas
        require(0 <= b1 < 1 and 0 <= b2 < 1, f"betas must lie in [0, 1), got {self.betas}")
        object.__setattr__(self, "betas", (float(b1), float(b2)))
        # rows are float32: a step past its largest value makes every row it touches inf
        if self.name == Optimizer.ADAM:  # a step is at most lr / (1 - beta1) (the first)
            require(self.lr <= FLOAT32_MAX * (1 - b1),
                     f"lr must be at most {FLOAT32_MAX * (1 - b1):.4g} for Adam with beta1 {b1:g}: its first step "
                     f"takes lr / (1 - beta1), and a step past float32's largest value ({FLOAT32_MAX:.4g}) makes "
                     f"rows inf; got {self.lr:g}")
        require(self.lr <= FLOAT32_MAX,
                 f"lr must be at most {FLOAT32_MAX:.4g} (float32's largest value: a larger step makes rows inf), "
                 f"got {self.lr:g}")

    @property
    def decays(self) -> bool:
        """Whether its L2 is a decay of every row each step (:mod:`het.decay`): outside FTRL."""
        return self.name != Optimizer.FTRL and self.l2 > 0

    def lr_at(self, step: int) -> float:
        """The learning rate at ``step`` under the schedule."""
        return self.lr * self.schedule.factor(step) if self.schedule.active else self.lr
