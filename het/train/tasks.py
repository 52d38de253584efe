"""What a job trains: its data, its model, a batch, its loss and its evaluation. The worker
(het.train.loop) is the same for every task.

- :class:`CTRTask`: Wide&Deep, DeepFM, DCN or DLRM on synthetic Criteo-like data (or MLPerf's
  multi-hot shape of it) or prepared Criteo, its keys label-encoded or hashed; binary
  cross-entropy; AUC and log loss (and the planted model's AUC).
- :class:`GraphTask`: GraphSAGE on a graph, mini-batches of training nodes with sampled
  neighbourhoods; node-id embeddings are the sparse parameters; accuracy.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass

import numpy as np
import torch

from het.choices import Ids, Mode, Model, Pooling
from het.config import OptimizerConfig, TableConfig
from het.data.batch import Batch
from het.data.hashed import HashedIds
from het.data.validation import ValidatedTable
from het.dist.dense import dense_table
from het.models import DCN, DLRM, DeepFM, WideDeep
from het.nn.bags import FieldBags
from het.nn.fields import BASE_TABLE, FieldGroup, FieldTables, group_widths, plan_groups
from het.train.config import AUTO, TrainConfig
from het.train.widths import auto_width, field_ids, widths_of

CTR_MODELS = {Model.WDL: WideDeep, Model.DEEPFM: DeepFM, Model.DCN: DCN, Model.DLRM: DLRM}
EMBEDDING_TABLE = BASE_TABLE  # a job of one width's table; fields of several widths: one table a width


class CTRTask:
    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.progressive = None  # a stream's: each batch scored before it trains (het.train.streaming)
        if cfg.stream.pattern:
            from het.train.streaming import Progressive, StreamSource

            self.data = StreamSource.of(cfg.stream)
            self.progressive = Progressive(cfg.stream.window)
        elif cfg.data.startswith("criteo:"):
            from het.data.criteo import CriteoDataset

            self.data = CriteoDataset(cfg.data[len("criteo:"):])
        elif cfg.data.startswith("table:"):
            from het.data.table import TableDataset

            self.data = TableDataset(cfg.data[len("table:"):])
        else:
            from het.data.synthetic import SyntheticCriteo, SyntheticCriteoConfig, criteo_1tb

            s = cfg.synthetic
            preset = criteo_1tb if cfg.data == "synthetic-criteo-1tb" else SyntheticCriteoConfig
            self.data = SyntheticCriteo(preset(alpha=s.alpha, cap=s.cap, scale=s.scale, seed=s.seed))
        if hasattr(self.data, "rows"):  # a prepared table: validation rows apart, training reshuffled every epoch
            self.data = ValidatedTable(self.data, cfg.validation.frac, cfg.seed)
        hashed = cfg.ids == Ids.HASHED or cfg.data == "synthetic-criteo-1tb"  # MLPerf's shape: raw ids, always
        if hashed and self.data.num_rows is not None:  # (prepared hashed data is hashed already)
            self.data = HashedIds(self.data)
        # Multi-hot fields: the embedding pools each field's bag (a table's by its pooling, its padding
        # left out; synthetic bags by "sum"), the model sees one row a field.
        multi = max(getattr(self.data, "bag_sizes", (1,))) > 1
        self.pooling = Pooling(getattr(self.data, "pooling", Pooling.SUM)) if multi else None
        self.padding_key = getattr(self.data, "pad_key", None) if multi else None
        self.num_rows = self.data.num_rows  # None: hashed ids, a dynamic table
        self.num_ids = getattr(self.data, "num_ids", self.num_rows)  # ids in the data: what sizes the cache
        self.groups = self._groups(widths_of(cfg, self.data))  # None: one table of width dim
        self.dim = self.cfg.dim if self.groups is None else group_widths(self.groups)
        self.loss_fn = torch.nn.BCEWithLogitsLoss()

    def _groups(self, widths: list[int] | None) -> list[FieldGroup] | None:
        """The tables of fields of several widths (fixed ones of their fields' keys only, where
        the keys are the data's label-encoded ones); ``None`` for one width."""
        if widths is None or len(set(widths)) == 1:
            if widths:
                self.cfg = dataclasses.replace(self.cfg, dim=widths[0])
            return None
        fixed = self.num_rows is not None and getattr(self.data, "offsets", None) is not None
        return plan_groups(widths, getattr(self.data, "bag_sizes", None),
                           self.data.cardinalities if fixed else None, self.data.offsets if fixed else None)

    def table_ids(self) -> dict[str, int]:
        """The ids each embedding table may hold (what sizes its cache)."""
        if self.groups is None:
            return {EMBEDDING_TABLE: self.num_ids}
        if all(g.rows is not None for g in self.groups):
            return {g.table: g.rows for g in self.groups}
        ids = field_ids(self.data)
        return {g.table: sum(ids[f] for f in g.fields) for g in self.groups}

    def build_model(self, embedding: torch.nn.Module) -> torch.nn.Module:
        torch.manual_seed(self.cfg.seed)  # every worker starts from the same dense parameters
        if self.groups:  # keys (B, L) -> a group of rows (B, F_g, D_g) a width
            embedding = FieldTables(embedding, self.groups, pooled=bool(self.pooling))
        elif self.pooling:  # keys (B, L) -> one pooled row per field (B, F, D)
            embedding = FieldBags(embedding, self.data.bag_sizes)
        return CTR_MODELS[self.cfg.model](embedding, num_fields=self.data.num_fields, dim=self.dim,
                                          num_dense=self.data.num_dense)

    def batch(self, step: int, rank: int, world: int, device) -> Batch | None:
        """Rank ``rank``'s batch of a step: batch ``step * world + rank`` of the data; of a
        stream, the step's share (None once it ended), each row's partition in ``parts``."""
        if self.progressive is None:
            return self.data.batch("train", step * world + rank, self.cfg.batch).to(device)
        got = self.data.step_batch(step, self.cfg.batch)
        if got is None:
            return None
        from het.train.streaming import StreamBatch

        b = got[0].to(device)
        return StreamBatch(b.dense, b.sparse, b.labels, got[1])

    @staticmethod
    def keys(batch: Batch) -> torch.Tensor:
        return batch.sparse

    def steps_per_epoch(self, world: int) -> int | None:
        """Steps of one pass over the training split by ``world`` ranks (None: an endless stream)."""
        rows = getattr(self.data, "rows", None)
        return None if rows is None else max(1, math.ceil(rows["train"] / (self.cfg.batch * world)))

    def loss(self, model, batch: Batch) -> torch.Tensor:
        logits = model(batch.dense, batch.sparse)
        if self.progressive is not None:  # a stream's batch, scored before it trains
            self.progressive.add(logits, batch.labels, batch.parts)
            if not len(batch.labels):  # the last step's rows went to other ranks: no gradient here
                return logits.sum() * 0.0
        return self.loss_fn(logits, batch.labels)

    @torch.no_grad()
    def evaluate(self, model, samples: int, device, rank: int = 0, world: int = 1, gather=None,
                 batch_size: int = 8192, split: str = "test") -> dict:
        """AUC and log loss on the first ``samples`` samples of ``split`` (and the planted AUC).

        With ``world`` ranks, rank ``r`` scores the held-out batches ``r, r + world, ...`` and
        ``gather`` (an all-gather of Python objects: every rank's object, in rank order) brings
        the scores together, so every rank returns the same metrics.
        """
        parts = (gather or _alone)(self.test_scores(model, samples, device, rank, world, batch_size, split))
        y, p, q = (_cat([part[k] for part in parts]) for k in range(3))
        from sklearn.metrics import log_loss  # here: sklearn costs 1.5 s of every het command's start

        out = {"auc": _auc(y, p), "logloss": float(log_loss(y, np.clip(p, 1e-7, 1 - 1e-7), labels=[0, 1]))}
        if 0 < len(y) < 1000 and not math.isnan(out["auc"]):  # a small split: how far its AUC may be off
            out["auc_ci95"] = list(auc_interval(out["auc"], int(y.sum()), int(len(y) - y.sum())))
        if q.size:
            out["planted_auc"] = _auc(y, q)
        return out

    @torch.no_grad()
    def test_scores(self, model, samples: int, device, rank: int = 0, world: int = 1,
                    batch_size: int = 8192, split: str = "test") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(labels, probabilities, planted logits)`` of rank ``rank``'s share of the first
        ``samples`` held-out samples (batches ``rank, rank + world, ...`` of ``batch_size``), in
        order; the planted logits are empty for data without a planted model."""
        labels, preds, planted = [], [], []
        has_planted = hasattr(self.data, "planted_logits")
        stored = hasattr(self.data, "rows")  # a prepared split: batch i of k samples holds samples i*k ..
        if stored:
            samples = min(samples, self.data.rows[split])
        for i in range(rank, math.ceil(samples / batch_size), world):
            size = min(batch_size, samples - i * batch_size)
            b = self.data.batch(split, i, batch_size if stored else size)
            b = Batch(b.dense[:size], b.sparse[:size], b.labels[:size])  # the last stored batch: its head
            preds.append(torch.sigmoid(model(b.dense.to(device), b.sparse.to(device))).cpu().numpy())
            labels.append(b.labels.numpy())
            if has_planted:
                planted.append(self.data.planted_logits(b.sparse, b.dense))
        return tuple(_cat(x) for x in (labels, preds, planted))


@dataclass
class GraphBatch:
    """Seed nodes, their sampled blocks (input layer first) and what the model reads."""

    seeds: torch.Tensor
    blocks: list
    input_nodes: torch.Tensor
    features: torch.Tensor | None
    labels: torch.Tensor


class GraphTask:
    pooling = padding_key = None  # one row per key

    progressive = None  # no stream: a graph's nodes are scored at the end

    def __init__(self, cfg: TrainConfig):
        from het.data.graph import load, normalize_features
        from het.data.sampler import NeighborSampler

        self.graph = normalize_features(load(cfg.data))
        self.num_rows = self.num_ids = self.graph.num_nodes
        if cfg.dim == AUTO:  # one table of node ids: one width, from their number
            cfg = dataclasses.replace(cfg, dim=auto_width(self.num_rows))
        self.cfg, self.dim, self.groups = cfg, cfg.dim, None
        self.sampler = NeighborSampler(self.graph, fanouts=cfg.graph.fanouts, seed=cfg.seed)
        self.train_nodes = torch.from_numpy(np.flatnonzero(_np(self.graph.train_mask)))
        self.loss_fn = torch.nn.CrossEntropyLoss()

    def build_model(self, embedding: torch.nn.Module) -> torch.nn.Module:
        from het.models.graphsage import GraphSAGE

        torch.manual_seed(self.cfg.seed)
        features = self.graph.features
        dropout, embedding_dropout = self.dropouts
        return GraphSAGE(embedding, dim=self.dim, in_features=0 if features is None else features.shape[1],
                         num_classes=self.graph.num_classes, hidden=self.cfg.graph.hidden,
                         layers=len(self.cfg.graph.fanouts), dropout=dropout,
                         embedding_dropout=embedding_dropout, aggregator=self.cfg.graph.aggregator)

    @property
    def dropouts(self) -> tuple[float, float]:
        """The model's dropouts: as set, or their defaults for the share of nodes labelled."""
        return self.cfg.graph.dropouts(len(self.train_nodes) / max(1, self.graph.num_nodes))

    def batch(self, step: int, rank: int, world: int, device) -> GraphBatch:
        """Rank ``rank``'s seeds of a step: the training nodes in a fresh seeded order every
        epoch, cut into global batches of ``batch * world``."""
        per_step = self.cfg.batch * world
        steps_per_epoch = max(1, math.ceil(len(self.train_nodes) / per_step))
        epoch, i = divmod(step, steps_per_epoch)
        order = self.train_nodes[torch.randperm(len(self.train_nodes),
                                                generator=torch.Generator().manual_seed(self.cfg.seed + epoch))]
        seeds = order[i * per_step:(i + 1) * per_step][rank::world]
        return self.gather(seeds, self.sampler, device)

    def gather(self, seeds: torch.Tensor, sampler, device) -> GraphBatch:
        blocks = [b.to(device) for b in sampler.sample(seeds)]
        input_nodes = blocks[0].src_nodes
        features = self.graph.features
        features = None if features is None else torch.as_tensor(features)[input_nodes.cpu()].to(device)
        labels = torch.as_tensor(self.graph.labels)[seeds].to(device)
        return GraphBatch(seeds.to(device), blocks, input_nodes, features, labels)

    @staticmethod
    def keys(batch: GraphBatch) -> torch.Tensor:
        return batch.input_nodes

    def steps_per_epoch(self, world: int) -> int:
        return max(1, math.ceil(len(self.train_nodes) / (self.cfg.batch * world)))

    def table_ids(self) -> dict[str, int]:
        return {EMBEDDING_TABLE: self.num_ids}

    def loss(self, model, batch: GraphBatch) -> torch.Tensor:
        return self.loss_fn(model(batch.input_nodes, batch.features, batch.blocks), batch.labels)

    @torch.no_grad()
    def evaluate(self, model, samples: int, device, rank: int = 0, world: int = 1, gather=None,
                 batch_size: int = 1024, split: str = "test") -> dict:
        """Accuracy on the validation and test nodes (both, whichever ``split``), over their whole
        neighbourhoods. With
        ``world`` ranks each classifies every ``world``-th batch of nodes and ``gather`` (as in
        :meth:`CTRTask.evaluate`) sums the counts, so every rank returns the same metrics."""
        from het.data.sampler import NeighborSampler

        full = NeighborSampler(self.graph, fanouts=[-1] * len(self.cfg.graph.fanouts), seed=0)  # every neighbour
        counts = {}
        for split, mask in (("val", self.graph.val_mask), ("test", self.graph.test_mask)):
            nodes = torch.from_numpy(np.flatnonzero(_np(mask)))
            correct = 0
            for lo in range(rank * batch_size, len(nodes), world * batch_size):
                b = self.gather(nodes[lo:lo + batch_size], full, device)
                correct += int((model(b.input_nodes, b.features, b.blocks).argmax(1) == b.labels).sum())
            counts[split] = (correct, len(nodes))
        parts = (gather or _alone)(counts)
        out = {}
        for split, (_, total) in counts.items():
            correct = sum(part[split][0] for part in parts)
            out[f"{split}_acc"] = correct / total if total else math.nan
        return out


def make_task(cfg: TrainConfig):
    return GraphTask(cfg) if cfg.is_graph else CTRTask(cfg)


def job_tables(cfg: TrainConfig, task=None) -> list[TableConfig]:
    """The PS tables a job needs: the embedding table, and the dense one in mode ``ps``. The
    embedding table is dynamic (any int64 key) when the task's keys are hashed ids
    (``task.num_rows is None``), or when admission, expiry or a row budget is asked for: they
    apply only to dynamic tables."""
    task = task or make_task(cfg)
    asked = set(cfg.table.dynamic_asked()) - {"admit_counters"}  # the sketch's size alone asks for no admission
    fixed = task.num_rows is not None and cfg.shard.memory is None and not asked
    groups = task.groups or [FieldGroup(EMBEDDING_TABLE, task.dim, (), (), (), None, task.num_rows)]
    tables = []
    for g in groups:
        if fixed and g.rows is not None:
            tables.append(TableConfig(g.table, rows=g.rows, dim=g.width, optimizer=row_optimizer(cfg), seed=cfg.seed,
                                      row_dtype=cfg.table.row_dtype, row_rounding=cfg.table.row_rounding))
        else:  # hashed ids, or label-encoded ones under admission, expiry or a budget (rows or memory)
            tables.append(TableConfig(g.table, rows=None, dim=g.width, optimizer=row_optimizer(cfg), seed=cfg.seed,
                                      **cfg.table.settings()))
    if cfg.mode == Mode.PS:
        tables.append(dense_table(dense_params(cfg, task), cfg.dense_lr, cfg.schedule.of(cfg.steps)))
    return tables


def row_optimizer(cfg: TrainConfig) -> OptimizerConfig:
    """The embedding table's optimizer: ``cfg.optimizer`` at ``cfg.lr`` under the job's schedule,
    its rows decaying by ``row_l2`` (het.decay); FTRL with its L1 and L2, unscheduled."""
    if cfg.optimizer == "ftrl":
        return OptimizerConfig(cfg.optimizer, lr=cfg.lr, l1=cfg.row_l1, l2=cfg.row_l2)
    return OptimizerConfig(cfg.optimizer, lr=cfg.lr, l2=cfg.row_l2, schedule=cfg.schedule.of(cfg.steps))


def dense_params(cfg: TrainConfig, task=None) -> int:
    """Dense (non-embedding) parameters of ``cfg``'s model, counted on meta tensors (no memory,
    so dim 4096 is free)."""
    task = task or make_task(cfg)
    with torch.device("meta"):
        model = task.build_model(torch.nn.Identity())
    model.embedding = torch.nn.Identity()
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """ROC AUC, or NaN when the labels hold one class only (a tiny held-out split)."""
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(labels, scores)) if len(np.unique(labels)) == 2 else math.nan


