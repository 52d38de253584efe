"""The closed choices of het's configs and modules, each an enum defined once.

A choice is written by users as a string (a flag, a TOML value, an argument); configs turn it
into a member when they are built and give it back as the same string when they are written
(:func:`het.config.plain`). Where a string is compared or looked up, a member does as well.
"""

from __future__ import annotations

import enum


class Choice(str, enum.Enum):
    """A closed choice. A member is its value, a str: it compares and hashes as the string,
    and prints, formats and serialises (JSON, TOML, a config's ``to_dict``) as it, so configs
    holding members read and write the same strings users write.

    Example:
        >>> import json
        >>> Policy("lfu") is Policy.LFU, Policy.LRU == "lru", f"{Policy.LRU}", json.dumps([Policy.LFU])
        (True, True, 'lru', '["lfu"]')
        >>> Policy.parse("LRU", "policy")
        Traceback (most recent call last):
        ...
        ValueError: policy must be one of ('lru', 'lfu'), got 'LRU'
    """

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return repr(self.value)

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @classmethod
    def values(cls) -> tuple[str, ...]:
        """The choices as plain strings, in their order of definition."""
        return tuple(m.value for m in cls)

    @classmethod
    def parse(cls, value, what: str) -> "Choice":
        """``value`` (a member or its string) as a member; a ValueError naming ``what``, the
        choices and the value otherwise."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"{what} must be one of {cls.values()}, got {value!r}") from None


class Optimizer(Choice):
    """The optimizers a shard applies to pushed rows (:mod:`het.ps.server.store.optim`)."""

    SGD = "sgd"
    ADAGRAD = "adagrad"
    ROWWISE_ADAGRAD = "rowwise_adagrad"
    ADAM = "adam"
    FTRL = "ftrl"


DENSE_OPTIMIZERS = (Optimizer.SGD, Optimizer.ADAGRAD, Optimizer.ADAM)  # row-wise Adagrad is for embedding rows


class Policy(Choice):
    """Which rows leave first: a worker cache's replacement, a shard's DRAM tier."""

    LRU = "lru"
    LFU = "lfu"


class LocalUpdate(Choice):
    """How a worker moves its cached copy of a row (:attr:`CacheConfig.local_update`)."""

    SGD = "sgd"
    ROW = "row"
    FULL = "full"


class PushDtype(Choice):
    """How pushed gradients travel: float32, or bfloat16 (half the bytes, rounded to nearest)."""

    F32 = "f32"
    BF16 = "bf16"


class RowDtype(Choice):
    """How a shard stores a table's rows: float32, or in half the bytes as float16 (11
    significant bits, values to 65504) or bfloat16 (8 bits, float32's range). Optimizer state
    stays float32; updates are computed in float32 and rounded (:mod:`het.ps.protocol.halves`)."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"


class RowRounding(Choice):
    """How an updated half-precision row is rounded: ``stochastic`` (up or down with the
    probabilities that make the expected value exact, as FBGEMM's half tables: updates smaller
    than half a step still move a row on average) or to ``nearest``."""

    STOCHASTIC = "stochastic"
    NEAREST = "nearest"


class DenseCompression(Choice):
    """How the dense AllReduce's gradients travel: float32; halved to float16 or bfloat16 by
    DDP's compression hooks (averaged in that precision, decompressed after); or PowerSGD's
    low-rank factors (DDP's PowerSGD hook, with error feedback)."""

    NONE = "none"
    FP16 = "fp16"
    BF16 = "bf16"
    POWERSGD = "powersgd"


class Mode(Choice):
    """What a training job puts where: ``het``, a PS with worker caches; ``hybrid``, a PS and
    no cache; ``ps``, the dense layers on the PS too (TF-PS)."""

    HET = "het"
    HYBRID = "hybrid"
    PS = "ps"


class Ids(Choice):
    """How a CTR job's ids become keys: ``encoded`` 0..N-1 (one fixed table), ``hashed`` to
    int64 (one dynamic table)."""

    ENCODED = "encoded"
    HASHED = "hashed"


class Model(Choice):
    """The models ``het train`` builds (:mod:`het.models`)."""

    WDL = "wdl"
    DEEPFM = "deepfm"
    DCN = "dcn"
    DLRM = "dlrm"
    GRAPHSAGE = "graphsage"


GRAPH_MODELS = (Model.GRAPHSAGE,)  # they take a graph; the others Criteo-like data


class Pooling(Choice):
    """How het.Embedding pools a bag of keys into one row (as ``nn.EmbeddingBag``'s mode)."""

    SUM = "sum"
    MEAN = "mean"


class Split(Choice):
    """A data set's parts: the stream a job trains on and the held-out samples it is scored on."""

    TRAIN = "train"
    TEST = "test"
    VAL = "val"


POLICIES, PUSH_DTYPES, SPLITS = Policy.values(), PushDtype.values(), Split.values()  # as plain strings
