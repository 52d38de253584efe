"""Synthetic Criteo-like CTR data: deterministic by seed, with a planted model to learn.

Every sample has Criteo's shape: 13 dense count features (``log(x + 1)``, as Criteo is usually
transformed) and 26 categorical fields with Criteo's cardinalities. Field ``f``'s keys are drawn
from a power law over its ids and label-encoded, as HET does, into ONE table: field ``f`` owns the
global keys ``offsets[f] .. offsets[f] + cardinalities[f] - 1``.

:func:`criteo_1tb` gives MLPerf's shape instead (DLRM-DCNv2 on Criteo 1TB): its 26 table sizes
and multi-hot fields, field ``f`` holding a bag of ``bag_sizes[f]`` keys (drawn independently)
in every sample. A batch's keys are then each field's bag side by side: ``(B, sum(bag_sizes))``.

The labels come from a planted model: every global key has a hidden weight, a pure function of
``(seed, key)`` computed by hashing (no table of weights is stored), and the dense features
have a hidden weight vector. ``logit = signal * (sum of the 26 key weights / sqrt(26) + dense
part) + bias`` (a bag of ``L`` keys counts its weights' sum over ``sqrt(L)``) and
``label ~ Bernoulli(sigmoid(logit))``. :meth:`SyntheticCriteo.planted_auc` is the AUC of the planted logits themselves: the ceiling a learned model can reach.

The planted model may drift (:meth:`SyntheticCriteo.partition`): at an angle ``theta`` a key weighs
``cos(theta) w_a + sin(theta) w_b`` (two independent hashed weights), still standard normal and
correlated ``cos(theta1 - theta2)`` between two angles; partition ``p`` of drift ``d`` is at ``p * d``.

Nothing here is proportional to the cardinalities (up to ~10M ids a field): ranks come from the
inverse CDF of a continuous bounded power law, ranks map to ids by a seeded affine bijection
``(a * rank + b) mod card``, and the key weights are hashed on demand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from het.choices import SPLITS
from het.data.batch import Batch

CRITEO_CARDINALITIES = (1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593,
                        3194, 27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105,
                        142572)
# MLPerf's DLRM-DCNv2 on Criteo 1TB: its tables (capped at 40M rows) and multi-hot bag sizes.
MLPERF_CARDINALITIES = (40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282,
                        10, 2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973,
                        108, 36)
MLPERF_BAG_SIZES = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1)
NUM_DENSE = 13
# Seeds of the generator's streams: (seed, stream, ...). Train and test are disjoint streams.
_TRAIN, _TEST, _CALIBRATION, _PARAMS, _PARTITIONS = 0, 1, 2, 3, 4
_CALIBRATION_SAMPLES = 8192
_MAX_CARDINALITY = 2 ** 31


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


@dataclass(frozen=True)
class SyntheticCriteoConfig:
    """How :class:`SyntheticCriteo` generates its data.

    Args:
        alpha: power-law exponent of every field's key popularity: ``P(rank r) ~ (r + 1) ** -alpha``.
        cap: if set, every field's cardinality becomes ``min(card, cap)`` (applied after ``scale``).
        scale: every field's cardinality is multiplied by ``scale``, rounded, and kept >= 1.
        seed: the whole data set (ids, features, planted weights, labels) is a function of it.
        positive_rate: target fraction of positive labels; the bias is calibrated to it.
        signal: strength of the planted logits; the default gives a planted AUC of about 0.82.
        base: every field's cardinality before ``scale`` and ``cap`` (Criteo's 26 by default).
        bag_sizes: keys per field in every sample, one per field of ``base``; ``None``: one each.

    Example:
        >>> SyntheticCriteoConfig(cap=1000).cap
        1000
        >>> SyntheticCriteoConfig(alpha=-1)
        Traceback (most recent call last):
        ...
        ValueError: alpha must be a finite number > 0, got -1
    """

    alpha: float = 1.05
    cap: int | None = None
    scale: float = 1.0
    seed: int = 0
    positive_rate: float = 0.25
    signal: float = 1.15
    base: tuple[int, ...] = CRITEO_CARDINALITIES
    bag_sizes: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        _require(len(self.base) > 0 and all(_is_int(c) and c >= 1 for c in self.base),
                 f"base must be a non-empty tuple of ints >= 1, got {self.base!r}")
        _require(self.bag_sizes is None or (len(self.bag_sizes) == len(self.base)
                                            and all(_is_int(n) and n >= 1 for n in self.bag_sizes)),
                 f"bag_sizes must be None or {len(self.base)} ints >= 1 (one per field), got {self.bag_sizes!r}")
        _require(math.isfinite(self.alpha) and self.alpha > 0,
                 f"alpha must be a finite number > 0, got {self.alpha}")
        _require(self.cap is None or (_is_int(self.cap) and self.cap >= 1),
                 f"cap must be None or an int >= 1, got {self.cap!r}")
        _require(math.isfinite(self.scale) and self.scale > 0,
                 f"scale must be a finite number > 0, got {self.scale}")
        _require(_is_int(self.seed) and self.seed >= 0, f"seed must be an int >= 0, got {self.seed!r}")
        _require(0 < self.positive_rate < 1, f"positive_rate must lie in (0, 1), got {self.positive_rate}")
        _require(math.isfinite(self.signal) and self.signal >= 0,
                 f"signal must be a finite number >= 0, got {self.signal}")
        # Keys map rank -> (a * rank + b) % card in int64, so a * rank < card**2 must fit.
        _require(max(self.cardinalities()) < _MAX_CARDINALITY,
                 f"every cardinality must be < {_MAX_CARDINALITY} after scale and cap, "
                 f"got {max(self.cardinalities())} (scale={self.scale}, cap={self.cap})")

    def cardinalities(self) -> tuple[int, ...]:
        """The fields' cardinalities (Criteo's 26 unless ``base`` is given), scaled then capped.

        Example:
            >>> SyntheticCriteoConfig(scale=0.001, cap=5000).cardinalities()[:4]
            (1, 1, 5000, 2203)
        """
        cards = (max(1, round(c * self.scale)) for c in self.base)
        return tuple(c if self.cap is None else min(c, self.cap) for c in cards)


def criteo_1tb(**kwargs) -> SyntheticCriteoConfig:
    """MLPerf's shape: Criteo 1TB's 26 tables (capped at 40M rows) and its multi-hot bags.
    ``kwargs`` are the other fields of :class:`SyntheticCriteoConfig` (``cap`` still caps).

    Example:
        >>> cfg = criteo_1tb(cap=None)
        >>> sum(cfg.cardinalities()), sum(cfg.bag_sizes)
        (204184588, 214)
    """
    return SyntheticCriteoConfig(base=MLPERF_CARDINALITIES, bag_sizes=MLPERF_BAG_SIZES, **kwargs)


class SyntheticCriteo:
    """Batches of synthetic Criteo-like samples; see the module docstring for the model.

    Args:
        cfg: the generator's config.

    Attributes:
        cardinalities: the fields' cardinalities (after ``scale`` and ``cap``).
        offsets: (F,) int64, field ``f``'s first global key.
        num_rows: the number of global keys, i.e. the size of the one embedding table.
        num_dense: 13.
        num_fields: F, 26.
        bag_sizes: (F,) keys per field in a sample (all 1 unless ``cfg.bag_sizes``).
        key_fields: (L,) int64, the field of each column of :attr:`Batch.sparse`, L = sum(bag_sizes).

    Example:
        >>> data = SyntheticCriteo(SyntheticCriteoConfig(cap=1000))
        >>> data.num_rows, data.num_fields, data.num_dense
        (16727, 26, 13)
        >>> b = data.batch("train", 0, 4)
        >>> b.dense.shape, b.sparse.shape, b.labels.shape
        (torch.Size([4, 13]), torch.Size([4, 26]), torch.Size([4]))
        >>> torch.equal(b.sparse, data.batch("train", 0, 4).sparse)
        True
    """

    num_dense = NUM_DENSE

    def __init__(self, cfg: SyntheticCriteoConfig = SyntheticCriteoConfig()):
        self.cfg = cfg
        self.cardinalities = cfg.cardinalities()
        self.num_fields = len(self.cardinalities)
        self.bag_sizes = cfg.bag_sizes or (1,) * self.num_fields
        self.key_fields = np.repeat(np.arange(self.num_fields), self.bag_sizes)  # (L,)
        cards = np.array(self.cardinalities, dtype=np.int64)  # (F,)
        self.offsets = np.concatenate([[0], np.cumsum(cards)[:-1]]).astype(np.int64)
        self.num_rows = int(cards.sum())
        rng = np.random.default_rng((cfg.seed, _PARAMS))
        mult, shift = _affine_maps(cards, rng)  # (F,), (F,)
        # One entry per key column (L,): a bag's keys are drawn from their field independently.
        self._cards, self._mult, self._shift, self._offsets = (
            x[self.key_fields] for x in (cards, mult, shift, self.offsets))
        self._bag_scale = 1.0 / np.sqrt(np.array(self.bag_sizes, dtype=np.float64))[self.key_fields]
        self._dense_mu = rng.uniform(0.0, 4.0, NUM_DENSE)  # log-scale location of each count
        self._dense_sigma = rng.uniform(0.5, 2.0, NUM_DENSE)
        self._dense_weight = rng.standard_normal(NUM_DENSE)
        self._key_salt = _splitmix64(np.array([cfg.seed], dtype=np.uint64))[0]
        self._drift_salt = _splitmix64(np.array([cfg.seed, _PARTITIONS], dtype=np.uint64))[1]
        self._calibrate()

    # ---- sampling ---------------------------------------------------------------------------

    def batch(self, split: str, index: int, size: int) -> Batch:
        """The ``index``-th batch of ``size`` samples of ``split``.

        The same ``(split, index, size)`` always gives the same batch; ``"train"`` and
        ``"test"`` are independent streams.

        Args:
            split: ``"train"`` or ``"test"``.
            index: which batch of the stream, >= 0.
            size: samples in the batch, >= 1.

        Shape:
            dense (size, 13) float32, sparse (size, L) int64 (L = sum(bag_sizes): 26 unless
            multi-hot), labels (size,) float32.

        Example:
            >>> data = SyntheticCriteo()
            >>> b = data.batch("test", 3, 1000)
            >>> bool((b.dense >= 0).all()), bool((b.sparse < data.num_rows).all())
            (True, True)
        """
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        _require(_is_int(index) and index >= 0, f"index must be an int >= 0, got {index!r}")
        _require(_is_int(size) and size >= 1, f"size must be an int >= 1, got {size!r}")
        rng = np.random.default_rng((self.cfg.seed, SPLITS.index(split), index))
        return self._sample(rng, size)

    def partition(self, number: int, size: int, drift: float) -> Batch:
        """Partition ``number`` of a drifting stream: ``size`` samples labelled by the planted
        model at angle ``number * drift`` (radians), from a stream of their own (not train's or
        test's). Shape: as :meth:`batch`."""
        _require(_is_int(number) and number >= 0, f"number must be an int >= 0, got {number!r}")
        _require(_is_int(size) and size >= 1, f"size must be an int >= 1, got {size!r}")
        return self._sample(np.random.default_rng((self.cfg.seed, _PARTITIONS, number)), size, number * drift)

    def _sample(self, rng: np.random.Generator, size: int, angle: float = 0.0) -> Batch:
        sparse = self._sample_keys(rng, size)  # (B, F)
        dense = self._sample_dense(rng, size)  # (B, 13)
        logits = self.planted_logits(sparse, dense, angle)
        labels = (rng.random(size) < _sigmoid(logits)).astype(np.float32)
        return Batch(torch.from_numpy(dense), torch.from_numpy(sparse), torch.from_numpy(labels))

    def _sample_keys(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """Global keys, each field's bag side by side. Shape: -> (size, L) int64."""
        ranks = _power_law_ranks(rng.random((size, len(self.key_fields))), self._cards, self.cfg.alpha)
        # a < card < 2**31 and rank < card, so a * rank + b stays below 2**63.
        return (self._mult * ranks + self._shift) % self._cards + self._offsets

    def _sample_dense(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """Lognormal counts, floored, then ``log(x + 1)``. Shape: -> (size, 13) float32."""
        z = rng.standard_normal((size, NUM_DENSE))
        counts = np.floor(np.exp(self._dense_mu + self._dense_sigma * z))
        return np.log1p(counts).astype(np.float32)

    # ---- the planted model ------------------------------------------------------------------

    def key_weights(self, keys: np.ndarray, angle: float = 0.0) -> np.ndarray:
        """The hidden weight of every global key: standard normal, a pure function of (seed, key),
        and of the drift's ``angle`` (see the module).

        Example:
            >>> data = SyntheticCriteo()
            >>> w = data.key_weights(np.array([0, 7, 0]))
            >>> w.dtype, bool(w[0] == w[2]), bool(w[0] != w[1])
            (dtype('float64'), True, True)
        """
        w = _hashed_normal(keys, self._key_salt)
        return w if angle == 0.0 else math.cos(angle) * w + math.sin(angle) * _hashed_normal(keys, self._drift_salt)

    def planted_logits(self, sparse: np.ndarray | torch.Tensor,
                       dense: np.ndarray | torch.Tensor, angle: float = 0.0) -> np.ndarray:
        """The planted model's logits (at the drift's ``angle``); the labels of a batch are drawn
        from their sigmoid.

        Args:
            sparse: global keys, as in :attr:`Batch.sparse` (each field's bag side by side).
            dense: transformed dense features, as in :attr:`Batch.dense`.

        Shape:
            sparse (B, L), dense (B, 13) -> (B,) float64.

        Example:
            >>> data = SyntheticCriteo()
            >>> b = data.batch("train", 0, 20_000)
            >>> q = data.planted_logits(b.sparse, b.dense)
            >>> q.shape, round(float(b.labels.mean()), 2), round(float((1 / (1 + np.exp(-q))).mean()), 2)
            ((20000,), 0.26, 0.25)
            >>> high = q > np.median(q)  # the half with the higher logits is positive far more often
            >>> round(float(b.labels[high].mean()), 2), round(float(b.labels[~high].mean()), 2)
            (0.44, 0.08)
        """
        sparse, dense = self._check_features(sparse, dense)
        bags = self.key_weights(sparse, angle) * self._bag_scale  # (B, L): a bag of n keys weighs sum / sqrt(n)
        keys_part = bags.sum(1) / math.sqrt(self.num_fields)  # (B,)
        return self.cfg.signal * (keys_part + self._dense_part(dense)) + self._bias

    def _dense_part(self, dense: np.ndarray) -> np.ndarray:
        """Standardised dense features times the hidden weights. Shape: (B, 13) -> (B,)."""
        standard = (dense.astype(np.float64) - self._dense_mean) / self._dense_std
        return standard @ self._dense_weight / math.sqrt(NUM_DENSE)

    def _calibrate(self) -> None:
        """Fix the dense standardisation, then the bias so the positive rate is on target."""
        rng = np.random.default_rng((self.cfg.seed, _CALIBRATION))
        sparse = self._sample_keys(rng, _CALIBRATION_SAMPLES)
        dense = self._sample_dense(rng, _CALIBRATION_SAMPLES)
        self._dense_mean = dense.mean(0, dtype=np.float64)
        self._dense_std = np.maximum(dense.std(0, dtype=np.float64), 1e-6)
        self._bias = 0.0
        logits = self.planted_logits(sparse, dense)
        self._bias = _bias_for_rate(logits, self.cfg.positive_rate)

    def planted_auc(self, samples: int = 100_000, batch_size: int = 8192) -> float:
        """AUC of the planted logits against the labels on the first ``samples`` test samples.

        The test samples are those of ``batch("test", i, batch_size)`` for ``i = 0, 1, ...``.
        This is the ceiling a learned model can reach on that test set.

        Example:
            >>> 0.7 < SyntheticCriteo().planted_auc(samples=20_000) < 0.95
            True
        """
        _require(_is_int(samples) and samples >= 2, f"samples must be an int >= 2, got {samples!r}")
        _require(_is_int(batch_size) and batch_size >= 1,
                 f"batch_size must be an int >= 1, got {batch_size!r}")
        num_batches = -(-samples // batch_size)
        test = Batch.cat([self.batch("test", i, batch_size) for i in range(num_batches)])
        logits = self.planted_logits(test.sparse[:samples], test.dense[:samples])
        from sklearn.metrics import roc_auc_score  # here: sklearn costs 1.5 s of every het command's start

        return float(roc_auc_score(test.labels[:samples].numpy(), logits))

    def _check_features(self, sparse, dense) -> tuple[np.ndarray, np.ndarray]:
        sparse, dense = np.asarray(sparse), np.asarray(dense)
        if sparse.ndim != 2 or sparse.shape[1] != len(self.key_fields):
            raise ValueError(f"expected sparse keys of shape (B, {len(self.key_fields)}), got {sparse.shape}")
        if dense.shape != (sparse.shape[0], NUM_DENSE):
            raise ValueError(f"expected dense features of shape ({sparse.shape[0]}, {NUM_DENSE}), "
                             f"got {dense.shape}")
        if sparse.size and (sparse.min() < 0 or sparse.max() >= self.num_rows):
            raise ValueError(f"keys must lie in [0, {self.num_rows}), "
                             f"got [{sparse.min()}, {sparse.max()}]")
        return sparse, dense


# ---- pure helpers ---------------------------------------------------------------------------

def _hashed_normal(keys: np.ndarray, salt) -> np.ndarray:
    """A standard normal a key, a pure function of the key and ``salt`` (Box-Muller of a hash)."""
    h = _splitmix64(np.asarray(keys, dtype=np.int64).view(np.uint64) ^ salt)
    u1 = ((h >> np.uint64(32)).astype(np.float64) + 0.5) / 2.0 ** 32  # (0, 1)
    u2 = ((h & np.uint64(0xFFFFFFFF)).astype(np.float64) + 0.5) / 2.0 ** 32
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


def _power_law_ranks(u: np.ndarray, cards: np.ndarray, alpha: float) -> np.ndarray:
    """Ranks ``0 .. card - 1`` with ``P(rank r) ~ (r + 1) ** -alpha``, from uniforms ``u``.

    Inverts the CDF of the continuous density ``x ** -alpha`` on ``[1, card + 1)`` and floors:
    no per-id arrays, so a field of 10M ids costs what a field of 10 does.

    Shape: u (B, F), cards (F,) -> (B, F) int64.

    Example:
        >>> r = _power_law_ranks(np.random.default_rng(0).random((10_000, 1)), np.array([100]), 1.0)
        >>> int(r.min()), int(r.max()) < 100, bool((r == 0).mean() > (r == 50).mean())
        (0, True, True)
    """
    log_top = np.log(cards + 1.0)  # (F,)
    c = 1.0 - alpha
    if abs(c) < 1e-9:  # alpha == 1: F(x) = log(x) / log(card + 1)
        x = np.exp(u * log_top)
    else:  # F(x) = (x**c - 1) / ((card + 1)**c - 1), inverted with expm1/log1p for alpha near 1
        x = np.exp(np.log1p(u * np.expm1(c * log_top)) / c)
    return np.clip(np.floor(np.minimum(x, cards)) - 1, 0, cards - 1).astype(np.int64)


def _affine_maps(cards: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Per field ``(a, b)`` with ``gcd(a, card) == 1``: ``rank -> (a * rank + b) % card`` is a
    bijection that scatters the hot ranks over the field's ids. Shape: (F,) -> (F,), (F,)."""
    mult = np.ones_like(cards)
    for f, card in enumerate(cards.tolist()):  # 26 fields; a few draws each until coprime
        while card > 2:
            a = int(rng.integers(2, card))
            if math.gcd(a, card) == 1:
                mult[f] = a
                break
    return mult, rng.integers(0, cards)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser, elementwise on uint64 (wrapping arithmetic)."""
    z = x + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _bias_for_rate(logits: np.ndarray, rate: float) -> float:
    """The ``b`` with ``mean(sigmoid(logits + b)) == rate``, by bisection (the mean is monotone)."""
    lo, hi = -60.0, 60.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _sigmoid(logits + mid).mean() < rate else (lo, mid)
    return 0.5 * (lo + hi)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # no overflow for large |x|
