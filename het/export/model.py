"""A trained model loaded from an export: :func:`load_model` -> :class:`ExportedModel`.

The tables stay on disk, memory-mapped: an export of any size opens at once and pages in the
rows it reads. The dense model is the export's ``torch.export`` program where there is one
(it needs none of het's model code), else the model's class with the exported parameters.
"""

from __future__ import annotations

import os

import numpy as np
import torch
from torch import nn

from het.data.batch import Batch
from het.export import dense as dense_model
from het.export import layout
from het.export.spec import Inputs, to_arrow
from het.export.tables import ExportedTable
from het.nn.bags import bag_keys, pool

VERIFY_BYTES = 1 << 30  # verify="auto": every file's checksum when the export is at most this big


class ExportedEmbedding(nn.Module):
    """An export's table as the CTR models call their embedding: ``(keys, offsets)`` as
    ``nn.Embedding`` / ``nn.EmbeddingBag`` (and ``het.Embedding``) take them, pooled by the same
    rules (:func:`het.nn.bags.pool`) so the rows match training's bit for bit."""

    def __init__(self, table: ExportedTable, mode: str | None = None, padding_idx: int | None = None):
        super().__init__()
        self.table, self.mode, self.padding_idx = table, mode, padding_idx

    def forward(self, keys: torch.Tensor, offsets: torch.Tensor | None = None) -> torch.Tensor:
        keys = keys.cpu()
        if self.mode is None:
            return self.table.rows(keys.reshape(-1)).reshape(*keys.shape, self.table.dim)
        flat, bag, bags = bag_keys(keys, None if offsets is None else offsets.cpu(), self.padding_idx)
        return pool(self.table.rows(flat), bag, bags, self.mode)             # (B, D)