def _alone(obj) -> list:
    """The all-gather of a job of one rank."""
    return [obj]


def _cat(arrays: list) -> np.ndarray:
    """The non-empty ``arrays`` concatenated (an empty part, from a rank that had no batch,
    would change the dtype); empty when all are."""
    arrays = [a for a in arrays if a.size]
    return np.concatenate(arrays) if arrays else np.empty(0)


def _np(x) -> np.ndarray:
    return x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def resolve_epochs(cfg: TrainConfig, world: int) -> TrainConfig:
    """``cfg`` with ``steps`` for its ``epochs`` (passes over the training split by ``world``
    ranks), or ``cfg`` itself without epochs."""
    if cfg.epochs is None:
        return cfg
    per_epoch = make_task(cfg).steps_per_epoch(world)
    if per_epoch is None:
        raise ValueError(f"epochs: {cfg.data} is an endless stream; give steps instead")
    return dataclasses.replace(cfg, steps=max(1, math.ceil(cfg.epochs * per_epoch)))


def warn_of_data(cfg: TrainConfig, world: int, task=None) -> None:
    """Print :func:`data_warnings` on stderr (nothing when the data cannot be read: the job
    itself names what is wrong with it)."""
    try:
        for line in data_warnings(cfg, world, task):
            print(f"het train: warning: {line}", file=sys.stderr, flush=True)
    except (ValueError, OSError):
        pass


