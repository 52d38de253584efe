"""The training job's config: one frozen dataclass, the only source of a job's settings.

Every setting is a field with its help text beside it; the ``het train`` flags and the TOML
keys are generated from the fields (:mod:`het.train.flags`), so adding a setting is one line
here. A field whose default depends on the model is ``None`` in the dataclass and takes its
model's value from :data:`MODEL_DEFAULTS` when the config is built, whichever way it is built
(``TrainConfig(model="deepfm")``, a TOML file, ``het train --model deepfm``)::

    model = "wdl"            # --model wdl
    staleness = 100          # --staleness 100 ("inf" for none)
    steps = 300
    [synthetic]              # --synthetic-cap 100000: a nested table's key is --TABLE-KEY
    cap = 100000
    [graph]                  # GraphSAGE only: --graph-fanouts 10,5
    fanouts = [10, 5]

Types are strict: a TOML ``steps = "abc"``, ``workers = 1.0`` or ``staleness = true`` is
refused with one line naming the key, the type expected and the value found.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass

from het.choices import (DENSE_OPTIMIZERS, GRAPH_MODELS, DenseCompression, Ids, Mode, Model, Optimizer, PushDtype,
                         RowDtype)
from het.config import CacheSettings, ShardSettings, TableSettings, parse_bytes, plain, setting
from het.staleness import format_staleness
from het.train.defaults import MODEL_DEFAULTS, TABLE_DEFAULTS, Samples
from het.train.fields import build, check_fields, merge, require, set_dotted
from het.train.sections import (CACHE_SLOT_BYTES, ExportConfig, GraphConfig, JobCache, PublishConfig, ScheduleConfig,
                                StreamConfig, SyntheticConfig, ValidationConfig)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

MODES, MODELS = Mode.values(), Model.values()
STREAM, STREAM_STEPS = "stream", 1 << 40  # a stream job's data, and its steps: until its stream ends
CTR_DATA = ("synthetic-criteo", "synthetic-criteo-1tb", "criteo:DIR", "table:DIR")
GRAPH_DATA = ("cora", "planetoid:DIR", "npz:PATH", "synthetic-graph", "synthetic-graph:NODES")

PREPARED = ("table:", "criteo:")
AUTO, AUTO_MOST = "auto", 64  # dim = "auto": a width a field from its distinct ids, at most 64


# Settings spelled otherwise before, by their old key: TOML keys and flags (``--ps-memory``) of
# these still work, each saying once, on stderr, how it is spelled.
RENAMED = {"ps_memory": "shard.memory", "ps_wal_max": "shard.wal_max", "ps_memory_policy": "shard.memory_policy",
           "ps_page_in": "shard.page_in", **{name: f"table.{name}" for name in TableSettings.__dataclass_fields__},
           "cache_frac": "cache.frac", "cache_rows": "cache.rows", "cache_memory": "cache.memory",
           **{name: f"cache.{name}" for name in CacheSettings.__dataclass_fields__}}


def renamed(d: dict) -> dict:
    """``d`` (a config's keys) with every key of :data:`RENAMED` moved to its new place (a new
    key given beside it wins), saying so on stderr.

    Example:
        >>> renamed({"ps_memory": "2GiB", "steps": 3})  # and a line on stderr
        {'steps': 3, 'shard': {'memory': '2GiB'}}
    """
    for old, new in RENAMED.items():
        if old in d:
            value = d.pop(old)
            head, _, leaf = new.partition(".")
            section = d.setdefault(head, {})
            if isinstance(section, dict):
                section.setdefault(leaf, value)
            say_renamed(old, new)
    return d


def say_renamed(old: str, new: str) -> None:
    """One line on stderr: setting ``old`` is spelled ``new`` (once a process for each)."""
    if (old, new) not in _SAID:
        _SAID.add((old, new))
        print(f"het: {old} is spelled {new} (flag --{new.replace('.', '-').replace('_', '-')}); the old "
              f"spelling will be removed", file=sys.stderr)


_SAID: set = set()


@dataclass(frozen=True)
class TrainConfig:
    """A training job. ``batch`` is per worker; ``lr`` is the sparse (PS) learning rate. Fields
    left ``None`` take their model's default (:data:`MODEL_DEFAULTS`), and on a prepared table
    first :data:`TABLE_DEFAULTS`.

    Example:
        >>> TrainConfig(model="deepfm").lr, TrainConfig(model="deepfm", lr=0.05).lr
        (0.01, 0.05)
        >>> TrainConfig(model="graphsage").data
        'cora'
        >>> TrainConfig(data="table:clicks").dim, TrainConfig(data="table:clicks", dim=64).dim, TrainConfig().dim
        (16, 64, 128)
        >>> TrainConfig(mode="hybrid").cache_rows_for(1000), TrainConfig(cache={"frac": 0.2}).cache_rows_for(1000)
        (0, 200)
        >>> TrainConfig(dim=64).cache_rows_for(10**9)  # a tenth of 10^9 ids: more than 2 GiB of cache
        1973790
    """

    model: Model = setting(Model.WDL, "the model: CTR models take Criteo-like data, graphsage a graph")
    data: str | None = setting(None, f"the data: {', '.join(CTR_DATA)} (CTR); {', '.join(GRAPH_DATA)} (graphsage)")
    mode: Mode = setting(Mode.HET, "het: PS + worker caches; hybrid: PS, no cache; ps: the dense layers on the "
                         "PS too (TF-PS)")
    staleness: float | None = setting(None, "the bound s: an integer (0: BSP) or inf", kind="staleness")
    steps: int | None = setting(None, "training steps")
    epochs: float | None = setting(None, "prepared tables and graphs: train this many passes over the training "
                                   "split across all workers (instead of steps)")
    time_limit_s: float | None = setting(None, "stop at the first step boundary after N seconds of training, "
                                         "then flush, evaluate and report the steps run (none: no limit)",
                                         aliases=("--time-limit",))
    batch: int | None = setting(None, "samples per worker per step")
    dim: int | str | None = setting(None, "embedding width of every field, or auto: a width a field from its distinct "
                                    "ids (6 x ids^0.25 as a power of two, 4 to 64: the rule of thumb of TensorFlow's "
                                    "feature columns and DeepCTR), one PS table a width", kind="width")
    widths: dict | None = setting(None, "CTR models: widths of named fields over dim, e.g. user=64,ad=32 (TOML: "
                                  "a [widths] table); one PS table a width", kind="widths")
    optimizer: Optimizer | None = setting(None, "the sparse optimizer, applied by the PS")
    lr: float | None = setting(None, "the sparse learning rate")
    dense_optimizer: Optimizer | None = setting(None, "the dense layers' optimizer (default: the sparse one's; "
                                          "Adagrad under row-wise Adagrad and FTRL)", choices=DENSE_OPTIMIZERS)
    dense_lr: float | None = setting(None, "the dense learning rate")
    weight_decay: float | None = setting(None, "the dense optimizer's L2 penalty (default: 5e-4 for graphsage, else 0)")
    row_l1: float = setting(0.0, "optimizer ftrl: L1 on the embedding rows, per coordinate (exact zeros)")
    row_l2: float = setting(0.0, "L2 on the embedding rows, exactly lazy: FTRL's own, else a decay of every row "
                                 "by 1 - lr * row_l2 a step")
    workers: int = setting(2, "local cluster: worker processes")
    servers: int = setting(1, "local cluster: PS shard processes")
    eval_samples: int | None = setting(None, "held-out samples evaluated at the end (0: no evaluation)")
    eval_curve: int = setting(0, "CTR models: also evaluate every N steps while training; the summary's curve "
                              "holds each step's metrics (0: only at the end)")
    seed: int = setting(0, "seed of the data order and the model")
    checkpoint: str | None = setting(None, "checkpoint directory")
    checkpoint_every: int = setting(0, "steps between checkpoints (needs checkpoint)")
    resume: str | None = setting(None, "a checkpoint directory to resume from")
    ps_wal: bool = setting(False, "local cluster: the shards log every push before acknowledging it "
                           "(het serve --wal), in RUN_DIR/ps-<i>")
    ps_encrypt: bool = setting(False, "every frame between workers and shards under ZeroMQ's CURVE, keyed by "
                               "the shared secret (a local cluster makes one)")
    ps_metrics_port: int | None = setting(None, "local cluster: shard i serves Prometheus metrics on port P+i "
                                          "(het serve --metrics-port; 0: free ports, printed)")
    tensorboard_dir: str | None = setting(None, "write TensorBoard scalars here while training (a local cluster: "
                                          "RUN_DIR/tensorboard unless set)", aliases=("--tensorboard",))
    tensorboard_every: int = setting(10, "steps between TensorBoard points (0: no TensorBoard)")
    ps_saves_local: bool = setting(False, "checkpoints leave each shard's rows in its own state directory, "
                                   "named in worker.pt: no storage shared between machines (chosen too when the "
                                   "workers do not see the shards' directories); resuming needs those shards' "
                                   "directories again")
    ps_stats_every: float = setting(10.0, "rank 0 asks the shards for their STATS every N seconds: the summary's "
                                    "timeline of rows, disk and RSS (0: never)")
    max_restarts: int = setting(0, "local cluster: a worker that dies is started again and the workers re-formed "
                                "while the shards serve on; a shard that dies without ps_wal restarts the job "
                                "from its latest checkpoint (one every tenth of the steps unless set); N of "
                                "these at most")
    rejoin_dir: str | None = setting(None, "where this machine keeps its workers' dense snapshots and unpushed "
                                     "counts for rejoining (a local cluster: RUN_DIR/rejoin; torchrun: "
                                     "$TMPDIR/het-rejoin-<user>-<run id>)")
    dense_snapshot_s: float = setting(30.0, "with restarts: seconds between rank 0's dense snapshots, what a group "
                                      "with no surviving worker rejoins from")
    prefetch: bool = setting(True, "send the next step's sync while this step computes")
    lazy_init: bool = setting(True, "rows no push touched are built by the worker from the seed, not pulled")
    ids: Ids = setting(Ids.ENCODED, "encoded: keys 0..N-1, one fixed table; hashed: each (field, id) hashed to "
                       "an int64 key, one dynamic table that stores only the rows training touched "
                       "(synthetic-criteo-1tb: always hashed)")
    push_dtype: PushDtype = setting(PushDtype.FP32, "how pushed gradients travel: bf16 takes half the bytes "
                                    "(rounded)")
    dense_compression: DenseCompression = setting(DenseCompression.BF16, "how the dense AllReduce's gradients "
                                                  "travel (modes het, hybrid): bf16 or fp16 take half the bytes "
                                                  "(bf16: AUC unchanged at 1,000 steps), fp32 exact, "
                                                  "powersgd low-rank factors with error feedback (DDP's hooks)")
    powersgd_rank: int = setting(4, "with dense_compression powersgd: the rank of its factors")
    synthetic: SyntheticConfig = setting(help="the synthetic Criteo-like data", factory=SyntheticConfig)
    graph: GraphConfig = setting(help="GraphSAGE's settings", factory=GraphConfig)
    validation: ValidationConfig = setting(help="validation and the kept model", factory=ValidationConfig)
    schedule: ScheduleConfig = setting(help="the learning rates' warmup and decay", factory=ScheduleConfig)
    export: ExportConfig = setting(help="exports of the model while it trains", factory=ExportConfig)
    publish: PublishConfig = setting(help="updates for servers following the job", factory=PublishConfig)
    cache: JobCache = setting(help="the workers' caches of hot rows", factory=JobCache)
    shard: ShardSettings = setting(help="the settings of the job's shards (het serve's flags)", factory=ShardSettings)
    table: TableSettings = setting(help="how the shards keep the job's tables' rows (het serve --table's settings)",
                                   factory=TableSettings)
    stream: StreamConfig = setting(help="training on partitions as they land", factory=StreamConfig)

    def __post_init__(self) -> None:
        require(self.model in MODELS, f"model: expected one of {MODELS}, got {self.model!r}")
        object.__setattr__(self, "model", Model(self.model))
        if isinstance(self.cache, dict):  # its lookahead's default is filled below
            object.__setattr__(self, "cache", build(JobCache, self.cache, "cache."))
        if not self.is_graph and isinstance(self.data, str) and self.data.startswith(PREPARED):
            for name, value in TABLE_DEFAULTS.items():
                if getattr(self, name) is None:
                    object.__setattr__(self, name, value)
        stream = self.stream if isinstance(self.stream, StreamConfig) else StreamConfig(**(self.stream or {}))
        if stream.pattern:  # the stream decides when the job ends; its batches are scored as they come
            require(self.data in (None, STREAM), f"stream: the stream is the job's data; got data {self.data!r} beside it")
            object.__setattr__(self, "data", STREAM)
            # no batch made ahead of its step: one past the stream's head would wait for data not there yet
            for name, value in (("steps", STREAM_STEPS), ("eval_samples", 0), ("cache.lookahead", 0)):
                self._default(name, value)
            object.__setattr__(self, "prefetch", False)
        for name, value in MODEL_DEFAULTS[self.model].items():
            if not isinstance(value, Samples):
                self._default(name, value)
        check_fields(self)
        for name, value in MODEL_DEFAULTS[self.model].items():  # in samples: steps at the batch, once checked
            if isinstance(value, Samples):
                self._default(name, value.steps(self.batch) if self.batch > 0 else 0)
        for ok, message in self._checks():
            require(ok, message)

    def _default(self, name: str, value) -> None:
        """The setting ``name`` (``section.key`` for one of a nested table) set to ``value``
        where it is None."""
        head, _, leaf = name.partition(".")
        section = getattr(self, head)
        if not leaf:
            if section is None:
                object.__setattr__(self, head, value)
        elif dataclasses.is_dataclass(section) and getattr(section, leaf) is None:
            object.__setattr__(self, head, dataclasses.replace(section, **{leaf: value}))

    def _checks(self) -> list[tuple[bool, str]]:
        """Each rule across the fields, with the line that names it when broken."""
        return [
            (self._data_fits_model(), f"model {self.model!r} takes data "
             f"{GRAPH_DATA if self.is_graph else CTR_DATA}, got {self.data!r}"),
            (self.steps >= 0 and self.batch > 0 and (self.dim == AUTO or self.dim > 0),
             f"steps >= 0, batch > 0 and dim > 0 expected (dim may be auto), got {self.steps}, {self.batch}, {self.dim}"),
            (not (self.widths and self.is_graph), f"widths name CTR fields; {self.model} has one table of node ids"),
            (self.lr > 0 and self.dense_lr > 0, f"lr and dense_lr must be > 0, got {self.lr} and {self.dense_lr}"),
            (self.weight_decay >= 0, f"weight_decay must be >= 0, got {self.weight_decay}"),
            (self.row_l1 >= 0 and self.row_l2 >= 0, f"row_l1 and row_l2 must be >= 0, got {self.row_l1}, {self.row_l2}"),
            (not (self.optimizer == Optimizer.FTRL and (self.schedule.warmup or self.schedule.decay != "none")),
             "optimizer ftrl: its lr is its alpha, fixed by its closed form; a schedule needs another optimizer"),
            (self.optimizer == Optimizer.FTRL or not self.row_l1,
             f"row_l1 regularises the rows under optimizer ftrl; got optimizer {self.optimizer}"),
            (self.optimizer == Optimizer.FTRL or self.lr * self.row_l2 < 1,
             f"row_l2 decays every row by 1 - lr * row_l2 a step, which must stay above 0: got lr {self.lr} times "
             f"row_l2 {self.row_l2}"),
            (not (self.publish.dir and self.row_l2 and self.optimizer != Optimizer.FTRL),
             f"publish follows the rows a step changed; with row_l2 every row changes every step (it decays): "
             f"publish with optimizer ftrl, or export (het export) the rows a checkpoint holds"),
            (self.eval_curve >= 0, f"eval_curve must be >= 0 (steps), got {self.eval_curve}"),
            (self.epochs is None or self.epochs > 0, f"epochs must be > 0, got {self.epochs}"),
            (self.workers >= 1 and self.servers >= 1,
             f"workers and servers must be >= 1, got {self.workers} and {self.servers}"),
            (self.time_limit_s is None or self.time_limit_s > 0,
             f"time_limit_s must be > 0 (seconds) or none, got {self.time_limit_s}"),
            (self.ps_stats_every >= 0, f"ps_stats_every must be >= 0 (seconds; 0: never), got {self.ps_stats_every}"),
            (self.eval_samples >= 0, f"eval_samples must be >= 0, got {self.eval_samples}"),
            (self.checkpoint_every >= 0, f"checkpoint_every must be >= 0, got {self.checkpoint_every}"),
            (self.max_restarts >= 0, f"max_restarts must be >= 0, got {self.max_restarts}"),
            (self.powersgd_rank >= 1, f"powersgd_rank must be >= 1, got {self.powersgd_rank}"),
            (self.dense_snapshot_s > 0, f"dense_snapshot_s must be > 0, got {self.dense_snapshot_s}"),
            (not self.checkpoint_every or self.checkpoint, "checkpoint_every needs a checkpoint directory"),
            (not (self.publish.consistency == "bounded" and self.staleness == math.inf),
             "publish.consistency bounded needs a finite staleness: with inf a cached row's updates may never reach "
             "the shards, and a version could lack them for ever; use flush"),
            (not self.stream.pattern or not (self.is_graph or self.eval_samples or self.eval_curve or self.cache.lookahead
                                             or self.epochs or self.validation.every or self.export.dir
                                             or self.schedule.decay != "none"),
             "stream: a CTR job whose data is the stream, scored batch by batch as it comes (no data, eval_samples, "
             "eval_curve, lookahead, epochs, validation, export or lr decay beside it; --publish serves it)"),
            (not ((self.export.dir or self.publish.dir) and self.is_graph),
             f"export and publish apply to CTR models; {self.model} is not exported"),
            *self._table_checks(),
            (self.tensorboard_every >= 0, f"tensorboard_every must be >= 0 (steps; 0: none), got {self.tensorboard_every}"),
            (self.ps_metrics_port is None or 0 <= self.ps_metrics_port <= 65535 - self.servers,
             f"ps_metrics_port must be a port (0: free ones) leaving room for {self.servers} shards, "
             f"got {self.ps_metrics_port}"),
            (self.shard.wal_max is None or self.ps_wal, "shard.wal_max bounds the shards' log: it needs ps_wal"),
            (self.table.row_dtype == RowDtype.FP32 or self.shard.memory is None,
             f"table.row_dtype {self.table.row_dtype} with shard.memory: a shard's disk tier stores float32 "
             f"records; use row_dtype fp32 there"),
        ]

    def _table_checks(self) -> list[tuple[bool, str]]:
        """The rules of the job's keys beside its tables' settings (which check themselves:
        :class:`het.config.TableSettings`)."""
        return [
            (not (self.is_graph and self.ids == Ids.HASHED), f"ids 'hashed' applies to CTR data; {self.model} "
             f"reads a graph's node ids, 0..N-1 (table.admit_after, expire_after and max_rows still apply)"),
        ]

    def _data_fits_model(self) -> bool:
        if self.data == STREAM:
            return bool(self.stream.pattern) and not self.is_graph
        for kind in (GRAPH_DATA if self.is_graph else CTR_DATA):
            prefix, _, arg = kind.partition(":")
            if self.data == kind or (arg and self.data.startswith(prefix + ":") and len(self.data) > len(prefix) + 1):
                return True
        return False

    @property
    def is_graph(self) -> bool:
        return self.model in GRAPH_MODELS

    @property
    def cached(self) -> bool:
        return self.mode == Mode.HET

    def cache_rows_for(self, table_rows: int, share: float = 1.0) -> int:
        """Rows of the worker cache for ``table_rows`` ids (the rows of a fixed table, the ids in
        the data for a dynamic one; 0 without a cache); a table of several takes ``share`` of
        ``cache.rows`` and ``cache.memory``."""
        if not self.cached:
            return 0
        if self.cache.rows is not None:
            return min(int(self.cache.rows * share), table_rows)
        return min(int(self.cache.frac * table_rows),
                   int(parse_bytes(self.cache.memory) * share) // self.cache_slot_bytes)

    @property
    def cache_slot_bytes(self) -> int:
        """At most what a cache slot takes: its row and pending gradient, a followed optimizer's
        state and squares (at most dim floats each), its key, clock and counters."""
        return CACHE_SLOT_BYTES + 16 * self.widest

    @property
    def widest(self) -> int:
        """The widest row a field of the job may get (``auto`` gives at most :data:`AUTO_MOST`)."""
        return max([AUTO_MOST if self.dim == AUTO else self.dim, *(self.widths or {}).values()])

    @property
    def several_widths(self) -> bool:
        """Whether the fields may get several widths (``auto``, or widths set per field)."""
        return self.dim == AUTO or bool(self.widths)

    def to_dict(self) -> dict:
        """Plain data (JSON and TOML alike): nested configs as dicts, s = inf as ``"inf"``."""
        d = plain(dataclasses.asdict(self))
        d["staleness"] = format_staleness(self.staleness)
        d["graph"]["fanouts"] = list(self.graph.fanouts)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        """The config of :meth:`to_dict`'s form (or a TOML file's); unknown keys are refused, a
        key of :data:`RENAMED` is read as its new one."""
        return build(cls, renamed(dict(d)), "")

    @classmethod
    def load(cls, path: str | None, overrides: dict | None = None, defaults: dict | None = None) -> "TrainConfig":
        """``defaults``, then the TOML file at ``path`` (if any), then ``overrides`` (flags that
        were given); keys of nested tables are dotted (``"synthetic.cap"``)."""
        d: dict = {}
        for key, value in (defaults or {}).items():
            set_dotted(d, key, value)
        if path:
            try:
                with open(path, "rb") as f:
                    merge(d, tomllib.load(f))
            except tomllib.TOMLDecodeError as e:
                raise ValueError(f"{path}: not valid TOML: {e}") from None
        for key, value in (overrides or {}).items():
            set_dotted(d, key, value)
        try:
            return cls.from_dict(d)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path}: {e}" if path else str(e)) from None
