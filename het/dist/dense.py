"""How the dense (MLP) parameters stay the same on every worker: a :class:`DenseSync`.

- :class:`AllReduceDense` (modes ``het`` and ``hybrid``): DistributedDataParallel over gloo
  (CPU) or NCCL (GPU); the gradients of a step are averaged over the workers during backward.
- :class:`PSDense` (mode ``ps``, TensorFlow-PS style): the dense parameters live on the PS as
  a table of rows; every step pulls them all and pushes the gradients back.

Gradient scaling, one rule for both (and for the sparse rows, see het.Embedding's
``grad_scale``): each worker's loss is the mean over its own batch, and each gradient that
leaves a worker is divided by the number of workers W, so what the servers and the AllReduce
add up is the gradient of the mean loss over all W * B samples of the step.
"""

from __future__ import annotations

import math
import time
from typing import Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

from het.choices import DenseCompression
from het.config import OptimizerConfig, TableConfig
from het.schedule import Schedule

DENSE_TABLE = "dense"
DENSE_ROW = 256  # floats per row of the dense table


class DenseSync(Protocol):
    """What a training step asks of its dense synchronisation, in the step's order.

    ``forward_module`` is what the forward pass calls: the DistributedDataParallel wrapper
    around the model with several workers, else the model itself (checkpoints and evaluation
    use the model, never the wrapper).
    """

    forward_module: nn.Module

    def before_forward(self) -> None:
        """Make the dense parameters current (mode ps: pull them)."""

    def zero_grad(self) -> None:
        """Clear the dense gradients before the backward pass."""

    def after_backward(self) -> None:
        """Apply the step's dense gradients (a local optimizer step, or a push to the PS)."""

    def scale_lr(self, factor: float) -> None:
        """The dense learning rate at this step: its base times ``factor`` (mode ps: the shard
        applies the schedule itself, at the step each push carries)."""

    def counters(self) -> dict:
        """``{"dense": bytes sent, "wait_ps_s": s, "allreduce_s": s}`` so far."""

    def state_dict(self) -> dict | None:
        """The dense optimizer's state for a checkpoint (None: it lives on the PS)."""

    def load_state_dict(self, state: dict | None) -> None:
        """Restore :meth:`state_dict`'s state."""


class AllReduceDense:
    """A local optimizer over ``model``'s dense parameters, and DDP around the model (when
    there is more than one worker), timing its AllReduce. Modes ``het`` and ``hybrid``."""

    def __init__(self, model: nn.Module, world: int, device: torch.device, optimizer: type[torch.optim.Optimizer],
                 compression: DenseCompression = DenseCompression.FP32, powersgd_rank: int = 4,
                 powersgd_start: int = 10, **optimizer_args):
        """``powersgd_rank``: the rank of PowerSGD's factors; ``powersgd_start``: the steps of
        plain AllReduce before PowerSGD starts (its error feedback needs a start)."""
        self.world, self.compression = world, DenseCompression(compression)
        self.allreduce_s = 0.0
        self.steps = 0
        self.sent = 0  # under PowerSGD, the elements AllReduced so far (factors and uncompressed tensors)
        self.powersgd = None
        if self.compression is DenseCompression.POWERSGD and world > 1:
            self.powersgd = powerSGD_hook.PowerSGDState(None, matrix_approximation_rank=powersgd_rank,
                                                        start_powerSGD_iter=max(2, powersgd_start))
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.numel = sum(p.numel() for p in self.params)
        self.optimizer = optimizer(self.params, **optimizer_args)
        self.forward_module = model
        if world > 1:
            ids = [device.index] if device.type == "cuda" else None
            self.forward_module = nn.parallel.DistributedDataParallel(model, device_ids=ids)
            self.forward_module.register_comm_hook(self, _timed_allreduce)

    def before_forward(self) -> None:
        pass

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

    def after_backward(self) -> None:
        self.optimizer.step()
        self.steps += 1

    def scale_lr(self, factor: float) -> None:
        """Set the dense learning rate to its base value times ``factor`` (a schedule's)."""
        for group in self.optimizer.param_groups:
            group["lr"] = group.setdefault("base_lr", group["lr"]) * factor

    def counters(self) -> dict:
        dense = self.bytes_per_step() * self.steps
        if self.powersgd is not None:  # what the factors and the uncompressed tensors moved
            dense = int(2 * (self.world - 1) / self.world * self.sent * 4)
        return {"dense": dense, "wait_ps_s": 0.0, "allreduce_s": self.allreduce_s}

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict | None) -> None:
        if state is not None:
            self.optimizer.load_state_dict(state)

    def bytes_per_step(self) -> int:
        """Bytes one worker sends in a ring AllReduce of the dense gradients: 2 (W - 1) / W of them,
        4 bytes each, or 2 compressed."""
        width = DenseCompression(self.compression).bytes
        return int(2 * (self.world - 1) / self.world * self.numel * width)