def data_warnings(cfg: TrainConfig, world: int, task=None) -> list[str]:
    """What a user should know of a prepared table before training on it, one line each: a
    training split smaller than one global batch, a test split too small for a steady AUC."""
    if cfg.is_graph or not cfg.data.startswith(("table:", "criteo:")):
        return []
    rows = (task or make_task(cfg)).data.rows
    out = []
    if rows["train"] < cfg.batch * world:
        out.append(f"the training split holds {rows['train']:,} rows, fewer than one global batch ({world} workers "
                   f"x {cfg.batch}): every step repeats rows; a smaller --batch fits the data")
    if 0 < rows["test"] < 1000:
        out.append(f"the test split holds {rows['test']:,} rows: its AUC moves by a few hundredths from one split "
                   f"to another (the summary gives its 95% interval)")
    return out


def auc_interval(auc: float, positives: int, negatives: int) -> tuple[float, float]:
    """The AUC's 95% interval (Hanley and McNeil 1982), for a small test split.

    Example:
        >>> lo, hi = auc_interval(0.8, 20, 80); round(lo, 3), round(hi, 3)
        (0.677, 0.923)
    """
    q1, q2 = auc / (2 - auc), 2 * auc * auc / (1 + auc)
    var = (auc * (1 - auc) + (positives - 1) * (q1 - auc * auc) + (negatives - 1) * (q2 - auc * auc)) / max(
        positives * negatives, 1)
    half = 1.96 * math.sqrt(max(var, 0.0))
    return max(0.0, auc - half), min(1.0, auc + half)
