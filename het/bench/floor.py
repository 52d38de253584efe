"""`het bench floor`: het's overhead against not distributing at all.

The floor is the job's own model with its rows in one plain local ``nn.Embedding(sparse=True)``
and the matching torch optimizer (Adagrad for Adagrad and row-wise Adagrad, SparseAdam for Adam,
SGD), in this process, one thread, every row in RAM, the data made as het makes it. Its rows start
as het's initial rows, so at s = 0 with SGD the two train alike (tested). Hashed ids
(``--ids hashed``) go to a table of as many rows as the data has ids, by the key modulo its size:
the hashing trick a plain model would use.

Beside it, in turn for ``--rounds`` rounds, ``het train --workers 1`` of the same flags (its shard
on the other core, as the default local job runs): each one's ms a step over its ``--steps``
steps from the first (het's: its training loop's ``wall_s``, start-up excluded, as the floor's),
and the ratio floor ms / het ms (1: het as fast as not distributing).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
import warnings

import torch
from torch import nn

from het.choices import Optimizer, Pooling
from het.nn.bags import pool
from het.train.config import TrainConfig
from het.train.flags import add_config_flags, config_from_args

SPARSE_OPTIMIZERS = {Optimizer.SGD: torch.optim.SGD, Optimizer.ADAGRAD: torch.optim.Adagrad,
                     Optimizer.ROWWISE_ADAGRAD: torch.optim.Adagrad, Optimizer.ADAM: torch.optim.SparseAdam}


class PlainEmbedding(nn.Module):
    """One local table behind het.Embedding's call: ``(keys)`` -> rows of ``keys.shape + (D,)``,
    or ``(keys, offsets)`` -> one pooled row a bag; ``hashed``: keys taken modulo the rows."""

    def __init__(self, table, hashed: bool, mode: Pooling | None):
        super().__init__()
        from het.ps.protocol.initial import initial_rows

        import numpy as np

        self.rows, self.hashed, self.mode = table.rows, hashed, mode
        self.table = nn.Embedding(table.rows, table.dim, sparse=True)
        with torch.no_grad():  # het's initial rows: the floor and het start alike
            self.table.weight.copy_(torch.from_numpy(initial_rows(table, np.arange(table.rows))))

    def forward(self, keys: torch.Tensor, offsets: torch.Tensor | None = None) -> torch.Tensor:
        index = torch.remainder(keys, self.rows) if self.hashed else keys
        if offsets is None:
            return self.table(index)
        bag = torch.repeat_interleave(torch.arange(len(offsets)), torch.diff(offsets, append=torch.tensor([len(keys)])))
        return pool(self.table(index), bag, len(offsets), self.mode)


def floor_model(cfg: TrainConfig):
    """``(task, model, step)``: the job's model over a :class:`PlainEmbedding`, and a function
    running training step ``i`` (its loss)."""
    from het.config import TableConfig
    from het.train.loop import TORCH_OPTIMIZERS
    from het.train.tasks import job_tables, make_task

    if cfg.is_graph:
        raise ValueError("het bench floor measures CTR models; GraphSAGE's sampling is not a plain model's step")
    warnings.filterwarnings("ignore", "Sparse invariant checks are implicitly disabled")  # torch's, per step
    task = make_task(cfg)
    if task.groups:
        raise ValueError("het bench floor compares one embedding table with nn.Embedding; give one --dim (not auto "
                         "or --widths)")
    table = job_tables(cfg, task)[0]
    hashed = task.num_rows is None
    if hashed:
        table = TableConfig(table.name, rows=int(task.num_ids), dim=table.dim, optimizer=table.optimizer,
                            init_scale=table.init_scale, seed=table.seed)
    embedding = PlainEmbedding(table, hashed, task.pooling)
    model = task.build_model(embedding)
    sparse = SPARSE_OPTIMIZERS[Optimizer(cfg.optimizer)](embedding.parameters(), lr=cfg.lr)
    dense_name = cfg.dense_optimizer or Optimizer(cfg.optimizer.removeprefix("rowwise_"))
    dense = TORCH_OPTIMIZERS[dense_name]([p for n, p in model.named_parameters() if not n.startswith("embedding.")],
                                         lr=cfg.dense_lr, weight_decay=cfg.weight_decay)

    def step(i: int) -> float:
        loss = task.loss(model, task.batch(i, 0, 1, "cpu"))
        sparse.zero_grad()
        dense.zero_grad()
        loss.backward()
        sparse.step()
        dense.step()
        return float(loss.detach())

    return task, model, step


def floor_ms(cfg: TrainConfig, steps: int) -> float:
    """The floor's ms a step over its first ``steps`` steps, one thread (building the model and
    its rows not counted)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _, _, step = floor_model(cfg)
        start = time.perf_counter()
        for i in range(steps):
            step(i)
        return (time.perf_counter() - start) / steps * 1000
    finally:
        torch.set_num_threads(threads)


