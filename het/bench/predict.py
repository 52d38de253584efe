"""`het bench predict`: an export's scoring speed against the same model with its rows in a plain
``nn.Embedding`` in RAM, one core, in turn.

Without ``--export``, one is made first: the job of the ``het train`` flags given, trained for
``--train-steps`` steps in this process against in-process shards, checkpointed and exported
(``--dtype``). Then both score the same held-out batches of ``--batch`` rows, in turn, for
``--rounds`` rounds of ``--seconds`` each:

- ``het``: :class:`het.export.ExportedModel` (rows mapped from disk, a dynamic table's index
  lookup and initial rows for keys never stored, the dense program);
- ``plain``: the model's class with an ``nn.Embedding`` of the export's rows decoded to float32
  in RAM, its keys mapped to those rows beforehand (a dynamic table's lookup is not timed: it is
  what a plain embedding does not have to do).

Prints samples/s of each, their ratio per round, and the median ratio.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import tempfile
import time

import torch
from torch import nn

from het.ps.local import local_client
from het.train.config import TrainConfig
from het.train.flags import add_config_flags, config_from_args


def trained_export(cfg: TrainConfig, steps: int, directory: str, dtype: str = "fp32", servers: int | None = None,
                   shard_options: dict | None = None, scores: bool = False) -> tuple:
    """Train ``cfg`` for ``steps`` steps in this process (in-process shards, one rank), write a
    checkpoint at the end and export it; ``(checkpoint, export, held-out metrics at the end)``,
    and with ``scores`` the training model's own ``(labels, probabilities)`` of those held-out
    samples (:meth:`het.train.tasks.CTRTask.test_scores`)."""
    from het.export.writer import export
    from het.ps.client.client import PSClient
    from het.train import checkpoint
    from het.train.loop import Worker
    from het.train.tasks import job_tables

    ckpt, out = os.path.join(directory, "checkpoint"), os.path.join(directory, "export")
    client = local_client(job_tables(cfg), servers or cfg.servers, lazy_init=cfg.lazy_init, **(shard_options or {}))
    try:
        worker = Worker(cfg, client)
        worker.train(steps, progress=False)
        checkpoint.save(worker, ckpt, steps)
        metrics = worker.evaluate(cfg.eval_samples) if cfg.eval_samples else {}
        checkpoint.record_evaluation(ckpt, steps, metrics)
        if scores:
            worker.model.eval()
            with worker.embedding.fresh():
                labels, probs, _ = worker.task.test_scores(worker.model, cfg.eval_samples, worker.device)
    finally:
        client.close()
    export(ckpt, out, dtype)
    return (ckpt, out, metrics, (labels, probs)) if scores else (ckpt, out, metrics)


def run(export_dir: str, batch: int = 4096, seconds: float = 3.0, rounds: int = 3, threads: int = 1) -> dict:
    """Samples/s of the export and of its plain twin on the same batches, in turn."""
    from het.export import load_model
    from het.export.batches import open_source
    from het.export.chunk import Skipped

    torch.set_num_threads(threads)
    model = load_model(export_dir)
    if model.table is None:
        raise ValueError(f"{export_dir} holds a table a width ({sorted(model.tables)}): het bench predict compares "
                         f"one table with nn.Embedding; export a job of one --dim")
    spec = model.manifest["input"]
    data = spec["preset"] if spec["source"] == "synthetic" else None
    if data is None:
        raise ValueError("het bench predict scores synthetic data: export a job trained on synthetic-criteo")
    chunks, _, _ = open_source(data, model.inputs, model.manifest, "test", 8 * batch, batch, Skipped())
    batches = [(torch.from_numpy(c.dense), torch.from_numpy(c.keys)) for c in chunks]
    plain, plain_batches = _plain_twin(model, batches)
    het_fn = lambda b: model(*b)  # noqa: E731
    plain_fn = lambda b: plain(*b)  # noqa: E731
    agree = max(float((het_fn(a) - plain_fn(b)).abs().max()) for a, b in zip(batches[:2], plain_batches[:2]))
    results = {"het": [], "plain": []}
    for _ in range(rounds):
        results["het"].append(_rate(het_fn, batches, seconds))
        results["plain"].append(_rate(plain_fn, plain_batches, seconds))
    ratios = [h / p for h, p in zip(results["het"], results["plain"])]
    table = model.table
    return {"export": os.path.abspath(export_dir), "batch": batch, "threads": threads, "rounds": rounds,
            "het_samples_per_s": results["het"], "plain_samples_per_s": results["plain"], "ratios": ratios,
            "ratio": statistics.median(ratios), "max_abs_difference": agree, "dtype": model.manifest["dtype"],
            "dynamic": table.dynamic, "rows": int(table.values.shape[0]), "dim": table.dim,
            "model": model.manifest["model"]["name"], "dense_program": model.uses_program}


class _Plain(nn.Module):
    """The model's class with an ``nn.Embedding`` of the rows in RAM."""

    def __init__(self, rows: torch.Tensor, dense: nn.Module, bag_sizes):
        super().__init__()
        from het.nn.bags import FieldBags

        self.embedding = nn.Embedding.from_pretrained(rows, freeze=True)
        self.bags = FieldBags(nn.EmbeddingBag.from_pretrained(rows, freeze=True, mode="sum"), bag_sizes) \
            if max(bag_sizes) > 1 else None
        self.dense = dense

    @torch.no_grad()
    def forward(self, dense, keys):
        rows = self.bags(keys) if self.bags is not None else self.embedding(keys)
        return torch.sigmoid(self.dense(dense, rows))


