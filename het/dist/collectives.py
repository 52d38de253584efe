"""The collectives a job's ranks call together (torch.distributed), each a no-op alone."""

from __future__ import annotations

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
