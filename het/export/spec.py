"""An export's input spec: how raw values become keys and dense features exactly as training
made them, written down at export time and applied when scoring.

What a CTR job reads comes from one of four sources, and its spec says which:

- ``synthetic``: the generator's settings (``het train --data synthetic-criteo``, ``-1tb``). Raw
  columns are ``I1..I13`` (dense values as the generator gives them, ``log(count + 1)``) and
  ``C1..C26``, each field's own id ``0 .. cardinality - 1`` (a list of ids for a multi-hot field).
- ``table``: ``het data prepare table``'s columns: the label, the dense columns (under the
  transforms fitted on the training rows, :mod:`het.data.transforms`; or ``--log-dense``:
  ``log(max(x, 0) + 1)``, missing -> 0) and the sparse ones, each value's text hashed with its
  column's name (missing: the empty string, its column's own key), then looked up in the
  vocabulary fitted on the training rows where there is one (:mod:`het.data.vocab`); last the
  bucketed dense columns, each value's quantile bucket as a key (:mod:`het.data.buckets`).
- ``criteo``: ``het data prepare criteo``'s label-encoding: ``C1..C26`` hex ids looked up in the
  vocabulary it kept (an id rarer than its ``--min-freq``: the field's rare key; missing: its
  missing key), ``I1..I13`` as ``log(max(x, 0) + 1)``.
- ``criteo-hashed``: ``het data prepare criteo --hash``: a ``table`` spec of Criteo's columns.

Then ``hash_ids`` (``het train --ids hashed`` on label-encoded data) hashes each field's id
into the dynamic table's key, as :class:`het.data.hashed.HashedIds` does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from het.data.buckets import bucket_keys
from het.data.hashing import hash_fields
from het.data.labels import Positive
from het.data.multi import multi_keys
from het.data.numbers import parse_numbers
from het.data.prepared import read_meta
from het.data.stream import first_partition
from het.data.stream_raw import RawPartitions, default_directory, is_raw
from het.data.table import hash_column
from het.data.transforms import apply
from het.data.vocab import apply_vocab

SOURCES = ("synthetic", "table", "criteo", "criteo-hashed")
CRITEO_DENSE = tuple(f"I{i}" for i in range(1, 14))
CRITEO_SPARSE = tuple(f"C{i}" for i in range(1, 27))
VOCAB_FILE = "input/vocab.npy"
_OK = -1


def build_spec(config: dict) -> tuple[dict, dict[str, str]]:
    """The input spec of a job's config (:meth:`het.train.config.TrainConfig.to_dict`), and the
    files it needs copied into the export (``{name in the export: source path}``). Reads the
    prepared data's ``meta.json``, so that directory must still be there."""
    data, hashed = config["data"], config["ids"] == "hashed"
    if data in ("synthetic-criteo", "synthetic-criteo-1tb"):
        return _synthetic_spec(config, data, hashed), {}
    if data == "stream":  # a stream's partitions: the first one's columns (synthetic ones: their generator's)
        stream = config["stream"]
        directory = first_partition(stream["pattern"])
        if is_raw(directory):  # a raw partition: its preparation holds the columns and the fitted transforms
            directory = RawPartitions(stream.get("prepared") or default_directory(stream["pattern"]),
                                      stream.get("schema")).prepared(directory)
        meta = _prepared_meta(directory, data)
        if meta.get("source") == "synthetic-stream":
            return _synthetic_spec(meta, "synthetic-criteo", hashed=True), {}
    else:
        kind, _, directory = data.partition(":")
        meta = _prepared_meta(directory, data)
    if meta.get("format") == "het-hashed":
        source = "criteo-hashed" if meta.get("source") == "criteo" else "table"
        log = str(meta.get("dense_transform", "")).startswith("log")
        spec = {"source": source, "label": meta["label"], "dense": list(meta["dense"]), "sparse": list(meta["sparse"]),
                "log_dense": log, "bag_sizes": [1] * len(meta["sparse"]), "hash_ids": False}
        if meta.get("dense_transforms"):  # fitted on the training rows: applied here as there
            spec["dense_transforms"] = meta["dense_transforms"]
        if meta.get("positive") is not None:  # the label's values that were 1
            spec["positive"] = meta["positive"]
        if meta.get("multi"):  # multi-hot columns: their separators, bags, padding and pooling
            spec.update(bag_sizes=list(meta["bag_sizes"]), multi=dict(meta["multi"]), pad_key=int(meta["pad_key"]),
                        pooling=meta.get("pooling", "mean"))
        if meta.get("buckets"):  # dense columns made ids: their boundaries, fitted on the training rows
            spec["buckets"] = meta["buckets"]
        if meta.get("vocabulary"):  # the ids kept a key of their own, and each column's out-of-vocabulary key
            spec["vocabulary"], spec["oov"] = VOCAB_FILE, dict(meta["vocabulary"]["oov"])
            return spec, {VOCAB_FILE: os.path.join(directory, meta["vocabulary"]["file"])}
        return spec, {}
    spec = {"source": "criteo", "label": "label", "dense": list(CRITEO_DENSE), "sparse": list(CRITEO_SPARSE),
            "log_dense": True, "bag_sizes": [1] * 26, "offsets": meta["offsets"],
            "cardinalities": meta["cardinalities"], "min_freq": meta.get("min_freq"), "hash_ids": hashed}
    vocab = os.path.join(directory, meta.get("vocabulary", "vocab.npy"))
    if os.path.isfile(vocab):
        spec["vocabulary"] = VOCAB_FILE
        return spec, {VOCAB_FILE: vocab}
    spec["vocabulary"] = None  # prepared before het kept it: keys from prepared data only
    return spec, {}


