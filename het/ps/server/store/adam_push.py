"""A fixed table's Adam push that holds rows of several steps (a worker's cache pushes a row once
its updates pass the staleness bound): the rows of one step in the native pass, the others taken
apart by :func:`het.ps.server.store.optim.adam_steps` (natively) on copies, all or nothing. The bits are the
reference's (:class:`het.ps.server.store.kernels.TorchPush`): the rows are disjoint, and the native
pass of one Adam step is held to torch's bit for bit."""

from __future__ import annotations

import torch

from het import native
from het.ps.server.store import optim
from het.ps.server.store.optim import rows_problem, sum_rows


def adam_steps_push(t, local: torch.Tensor, grads: torch.Tensor, counts: torch.Tensor, step: int, sq: torch.Tensor,
                    one_step) -> None:
    """Push ``grads`` of ``local`` (with their ``counts`` and squares ``sq``) to the Adam table
    ``t``: rows of several steps computed aside and checked first, then ``one_step(t, local,
    grads, counts, step, None)`` (the native push, all or nothing) for the rest, then the first
    written. Raises ValueError, changing nothing, as the reference would."""
    rows, inverse = native.unique_inverse(local)
    if len(rows) != len(local):  # one gradient a row: duplicates summed first, as the reference
        grads, counts, sq = (sum_rows(x, inverse, len(rows)) for x in (grads, counts, sq))
    else:
        rows = local
    many = counts > 1
    at, one = rows[many], ~many
    opt = t.optimizer
    weight = t.weight.index_select(0, at)
    state = {n: v.index_select(0, at) for n, v in opt.state.items()}
    clocks = t.clocks.index_select(0, at) + counts[many]
    steps(weight, state["exp_avg"], state["exp_avg_sq"], grads[many].contiguous(), counts[many], sq[many].contiguous(),
          max(int(step), 1), opt.cfg)
    problem = rows_problem(weight, state, clocks)
    if problem:
        raise ValueError(problem)
    if bool(one.any()):
        one_step(t, rows[one], grads[one].contiguous(), counts[one], step, None)
    t.weight.index_copy_(0, at, weight)
    for n, v in opt.state.items():
        v.index_copy_(0, at, state[n])
    t.clocks.index_copy_(0, at, clocks)
    t.touched.index_fill_(0, at, True)


def steps(weight, m, v, grads, counts, sq, step: int, cfg) -> None:
    """:func:`het.ps.server.store.optim.adam_steps` of every row of ``weight``, ``m`` and ``v`` (copies),
    natively where het's core is built: the same bits."""
    if native.ops is None:
        optim.adam_steps(weight, m, v, torch.arange(len(weight)), grads, counts, sq, step, cfg)
        return
    p1, p2, sizes = optim.adam_tables(int(counts.max()), step, cfg)
    move, new_m, new_v = native.ops.adam_steps(m, v, grads, counts, sq.float(), p1, p2, sizes, cfg.eps)
    m.copy_(new_m)
    v.copy_(new_v)
    weight.sub_(move)
