"""``het predict``: an export's scores for a data set, streamed in chunks with bounded memory:
one chunk of rows, the scores and labels kept for an exact AUC (5 bytes a row; past
:data:`EXACT_ROWS` a 2^20-bin histogram instead, which ``auc_method`` names), and the output
written as the rows go (CSV or Parquet, into a temporary file renamed when complete).
"""

from __future__ import annotations

import math
import os
import secrets
import time

import numpy as np
import torch

from het.export.batches import open_source
from het.export.chunk import Chunk, Skipped
from het.export.model import ExportedModel, load_model

EXACT_ROWS = 20_000_000
BINS = 1 << 20
OUT_SUFFIXES = (".csv", ".parquet")


def predict(export_dir: str, data: str, split: str | None = None, out: str | None = None, batch: int = 4096,
            samples: int | None = None, progress: bool = False, verify: bool | None = None,
            model: ExportedModel | None = None, sep: str | None = None, names: list[str] | None = None,
            keep: list[str] = ()) -> dict:
    """Score ``data`` with the export at ``export_dir``; the summary (rows scored and skipped,
    AUC and log loss where there are labels, samples/s, the output's path).

    Args:
        data: ``synthetic-criteo`` (``-1tb``), ``table:DIR``, ``criteo:DIR``, or raw files
            (comma-separated CSV, TSV, Parquet, or Criteo TSV).
        split: ``test`` (default for prepared and synthetic data), ``train``, or ``all``
            (prepared data in input order; the only choice for raw files).
        out: a ``.csv`` or ``.parquet`` file: one row per row scored, in input order: ``row``,
            ``line`` (raw files), ``label`` (if any) and ``score``.
        batch: rows scored at once.
        samples: score the first ``samples`` rows only (synthetic data: its default is the
            training job's evaluation size).
        sep, names: how raw CSV/TSV files are read: the separator, the column names of files
            without a header (a file without the label column is scored all the same).
        keep: raw columns written beside each score, as read (raw files; e.g. an id).
    """
    if not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be an int >= 1, got {batch!r}")
    if samples is not None and (not isinstance(samples, int) or samples < 1):
        raise ValueError(f"samples must be None or an int >= 1, got {samples!r}")
    if out is not None and not out.endswith(OUT_SUFFIXES):
        raise ValueError(f"--out must end in {' or '.join(OUT_SUFFIXES)}, got {out!r}")
    model = model or load_model(export_dir, verify=verify)
    skipped = Skipped()
    chunks, total, split = open_source(data, model.inputs, model.manifest, split, samples, batch, skipped, sep, names,
                                       list(keep))
    metrics, writer = _Metrics(), _Writer(out) if out else None
    start, rows, bar = time.perf_counter(), 0, None
    try:
        for c in chunks:
            if bar is None and progress:  # once the source has given rows: a refusal comes without a bar
                bar = _bar(total)
            scores = model(torch.from_numpy(c.dense), torch.from_numpy(c.keys)).numpy()
            metrics.add(c.labels, scores)
            if writer is not None:
                writer.add(c, scores)
            rows += len(c.rows)
            if bar is not None:
                bar.update(len(c.rows))
        if writer is not None:
            writer.close()
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    finally:
        if bar is not None:
            bar.close()
    seconds = time.perf_counter() - start
    return {"export": os.path.abspath(export_dir), "data": data, "split": split, "rows": rows,
            "skipped": skipped.count, "first_skipped": skipped.first, **metrics.result(),
            "seconds": seconds, "samples_per_s": rows / seconds if seconds else 0.0, "batch": batch,
            "out": os.path.abspath(out) if out else None, "dtype": model.manifest["dtype"],
            "dense_program": model.uses_program}


class _Metrics:
    """Log loss summed as rows come; AUC exact from the kept scores, or from histograms."""

    def __init__(self):
        self.scores, self.labels = [], []
        self.hist = None
        self.rows = self.labelled = 0
        self.loss = 0.0

    def add(self, labels: np.ndarray | None, scores: np.ndarray) -> None:
        self.rows += len(scores)
        if labels is None:
            return
        self.labelled += len(labels)
        p = np.clip(scores.astype(np.float64), 1e-7, 1 - 1e-7)
        self.loss -= float(np.sum(labels * np.log(p) + (1 - labels) * np.log1p(-p)))
        if self.hist is None and self.labelled <= EXACT_ROWS:
            self.scores.append(scores.astype(np.float32))
            self.labels.append(labels.astype(np.uint8))
            return
        if self.hist is None:  # past the exact bound: the kept rows move into histograms
            self.hist = np.zeros((2, BINS), np.int64)
            for s, y in zip(self.scores, self.labels):
                self._bin(s, y)
            self.scores, self.labels = [], []
        self._bin(scores, labels)

    def _bin(self, scores, labels) -> None:
        b = np.minimum((scores.astype(np.float64) * BINS).astype(np.int64), BINS - 1)
        for y in (0, 1):
            self.hist[y] += np.bincount(b[labels == y], minlength=BINS)

    def result(self) -> dict:
        if not self.labelled:
            return {"labelled": 0}
        out = {"labelled": self.labelled, "logloss": self.loss / self.labelled}
        if self.hist is None:
            y, s = np.concatenate(self.labels), np.concatenate(self.scores)
            from sklearn.metrics import roc_auc_score

            out.update(auc=float(roc_auc_score(y, s)) if 0 < y.sum() < len(y) else math.nan, auc_method="exact")
        else:
            neg, pos = self.hist
            below = np.cumsum(neg) - neg  # negatives in lower bins
            auc = (pos * (below + neg / 2)).sum() / max(1, pos.sum() * neg.sum())
            out.update(auc=float(auc), auc_method=f"histogram of {BINS} bins")
        return out


class _Writer:
    """Scores into a temporary file beside ``path``, renamed into place when complete."""

    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        self.tmp = f"{self.path}.tmp-{secrets.token_hex(4)}"
        self.parquet = path.endswith(".parquet")
        self._writer = self._file = None

    def add(self, c: Chunk, scores: np.ndarray) -> None:
        import pyarrow as pa

        cols = {"row": c.rows.astype(np.int64)}
        if c.lines is not None:
            cols["line"] = c.lines.astype(np.int64)
        if c.labels is not None:
            cols["label"] = c.labels.astype(np.float32)
        cols.update(c.kept)
        cols["score"] = scores.astype(np.float32)
        table = pa.table(cols)
        if self.parquet:
            import pyarrow.parquet as pq

            if self._writer is None:
                self._writer = pq.ParquetWriter(self.tmp, table.schema)
            self._writer.write_table(table)
            return
        import pyarrow.csv as pcsv

        if self._file is None:
            self._file = open(self.tmp, "xb")
            self._writer = pcsv.CSVWriter(self._file, table.schema)
        self._writer.write_table(table)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
        if not os.path.exists(self.tmp):  # no rows: an empty file
            open(self.tmp, "xb").close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        try:
            if self._writer is not None:
                self._writer.close()
            if self._file is not None:
                self._file.close()
        finally:
            if os.path.exists(self.tmp):
                os.remove(self.tmp)


def _bar(total):
    from tqdm import tqdm

    return tqdm(total=total, unit=" rows", desc="het predict", mininterval=0.5)