def _synthetic_spec(config: dict, data: str, hashed: bool) -> dict:
    from het.data.synthetic import SyntheticCriteo, SyntheticCriteoConfig, criteo_1tb

    s = config["synthetic"]
    settings = {"alpha": s["alpha"], "cap": s["cap"], "scale": s["scale"], "seed": s["seed"]}
    preset = criteo_1tb if data == "synthetic-criteo-1tb" else SyntheticCriteoConfig
    gen = SyntheticCriteo(preset(**settings))
    return {"source": "synthetic", "preset": data, "synthetic": settings, "label": "label",
            "dense": list(CRITEO_DENSE), "sparse": list(CRITEO_SPARSE), "bag_sizes": list(gen.bag_sizes),
            "cardinalities": list(gen.cardinalities), "offsets": gen.offsets.tolist(),
            "hash_ids": hashed or data == "synthetic-criteo-1tb"}


def _prepared_meta(directory: str, data: str) -> dict:
    path = os.path.join(directory, "meta.json")
    if not os.path.isfile(path):
        raise ValueError(f"the checkpoint was trained on {data}, and its input spec comes from {path}: "
                         f"not found (the prepared directory must be where training read it)")
    return read_meta(path)


@dataclass
class Parsed:
    """Raw rows made model input. ``bad`` (n,) is -1 for a row read, else the index in
    :attr:`Inputs.columns` of its first bad column; ``dense``, ``keys`` and ``labels`` hold every
    row (a bad row's values are placeholders). Shapes: dense (n, D) float32, keys (n, L) int64,
    labels (n,) float32 or None."""

    dense: np.ndarray
    keys: np.ndarray
    labels: np.ndarray | None
    bad: np.ndarray
    reasons: dict[int, str]  # row -> why it was not read (the first rows of each batch only)

    @property
    def ok(self) -> np.ndarray:
        return self.bad == _OK