def het_ms(argv: list[str], steps: int) -> float:
    """``het train --workers 1`` of ``argv``'s flags for ``steps`` steps: ms a step of its
    training loop (its ``wall_s``: the steps and the final flush)."""
    out = subprocess.run([sys.executable, "-m", "het", "train", *argv, "--workers", "1", "--steps", str(steps),
                          "--eval-samples", "0", "--tensorboard-every", "0", "--json", "--quiet"],
                         capture_output=True, text=True, timeout=3600)
    if out.returncode:
        raise RuntimeError(f"het train failed (exit {out.returncode}): {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["wall_s"] / steps * 1000


def run(cfg: TrainConfig, argv: list[str], steps: int = 400, rounds: int = 3) -> dict:
    """Floor and het, in turn, ``rounds`` times; each one's ms a step and their ratio."""
    floor, het = [], []
    for _ in range(rounds):
        floor.append(floor_ms(cfg, steps))
        het.append(het_ms(argv, steps))
    ratios = [f / h for f, h in zip(floor, het)]
    return {"model": str(cfg.model), "ids": str(cfg.ids), "batch": cfg.batch, "dim": cfg.dim, "steps": steps,
            "floor_ms_per_step": floor, "het_ms_per_step": het, "ratio": ratios,
            "median_ratio": statistics.median(ratios),
            "floor_samples_per_s": cfg.batch * 1000 / statistics.median(floor),
            "het_samples_per_s": cfg.batch * 1000 / statistics.median(het)}


def add_parser(bsub) -> None:
    """Register ``het bench floor`` on the subparsers of ``het bench``."""
    p = bsub.add_parser("floor", help="het with one worker against the same model on plain local nn.Embedding, "
                                      "one process: ms a step and their ratio")
    p.add_argument("--rounds", type=int, default=3, help="floor then het, this many times")
    add_config_flags(p, exclude=("workers", "checkpoint", "checkpoint_every", "resume", "export.dir", "export.every",
                                 "export.dtype", "publish.dir", "publish.every", "publish.base_every",
                                 "publish.keep"),
                     defaults={"steps": 400})
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_main)


def _main(args) -> None:
    cfg = config_from_args(args)
    argv = _train_argv(sys.argv)
    result = run(cfg, argv, cfg.steps, args.rounds)
    if args.json:
        print(json.dumps(result, sort_keys=True))
        return
    print(f"het bench floor ({result['model']}, ids {result['ids']}, batch {result['batch']}, dim {result['dim']}): "
          f"floor {statistics.median(result['floor_ms_per_step']):.1f} ms a step, het "
          f"{statistics.median(result['het_ms_per_step']):.1f} ms; het at {result['median_ratio']:.2f}x the floor")


def _train_argv(argv: list[str]) -> list[str]:
    """The ``het train`` flags of a ``het bench floor`` command line: all but the bench's own.

    Example:
        >>> _train_argv(["het", "bench", "floor", "--rounds", "2", "--dim", "8", "--json", "--steps", "50"])
        ['--dim', '8']
    """
    out, skip = [], False
    for arg in argv[3:]:
        if skip:
            skip = False
        elif arg in ("--rounds", "--steps"):
            skip = True
        elif arg != "--json" and not arg.startswith(("--rounds=", "--steps=")):
            out.append(arg)
    return out