def _plain_twin(model, batches):
    """The plain model, and the batches with their keys as its rows (a dynamic table's keys
    looked up beforehand; keys never stored get their initial rows appended)."""
    from het.export import dense as dense_model

    table = model.table
    rows = table._gather(torch.arange(table.values.shape[0])) if table.values.shape[0] else torch.zeros(0, table.dim)
    dense = dense_model.load(model.root, model.manifest["model"])
    out = []
    if table.dynamic:
        extra = []
        for d, k in batches:
            at = torch.from_numpy(table.index.lookup(k.reshape(-1).numpy())).reshape(k.shape)
            fresh = at < 0
            if bool(fresh.any()):
                at[fresh] = len(rows) + sum(len(e) for e in extra) + torch.arange(int(fresh.sum()))
                extra.append(table.rows(k[fresh]))  # their initial rows (decayed, where the rows decay)
            out.append((d, at))
        rows = torch.cat([rows, *extra])
    else:
        out = batches
    return _Plain(rows, dense, model.manifest["model"]["bag_sizes"]).eval(), out


def _rate(fn, batches, seconds: float) -> float:
    """Samples/s of ``fn`` over ``batches``, cycled for ``seconds``."""
    fn(batches[0])
    done, start, i = 0, time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        b = batches[i % len(batches)]
        fn(b)
        done += len(b[0])
        i += 1
    return done / (time.perf_counter() - start)


def add_parser(bsub) -> None:
    """Register ``het bench predict`` on the subparsers of ``het bench``."""
    p = bsub.add_parser("predict", help="an export's scoring samples/s against plain nn.Embedding in RAM, one core")
    p.add_argument("--export", default=None, help="an export directory (default: train the job of the flags, "
                                                   "checkpoint and export it first)")
    p.add_argument("--train-steps", type=int, default=100, help="steps trained before exporting (without --export)")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "fp16", "int8"), help="the export's rows")
    p.add_argument("--score-batch", type=int, default=4096, help="rows scored at once (--batch is the training job's)")
    p.add_argument("--seconds", type=float, default=3.0, help="per round and side")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    add_config_flags(p, exclude=("steps", "checkpoint", "checkpoint_every", "resume", "workers", "export.dir",
                                 "export.every", "export.dtype", "publish.dir", "publish.every", "publish.base_every",
                                 "publish.keep"),
                     fixed={"workers": 1})
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_main)


@contextlib.contextmanager
def an_export(args, dtype: str = "fp32"):
    """The export a benchmark measures: ``--export``, or the job of the flags trained for
    ``--train-steps`` and exported into a temporary directory, removed afterwards."""
    if args.export is not None:
        yield args.export
        return
    work = tempfile.mkdtemp(prefix="het-bench-")
    try:
        yield trained_export(config_from_args(args), args.train_steps, work, dtype)[1]
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _main(args) -> None:
    with an_export(args, args.dtype) as export_dir:
        result = run(export_dir, args.score_batch, args.seconds, args.rounds, args.threads)
    if args.json:
        print(json.dumps(result, sort_keys=True))
        return
    print(f"het bench predict ({result['model']}, {result['dtype']}, {'dynamic' if result['dynamic'] else 'fixed'} "
          f"table of {result['rows']:,} rows, batch {result['batch']}, {result['threads']} thread): "
          f"het {statistics.median(result['het_samples_per_s']):,.0f} samples/s, plain nn.Embedding "
          f"{statistics.median(result['plain_samples_per_s']):,.0f}: {result['ratio']:.2f}x "
          f"(rounds {', '.join(f'{r:.2f}' for r in result['ratios'])})")
