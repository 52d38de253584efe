"""What one dense AllReduce of the default job costs on this machine with no network shaping
and nothing else running: two processes on 127.0.0.1 over gloo (as ``het train`` on CPU), the
default WDL model's dense gradients in float32 and in bfloat16 (what DDP's bf16 hook sends),
wall and CPU milliseconds per AllReduce on rank 0, the median of five rounds. Beside a step's
time it is the AllReduce share no compression can remove here:

    .venv/bin/python docs/scripts/allreduce_floor.py [--repeats 300]
"""

import argparse
import json
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from het.train.config import TrainConfig
from het.train.tasks import dense_params


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, numel: int, repeats: int, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        result = {}
        for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
            grads = torch.randn(numel).to(dtype)
            for _ in range(20):
                dist.all_reduce(grads)
            walls, cpus = [], []
            for _ in range(5):
                dist.barrier()
                wall, cpu = time.perf_counter(), time.process_time()
                for _ in range(repeats):
                    dist.all_reduce(grads)
                walls.append((time.perf_counter() - wall) / repeats * 1e3)
                cpus.append((time.process_time() - cpu) / repeats * 1e3)
            result[name] = {"wall_ms": round(statistics.median(walls), 3), "cpu_ms": round(statistics.median(cpus), 3)}
        if rank == 0:
            out.put(result)
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=300, help="AllReduces a round")
    args = parser.parse_args()
    numel = dense_params(TrainConfig())
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    mp.start_processes(_rank, args=(_free_port(), numel, args.repeats, out), nprocs=2, start_method="spawn")
    print(json.dumps({"dense_params": numel, **out.get(timeout=10)}))


if __name__ == "__main__":
    main()