class ExportedModel(nn.Module):
    """A CTR model from an export: ``model(batch)`` or ``model(dense, keys)`` -> probabilities,
    ``model.predict(columns)`` from raw values.

    Attributes:
        manifest: the export's manifest (model, tables, input spec, training's evaluation).
        inputs: the input spec at work (:class:`het.export.spec.Inputs`).
        uses_program: whether the dense part runs the ``torch.export`` program.
    """

    def __init__(self, root: str, manifest: dict, table, dense: nn.Module, uses_program: bool = False):
        """``table``: the export's table, or a dict of its tables by name (fields of several widths)."""
        super().__init__()
        from het.nn.bags import FieldBags
        from het.nn.fields import FieldGroup, FieldTables

        if isinstance(table, dict) and len(table) == 1:
            table = next(iter(table.values()))
        self.root, self.manifest, self.dense = root, manifest, dense
        self.tables = table if isinstance(table, dict) else {next(iter(manifest["tables"])): table}
        self.table = None if isinstance(table, dict) else table  # the one table, where there is one
        self.uses_program = uses_program
        bags, spec = manifest["model"]["bag_sizes"], manifest["input"]
        pooling = (spec.get("pooling", "sum"), spec.get("pad_key")) if max(bags) > 1 else (None, None)
        if manifest["model"].get("fields"):  # a table a width, each looked up as training did
            groups = [FieldGroup.from_dict(g) for g in manifest["model"]["fields"]]
            source = nn.ModuleDict({n: ExportedEmbedding(t, *pooling) for n, t in self.tables.items()})
            self.lookup = FieldTables(source, groups, pooled=max(bags) > 1)
        elif max(bags) > 1:  # multi-hot fields: each field's bag pooled, as training pooled them
            self.lookup = FieldBags(ExportedEmbedding(table, *pooling), bags)
        else:
            self.lookup = ExportedEmbedding(table)
        self.inputs = Inputs(manifest["input"], root)

    @classmethod
    def open(cls, root: str, manifest: dict, use_program: bool = True) -> ExportedModel:
        """The model of the export in ``root`` (its manifest read and checked)."""
        tables = {name: ExportedTable(os.path.join(root, "tables", name), entry)
                  for name, entry in manifest["tables"].items()}
        table = next(iter(tables.values())) if len(tables) == 1 else tables
        if use_program and manifest["dense"].get("program") is not None:
            dense = torch.export.load(os.path.join(root, dense_model.PROGRAM)).module()
            return cls(root, manifest, table, dense, uses_program=True)
        return cls(root, manifest, table, dense_model.load(root, manifest["model"]))

    def variant(self, table=None, dense_state: dict | None = None) -> ExportedModel:
        """This model with another table (one with rows of later versions over it) and other
        dense parameters (the model's class, loaded with them)."""
        dense = self.dense
        uses_program = self.uses_program
        if dense_state is not None:
            dense = dense_model.load_params(dense_model.build(self.manifest["model"]), dense_state)
            uses_program = False
        if table is None:
            table = self.table if self.table is not None else self.tables
        return ExportedModel(self.root, self.manifest, table, dense, uses_program)

    @property
    def device(self) -> torch.device:
        return next((b.device for b in self.dense.buffers()), None) or next(self.dense.parameters()).device

    @torch.no_grad()
    def forward(self, dense, keys: torch.Tensor | None = None) -> torch.Tensor:
        """Click probabilities. Shape: a Batch, or dense (B, num_dense) float32 and keys (B, L)
        int64 (the table's keys, as a prepared directory holds them after the input spec's
        hashing) -> (B,)."""
        if isinstance(dense, Batch):
            dense, keys = dense.dense, dense.sparse
        return torch.sigmoid(self.logits(dense, keys))

    def logits(self, dense: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            rows = self.lookup(keys.to("cpu", torch.int64))                # (B, F, D), or a tensor a width
            rows = rows.to(self.device) if isinstance(rows, torch.Tensor) else tuple(r.to(self.device) for r in rows)
            return self.dense(dense.to(self.device, torch.float32), rows)

    def predict(self, columns, errors: str = "raise"):
        """Probabilities of raw rows: a dict of columns, a pandas or polars DataFrame or a
        pyarrow Table, read through the export's input spec. ``errors="raise"``: a row that
        cannot be read is a ValueError naming it, its column and what was expected; ``"skip"``:
        its probability is NaN.

        Returns:
            float32 scores in row order: a pandas Series named ``score`` on the DataFrame's index
            for a pandas DataFrame (so ``df["score"] = model.predict(df)`` lines up), a polars
            Series for a polars one, else an ndarray. Shape: n rows -> (n,).

        Example (an export at ``out``): ``model.predict({"user": ["u1"], "price": [2.5]})``.
        """
        if errors not in ("raise", "skip"):
            raise ValueError(f"errors must be 'raise' or 'skip', got {errors!r}")
        parsed = self.inputs.parse(to_arrow(columns))
        if errors == "raise" and not parsed.ok.all():
            i = int(np.flatnonzero(~parsed.ok)[0])
            raise ValueError(f"row {i}: {parsed.reasons.get(i, 'cannot be read')}")
        out = np.full(len(parsed.bad), np.nan, np.float32)
        ok = np.flatnonzero(parsed.ok)
        if len(ok):
            dense, keys = torch.from_numpy(parsed.dense[ok]), torch.from_numpy(parsed.keys[ok])
            out[ok] = self(dense, keys).cpu().numpy()
        return _like(columns, out)


def _like(columns, scores: np.ndarray):
    """Scores as the kind of table they came from: a pandas or polars Series, else the array."""
    module = type(columns).__module__
    if module.startswith("pandas"):
        import pandas as pd

        return pd.Series(scores, index=columns.index, name="score")
    if module.startswith("polars"):
        import polars as pl

        return pl.Series("score", scores)
    return scores


def load_model(path: str, verify: bool | None = None, use_program: bool = True) -> ExportedModel:
    """The model of the export in ``path`` (``het export CKPT OUT`` writes one).

    Args:
        path: the export directory.
        verify: check every file's checksums first (True), none but the manifest's (False), or
            every file when the export is at most 1 GiB and the small files otherwise (None).
        use_program: run the dense model's ``torch.export`` program where the export has one.

    Raises:
        het.export.layout.ExportError (a ValueError): not an export, another format version,
            or a damaged file (named, with its offset).
    """
    manifest = layout.read_manifest(path)
    files = manifest["files"]
    total = sum(e["bytes"] for e in files.values())
    for rel, entry in sorted(files.items()):
        if verify or (verify is None and (total <= VERIFY_BYTES or entry["bytes"] <= VERIFY_BYTES // 64)):
            layout.verify(path, rel, entry)
    return ExportedModel.open(path, manifest, use_program)
