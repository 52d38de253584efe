"""The closed choices of het's configs and modules, each an enum defined once.

A choice is written by users as a string (a flag, a TOML value, an argument); configs turn it
into a member when they are built and give it back as the same string when they are written
(:func:`het.config.plain`). Where a string is compared or looked up, a member does as well.
"""

from __future__ import annotations

import enum
import sys


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
    def _missing_(cls, value):
        """An old spelling of a member (:data:`SPELLED`): the member, saying once on stderr how
        it is spelled."""
        new = SPELLED.get(cls.__name__, {}).get(value) if isinstance(value, str) else None
        if new is None:
            return None
        if (cls.__name__, value) not in _SAID:
            _SAID.add((cls.__name__, value))
            print(f"het: {cls.__name__} {value!r} is spelled {new!r}; the old spelling will be removed", file=sys.stderr)
        return cls(new)

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


class Precision(Choice):
    """How floats are kept or travel: het's one vocabulary of precisions. Each use takes some
    of them: a table's rows (:class:`RowDtype`), pushed gradients (:class:`PushDtype`), the
    dense AllReduce (:class:`DenseCompression`) and an export's rows (``het export --dtype``);
    ``int8`` is an export's rows quantised a row at a time (a scale and an offset beside it).

    Example:
        >>> [(p.value, p.bytes) for p in Precision]
        [('fp32', 4), ('fp16', 2), ('bf16', 2), ('int8', 1)]
    """

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    INT8 = "int8"

    @property
    def bytes(self) -> int:
        """The bytes of one value."""
        return {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1}[self.value]


class PushDtype(Choice):
    """How pushed gradients travel: float32, or bfloat16 (half the bytes, rounded to nearest).

    Example:
        >>> PushDtype("bf16").bytes, PushDtype.FP32.bytes
        (2, 4)
    """

    FP32 = Precision.FP32.value
    BF16 = Precision.BF16.value

    @property
    def bytes(self) -> int:
        return Precision(self.value).bytes


class RowDtype(Choice):
    """How a shard stores a table's rows: float32, or in half the bytes as float16 (11
    significant bits, values to 65504) or bfloat16 (8 bits, float32's range). Optimizer state
    stays float32; updates are computed in float32 and rounded (:mod:`het.ps.protocol.halves`)."""

    FP32 = Precision.FP32.value
    FP16 = Precision.FP16.value
    BF16 = Precision.BF16.value


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

    FP32 = Precision.FP32.value
    FP16 = Precision.FP16.value
    BF16 = Precision.BF16.value
    POWERSGD = "powersgd"

    @property
    def bytes(self) -> int:
        """The bytes a gradient value travels in (PowerSGD's factors: float32)."""
        return 4 if self is DenseCompression.POWERSGD else Precision(self.value).bytes


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
EXPORT_DTYPES = (Precision.FP32.value, Precision.FP16.value, Precision.INT8.value)  # an export's rows

# Old spellings of choices, by choice: still read, each saying once how it is spelled.
SPELLED = {"PushDtype": {"f32": "fp32"}, "DenseCompression": {"none": "fp32"}}
_SAID: set = set()