def _timed_allreduce(state: AllReduceDense, bucket):
    """DDP's communication hook: the bucket averaged over the ranks (compressed on the wire by
    DDP's own fp16, bf16 or PowerSGD hook when the job asks), its time counted."""
    start = time.perf_counter()
    if state.powersgd is not None:
        compressed = state.powersgd.total_numel_after_compression
        fut = powerSGD_hook.powerSGD_hook(state.powersgd, bucket)
        # before PowerSGD starts the bucket goes whole; after, its factors and small tensors
        state.sent += (state.powersgd.total_numel_after_compression - compressed) or bucket.buffer().numel()
    elif state.compression in (DenseCompression.FP32, DenseCompression.POWERSGD):
        fut = dist.all_reduce(bucket.buffer().div_(state.world), async_op=True).get_future()
    else:
        hook = default_hooks.fp16_compress_hook if state.compression is DenseCompression.FP16 else \
            default_hooks.bf16_compress_hook
        fut = hook(None, bucket)

    def done(f):
        state.allreduce_s += time.perf_counter() - start
        value = f.value()
        return value[0] if isinstance(value, list) else value

    return fut.then(done)


def dense_table(numel: int, lr: float, schedule: Schedule | None = None) -> TableConfig:
    """The PS table that holds ``numel`` dense parameters in mode ``ps`` (SGD on the shard, under
    the job's ``schedule``)."""
    return TableConfig(DENSE_TABLE, rows=math.ceil(numel / DENSE_ROW), dim=DENSE_ROW,
                       optimizer=OptimizerConfig("sgd", lr=lr, schedule=schedule or Schedule()), init_scale=0.0)


def ps_dense_bytes(numel: int) -> int:
    """Bytes a worker's step moves in mode ps for ``numel`` dense parameters: a pull and a push
    of the whole dense table, rows of DENSE_ROW floats, each with its key both ways (one byte:
    the keys 0, 1, 2, ... of a table of two rows or more travel delta-coded), its clock (int16,
    as it travels from the 256th step on to the 32,767th: :func:`het.ps.protocol.integers.narrow`) and
    the push's count (one byte), and the pull's marks of the rows the client builds (a bit a
    row). A model for projections: :class:`PSDense` counts what travels.

    Example:
        >>> ps_dense_bytes(300)  # 2 rows, both ways
        4107
    """
    rows = math.ceil(numel / DENSE_ROW)
    return rows * (2 * 4 * DENSE_ROW + 1 + 2 + 1 + 1) + -(-rows // 8)


class PSDense:
    """Dense parameters on the PS: pulled before every forward, gradients pushed after backward
    (mode ``ps``, TensorFlow-PS style).

    Rank 0 writes the model's initial values into the (zero) table before training; the shard
    applies SGD with the job's ``dense_lr``.
    """

    def __init__(self, model: nn.Module, client, world: int, rank: int):
        self.forward_module, self.client, self.world = model, client, world
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.numel = sum(p.numel() for p in self.params)
        table = client.tables[DENSE_TABLE]
        self.keys = torch.arange(table.rows)
        self.rows, self.row_width = table.rows, table.dim
        self.wait_s, self.bytes = 0.0, 0
        self.step = 0
        if rank == 0:
            self._install_initial_values()

    def _install_initial_values(self) -> None:
        """Move the (zero, SGD) table to the model's initial values: pushing
        ``(table - values) / lr`` makes SGD's ``table -= lr * grad`` land on them exactly."""
        current, _ = self.client.wait(self.client.pull(DENSE_TABLE, self.keys))
        lr = self.client.tables[DENSE_TABLE].optimizer.lr
        grads = (current.reshape(-1) - self._flat([p.detach() for p in self.params])) / lr
        zero_counts = torch.zeros(self.rows, dtype=torch.int64)  # no update of training: clocks stay
        self.client.wait(self.client.push(DENSE_TABLE, self.keys, grads.reshape(self.rows, self.row_width),
                                          zero_counts))

    def before_forward(self) -> None:
        handle = self.client.pull(DENSE_TABLE, self.keys)
        rows, _ = self._wait(handle)
        self.bytes += handle.request_bytes + handle.reply_bytes  # keys sent; rows, clocks, built marks back
        flat = rows.reshape(-1)
        offset = 0
        with torch.no_grad():
            for p in self.params:
                p.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    def zero_grad(self) -> None:
        self.forward_module.zero_grad()

    def after_backward(self) -> None:
        grads = self._flat([p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params])
        grads = (grads / self.world).reshape(self.rows, self.row_width)
        self.step += 1
        handle = self.client.push(DENSE_TABLE, self.keys, grads, torch.ones(self.rows, dtype=torch.int64),
                                  step=self.step)
        self.bytes += handle.push_bytes
        self._wait(handle)

    def _wait(self, handle):
        """The handle's result; ``wait_s`` counts the time blocked on the PS, not the merging of
        its replies afterwards (as :meth:`het.nn.Embedding._wait`)."""
        start = time.perf_counter()
        try:
            return self.client.wait(handle)
        finally:
            self.wait_s += time.perf_counter() - start - handle.merge_s

    def counters(self) -> dict:
        return {"dense": self.bytes, "wait_ps_s": self.wait_s, "allreduce_s": 0.0}

    def state_dict(self) -> None:
        return None  # the dense parameters and their SGD live on the PS, saved with it

    def load_state_dict(self, state) -> None:
        pass

    def _flat(self, tensors) -> torch.Tensor:
        flat = torch.zeros(self.rows * self.row_width)
        flat[:self.numel] = torch.cat([t.reshape(-1).cpu() for t in tensors])
        return flat
