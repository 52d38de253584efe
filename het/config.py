"""Configs: frozen dataclasses, one per component, checked when built; their closed choices
are enums (:mod:`het.choices`).

Configs are data. Runtime handles (sockets, processes, tensors) never go in them, so a
config can be printed, compared, written to a checkpoint and sent to another process. Each
field's help text is in its metadata (:func:`setting`): the command-line flags are generated
from the fields (:mod:`het.train.flags`).
"""

from __future__ import annotations

import functools
import re
from dataclasses import asdict, dataclass, field

from het.choices import LocalUpdate, Policy, RowDtype, RowRounding
from het.optimizer import OptimizerConfig
from het.settings import is_int, plain, require, setting
from het.staleness import check_staleness

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")


MAX_ADMIT_AFTER = 255  # sightings are counted in uint8 (het.ps.server.store.admission)
DYNAMIC_ONLY = ("admit_after", "admit_counters", "expire_after", "max_rows")  # TableSettings', for rows=None


@dataclass(frozen=True, kw_only=True)
class TableSettings:
    """How the shards keep a table's rows, declared once: a job's ``[table]`` (flags
    ``--table-*``) sets them for its tables, ``het serve --table`` for one, and every
    :class:`TableConfig` holds them (see its arguments). Checked when built.

    Example:
        >>> TableSettings(row_dtype="bf16").row_dtype, TableSettings().admit_after
        ('bf16', 1)
        >>> TableSettings(expire_after=0)
        Traceback (most recent call last):
        ...
        ValueError: expire_after must be None or an int >= 1, got 0
    """

    admit_after: int = setting(1, "dynamic tables (hashed ids): store a key once pushes touched it in N worker-steps "
                               "(before: reads give its initial row, its gradients are dropped)")
    admit_counters: int = setting(1 << 22, "dynamic tables: bytes of each shard's sketch of sightings (admission); "
                                  "about 8x the keys awaiting admission keeps early admissions near 2 in 100")
    expire_after: int | None = setting(None, "dynamic tables: remove rows not updated for N steps (none: never)")
    max_rows: int | None = setting(None, "dynamic tables: the most rows a shard stores in a table; the least "
                                   "recently updated go first (none: no budget)")
    row_dtype: RowDtype = setting(RowDtype.FP32, "how shards store the rows: fp16 or bf16 take half the bytes "
                                  "(optimizer state stays fp32; updates rounded, see row_rounding)")
    row_rounding: RowRounding = setting(RowRounding.STOCHASTIC, "with row_dtype fp16 or bf16: how an updated row is "
                                        "rounded (stochastic: exact on average, as FBGEMM's; nearest)")

    def __post_init__(self) -> None:
        object.__setattr__(self, "row_dtype", RowDtype.parse(self.row_dtype, "row_dtype"))
        object.__setattr__(self, "row_rounding", RowRounding.parse(self.row_rounding, "row_rounding"))
        require(is_int(self.admit_after) and 1 <= self.admit_after <= MAX_ADMIT_AFTER,
                 f"admit_after must be an int in [1, {MAX_ADMIT_AFTER}], got {self.admit_after!r}")
        require(is_int(self.admit_counters) and self.admit_counters >= 4,
                 f"admit_counters must be an int >= 4 (bytes), got {self.admit_counters!r}")
        for name in ("expire_after", "max_rows"):
            value = getattr(self, name)
            require(value is None or (is_int(value) and value >= 1), f"{name} must be None or an int >= 1, got {value!r}")

    def dynamic_asked(self) -> list[str]:
        """The settings given that only a dynamic table (``rows=None``) has: admission, expiry, a row budget.

        Example:
            >>> TableSettings(max_rows=10).dynamic_asked(), TableSettings(admit_counters=64).dynamic_asked()
            (['max_rows'], ['admit_counters'])
        """
        return [n for n in DYNAMIC_ONLY if getattr(self, n) != TableSettings.__dataclass_fields__[n].default]

    def settings(self) -> dict:
        """These settings by name, as :class:`TableSettings` takes them (of a TableConfig too)."""
        return {f: getattr(self, f) for f in TableSettings.__dataclass_fields__}


