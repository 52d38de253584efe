"""One worker's training: build, step, evaluate, summarise. Runs under torchrun or the local
cluster launcher (het.dist.launch) alike: rank and world size come from the environment.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from tqdm import tqdm

from het.choices import Mode, Optimizer
from het.config import CacheConfig
from het.dist.collectives import barrier, gather, join_group, local_device
from het.dist.dense import AllReduceDense, DenseSync, PSDense
from het.nn.embedding import Embedding
from het.ps.client.client import PSClient
from het.train import checkpoint
from het.train.board import Board
from het.train.config import TrainConfig
from het.train.exports import Outputs
from het.train.rejoin import Rejoin, directory as rejoin_directory
from het.train.selection import Keeper, eval_every
from het.train.streaming import Progressive
from het.train.summary import job_summary
from het.train.tasks import make_task, resolve_epochs
from het.train.timeline import Timeline, disk_postfix

# After SIGTERM, how long a wait for a silent shard goes on (a live shard answers in milliseconds).
STOP_GRACE_S = 1.0
TORCH_OPTIMIZERS = {Optimizer.SGD: torch.optim.SGD, Optimizer.ADAGRAD: torch.optim.Adagrad,
                    Optimizer.ADAM: torch.optim.Adam}  # the dense layers' (DENSE_OPTIMIZERS)
DENSE_DEFAULT = {Optimizer.ROWWISE_ADAGRAD: Optimizer.ADAGRAD, Optimizer.FTRL: Optimizer.ADAGRAD}


class Worker:
    """One rank's task, model, caches, dense synchronisation and counters.

    ``model`` is the model itself (checkpoints and evaluation read it); the training step calls
    ``dense.forward_module``, which is the DistributedDataParallel wrapper around it when there
    are several workers in modes het and hybrid.
    """

    def __init__(self, cfg: TrainConfig, client: PSClient, rank: int = 0, world: int = 1,
                 device: torch.device | str = "cpu"):
        self.cfg, self.client, self.rank, self.world = cfg, client, rank, world
        self.device = torch.device(device)
        self.task = make_task(cfg)
        if self.task.progressive is not None:  # a stream: read as rank `rank` of `world`, waits ended by SIGTERM
            self.task.data.attach(rank, world)
            self.task.progressive = Progressive(-(-cfg.stream.window // world))  # a rank's share of the window
            self.task.data.stop = lambda: self.stop
        ids = self.task.table_ids()  # one table, or one a width
        share = {name: n / max(1, sum(ids.values())) for name, n in ids.items()}
        caches = {name: CacheConfig(capacity=(c := cfg.cache_rows_for(n, share[name])), staleness=cfg.staleness,
                                    **(cfg.cache.settings() | ({} if c else {"lookahead": 0})))
                  for name, n in ids.items()}
        self.cache_rows = sum(c.capacity for c in caches.values())
        self.embedding = Embedding(tables=[client.tables[n] for n in ids], client=client, cache=caches,
                                   device=self.device,
                                   grad_scale=1.0 / world, push_dtype=cfg.push_dtype, mode=self.task.pooling,
                                   padding_idx=self.task.padding_key)
        self.model = self.task.build_model(self.embedding).to(self.device)
        self.dense = self._dense_sync()
        self.bsp = cfg.staleness == 0
        self.prefetch = cfg.prefetch and not self.bsp
        self.lookahead = max(c.lookahead for c in caches.values())
        # the coming steps: made and announced `lookahead` steps early, synced one step early
        self.upcoming = self.embedding.upcoming
        self.upcoming.follow(lambda step: self.task.batch(step, rank, world, self.device), self.task.keys,
                             ahead=self.lookahead, early=self.prefetch)
        self.step_count = 0
        self.start = 0  # the step training starts from (a resumed job's)
        self.schedule = cfg.schedule.of(cfg.steps)
        self.last_loss = math.nan
        self.flush_s, self.flush_bytes = 0.0, 0  # the final flushes': time and sparse bytes
        self.stop = False  # set by SIGTERM; every rank stops at the same step boundary
        self.early_stop = False  # validation stopped improving (het.train.selection): every rank alike
        self.out_of_time = False  # cfg.time_limit_s passed on some rank: every rank stops at that step

    def _dense_sync(self) -> DenseSync:
        if self.cfg.mode == Mode.PS:
            dense = PSDense(self.model, self.client, self.world, self.rank)
            barrier(self.world)  # rank 0 has written the initial dense values
            return dense
        # dense layers under a row-wise Adagrad table get plain Adagrad (no rows to share a sum), as under FTRL
        optimizer = TORCH_OPTIMIZERS[self.cfg.dense_optimizer or DENSE_DEFAULT.get(self.cfg.optimizer, self.cfg.optimizer)]
        return AllReduceDense(self.model, self.world, self.device, optimizer, self.cfg.dense_compression,
                              powersgd_rank=self.cfg.powersgd_rank, lr=self.cfg.dense_lr,
                              weight_decay=self.cfg.weight_decay)

    def step(self, batch, next_batch=None) -> float:
        """One training step; returns the loss. Reads top to bottom."""
        self._schedule(self.start + self.step_count + 1)          # the learning rates of this step
        self.dense.before_forward()                               # mode ps: pull the dense parameters
        self.upcoming.send_early(batch, next_batch)               # syncs fly while this step computes
        loss = self.task.loss(self.dense.forward_module, batch)   # rows: cache, or the prefetched sync
        self.dense.zero_grad()
        loss.backward()                                           # rows' gradients -> cache; dense AllReduce
        self.dense.after_backward()                               # local optimizer step, or push to the PS
        if self.bsp:                                              # s = 0: every push applied before any pull
            self.embedding.push_due()
            barrier(self.world)
        self.step_count += 1
        self.last_loss = float(loss.detach())
        return self.last_loss

    def _schedule(self, step: int) -> None:
        """Both learning rates at ``step`` (1, 2, ...) under the job's schedule: the dense
        optimizer's, and the caches' local updates' (the shards scale their own by the step each
        push carries)."""
        if not self.schedule.active:
            return
        factor = self.schedule.factor(step)
        self.dense.scale_lr(factor)
        self.embedding.scale_lr(factor)

    def train(self, steps: int, start: int = 0, progress: bool = True, on_step=None) -> dict:
        bar = tqdm(total=None if self.task.progressive is not None else steps - start, desc=f"het train ({self.cfg.mode}, s={self.cfg.staleness})",
                   unit="step", disable=not progress or self.rank != 0, mininterval=0.5)
        # rank 0 alone asks the shards how they fare: the summary's timeline, the bar's rows on disk
        timeline = Timeline(self._shard_stats, self.cfg.ps_stats_every if self.rank == 0 else 0,
                            self.cfg.batch * self.world, start)
        barrier(self.world)  # every rank's clock starts together: the time limit and samples/s are the job's
        start_time = time.perf_counter()
        self.start = start
        batch = self.upcoming.batch(start, end=steps) if start < steps else None
        loss = math.nan
        for step in range(start, steps):
            if batch is None:  # a stream ended (het.train.streaming): every rank at the same step
                break
            # the next batch before this step only to send its sync early: a stream's may wait for data
            early = self.prefetch and step + 1 < steps
            next_batch = self.upcoming.batch(step + 1, end=steps) if early else None
            loss = self.step(batch, next_batch)
            if not early and step + 1 < steps:
                next_batch = self.upcoming.batch(step + 1, end=steps)
            batch = next_batch
            left = steps - step - 1
            if self.lookahead and not self.bsp and 0 < left <= self.lookahead:
                # the window holds every step left: rows none of them uses are pushed now, a
                # share a step, instead of all in the final flush
                self.embedding.push_idle(1 / left)
            stats = self.embedding.total_stats()
            elapsed = time.perf_counter() - start_time
            entry = timeline.after_step(step + 1)
            if entry is not None and self.task.progressive is not None:  # a stream's latest rows, scored
                entry["progressive"] = self.task.progressive.window_metrics()
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.4f}", hit_rate=f"{stats.get('hit_rate', 0):.3f}",
                            samples_per_s=f"{(step + 1 - start) * self.cfg.batch * self.world / elapsed:,.0f}",
                            **disk_postfix(timeline.last), refresh=False)
            if on_step is not None:
                on_step(step + 1)  # a checkpoint or an evaluation: the next step prefetches again
            if self._stop_requested(time.perf_counter() - start_time) or self.early_stop:
                break
        self._flush()
        barrier(self.world)
        bar.close()
        return {"wall_s": time.perf_counter() - start_time, "loss": loss, "timeline": timeline.entries}

    def _shard_stats(self) -> list[dict]:
        """The shards' STATS (the timeline's), reporting a stream's rolling progressive AUC and
        log loss over this rank's share of the latest rows, which the shards serve among their
        Prometheus metrics (``het_job_stream_auc_window``, ...)."""
        if self.task.progressive is None:
            return self.client.stats()
        window = self.task.progressive.window_metrics()
        report = {"stream_auc_window": window["auc"], "stream_logloss_window": window["logloss"],
                  "stream_rows_scored": float(sum(t[:2].sum() for t in self.task.progressive.parts.values()))}
        return self.client.stats(report={k: v for k, v in report.items() if math.isfinite(v)})

    def _flush(self) -> None:
        """Push every cache's pending updates (the end of training), timing it and counting its
        pushes' bytes apart (not the syncs of prefetches it completes after a stop)."""
        before, start = self.embedding.traffic["sparse_push"], time.perf_counter()
        self.embedding.flush()
        self.flush_s += time.perf_counter() - start
        self.flush_bytes += self.embedding.traffic["sparse_push"] - before

    def _stop_requested(self, elapsed_s: float) -> bool:
        """Whether every rank stops after this step: SIGTERM reached one (``stop``), or training ran
        past ``cfg.time_limit_s`` on one (``out_of_time``, then set on every rank)."""
        limit = self.cfg.time_limit_s
        out_of_time = limit is not None and elapsed_s >= limit
        if self.world == 1:
            self.out_of_time = out_of_time
            return self.stop or out_of_time
        flags = torch.tensor([float(self.stop), float(out_of_time)], device=self.device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)  # two floats a step: any rank's signal or clock stops all
        self.out_of_time = bool(flags[1].item())
        return bool(flags.max().item())

    def evaluate(self, samples: int, split: str = "test") -> dict:
        """Held-out metrics of ``split`` (test, or val), computed by all ranks together: every
        rank must call it. Each scores its share of the held-out data, reading rows as the PS holds them (the cache's
        bound is 0 meanwhile: ``Embedding.fresh``), and every rank gets the metrics of the
        whole. In mode ps the dense parameters are pulled first, so every rank scores with the
        same, latest ones."""
        self.dense.before_forward()
        self.model.eval()
        try:
            with self.embedding.fresh():
                return self.task.evaluate(self.model, samples, self.device, self.rank, self.world,
                                          lambda part: gather(part, self.world), split=split)
        finally:
            self.model.train()

    def counters(self) -> dict:
        """This rank's traffic, cache and time counters (summed over ranks by the summary)."""
        stats = self.embedding.total_stats()
        dense = self.dense.counters()
        return {**{k: stats.get(k, 0) for k in ("lookups", "hits", "misses", "stale_refreshes", "evictions",
                                                "drift_sq", "drift_norm_sq")},
                **{k: self.embedding.traffic.get(k, 0) for k in ("sparse_pull", "sparse_push", "sync")},
                "dense": dense["dense"], "wait_ps_s": self.embedding.wait_s + dense["wait_ps_s"],
                "allreduce_s": dense["allreduce_s"], "flush_s": self.flush_s, "flush_bytes": self.flush_bytes}


