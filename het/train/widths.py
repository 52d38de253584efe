"""Each CTR field's embedding width: one for all (``dim``), a width a field from its distinct ids
(``dim = "auto"``), or widths set by name (``widths``), and the PS tables they make
(:func:`het.nn.fields.plan_groups`: one table a distinct width).

The ``auto`` rule is the rule of thumb of TensorFlow's feature columns and DeepCTR: about
``6 * ids ** 0.25``, here as the nearest power of two from 4 to 64, so a column of two values gets
8 and one of a million 64, and a job has few distinct widths, so few tables.
"""

from __future__ import annotations

import math

from het.data.sketch import distinct_per_field
from het.train.config import AUTO, AUTO_MOST

AUTO_LEAST = 4
COUNT_ROWS = 1 << 22  # the training rows read to count a prepared table's ids a field (its first 4M)


def auto_width(ids: int) -> int:
    """The ``auto`` width of a field of ``ids`` distinct ids.

    Example:
        >>> [auto_width(n) for n in (2, 10, 100, 1000, 10 ** 6, 10 ** 9)]
        [8, 8, 16, 32, 64, 64]
    """
    w = 6 * max(int(ids), 1) ** 0.25
    return int(min(AUTO_MOST, max(AUTO_LEAST, 2 ** round(math.log2(w)))))


def field_names(data) -> list[str]:
    """The data's field names: a prepared table's columns, else Criteo's ``C1 .. C26``."""
    names = list(getattr(data, "meta", {}).get("sparse") or [])
    if len(names) != data.num_fields:
        names = [f"C{f + 1}" for f in range(data.num_fields)]
    return names


def field_ids(data) -> list[int]:
    """Distinct ids of each field: the data's cardinalities where it has them (synthetic data,
    label-encoded Criteo), a prepared table's ``field_ids`` (counted on its training split when
    it was prepared), else counted on the training split's first :data:`COUNT_ROWS` rows (a
    sketch beyond 4,096 ids a field, within a few percent)."""
    inner = data
    while getattr(inner, "cardinalities", None) is None and hasattr(inner, "data"):
        inner = inner.data
    cards = getattr(inner, "cardinalities", None)
    if cards is None:
        cards = getattr(data, "meta", {}).get("field_ids")
    if cards is not None:
        return [max(1, int(c)) for c in cards]
    rows, block = min(data.rows["train"], COUNT_ROWS), 1 << 16
    blocks = (data.batch("train", i, block).sparse.numpy()[:rows - i * block] for i in range(math.ceil(rows / block)))
    counts = distinct_per_field(blocks, getattr(data, "bag_sizes", (1,) * data.num_fields), getattr(data, "pad_key", None))
    return [max(1, c) for c in counts]


def widths_of(cfg, data) -> list[int] | None:
    """Each field's width under ``cfg``, or ``None`` when every field takes ``cfg.dim`` (one table).

    Raises ValueError naming the fields when ``cfg.widths`` names one the data lacks."""
    if not cfg.several_widths:
        return None
    names = field_names(data)
    given = dict(cfg.widths or {})
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ValueError(f"widths: no field {', '.join(map(repr, unknown))} in the data; its fields: {', '.join(names)}")
    ids = field_ids(data) if cfg.dim == AUTO else None
    return [given[n] if n in given else (auto_width(ids[f]) if ids is not None else cfg.dim)
            for f, n in enumerate(names)]