class Inputs:
    """An export's input spec at work: raw columns -> dense features and table keys.

    Args:
        spec: the manifest's ``input``.
        root: the export directory (where the spec's files are).
    """

    def __init__(self, spec: dict, root: str):
        if spec.get("source") not in SOURCES:
            raise ValueError(f"input spec source must be one of {SOURCES}, got {spec.get('source')!r}")
        self.spec, self.root = spec, root
        self.source = spec["source"]
        self.label, self.dense, self.sparse = spec["label"], list(spec["dense"]), list(spec["sparse"])
        self.bag_sizes = [int(b) for b in spec["bag_sizes"]]
        self.key_fields = np.repeat(np.arange(len(self.sparse)), self.bag_sizes)
        self.buckets = {t["column"]: t for t in spec.get("buckets") or []}
        hashed = [c for c in self.sparse if c not in self.buckets]
        self.oov_slots = np.repeat([int(spec["oov"][c]) for c in hashed], self.bag_sizes[:len(hashed)]) \
            if spec.get("oov") else np.zeros(0, np.int64)  # each hashed key's column's out-of-vocabulary key
        self._vocab = None

    @property
    def columns(self) -> list[str]:
        """Every column the spec reads: the label, the dense columns, the sparse ones."""
        return [self.label, *self.dense, *self.sparse]

    @property
    def num_keys(self) -> int:
        return len(self.key_fields)

    # -- keys -----------------------------------------------------------------------------------
    def table_keys(self, data_keys: np.ndarray) -> np.ndarray:
        """Keys as a prepared directory or the generator holds them -> the table's keys (hashed
        per field where training hashed them). Shape: (n, L) -> (n, L) int64."""
        data_keys = np.asarray(data_keys, dtype=np.int64)
        if not self.spec.get("hash_ids"):
            return data_keys
        offsets = np.asarray(self.spec["offsets"], dtype=np.int64)[self.key_fields]
        return hash_fields(self.key_fields, data_keys - offsets)

    def kept_ids(self) -> np.ndarray:
        """A ``table`` spec's vocabulary: the sorted keys that keep their own (het.data.vocab)."""
        if self._vocab is None:
            self._vocab = np.load(os.path.join(self.root, self.spec["vocabulary"]))
        return self._vocab

    def vocabulary(self):
        """The label-encoding of a ``criteo`` spec (het.data.criteo.Vocabulary)."""
        if self._vocab is None:
            from het.data.criteo import Vocabulary

            if not self.spec.get("vocabulary"):
                raise ValueError("this export's Criteo data was prepared without its vocabulary (het data "
                                 "prepare criteo before it kept vocab.npy): it scores prepared data "
                                 "(--data criteo:DIR), not raw values; prepare and train again to score raw ones")
            self._vocab = Vocabulary.from_keys(np.load(os.path.join(self.root, self.spec["vocabulary"])))
        return self._vocab

    # -- raw columns ----------------------------------------------------------------------------
    def parse(self, table: pa.Table | pa.RecordBatch, need_label: bool = False) -> Parsed:
        """Raw columns (Arrow) -> :class:`Parsed`. A column the spec needs and ``table`` lacks is a
        ValueError naming it; so is a column of the wrong kind (nested values for a single id)."""
        names = table.schema.names
        missing = [c for c in self.columns[1:] + ([self.label] if need_label else []) if c not in names]
        if missing:
            shown = missing if len(missing) <= 6 else f"{missing[:6]}... ({len(missing)} in all)"
            reads = f"{self.dense[:3] + self.sparse[:3]}... ({len(self.columns) - 1} columns)" \
                if len(self.columns) > 7 else str(self.columns[1:])
            raise ValueError(f"missing column(s) {shown}: this model reads {reads}"
                             f"{' and the label ' + repr(self.label) if need_label else ''}")
        n = table.num_rows
        bads, reasons = [], {}
        labels = None
        if self.label in names:
            labels, bad = Positive(self.spec.get("positive")).labels(_column(table, self.label))
            bads.append(bad)
        else:
            bads.append(np.zeros(n, bool))
        dense = np.zeros((n, len(self.dense)), np.float32)
        for j, name in enumerate(self.dense):
            dense[:, j], bad = self._dense(_column(table, name), name)
            bads.append(bad)
        keys, key_bads = self._keys(table)
        bads += key_bads
        stacked = np.stack(bads, 1)
        first = np.where(stacked.any(1), stacked.argmax(1), _OK)
        for i in np.flatnonzero(first != _OK)[:10]:
            col = self.columns[int(first[i])]
            reasons[int(i)] = f"{col}: {_show(_column(table, col), int(i))} {self._expected(col)}"
        return Parsed(dense, keys, labels, first, reasons)

    def _dense(self, arr: pa.Array, name: str) -> tuple[np.ndarray, np.ndarray]:
        _check_flat(arr, name)
        x, missing, bad = parse_numbers(arr)
        if self.spec.get("dense_transforms"):
            return apply(x, missing, self.spec["dense_transforms"][self.dense.index(name)]), bad
        if self.spec.get("log_dense"):
            x = np.log1p(np.where(x > 0, x, 0.0))
        return x, bad

    def _keys(self, table) -> tuple[np.ndarray, list[np.ndarray]]:
        """The table keys of every row, and a bad mask per sparse column."""
        n = table.num_rows
        if self.source in ("table", "criteo-hashed"):
            keys, bads, col, seps = np.empty((n, self.num_keys), np.int64), [], 0, self.spec.get("multi", {})
            for name, size in zip(self.sparse, self.bag_sizes):
                arr = _column(table, name)
                bad = np.zeros(n, bool)
                if name in seps:  # a list, or its separated text: a bag of keys (het.data.multi)
                    keys[:, col:col + size] = multi_keys(name, arr, seps[name], size)[0]
                elif name in self.buckets:  # a number's quantile bucket (het.data.buckets)
                    _check_flat(arr, name)
                    x, missing, bad = parse_numbers(arr)
                    keys[:, col] = bucket_keys(x, missing, self.buckets[name])
                else:
                    _check_flat(arr, name)
                    keys[:, col] = hash_column(name, _lower(arr) if self.source == "criteo-hashed" else arr)
                bads.append(bad)
                col += size
            if self.spec.get("vocabulary"):  # the bucketed columns are last, their keys all kept
                width = len(self.oov_slots)
                keys[:, :width] = apply_vocab(keys[:, :width], self.kept_ids(), self.oov_slots)
            return keys, bads
        if self.source == "criteo":
            raw, bads = np.empty((n, 26), np.int64), []
            for j, name in enumerate(self.sparse):
                arr = _column(table, name)
                _check_flat(arr, name)
                ids, bad = hex_ids(arr)
                raw[:, j] = np.where(ids >= 0, ids | (j << 32), -1)
                bads.append(bad)
            return self.table_keys(self.vocabulary().encode(raw)), bads
        return self._synthetic_keys(table)

    def _synthetic_keys(self, table) -> tuple[np.ndarray, list[np.ndarray]]:
        n = table.num_rows
        cards = np.asarray(self.spec["cardinalities"], dtype=np.int64)
        offsets = np.asarray(self.spec["offsets"], dtype=np.int64)
        keys, bads, col = np.zeros((n, self.num_keys), np.int64), [], 0
        for f, name in enumerate(self.sparse):
            ids, bad = _ids(_column(table, name), name, self.bag_sizes[f])  # (n, bag)
            bad |= ((ids < 0) | (ids >= cards[f])).any(1)
            keys[:, col:col + self.bag_sizes[f]] = np.where(bad[:, None], offsets[f], ids + offsets[f])
            bads.append(bad)
            col += self.bag_sizes[f]
        return self.table_keys(keys), bads

    def _expected(self, column: str) -> str:
        if column == self.label:
            return "is not a label 0 or 1"
        if column in self.dense or column in self.buckets:
            return "is not a finite number"
        if self.source == "criteo":
            return "is not a Criteo id (8 hex digits, or empty for missing)"
        if self.source == "synthetic":
            f = self.sparse.index(column)
            size = self.bag_sizes[f]
            what = "an id" if size == 1 else f"a list of {size} ids"
            return f"is not {what} in [0, {self.spec['cardinalities'][f]})"
        return "cannot be read"


