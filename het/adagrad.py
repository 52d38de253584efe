"""Adagrad's move for a sum of steps: the one formula the shard's Adagrad (het.ps.server.store.optim)
and a worker cache's local rule (het.cache) share, so that a cached copy moves as the server's
row will when its pending push lands."""

from __future__ import annotations

import torch


def adagrad_factor(acc: torch.Tensor, sq: torch.Tensor, counts: torch.Tensor, eps: float) -> torch.Tensor:
    """The factor that Adagrad's ``u`` steps multiply their gradient sum by, from the
    accumulator ``acc`` before them and ``sq``, what they add to it: ``1 / (sqrt(acc + sq) +
    eps)`` for one step (Adagrad's own), and for ``u > 1`` steps of like size
    ``(1/u) sum_k 1 / sqrt(acc + k sq / u)`` by the midpoint rule,
    ``2 / (sqrt(acc + sq + h) + sqrt(acc + h) + 2 eps)`` with ``h = sq / 2u``. Shapes
    broadcast; ``counts`` (n, 1).

    Example:
        >>> import math
        >>> g = torch.tensor([[0.1]])  # 100 steps of 0.1 from a zero accumulator
        >>> step = 100 * g * adagrad_factor(torch.zeros(1, 1), 100 * g * g, torch.tensor([[100]]), 0.0)
        >>> sequential = sum(0.1 / math.sqrt(k * 0.01) for k in range(1, 101))
        >>> round(float(step), 2), round(sequential, 2), round(float(100 * g / (100 * g).abs()), 2)  # vs one step
        (18.64, 18.59, 1.0)
    """
    h = sq / (2 * counts)
    several = 2 / ((acc + sq + h).sqrt() + (acc + h).sqrt() + 2 * eps)
    return torch.where(counts > 1, several, 1 / ((acc + sq).sqrt() + eps))