@dataclass(frozen=True)
class TableConfig(TableSettings):
    """One embedding table held by the parameter servers.

    Args:
        name: the table's name; letters, digits, ``_ . -``.
        rows: number of rows (keys are ``0 .. rows - 1``); ``None`` makes the table *dynamic*:
            it takes any int64 key (raw or hashed ids, no vocabulary), and a shard stores only
            the rows that pushes have changed (:mod:`het.ps.server.store.dynamic`).
        dim: width of a row.
        optimizer: the sparse optimizer the shards apply to this table.
        init_scale: rows start uniform in ``[-init_scale, init_scale]``.
        seed: initial rows are a pure function of ``(seed, name, key)``, so they do not
            depend on how many shards hold the table.
        admit_after: dynamic tables: a key gets storage once pushes have touched it in this
            many worker-steps; before that its reads give the initial row and its gradients are
            dropped (and counted). 1 admits every key on its first push.
        admit_counters: dynamic tables with ``admit_after > 1``: the bytes of each shard's
            count-min sketch of sightings (one byte a counter, :mod:`het.ps.server.store.admission`). With
            ``m`` keys not yet admitted, a key is admitted early with probability near
            ``(1 - exp(-4 m / admit_counters)) ** 4``.
        expire_after: dynamic tables: a row not updated for this many steps is removed (it
            reads as its initial value again); ``None``: never.
        max_rows: dynamic tables: the most rows one shard stores; past it the least recently
            updated rows are evicted; ``None``: no budget.
        row_dtype: how shards store the rows: ``fp32``, or ``fp16`` / ``bf16`` in half the bytes
            (optimizer state stays float32; a row's initial value and every update rounded to
            it, :mod:`het.ps.protocol.halves`).
        row_rounding: half-precision rows: ``stochastic`` or ``nearest`` rounding of updates.

    Example:
        >>> import json
        >>> t = TableConfig("user", rows=1000, dim=16, optimizer=OptimizerConfig("adam", betas=(0.8, 0.9)))
        >>> TableConfig.from_dict(json.loads(json.dumps(t.to_dict()))) == t  # the optimizer too
        True
        >>> TableConfig("ids", rows=None, dim=16, admit_after=2).dynamic
        True
        >>> TableConfig("user id", rows=1000, dim=16)
        Traceback (most recent call last):
        ...
        ValueError: table name must match ^[A-Za-z_][A-Za-z0-9_.-]{0,63}$, got 'user id'
    """

    name: str
    rows: int | None
    dim: int
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    init_scale: float = setting(0.01, "rows start uniform in [-init_scale, init_scale]")
    seed: int = setting(0, "initial rows are a function of (seed, table, key)")

    def __post_init__(self) -> None:
        require(isinstance(self.name, str) and bool(_NAME.match(self.name)),
                 f"table name must match {_NAME.pattern}, got {self.name!r}")
        require(self.rows is None or (is_int(self.rows) and self.rows > 0),
                 f"table {self.name!r}: rows must be a positive int (or None: a dynamic table), got {self.rows!r}")
        require(isinstance(self.dim, int) and self.dim > 0,
                 f"table {self.name!r}: dim must be a positive int, got {self.dim!r}")
        require(self.init_scale >= 0, f"init_scale must be >= 0, got {self.init_scale}")
        if isinstance(self.optimizer, dict):
            object.__setattr__(self, "optimizer", OptimizerConfig(**self.optimizer))
        try:
            super().__post_init__()
        except ValueError as e:
            raise ValueError(f"table {self.name!r}: {e}") from None
        if not self.dynamic:
            used = self.dynamic_asked()
            require(not used, f"table {self.name!r}: {', '.join(used)} apply only to dynamic tables (rows=None), "
                               f"this one has {self.rows} rows")

    @property
    def dynamic(self) -> bool:
        """Whether the table takes any int64 key (``rows is None``)."""
        return self.rows is None

    @property
    def size(self) -> str:
        """``"rows x dim"``, or ``"dynamic x dim"`` for a table of any int64 key.

        Example:
            >>> TableConfig("t", rows=10, dim=4).size, TableConfig("ids", rows=None, dim=4).size
            ('10 x 4', 'dynamic x 4')
        """
        return f"{'dynamic' if self.dynamic else self.rows} x {self.dim}"

    def to_dict(self) -> dict:
        """Plain data: the optimizer as a dict, choices as strings."""
        return plain(asdict(self))

    @classmethod
    def from_dict(cls, d: dict) -> "TableConfig":
        d = dict(d)
        opt = dict(d.pop("optimizer", {}))
        if "betas" in opt:
            opt["betas"] = tuple(opt["betas"])
        return cls(optimizer=OptimizerConfig(**opt), **d)


