"""The collectives a job's ranks call together (torch.distributed), each a no-op alone."""

from __future__ import annotations

import torch
import torch.distributed as dist


def barrier(world: int) -> None:
    """Wait for every rank (nothing to wait for with one)."""
    if world > 1:
        dist.barrier()


def gather(obj, world: int) -> list:
    """Every rank's ``obj``, in rank order, on every rank (an all-gather of Python objects)."""
    if world == 1:
        return [obj]
    out = [None] * world
    dist.all_gather_object(out, obj)
    return out


def rank0_says(flag: bool, world: int) -> bool:
    """Rank 0's ``flag`` on every rank (what the others pass is ignored)."""
    if world == 1:
        return flag
    t = torch.tensor([float(flag)])
    dist.broadcast(t, src=0)
    return bool(t.item())
