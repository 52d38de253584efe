"""The training job's config: one frozen dataclass, from a TOML file and flags.

A TOML file holds the same keys as the dataclass (flags override it)::

    model = "wdl"
    data = "synthetic-criteo"
    mode = "het"
    staleness = 100
    steps = 300
    batch = 512
    dim = 16
    [synthetic]
    cap = 100000
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass, field

from het.config import OPTIMIZERS, POLICIES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

MODES = ("het", "hybrid", "ps")
CTR_MODELS = ("wdl", "deepfm", "dcn", "dlrm")
GRAPH_MODELS = ("graphsage",)
MODELS = CTR_MODELS + GRAPH_MODELS
CTR_DATA = ("synthetic-criteo", "criteo:DIR")
GRAPH_DATA = ("cora", "planetoid:DIR", "npz:PATH", "synthetic-graph", "synthetic-graph:NODES")


# GraphSAGE on Cora-sized graphs: a step's global batch covers Cora's 140 training nodes.
GRAPH_DEFAULTS = {"data": "cora", "steps": 200, "batch": 140, "dim": 16, "optimizer": "adam", "lr": 0.001,
                  "dense_optimizer": "adam", "dense_lr": 0.01, "staleness": 10, "cache_frac": 0.1,
                  "eval_samples": 1, "eval_every": 10}
# DeepFM's FM term sums 325 pairwise dot products of the fields' rows: at the CTR default sparse
# lr of 0.05 (Adagrad) its logits blow up early and it ends far below the others (AUC 0.742
# after 1M samples, 0.792 at 0.01; docs/RESULTS.md, "Workloads").
MODEL_DEFAULTS = {"deepfm": {"lr": 0.01}}


@dataclass(frozen=True)
class SyntheticConfig:
    """Size and skew of the synthetic Criteo-like data."""

    cap: int | None = 100_000
    scale: float = 1.0
    alpha: float = 1.05
    seed: int = 0


@dataclass(frozen=True)
class TrainConfig:
    """A training job. ``batch`` is per worker; ``lr`` is the sparse (PS) learning rate.

    Example:
        >>> TrainConfig(mode="hybrid").cache_rows_for(1000)
        0
        >>> TrainConfig(cache_frac=0.1).cache_rows_for(1000)
        100
    """

    model: str = "wdl"
    data: str = "synthetic-criteo"
    mode: str = "het"
    staleness: float = 100
    steps: int = 1000
    batch: int = 512
    dim: int = 128
    optimizer: str = "adagrad"
    lr: float = 0.05
    dense_optimizer: str | None = None  # None: the same as `optimizer`
    dense_lr: float = 0.001
    weight_decay: float = 0.0  # the dense optimizer's L2 penalty
    cache_frac: float = 0.1
    cache_rows: int | None = None
    policy: str = "lfu"
    lookahead: int = 0  # steps whose keys the data loader announces to the cache ahead of time
    workers: int = 2
    servers: int = 1
    eval_samples: int = 65_536
    eval_every: int = 0  # graphs: evaluate every N steps and report the best validation's metrics
    seed: int = 0
    checkpoint: str | None = None
    checkpoint_every: int = 0
    resume: str | None = None
    prefetch: bool = True
    lazy_init: bool = True  # rows no push touched are built by the worker from the seed, not pulled
    push_dtype: str = "f32"  # how pushed row gradients travel: f32, or bf16 (half the bytes, rounded)
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    fanouts: tuple[int, ...] = (10, 5)  # graphs: neighbours sampled per layer
    hidden: int = 128                   # graphs: GraphSAGE's hidden width
    dropout: float = 0.5                # graphs

    def __post_init__(self) -> None:
        checks = [
            (self.model in MODELS, f"model must be one of {MODELS}, got {self.model!r}"),
            (self._data_fits_model(), f"model {self.model!r} takes data "
             f"{GRAPH_DATA if self.model in GRAPH_MODELS else CTR_DATA}, got {self.data!r}"),
            (self.mode in MODES, f"mode must be one of {MODES}, got {self.mode!r}"),
            (self.optimizer in OPTIMIZERS, f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}"),
            (self.dense_optimizer in (None, *OPTIMIZERS),
             f"dense_optimizer must be one of {OPTIMIZERS}, got {self.dense_optimizer!r}"),
            (self.policy in POLICIES, f"policy must be one of {POLICIES}, got {self.policy!r}"),
            (self.push_dtype in ("f32", "bf16"), f"push_dtype must be 'f32' or 'bf16', got {self.push_dtype!r}"),
            (self.staleness == math.inf or (float(self.staleness).is_integer() and self.staleness >= 0),
             f"staleness must be an integer >= 0 or inf, got {self.staleness!r}"),
            (self.steps >= 0 and self.batch > 0 and self.dim > 0,
             f"steps >= 0, batch > 0 and dim > 0 expected, got {self.steps}, {self.batch}, {self.dim}"),
            (0 <= self.cache_frac <= 1, f"cache_frac must lie in [0, 1], got {self.cache_frac}"),
            (self.cache_rows is None or self.cache_rows >= 0, f"cache_rows must be >= 0, got {self.cache_rows}"),
            (isinstance(self.lookahead, int) and self.lookahead >= 0,
             f"lookahead must be an int >= 0 (steps), got {self.lookahead!r}"),
            (self.workers >= 1 and self.servers >= 1,
             f"workers and servers must be >= 1, got {self.workers} and {self.servers}"),
            (self.checkpoint_every >= 0, f"checkpoint_every must be >= 0, got {self.checkpoint_every}"),
            (not self.checkpoint_every or self.checkpoint, "checkpoint_every needs a checkpoint directory"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        object.__setattr__(self, "fanouts", tuple(int(f) for f in self.fanouts))
        if not self.fanouts or min(self.fanouts) < 1:
            raise ValueError(f"fanouts must be positive integers, got {self.fanouts}")
        if isinstance(self.synthetic, dict):
            object.__setattr__(self, "synthetic", SyntheticConfig(**self.synthetic))
        if self.staleness != math.inf:
            object.__setattr__(self, "staleness", int(self.staleness))

    def _data_fits_model(self) -> bool:
        kinds = GRAPH_DATA if self.model in GRAPH_MODELS else CTR_DATA
        return any(self.data == k or (k.endswith(("DIR", "PATH", "NODES")) and self.data.startswith(k.split(":")[0] + ":")
                                      and len(self.data) > len(k.split(":")[0]) + 1) for k in kinds)

    @property
    def graph(self) -> bool:
        return self.model in GRAPH_MODELS

    @property
    def cached(self) -> bool:
        return self.mode == "het"

    def cache_rows_for(self, table_rows: int) -> int:
        """Rows of the worker cache for a table of ``table_rows`` rows (0 without a cache)."""
        if not self.cached:
            return 0
        if self.cache_rows is not None:
            return min(self.cache_rows, table_rows)
        return int(self.cache_frac * table_rows)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["staleness"] = "inf" if self.staleness == math.inf else self.staleness
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        d = dict(d)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown config keys {sorted(unknown)}; known: {sorted(names)}")
        if d.get("staleness") in ("inf", "infinity"):
            d["staleness"] = math.inf
        if isinstance(d.get("synthetic"), dict):
            d["synthetic"] = SyntheticConfig(**d["synthetic"])
        return cls(**d)

    @classmethod
    def load(cls, path: str | None, overrides: dict) -> "TrainConfig":
        """The TOML file at ``path`` (if any), then ``overrides`` (flags that were given)."""
        d: dict = {}
        if path:
            with open(path, "rb") as f:
                try:
                    d = tomllib.load(f)
                except tomllib.TOMLDecodeError as e:
                    raise ValueError(f"{path}: not valid TOML: {e}") from None
        model = overrides.get("model", d.get("model", "wdl"))
        if model in GRAPH_MODELS:  # a graph job's defaults differ from a CTR job's
            d = {**GRAPH_DEFAULTS, **d}
        d = {**MODEL_DEFAULTS.get(model, {}), **d}
        synthetic = dict(d.pop("synthetic", {}))
        for key, value in overrides.items():
            if key.startswith("synthetic_"):
                synthetic[key[len("synthetic_"):]] = value
            else:
                d[key] = value
        if synthetic:
            d["synthetic"] = synthetic
        return cls.from_dict(d)
