"""Torch optimizers for ``nn.Embedding(sparse=True)`` (and dense 2-D parameters) of the shard's
optimizers that torch lacks: row-wise Adagrad and FTRL-Proximal. They are the references the
shard's :mod:`het.ps.server.store.optim` is held to, and a user's way to train a plain
``nn.Embedding`` as het's table would be trained."""

from __future__ import annotations

import torch

from het.config import OptimizerConfig
from het.ps.server.store.optim import ftrl_step


class RowWiseAdagradTorch(torch.optim.Optimizer):
    """Row-wise Adagrad as a torch optimizer, for the sparse gradients of ``nn.Embedding(sparse=True)``
    (and dense 2-D parameters): the reference :class:`RowWiseAdagrad` is checked against.

    Example:
        >>> emb = torch.nn.Embedding(4, 2, sparse=True)
        >>> opt = RowWiseAdagradTorch(emb.parameters(), lr=0.1)
        >>> emb(torch.tensor([1, 1])).sum().backward()
        >>> opt.step()
        >>> opt.state[emb.weight]["sum"].flatten().tolist()  # row 1: mean of (2^2, 2^2)
        [0.0, 4.0, 0.0, 0.0]
    """

    def __init__(self, params, lr: float = 0.01, eps: float = 1e-10, initial_accumulator: float = 0.0):
        super().__init__(params, {"lr": lr, "eps": eps, "initial_accumulator": initial_accumulator})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.dim() != 2:
                    raise ValueError(f"row-wise Adagrad updates rows: expected a 2-D parameter, got shape "
                                     f"{tuple(p.shape)}")
                state = self.state[p]
                if "sum" not in state:
                    state["sum"] = torch.full((p.shape[0], 1), float(group["initial_accumulator"]), device=p.device)
                grad = p.grad.coalesce() if p.grad.is_sparse else p.grad.to_sparse(1)
                rows, values = grad.indices()[0], grad.values()
                acc = state["sum"]
                acc.index_add_(0, rows, (values * values).mean(1, keepdim=True))
                std = acc.index_select(0, rows).sqrt_().add_(group["eps"])
                p.index_add_(0, rows, values / std, alpha=-group["lr"])


class FTRLTorch(torch.optim.Optimizer):
    """:class:`FTRL` as a torch optimizer for ``nn.Embedding(sparse=True)`` (and dense 2-D
    parameters): the reference the shard's FTRL is held to.

    Example:
        >>> emb = torch.nn.Embedding(3, 2, sparse=True)
        >>> with torch.no_grad():
        ...     _ = emb.weight.fill_(0.5)
        >>> opt = FTRLTorch(emb.parameters(), lr=0.1)
        >>> emb(torch.tensor([1])).sum().backward()
        >>> opt.step()
        >>> emb.weight[1].tolist()  # w - alpha * sign(g) on a first step, l1 = l2 = beta = 0
        [0.4000000059604645, 0.4000000059604645]
    """

    def __init__(self, params, lr: float = 0.01, l1: float = 0.0, l2: float = 0.0, beta: float = 0.0):
        super().__init__(params, {"lr": lr, "l1": l1, "l2": l2, "beta": beta})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            cfg = OptimizerConfig("ftrl", lr=group["lr"], l1=group["l1"], l2=group["l2"], beta=group["beta"])
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "z" not in state:
                    state["z"], state["n"] = torch.zeros_like(p), torch.zeros_like(p)
                grad = p.grad.coalesce() if p.grad.is_sparse else p.grad.to_sparse(1)
                ftrl_step(p, state["z"], state["n"], grad.indices()[0], grad.values(), cfg)