def to_arrow(columns) -> pa.Table:
    """Raw columns as Arrow: a dict of columns (lists or arrays), a pandas or polars DataFrame, or
    an Arrow table or record batch. ValueError names a column Arrow cannot read."""
    if isinstance(columns, pa.Table):
        return columns
    if isinstance(columns, pa.RecordBatch):
        return pa.Table.from_batches([columns])
    if hasattr(columns, "to_dict") and hasattr(columns, "columns") and hasattr(columns, "dtypes"):  # pandas
        return pa.Table.from_pandas(columns, preserve_index=False)
    if type(columns).__module__.startswith("polars") and hasattr(columns, "to_arrow"):  # polars, where installed
        return columns.to_arrow()
    if not isinstance(columns, dict):
        raise ValueError(f"expected columns as a dict, a pandas or polars DataFrame or a pyarrow Table, "
                         f"got {type(columns).__name__}")
    arrays, lengths = {}, {}
    for name, values in columns.items():
        if not isinstance(name, str):
            raise ValueError(f"column names must be strings, got {name!r}")
        try:
            arrays[name] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as e:
            raise ValueError(f"column {name!r}: {str(e).splitlines()[0][:200]}") from None
        lengths[name] = len(arrays[name])
    if len(set(lengths.values())) > 1:
        raise ValueError(f"columns must have the same length, got {lengths}")
    return pa.table(arrays) if arrays else pa.table({})


