"""The collectives a job's ranks call together (torch.distributed), each a no-op alone."""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist


def local_device() -> torch.device:
    """This rank's device: the GPU of its LOCAL_RANK where there is one, else the CPU (also when
    this machine has fewer GPUs than local workers)."""
    local = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available() and local < torch.cuda.device_count():
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def join_group(world: int, device: torch.device) -> None:
    """Join the job's process group (torchrun's environment), unless alone or joined already."""
    if world > 1 and not dist.is_initialized():
        # a peer that died must not hang the others for gloo's default 30 minutes
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=datetime.timedelta(seconds=600))


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


def rank0_object(obj, world: int):
    """Rank 0's ``obj`` (any picklable object) on every rank (what the others pass is ignored)."""
    if world == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def rank0_says(flag: bool, world: int) -> bool:
    """Rank 0's ``flag`` on every rank (what the others pass is ignored)."""
    if world == 1:
        return flag
    t = torch.tensor([float(flag)])
    dist.broadcast(t, src=0)
    return bool(t.item())