def run_worker(cfg: TrainConfig, addresses: list[str], secret: bytes | None = None, progress: bool = True,
               timeout_s: float = 60.0) -> dict | None:
    """Train as one rank (rank and world from torchrun's environment variables); rank 0
    returns the job's summary, the other ranks None."""
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    cfg = resolve_epochs(cfg, world)
    device = local_device()
    join_group(world, device)
    # with write-ahead logs a shard that dies is started again in place: wait for it, re-send
    client = PSClient.connect(addresses, timeout_s=timeout_s, secret=secret, lazy_init=cfg.lazy_init,
                              reconnect_s=120.0 if cfg.ps_wal else 0.0, encrypt=cfg.ps_encrypt)
    board = None
    try:
        worker = Worker(cfg, client, rank, world, device)
        rejoin = Rejoin(worker, rejoin_directory(cfg.rejoin_dir), cfg.dense_snapshot_s)  # a group re-formed
        start = rejoin.begin(lambda: checkpoint.restore(worker, cfg.resume) if cfg.resume else 0)
        keeper = Keeper(worker, eval_every(cfg, worker.task, world), cfg.eval_samples)
        board = Board(worker, cfg.tensorboard_dir, cfg.tensorboard_every)
        curve = _Curve(worker, cfg.eval_curve if not cfg.is_graph and cfg.eval_samples else 0, cfg.eval_samples,
                       board.evaluation)
        outputs = Outputs(worker, cfg, lambda: PSClient.connect(  # exports, publications (a thread's client)
            addresses, timeout_s=timeout_s, secret=secret, reconnect_s=120.0 if cfg.ps_wal else 0.0,
            encrypt=cfg.ps_encrypt))
        hooks = [h for h in (checkpoint.saver(worker, cfg), *outputs.hooks, keeper, curve, board, rejoin) if h]
        if outputs.publishes is not None and worker.task.progressive is not None:
            worker.task.data.on_caught_up = outputs.publishes.caught_up  # a stream's rows served once trained
        # SIGTERM: stop at the next step boundary, flush, exit 143; a peer's death: flush, exit for a rejoin
        with _stop_on_sigterm(worker), rejoin.guard(lambda: start + worker.step_count):
            run = worker.train(cfg.steps, start, progress, on_step=lambda step: [h(step) for h in hooks])
        _exit_if_stopped(worker, start)
        steps = worker.step_count  # cfg.steps - start, or fewer when the time limit or validation stopped it
        kept = keeper.finish(start + steps) if keeper else start + steps  # the best validated model, put back
        if cfg.checkpoint and (kept != start + steps or (cfg.stream.pattern and kept != checkpoint.saved_step(
                cfg.checkpoint))):  # the checkpoint holds the model the job ends with (a stream's: at its end)
            checkpoint.save(worker, cfg.checkpoint, kept)
        written = outputs.finish(start + steps, kept)  # every cache flushed: the last publication
        per_rank = gather(worker.counters(), world)
        scored = worker.task.progressive.merged(world) if worker.task.progressive is not None else None
        metrics = worker.evaluate(cfg.eval_samples) if cfg.eval_samples else {}  # every rank its share
        board.evaluation(start + steps, metrics)
        summary = None
        if rank == 0:
            if cfg.checkpoint:  # a checkpoint of the kept step holds the model just evaluated
                checkpoint.record_evaluation(cfg.checkpoint, kept, metrics)
            summary = job_summary(worker, run, per_rank, metrics, start, kept, curve, keeper, scored)
            summary.update(written, **rejoin.summary(start, steps))
        # every rank leaves together, and only after its DDP model is gone: a rank that tore its
        # process group down while a peer still used it, or before DDP's reducer, could abort at
        # exit ("terminate called without an active exception", seen once in 31 local jobs)
        barrier(world)
        return summary
    finally:
        client.close()
        if board is not None:
            board.close()
        worker = keeper = curve = hooks = outputs = board = None  # DDP's reducer goes before the process group it uses
        gc.collect()
        if world > 1 and dist.is_initialized():
            dist.destroy_process_group()


