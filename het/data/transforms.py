"""Dense columns' transforms, fitted on the training split and applied unchanged wherever the
model scores: in the prepared arrays, ``het predict``, ``het.load_model`` and ``het serve-model``.

A transform is plain data (one dict a column, kept in the prepared ``meta.json`` and in an
export's input spec) and one function applies it, :func:`apply`, so training and serving cannot
differ. Its steps, in order:

1. the value as float32 (what a prepared array stores), widened to float64;
2. ``log``: ``log(max(x, 0) + 1)``;
3. ``standard``: ``(x - mean) / std``, both fitted on the training rows;
4. clipped to what the training rows gave (``lo``, ``hi``): an unseen extreme value scores as
   the most extreme value training saw;
5. a missing value is 0 after the steps: the training mean under ``standard``.

Kinds: ``none`` (x, missing -> 0: the column as given), ``log``, ``standard``, ``log-standard``;
``auto`` chooses per column from the training rows: ``log-standard`` for a non-negative column
skewed to the right (skewness over 1: counts, amounts, durations), else ``standard``. Dense
inputs fed raw cost a real CTR table 0.014 AUC (``shared/docs/QUALITY.md``): ``auto`` is the
default of ``het data prepare table``. ``bucket`` makes the columns ids instead
(:mod:`het.data.buckets`).
"""

from __future__ import annotations

import math

import numpy as np

TRANSFORMS = ("auto", "none", "log", "standard", "log-standard")
KINDS = (*TRANSFORMS, "bucket")  # bucket: quantile buckets as ids instead (het.data.buckets)
SKEW_FOR_LOG = 1.0  # auto: log1p first when a non-negative column's skewness passes this


def _log(x: np.ndarray) -> np.ndarray:
    return np.log1p(np.where(x > 0, x, 0.0))


class DenseStats:
    """Moments of each dense column over the rows :meth:`add` is given (the training split),
    raw and after ``log``, missing values left out; enough to fit every kind.

    Example:
        >>> s = DenseStats(1)
        >>> s.add(np.array([[1.0], [3.0], [np.nan]], np.float32))
        >>> t = s.fit(["x"], "standard")[0]
        >>> t["kind"], t["mean"], t["std"], t["count"]
        ('standard', 2.0, 1.0, 2)
    """

    def __init__(self, width: int):
        self.count = np.zeros(width, np.int64)
        self.moments = np.zeros((2, 3, width))  # (raw, log), (sum x, x^2, x^3)
        self.lo = np.full(width, np.inf)
        self.hi = np.full(width, -np.inf)

    def add(self, dense: np.ndarray) -> None:
        """Rows of raw values, NaN where missing. Shape: (n, D)."""
        x = np.asarray(dense, np.float32).astype(np.float64)
        seen = ~np.isnan(x)
        self.count += seen.sum(0)
        for i, v in enumerate((x, _log(x))):
            v = np.where(seen, v, 0.0)
            for p in range(3):
                self.moments[i, p] += (v ** (p + 1)).sum(0)
        self.lo = np.minimum(self.lo, np.where(seen, x, np.inf).min(0, initial=np.inf))
        self.hi = np.maximum(self.hi, np.where(seen, x, -np.inf).max(0, initial=-np.inf))

    def _mean_std_skew(self, j: int, log: bool) -> tuple[float, float, float]:
        n = max(int(self.count[j]), 1)
        s1, s2, s3 = (float(m) / n for m in self.moments[int(log), :, j])
        var = max(s2 - s1 * s1, 0.0)
        std = math.sqrt(var)
        skew = (s3 - 3 * s1 * var - s1 ** 3) / std ** 3 if std > 0 else 0.0
        return s1, std, skew

    def fit(self, names: list[str], kind: str = "auto") -> list[dict]:
        """One transform a column (see the module docstring), of ``kind`` or chosen by ``auto``."""
        if kind not in TRANSFORMS:
            raise ValueError(f"dense transform must be one of {TRANSFORMS}, got {kind!r}")
        out = []
        for j, name in enumerate(names):
            chosen = kind
            if kind == "auto":
                right_skewed = self.lo[j] >= 0 and self._mean_std_skew(j, log=False)[2] > SKEW_FOR_LOG
                chosen = "log-standard" if right_skewed else "standard"
            log = chosen.startswith("log")
            t = {"column": name, "kind": chosen, "log": log, "standard": chosen.endswith("standard"),
                 "count": int(self.count[j]), "mean": 0.0, "std": 1.0, "lo": None, "hi": None}
            if t["standard"]:
                mean, std, _ = self._mean_std_skew(j, log)
                t["mean"], t["std"] = mean, std if std > 0 else 1.0
            if chosen != "none" and self.count[j]:
                t["lo"], t["hi"] = (float(_steps(np.array([v]), t)[0]) for v in (self.lo[j], self.hi[j]))
            out.append(t)
        return out


def _steps(x: np.ndarray, t: dict) -> np.ndarray:
    """Steps 2 and 3 of the module docstring on float64 values."""
    if t["log"]:
        x = _log(x)
    if t["standard"]:
        x = (x - t["mean"]) / t["std"]
    return x


def apply(x: np.ndarray, missing: np.ndarray, t: dict) -> np.ndarray:
    """A column's raw values -> the model's float32 input under transform ``t``.

    Shape:
        (n,) float, (n,) bool -> (n,) float32.

    Example:
        >>> t = {"column": "x", "kind": "standard", "log": False, "standard": True, "mean": 2.0, "std": 1.0,
        ...      "lo": -1.0, "hi": 1.0}
        >>> apply(np.array([1.0, 9.0, 0.0]), np.array([False, False, True]), t).tolist()
        [-1.0, 1.0, 0.0]
    """
    v = np.asarray(x, np.float32).astype(np.float64)
    v = _steps(np.where(missing, 0.0, v), t)
    if t.get("lo") is not None:
        v = np.clip(v, t["lo"], t["hi"])
    return np.where(missing, 0.0, v).astype(np.float32)


def apply_all(dense: np.ndarray, transforms: list[dict]) -> np.ndarray:
    """Every column of raw rows (NaN where missing) under its transform. Shape: (n, D) -> (n, D)."""
    out = np.empty(dense.shape, np.float32)
    for j, t in enumerate(transforms):
        x = np.asarray(dense[:, j], np.float32)
        out[:, j] = apply(x, np.isnan(x), t)
    return out


def describe(transforms: list[dict]) -> str:
    """One line: each column and its kind (``age standard, fnlwgt log-standard``)."""
    return ", ".join(f"{t['column']} {t['kind']}" for t in transforms) or "no dense columns"
