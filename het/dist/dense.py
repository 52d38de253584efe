"""How the dense (MLP) parameters stay the same on every worker.

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

import torch
import torch.distributed as dist
from torch import nn

from het.config import OptimizerConfig, TableConfig

DENSE_TABLE = "dense"
DENSE_ROW = 256  # floats per row of the dense table


class AllReduceDense:
    """DDP around ``model`` (when there is more than one worker), timing its AllReduce."""

    def __init__(self, model: nn.Module, world: int, device: torch.device):
        self.world = world
        self.allreduce_s = 0.0
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.numel = sum(p.numel() for p in self.params)
        self.model = model
        if world > 1:
            ids = [device.index] if device.type == "cuda" else None
            self.model = nn.parallel.DistributedDataParallel(model, device_ids=ids)
            self.model.register_comm_hook(self, _timed_allreduce)

    def before_forward(self) -> None:
        pass

    def after_backward(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()

    def bytes_per_step(self) -> int:
        """Bytes one worker sends in a ring AllReduce of the dense gradients: 2 (W - 1) / W of them."""
        return int(2 * (self.world - 1) / self.world * self.numel * 4)


def _timed_allreduce(state: AllReduceDense, bucket):
    start = time.perf_counter()
    fut = dist.all_reduce(bucket.buffer().div_(state.world), async_op=True).get_future()

    def done(f):
        state.allreduce_s += time.perf_counter() - start
        return f.value()[0]

    return fut.then(done)


def dense_table(model: nn.Module, lr: float) -> TableConfig:
    """The PS table that holds ``model``'s dense parameters in mode ``ps`` (SGD on the shard)."""
    numel = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return TableConfig(DENSE_TABLE, rows=math.ceil(numel / DENSE_ROW), dim=DENSE_ROW,
                       optimizer=OptimizerConfig("sgd", lr=lr), init_scale=0.0)


class PSDense:
    """Dense parameters on the PS: pulled before every forward, gradients pushed after backward.

    Rank 0 writes the model's initial values into the (zero) table before training; the shard
    applies SGD with the job's ``dense_lr``.
    """

    def __init__(self, model: nn.Module, client, world: int, rank: int):
        self.model, self.client, self.world = model, client, world
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
        start = time.perf_counter()
        rows, _ = self.client.wait(self.client.pull(DENSE_TABLE, self.keys))
        self.wait_s += time.perf_counter() - start
        self.bytes += rows.numel() * 4 + self.keys.numel() * 16
        flat = rows.reshape(-1)
        offset = 0
        with torch.no_grad():
            for p in self.params:
                p.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    def after_backward(self, optimizer) -> None:
        grads = self._flat([p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params])
        grads = (grads / self.world).reshape(self.rows, self.row_width)
        self.step += 1
        start = time.perf_counter()
        self.client.wait(self.client.push(DENSE_TABLE, self.keys, grads, torch.ones(self.rows, dtype=torch.int64),
                                          step=self.step))
        self.wait_s += time.perf_counter() - start
        self.bytes += grads.numel() * 4 + self.keys.numel() * 16

    def bytes_per_step(self) -> int:
        return 0  # counted as it travels, in self.bytes

    def _flat(self, tensors) -> torch.Tensor:
        flat = torch.zeros(self.rows * self.row_width)
        flat[:self.numel] = torch.cat([t.reshape(-1).cpu() for t in tensors])
        return flat