def _exit_if_stopped(worker: Worker, start: int) -> None:
    """SIGTERM stopped the worker (its cache flushed): exit 143."""
    if worker.stop:
        _say(f"het train: worker {worker.rank} stopped by SIGTERM after step {start + worker.step_count}, "
             f"its cache flushed")
        raise SystemExit(143)


class _Curve:
    """Held-out metrics every ``every`` steps while training (``eval_curve``), all ranks
    together: how a metric moves with the steps, e.g. the gap between staleness bounds. The
    last point is the final evaluation, after the flush."""

    def __init__(self, worker: Worker, every: int, samples: int, on_point=lambda step, metrics: None):
        self.worker, self.every, self.samples, self.on_point = worker, every, samples, on_point
        self.points: list[dict] = []

    def __bool__(self) -> bool:
        return self.every > 0

    def __call__(self, step: int) -> None:
        if step % self.every == 0 and step < self.worker.cfg.steps:  # the end is evaluated anyway
            metrics = self.worker.evaluate(self.samples)
            self.points.append({"step": step, **metrics})
            self.on_point(step, metrics)


@contextlib.contextmanager
def _stop_on_sigterm(worker: Worker):
    """SIGTERM asks the worker to stop: it finishes its step, flushes, and leaves (exit 143).

    A worker blocked on a shard that is gone (the launcher tears the job down because the shard
    died, or the launcher died and took the shards along) would otherwise sit out the PS timeout
    (60 s) before it saw the flag: the client gives up on a silent shard about a second after
    the signal instead (a checkpoint being written then is abandoned: its temporary directory
    goes at the next save), and so does a peer's collective once that worker left. Either
    failure, after SIGTERM, is the stop asked for: one line, exit 143, no traceback.
    """
    def handler(signum, frame):
        worker.stop = True
        worker.client.stop_waiting(STOP_GRACE_S)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    except Exception as e:
        if not worker.stop:
            raise
        reason = (str(e).strip().splitlines() or [""])[0][:300]
        _say(f"het train: worker {worker.rank} stopped by SIGTERM, its cache not flushed: "
             f"{type(e).__name__}: {reason}")
        raise SystemExit(143) from None
    finally:
        signal.signal(signal.SIGTERM, previous)


def _say(line: str) -> None:
    """Print ``line`` on stderr, if it is still there: a launcher that died took its pipe along."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass
