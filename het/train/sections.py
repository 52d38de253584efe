"""The job config's nested tables (``[cache]``, ``[synthetic]``, ``[graph]``, ``[validation]``, ``[schedule]``,
``[export]``, ``[publish]``, ``[stream]``): one frozen dataclass each, their flags ``--TABLE-KEY`` or an alias."""

from __future__ import annotations

from dataclasses import dataclass

from het.choices import EXPORT_DTYPES, RowDtype
from het.config import CacheSettings, parse_bytes, setting
from het.schedule import DECAYS, Schedule
from het.train.fields import check_fields, require


# a worker cache slot's bytes besides its floats (het.cache.cache.EmbeddingCache): the key,
# six 64-bit clocks and counters, two flags; rounded up
CACHE_SLOT_BYTES = 64


@dataclass(frozen=True, kw_only=True)
class JobCache(CacheSettings):
    """A job's worker caches (``[cache]``, ``--cache-KEY``): how big, and the settings every
    cache holds (:class:`het.config.CacheSettings`)."""

    frac: float = setting(0.1, "cache rows as a fraction of the table")
    rows: int | None = setting(None, "cache rows (instead of frac)")
    memory: str = setting("2GiB", "the most a worker's cache of frac rows may take (at "
                          f"{CACHE_SLOT_BYTES} B + 16 B a float of dim a row, an upper bound); an explicit "
                          "rows is not capped", kind="size")

    def __post_init__(self) -> None:
        check_fields(self, "cache.")
        super().__post_init__()
        require(0 <= self.frac <= 1, f"cache.frac must lie in [0, 1], got {self.frac}")
        require(self.rows is None or self.rows >= 0, f"cache.rows must be >= 0, got {self.rows}")
        try:
            value = parse_bytes(self.memory) if self.memory is not None else None
        except ValueError as e:
            raise ValueError(f"cache.memory: {e}") from None
        require(value is None or value > 0, f"cache.memory must be > 0, got {self.memory!r}")


@dataclass(frozen=True)
class SyntheticConfig:
    """Size and skew of the synthetic Criteo-like data (``[synthetic]``, ``--synthetic-KEY``)."""

    cap: int | None = setting(100_000, "cap on each synthetic field's cardinality")
    scale: float = setting(1.0, "multiplies every field's cardinality (before the cap)")
    alpha: float = setting(1.05, "power-law exponent of the synthetic ids' popularity")
    seed: int = setting(0, "seed of the synthetic data set (ids, features, planted model)")

    def __post_init__(self) -> None:
        check_fields(self, "synthetic.")
        require(self.cap is None or self.cap >= 1, f"synthetic.cap must be >= 1, got {self.cap}")
        require(self.scale > 0, f"synthetic.scale must be > 0, got {self.scale}")


FEW_LABELS = 0.2  # a graph whose training nodes are under this share of its nodes (a fifth): few labels