@dataclass(frozen=True, kw_only=True)
class CacheSettings:
    """How a worker's cache chooses and moves its rows, declared once: a job's ``[cache]``
    (flags ``--cache-*``) sets them for its caches, and every :class:`CacheConfig` holds them
    (see its arguments). Checked when built.

    Example:
        >>> CacheSettings(policy="lru").policy, CacheSettings().lookahead
        ('lru', None)
        >>> CacheSettings(lookahead=-1)
        Traceback (most recent call last):
        ...
        ValueError: lookahead must be None or an int >= 0 (steps), got -1
    """

    policy: Policy = setting(Policy.LFU, "the cache's replacement policy")
    lookahead: int | None = setting(None, "announce the next N steps' keys to the cache: Belady's rule within them "
                                    "(0: off; none: a job's default, 16,384 samples' worth, or off for a cache alone)")
    local_update: LocalUpdate = setting(LocalUpdate.ROW, "how a worker moves its cached copy of a row: sgd (HET's "
                                        "rule), row (the step the PS's Adagrad will take, from a float of its state a "
                                        "row), full (from its whole state); tables of other optimizers use sgd")

    def settings(self) -> dict:
        """These settings by name, as :class:`CacheSettings` takes them (of a CacheConfig or a job's too)."""
        return {f: getattr(self, f) for f in CacheSettings.__dataclass_fields__}

    def __post_init__(self) -> None:
        object.__setattr__(self, "policy", Policy.parse(self.policy, "policy"))
        require(self.lookahead is None or (is_int(self.lookahead) and self.lookahead >= 0),
                 f"lookahead must be None or an int >= 0 (steps), got {self.lookahead!r}")
        object.__setattr__(self, "local_update", LocalUpdate.parse(self.local_update, "local_update"))


@dataclass(frozen=True)
class CacheConfig(CacheSettings):
    """A worker's cache of hot rows for one table.

    Args:
        capacity: rows the cache holds (0 disables caching: every key goes to the PS).
        policy: ``"lru"`` or ``"lfu"`` replacement.
        staleness: the bound ``s``: a cached row is read while ``c_g - c_s <= s`` and pushed
            once it holds more than ``s`` local updates. ``0`` is synchronous, ``math.inf``
            fully asynchronous.
        ways: rows per set (set-associative slots, as in FBGEMM's cache).
        local_lr: step size of the ``"sgd"`` local update (``row -= local_lr * grad``).
            ``None`` takes the table optimizer's lr: exact for SGD.
        local_update: how a worker updates its cached copy of a row between refreshes (read
            your writes). ``"sgd"``: HET's rule, ``row -= local_lr * grad``, exact for SGD only.
            ``"row"`` (Adagrad and row-wise Adagrad tables): the copy is the server's row at the
            last refresh moved by the step the server's optimizer will take with the pending
            gradient sum, from a one-float-a-row summary of its accumulator sent with the row
            (the mean over the row; row-wise Adagrad's own). ``"full"``: the same with the
            whole per-coordinate accumulator (one float per coordinate on the wire). Tables
            of other optimizers (SGD, Adam) use ``"sgd"``.
        lookahead: how many coming steps' keys, announced by the data loader
            (``Embedding.announce``), the cache consults when it evicts; 0 (or None): the policy alone.

    Example:
        >>> CacheConfig(capacity=1024, staleness=100.0).staleness, CacheConfig(staleness=float("inf")).staleness
        (100, inf)
        >>> CacheConfig(capacity=1024, staleness=2.5)
        Traceback (most recent call last):
        ...
        ValueError: staleness: expected an integer >= 0 or 'inf', got 2.5 (float)
    """

    capacity: int = 0
    staleness: float = 0
    ways: int = 32
    local_lr: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "lookahead", self.lookahead or 0)
        require(isinstance(self.capacity, int) and self.capacity >= 0,
                 f"cache capacity must be an int >= 0, got {self.capacity!r}")
        object.__setattr__(self, "staleness", check_staleness(self.staleness))
        require(isinstance(self.ways, int) and 1 <= self.ways <= 256,
                 f"ways must be an int in [1, 256], got {self.ways!r}")


@dataclass(frozen=True, kw_only=True)
class ShardSettings:
    """A shard's settings beyond its tables and its place among the shards: declared, documented
    and checked here once. ``het serve`` takes each as a flag (``--memory``), a training job as
    its ``[shard]`` table (``--shard-memory``), and a job's shards are built with all of them, so a
    setting added here reaches every one of those with no other change. Sizes may be given as
    text (``"2GiB"``).

    Example:
        >>> ShardSettings(memory="2GiB", wal_max=None).memory
        2147483648
    """

    max_keys: int = setting(1 << 18, "keys in one request at most; a larger frame drops its sender")
    memory: int | None = setting(None, "DRAM kept for rows, optimizer state and index (e.g. 2GiB); the rest of "
                                 "the rows live in a disk tier in the state directory, and a job's table is made "
                                 "dynamic (default: all in memory)", kind="size")
    memory_policy: Policy = setting(Policy.LRU, "with a memory budget: which rows leave DRAM first")
    page_in: bool = setting(True, "with a memory budget: the rows on disk a sync names are paged into DRAM "
                            "after its reply, before the step that needs them")
    wal_max: int | None = setting(None, "with a write-ahead log: past this many bytes of log (e.g. 64MiB) the shard "
                                  "starts the log afresh while a forked child writes its tables as the log's "
                                  "base (none: the log grows until a save)", kind="size")
    session_idle_s: float = setting(3600.0, "client sessions idle this long are forgotten (their replay and "
                                    "dedup entries); a forgotten one's requests are refused")
    max_sessions: int = setting(65536, "client sessions held at most: past it the longest unseen is forgotten")

    def __post_init__(self) -> None:
        for name in ("memory", "wal_max"):  # a size as text: "2GiB"
            if isinstance(getattr(self, name), str):
                try:
                    object.__setattr__(self, name, parse_bytes(getattr(self, name)))
                except ValueError as e:
                    raise ValueError(f"{name}: {e}") from None
        require(is_int(self.max_keys) and self.max_keys >= 1, f"max_keys must be an int >= 1, got {self.max_keys!r}")
        require(self.memory is None or (is_int(self.memory) and self.memory > 0),
                f"memory must be a number of bytes > 0 (or None: no budget), got {self.memory!r}")
        require(self.wal_max is None or (is_int(self.wal_max) and self.wal_max > 0),
                f"wal_max must be a number of bytes > 0 (or None: no bound), got {self.wal_max!r}")
        require(type(self.page_in) is bool, f"page_in must be true or false, got {self.page_in!r}")
        require(isinstance(self.session_idle_s, (int, float)) and not isinstance(self.session_idle_s, bool)
                and self.session_idle_s > 0, f"session_idle_s must be a number of seconds > 0, got {self.session_idle_s!r}")
        require(is_int(self.max_sessions) and self.max_sessions >= 1,
                f"max_sessions: an int >= 1, got {self.max_sessions!r}")
        object.__setattr__(self, "memory_policy", Policy.parse(self.memory_policy, "memory_policy"))