def hex_ids(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Criteo ids (8 hex digits) -> (ids int64, -1 for missing; bad). Shape: (n,) -> (n,), (n,).

    Example:
        >>> ids, bad = hex_ids(pa.array(["68fd1e64", "", None, "xyz", "0000000A"]))
        >>> ids.tolist(), bad.tolist()
        ([1761418852, -1, -1, -1, 10], [False, False, False, True, False])
    """
    if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        arr = pc.cast(arr, pa.string())
    arr = pc.fill_null(arr, "")
    lengths = pc.utf8_length(arr).to_numpy(zero_copy_only=False)
    valid = pc.match_substring_regex(arr, "^[0-9a-fA-F]{8}$").to_numpy(zero_copy_only=False)
    padded = pc.utf8_rpad(pc.if_else(pc.equal(pc.utf8_length(arr), 8), arr, "00000000"), 8, "0")
    text = np.frombuffer(padded.buffers()[2], np.uint8)
    offsets = np.frombuffer(padded.buffers()[1], np.int32)[padded.offset:padded.offset + len(padded) + 1]
    chars = text[offsets[:-1, None] + np.arange(8)]  # (n, 8)
    nibbles = np.where(chars <= 57, chars - 48, (chars | 32) - 87).astype(np.int64)
    ids = (nibbles << (4 * np.arange(7, -1, -1))).sum(1)
    return np.where(valid, ids, -1), ~valid & (lengths > 0)


def _ids(arr: pa.Array, name: str, size: int) -> tuple[np.ndarray, np.ndarray]:
    """A synthetic field's ids, (n, size) int64, and which rows are bad."""
    n = len(arr)
    if size == 1:
        _check_flat(arr, name)
        if pa.types.is_integer(arr.type):
            ids = pc.fill_null(arr, -1).to_numpy(zero_copy_only=False).astype(np.int64)
            return ids[:, None], np.asarray(arr.is_null())
        x, missing, bad = parse_numbers(arr)
        ok = ~missing & ~bad & (x == np.floor(x))
        return np.where(ok, x, -1).astype(np.int64)[:, None], ~ok
    if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)):
        raise ValueError(f"column {name!r}: expected a list of {size} ids per row (a multi-hot field), got {arr.type}")
    lengths = pc.fill_null(pc.list_value_length(arr), -1).to_numpy(zero_copy_only=False)
    flat = pc.list_flatten(arr)
    if not pa.types.is_integer(flat.type) and len(flat):
        raise ValueError(f"column {name!r}: expected lists of integer ids, got {arr.type}")
    ok = lengths == size
    values = pc.fill_null(flat, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    out = np.full((n, size), -1, np.int64)
    starts = np.concatenate([[0], np.cumsum(np.maximum(lengths, 0))[:-1]])
    out[ok] = values[starts[ok, None] + np.arange(size)]
    return out, ~ok


def _column(table, name: str) -> pa.Array:
    col = table.column(name)
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def _check_flat(arr: pa.Array, name: str) -> None:
    if pa.types.is_nested(arr.type):
        raise ValueError(f"column {name!r}: expected a number or a string per row, got {arr.type}")


def _lower(arr: pa.Array) -> pa.Array:
    if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        arr = pc.cast(arr, pa.string())
    return pc.utf8_lower(arr)


def _show(arr: pa.Array, i: int) -> str:
    value = arr[i].as_py()
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