@dataclass(frozen=True)
class GraphConfig:
    """GraphSAGE's settings (``[graph]``, ``--graph-KEY``); CTR jobs ignore them."""

    fanouts: tuple[int, ...] = setting((10, 5), "neighbours sampled per layer, e.g. 10,5", aliases=("--fanouts",))
    hidden: int = setting(128, "GraphSAGE's hidden width", aliases=("--hidden",))
    # A training node's own id row can memorise its label. With few labelled nodes (Planetoid's
    # splits: 20 a class) more dropout keeps it from doing so: validation accuracy Cora 0.794 ->
    # 0.813, CiteSeer-like 0.857 -> 0.873, PubMed-like 0.901 -> 0.913; on a graph with 60% of its
    # nodes labelled, whose id rows carry the signal, it costs 0.53 (docs/RESULTS.md, "GraphSAGE
    # on Cora"). So the default follows the share of nodes labelled for training.
    dropout: float | None = setting(None, "dropout between GraphSAGE's layers (default: 0.8 when under a fifth "
                                    "of the nodes are training nodes, else 0.5)", aliases=("--dropout",))
    embedding_dropout: float | None = setting(None, "dropout on the node-id rows alone, before dropout (default: "
                                              "0.9 when under a fifth of the nodes are training nodes, else 0.5)",
                                              aliases=("--embedding-dropout",))

    # Chosen on validation accuracy (with weight decay 5e-4), 3-5 seeds: Cora 0.786 -> 0.796, CiteSeer-like
    # 0.797 -> 0.856, PubMed-like 0.860 -> 0.907, synthetic 0.923 -> 0.931 (docs/RESULTS.md, "GraphSAGE on Cora")
    aggregator: str = setting("gcn", "how a layer combines a node and its neighbours: gcn (one mean of both, one "
                              "weight) or mean (GraphSAGE's: the node and its neighbours' mean by two weights)",
                              choices=("gcn", "mean"))

    def __post_init__(self) -> None:
        check_fields(self, "graph.")
        require(len(self.fanouts) > 0 and min(self.fanouts) >= 1,
                 f"graph.fanouts must be positive integers, got {self.fanouts}")
        require(self.hidden >= 1, f"graph.hidden must be >= 1, got {self.hidden}")
        for name in ("dropout", "embedding_dropout"):
            value = getattr(self, name)
            require(value is None or 0 <= value < 1, f"graph.{name} must lie in [0, 1), got {value}")

    def dropouts(self, labelled: float) -> tuple[float, float]:
        """``(dropout, embedding_dropout)`` for a graph whose training nodes are the share
        ``labelled`` of its nodes: each as set, or its default for that share.

        Example:
            >>> GraphConfig().dropouts(140 / 2708), GraphConfig(dropout=0.6).dropouts(0.6)
            ((0.8, 0.9), (0.6, 0.5))
        """
        few = labelled < FEW_LABELS
        return (self.dropout if self.dropout is not None else (0.8 if few else 0.5),
                self.embedding_dropout if self.embedding_dropout is not None else (0.9 if few else 0.5))


@dataclass(frozen=True)
class ExportConfig:
    """Exports of the model while it trains (``[export]``, ``--export DIR --export-every N``)."""

    dir: str | None = setting(None, "CTR models: keep an export of the model (het export's) in this directory",
                              aliases=("--export",))
    every: int = setting(0, "steps between exports, and the last step (needs a directory); written in the background")
    dtype: str = setting("fp32", "the exports' rows (int8: row-wise scale and bias)", choices=EXPORT_DTYPES)

    def __post_init__(self) -> None:
        check_fields(self, "export.")
        require(self.every >= 0, f"export.every must be >= 0, got {self.every}")
        require(not self.every or self.dir, "export.every needs export.dir (--export DIR)")


PUBLISH_CONSISTENCY = ("flush", "bounded")


@dataclass(frozen=True)
class PublishConfig:
    """Updates for servers that follow the job (``[publish]``, ``--publish DIR --publish-every S``):
    the rows pushes changed and the dense weights every ``every`` seconds, a full base once the
    deltas since the last near its bytes or after ``base_every`` of them (:mod:`het.train.publish`)."""

    dir: str | None = setting(None, "CTR models: publish updates here for het serve-model --follow DIR",
                              aliases=("--publish",))
    every: float = setting(10.0, "seconds between deltas (the rows pushes changed since the last one)")
    base_every: int = setting(30, "deltas at most between full bases, which come sooner once the deltas since "
                                  "the last near its bytes (a follower starting late begins at the newest)")
    keep: int = setting(1, "bases kept, with the deltas after the oldest of them (1: the directory holds at "
                           "most three bases' bytes)")
    consistency: str | None = setting(None, "flush: every cache flushed at each version, which holds every update "
                                            "up to its step; bounded: nothing stops, each row lacks at most the "
                                            "staleness bound's updates of each worker (default: bounded, flush with "
                                            "--staleness inf)", choices=PUBLISH_CONSISTENCY)
    dtype: RowDtype | None = setting(None, "how a delta stores its rows (default: as the table stores them)")

    def __post_init__(self) -> None:
        check_fields(self, "publish.")
        require(self.every > 0, f"publish.every must be > 0 (seconds), got {self.every}")
        require(self.base_every >= 1 and self.keep >= 1,
                f"publish.base_every and publish.keep must be >= 1, got {self.base_every}, {self.keep}")