@dataclass(frozen=True)
class ShardConfig(ShardSettings):
    """One PS shard: which slice of every table it holds, and its settings
    (:class:`ShardSettings`, keyword arguments).

    Keys are partitioned by ``key % num_shards``: shard ``i`` holds keys ``i, i + S, ...``
    at local row ``key // S`` (see :mod:`het.ps.protocol.partition`).

    ``max_keys`` bounds the keys of one request; a frame larger than such a request's largest
    array (``max_frame_bytes``: its rows, plus room for the header) drops its sender's
    connection before it is held in memory.

    Example:
        >>> ShardConfig((TableConfig("t", rows=10, dim=64),), max_keys=1024).max_frame_bytes
        327680
    """

    tables: tuple[TableConfig, ...]
    index: int = setting(0, "which shard of num_shards this one is")
    num_shards: int = setting(1, "how many shards hold the tables together")

    def __post_init__(self) -> None:
        super().__post_init__()
        tables = tuple(TableConfig.from_dict(t) if isinstance(t, dict) else t for t in self.tables)
        object.__setattr__(self, "tables", tables)
        require(len(tables) > 0, "a shard needs at least one table")
        names = [t.name for t in tables]
        require(len(set(names)) == len(names), f"table names must be unique, got {names}")
        require(isinstance(self.num_shards, int) and self.num_shards >= 1,
                 f"num_shards must be an int >= 1, got {self.num_shards!r}")
        require(isinstance(self.index, int) and 0 <= self.index < self.num_shards,
                 f"shard index must be in [0, {self.num_shards}), got {self.index!r}")
        require(self.memory is None or any(t.dynamic for t in tables),
                "a memory budget needs a dynamic table (rows=None): a fixed table is all in memory")

    @classmethod
    def from_dict(cls, d: dict) -> "ShardConfig":
        """The config of a plain dict (JSON's): its fields, the tables as :meth:`TableConfig.to_dict`
        gives them."""
        d = dict(d)
        return cls(tuple(TableConfig.from_dict(t) for t in d.pop("tables")), **d)

    @functools.cached_property  # read for every request: the tables never change
    def max_frame_bytes(self) -> int:
        """The largest frame a request of ``max_keys`` keys needs: its rows of the widest
        table as float32, and 64 KiB for the header and meta."""
        return self.max_keys * max(t.dim for t in self.tables) * 4 + (1 << 16)

    @functools.cached_property
    def max_message_bytes(self) -> int:
        """The largest message a request of ``max_keys`` keys needs: a push and a sync in one
        (keys, gradients, counts, squares, keys, clocks: ``8 D + 32`` bytes a key of the widest
        table), and 64 KiB for the header, meta and MAC."""
        return self.max_keys * (8 * max(t.dim for t in self.tables) + 32) + (1 << 16)


_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 1000 ** 2, "mib": 1 << 20,
          "g": 1 << 30, "gb": 1000 ** 3, "gib": 1 << 30, "t": 1 << 40, "tb": 1000 ** 4, "tib": 1 << 40}


def parse_bytes(text: str | int) -> int:
    """A size as people write it: ``2GiB``, ``256MiB``, ``1.5G``, ``4096`` (bytes).

    Example:
        >>> parse_bytes("2GiB"), parse_bytes("256 MiB"), parse_bytes("1.5G"), parse_bytes(4096)
        (2147483648, 268435456, 1610612736, 4096)
    """
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    import re
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"expected a size such as 2GiB, 256MiB or 4096 (bytes), got {text!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
