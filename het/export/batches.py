"""What ``het predict`` scores, a chunk of rows at a time: any of training's data specs, or raw
CSV, TSV or Parquet files (raw Criteo TSV too), read through the export's input spec.

Every source yields :class:`Chunk`\\ s in input order. A prepared directory's ``all`` split is
put back into the order of the input it was prepared from (its split is a hash of each row's
position, which ``meta.json`` records); raw rows that cannot be read are skipped and counted as
``het data prepare`` counts them, the first ones with their line and why.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator

import numpy as np

from het.data import prepared
from het.data.prepared import SPLITS, split_is_test
from het.export.chunk import Chunk, Skipped
from het.export.spec import Inputs

SYNTHETIC = ("synthetic-criteo", "synthetic-criteo-1tb")
EVAL_BATCH = 8192  # het.train.tasks.CTRTask.evaluate's batches: synthetic data's test stream is cut so
RAW_SUFFIXES = (".csv", ".tsv", ".txt", ".parquet", ".pq", ".gz")


def open_source(data: str, inputs: Inputs, manifest: dict, split: str | None, samples: int | None,
                chunk: int, skipped: Skipped, sep: str | None = None, names: list[str] | None = None,
                keep: list[str] = ()) -> tuple[Iterator[Chunk], int | None, str]:
    """``(chunks, total rows or None, split)`` of a ``--data`` spec; ``sep`` and ``names``: how
    raw CSV/TSV files are read (:func:`het.data.table_reader.batches`); ``keep``: raw columns
    carried through (raw files only)."""
    if data in SYNTHETIC:
        return _synthetic(data, inputs, manifest, split or "test", samples, chunk)
    kind, _, directory = data.partition(":")
    if keep and (data in SYNTHETIC or (kind in ("table", "criteo") and directory)):
        raise ValueError(f"--keep carries columns of raw files; {data!r} is not one (its raw columns are gone)")
    if kind in ("table", "criteo") and directory:
        return _prepared(kind, directory, inputs, split or "test", samples, chunk)
    paths = data.split(",")
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise ValueError(f"--data: expected {', '.join(SYNTHETIC)}, table:DIR, criteo:DIR or raw CSV/TSV/Parquet "
                         f"files, got {data!r} ({missing[0]!r} is not a file)")
    if split not in (None, "all"):
        raise ValueError(f"--split {split}: raw files are read whole (--split all), their rows have no split")
    from het.export.raw import raw_chunks

    return raw_chunks(paths, inputs, samples, chunk, skipped, sep, names, keep), None, "all"


def _synthetic(data, inputs: Inputs, manifest, split, samples, chunk):
    spec = inputs.spec
    if spec["source"] != "synthetic" or spec["preset"] != data:
        raise ValueError(f"--data {data}: this export was trained on {_trained_on(spec)}, not on {data}")
    if split not in SPLITS:
        raise ValueError(f"--split {split}: synthetic data has train and test streams without end; choose test or "
                         f"train (and --samples)")
    from het.data.synthetic import SyntheticCriteo, SyntheticCriteoConfig, criteo_1tb

    preset = criteo_1tb if data == "synthetic-criteo-1tb" else SyntheticCriteoConfig
    gen = SyntheticCriteo(preset(**spec["synthetic"]))
    total = samples or manifest["train"].get("eval_samples") or 100_000

    def chunks():
        for i in range(math.ceil(total / EVAL_BATCH)):  # the stream cut as training's evaluation cuts it
            b = gen.batch(split, i, min(EVAL_BATCH, total - i * EVAL_BATCH))
            for lo in range(0, len(b), chunk):
                hi = min(len(b), lo + chunk)
                yield Chunk(b.dense[lo:hi].numpy(), inputs.table_keys(b.sparse[lo:hi].numpy()),
                            b.labels[lo:hi].numpy(), i * EVAL_BATCH + np.arange(lo, hi))
    return chunks(), total, split


def _prepared(kind: str, directory: str, inputs: Inputs, split: str, samples, chunk):
    from het.data.criteo import CriteoDataset
    from het.data.table import TableDataset

    spec = inputs.spec
    expected = {"table": ("table", "criteo-hashed"), "criteo": ("criteo", "criteo-hashed")}[kind]
    if spec["source"] not in expected:
        raise ValueError(f"--data {kind}:{directory}: this export was trained on {_trained_on(spec)}")
    data = (CriteoDataset if kind == "criteo" else TableDataset)(directory)
    _check_prepared(data.meta, spec, directory)
    if split not in (*SPLITS, "all"):
        raise ValueError(f"--split must be test, train or all, got {split!r}")
    if split == "all":
        total = data.rows["train"] + data.rows["test"]
    else:
        total = data.rows[split]
    total = min(total, samples) if samples else total
    return _prepared_chunks(data, inputs, split, total, chunk), total, split


def _prepared_chunks(data, inputs: Inputs, split: str, total: int, chunk: int) -> Iterator[Chunk]:
    if split != "all":
        for lo in range(0, total, chunk):
            hi = min(total, lo + chunk)
            yield _from_rows(data, split, lo, hi, inputs, np.arange(lo, hi))
        return
    meta = data.meta
    taken = {"train": 0, "test": 0}
    for lo in range(0, total, chunk):  # rows back in input order: the split is a hash of the position
        hi = min(total, lo + chunk)
        rows = np.arange(lo, hi)
        test = split_is_test(rows, int(meta.get("seed", 0)), float(meta.get("test_fraction", 0.1)))
        parts = []
        for name, mask in (("train", ~test), ("test", test)):
            k = int(mask.sum())
            parts.append((mask, _from_rows(data, name, taken[name], taken[name] + k, inputs, rows[mask])))
            taken[name] += k
        yield _interleave(parts, rows)


def _from_rows(data, split, lo, hi, inputs: Inputs, rows) -> Chunk:
    b = data.rows_between(split, lo, hi)
    return Chunk(b.dense.numpy(), inputs.table_keys(b.sparse.numpy()), b.labels.numpy(), rows)


def _interleave(parts, rows) -> Chunk:
    n = len(rows)
    first = parts[0][1]
    dense = np.empty((n, first.dense.shape[1]), np.float32)
    keys = np.empty((n, first.keys.shape[1]), np.int64)
    labels = np.empty(n, np.float32)
    for mask, c in parts:
        dense[mask], keys[mask], labels[mask] = c.dense, c.keys, c.labels
    return Chunk(dense, keys, labels, rows)


def _check_prepared(meta: dict, spec: dict, directory: str) -> None:
    """Refuse prepared data whose keys are not the export's: other columns or another vocabulary."""
    if spec["source"] == "criteo":
        if meta.get("format") != "het-criteo" or meta.get("offsets") != spec["offsets"]:
            raise ValueError(f"{directory}: prepared with another vocabulary than the export's training data "
                             f"(its field offsets differ): its keys would name other rows")
        return
    if meta.get("format") != "het-hashed" or [meta.get("dense"), meta.get("sparse")] != [spec["dense"], spec["sparse"]]:
        raise ValueError(f"{directory}: columns dense {meta.get('dense')} sparse {meta.get('sparse')}; the export reads "
                         f"dense {spec['dense']} sparse {spec['sparse']}")


def _trained_on(spec: dict) -> str:
    if spec["source"] == "synthetic":
        return spec["preset"]
    return {"table": "a prepared table (table:DIR)", "criteo": "label-encoded Criteo (criteo:DIR)",
            "criteo-hashed": "hashed Criteo (criteo:DIR, --hash)"}[spec["source"]]


def read_meta(directory: str) -> dict:
    return prepared.read_meta(os.path.join(directory, "meta.json"))