SELECT = ("logloss", "auc")


@dataclass(frozen=True)
class ValidationConfig:
    """Validation and the kept model (``[validation]``, ``--val-frac``, ``--eval-every``,
    ``--select``, ``--patience``): every ``every`` steps the job scores its validation split;
    the best evaluation's model (rows on the PS included) is the one the job ends with: reported,
    checkpointed, exported and published (:mod:`het.train.selection`)."""

    frac: float = setting(0.1, "CTR tables: the share of the training rows kept apart for validation, chosen "
                          "by a hash of the row and the seed (synthetic data: a stream of its own; graphs: "
                          "their validation nodes)", aliases=("--val-frac",))
    every: int | None = setting(None, "evaluate on validation every N steps and keep the best model (0: off; "
                                "default: twice an epoch on a prepared table, every 10 steps on a graph, off "
                                "on synthetic data)", aliases=("--eval-every",))
    select: str = setting("logloss", "CTR models: the validation metric that picks the kept model (graphs: "
                          "accuracy)", choices=SELECT, aliases=("--select",))
    patience: int = setting(0, "stop after N evaluations without a better one (0: train every step)",
                            aliases=("--patience",))

    def __post_init__(self) -> None:
        check_fields(self, "validation.")
        require(0 <= self.frac < 1, f"validation.frac must lie in [0, 1), got {self.frac}")
        require(self.every is None or self.every >= 0, f"validation.every must be >= 0, got {self.every}")
        require(self.patience >= 0, f"validation.patience must be >= 0, got {self.patience}")


@dataclass(frozen=True)
class ScheduleConfig:
    """The learning rates' schedule, dense and sparse alike (``[schedule]``, ``--lr-warmup``,
    ``--lr-decay``, ``--lr-floor``; :mod:`het.schedule`): the shards apply the sparse one at the
    step each push carries."""

    warmup: int = setting(0, "steps of linear warmup of both learning rates", aliases=("--lr-warmup",))
    decay: str = setting("none", "after the warmup, both learning rates fall to floor x lr at the last step",
                         choices=DECAYS, aliases=("--lr-decay",))
    floor: float = setting(0.0, "the share of each learning rate left at the last step", aliases=("--lr-floor",))

    def __post_init__(self) -> None:
        check_fields(self, "schedule.")
        require(self.warmup >= 0, f"schedule.warmup must be >= 0 (steps), got {self.warmup}")
        require(0 <= self.floor <= 1, f"schedule.floor must lie in [0, 1], got {self.floor}")

    def of(self, steps: int) -> Schedule:
        """The schedule of a job of ``steps`` steps."""
        return Schedule(self.warmup, self.decay, max(steps, self.warmup + 1), self.floor)


@dataclass(frozen=True)
class StreamConfig:
    """Training on partitions as they land (``[stream]``, ``--stream PATTERN --stream-idle S``:
    :mod:`het.train.streaming`): each taken once complete, in order, trained once."""

    pattern: str | None = setting(None, "CTR models: train on the partitions this glob matches (prepared "
                                        "directories, CSV, TSV or Parquet), in order as each completes (its "
                                        "_SUCCESS, or its final name), waiting for new ones",
                                  aliases=("--stream",))
    idle: float | None = setting(None, "seconds the job waits for a new partition, once it trained every row "
                                       "there, before it ends (default: for ever)")
    prepared: str | None = setting(None, "where raw (CSV, TSV, Parquet) partitions are prepared as they are taken "
                                         "(default: a directory of the pattern's in the system's temporary one)")
    schema: str | None = setting(None, "raw partitions' columns: a schema.toml as het data prepare table --schema "
                                       "reads (default: inferred from the first partition's head)")
    window: int = setting(100_000, "rows of progressive validation's rolling window (the latest rows scored, "
                                   "besides each partition's): the summary, TensorBoard and the shards' metrics")

    def __post_init__(self) -> None:
        check_fields(self, "stream.")
        require(self.idle is None or self.idle >= 0, f"stream.idle must be >= 0 (seconds) or none, got {self.idle}")
        require(self.window >= 1, f"stream.window must be >= 1 (rows), got {self.window}")
