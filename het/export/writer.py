"""``het export``: a training checkpoint -> a self-contained export directory
(:mod:`het.export.layout`), streamed a piece of a table at a time.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import time

import numpy as np
import torch

from het.export import dense as dense_model
from het.export import layout, tables
from het.export.rows import DTYPES, row_bytes
from het.export.source import Checkpoint
from het.export.spec import build_spec
from het.files import atomic_directory

DENSE_TABLE = "dense"  # het.dist.dense: mode ps keeps the dense parameters in this PS table
GRAPH_MODELS = ("graphsage",)


def check_out(out: str, checkpoint: str | None) -> None:
    """Refuse an ``out`` het may not replace: a file; the checkpoint itself, a directory holding
    it or one inside it; or a directory holding anything but an export het wrote (a user's
    folder). An empty directory, or none, is fine. A ValueError names what is there."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"{out!r} is a file: an export goes into a directory of its own")
    target, ckpt = os.path.realpath(out), os.path.realpath(checkpoint) if checkpoint else None
    if ckpt and (target == ckpt or ckpt.startswith(target.rstrip(os.sep) + os.sep) or target.startswith(ckpt + os.sep)):
        raise ValueError(f"{out!r} is, holds or lies inside the checkpoint {checkpoint!r}: an export goes into a "
                         f"directory of its own, apart from the checkpoint it reads")
    if not os.path.isdir(out) or not os.listdir(out):
        return
    try:
        with open(os.path.join(out, layout.MANIFEST)) as f:
            ours = json.load(f)["manifest"]["format"] == layout.FORMAT
    except (OSError, ValueError, KeyError, TypeError):
        ours = False
    if not ours:
        raise ValueError(f"{out!r} holds {sorted(os.listdir(out))[:5]} and no export het wrote: het export replaces "
                         f"only an earlier export; choose a new or empty directory")


def export(checkpoint: str, out: str, dtype: str = "fp32", progress: bool = False) -> dict:
    """Export the checkpoint at ``checkpoint`` into the directory ``out`` (replaced whole if it
    holds an export; nothing is left there if this fails); a summary of what was written.

    Args:
        checkpoint: a directory ``het train --checkpoint`` wrote.
        out: the export's directory.
        dtype: the tables' rows: ``"fp32"``, ``"fp16"`` or ``"int8"`` (:mod:`het.export.rows`).
        progress: a progress bar of the rows written, on stderr.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    start = time.perf_counter()
    ckpt = Checkpoint(checkpoint)
    try:
        config = ckpt.config
        if config.get("model") in GRAPH_MODELS:
            raise ValueError(f"a {config['model']} checkpoint is not exported: scoring a node needs its sampled "
                             f"neighbourhood and features from the training graph, which an export does not hold; "
                             f"het export takes CTR models (wdl, deepfm, dcn, dlrm)")
        spec, files = build_spec(config)
        check_out(out, checkpoint)
        with atomic_directory(out) as root:
            os.chmod(root, 0o755)  # made private while written; readable, like any model file, once there
            manifest = _write(ckpt, config, spec, files, root, dtype, progress)
    finally:
        ckpt.close()
    total = sum(e["bytes"] for e in manifest["files"].values())
    return {"out": os.path.abspath(out), "dtype": dtype, "model": manifest["model"]["name"],
            "step": manifest["step"], "tables": {n: {k: t[k] for k in ("rows", "dynamic", "bytes")}
                                                  for n, t in manifest["tables"].items()},
            "bytes": total, "seconds": time.perf_counter() - start, "dense_program": manifest["dense"]["program"],
            "dense_program_error": manifest["dense"].get("program_error")}


def _write(ckpt: Checkpoint, config: dict, spec: dict, files: dict, root: str, dtype: str, progress: bool) -> dict:
    names = [n for n in ckpt.tables if n != DENSE_TABLE]
    groups = ckpt.fields or []
    if not names:
        raise ValueError(f"{ckpt.path} holds no embedding table (tables: {sorted(ckpt.tables)}): not a CTR model's")
    if sorted(names) != sorted(g["table"] for g in groups) and len(names) != 1:
        raise ValueError(f"the checkpoint holds embedding tables {names} but no record of their fields: it was "
                         f"not written by het train")
    widths = [g["width"] for g in groups for _ in g["fields"]] or ckpt.tables[names[0]].dim
    model = {"name": config["model"], "num_fields": len(spec["sparse"]), "dim": widths,
             "num_dense": len(spec["dense"]), "bag_sizes": spec["bag_sizes"], **({"fields": groups} if groups else {})}
    dense_info = _write_dense(ckpt, config, model, root)
    bar = _bar(sum(ckpt.stored_rows(name) for name in names), progress)
    try:
        entries = {name: tables.write(ckpt, name, os.path.join(root, "tables", name), dtype,
                                      progress=bar.update if bar else None) for name in names}
    finally:
        if bar:
            bar.close()
    for rel, src in files.items():
        os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
        shutil.copyfile(src, os.path.join(root, rel))
    manifest = {"format": layout.FORMAT, "version": layout.VERSION,
                "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "checkpoint": os.path.abspath(ckpt.path), "step": ckpt.step, "model": model, "dense": dense_info,
                "tables": entries, "dtype": dtype, "input": spec,
                "row_bytes": row_bytes(max(ckpt.tables[n].dim for n in names), dtype),
                "evaluation": ckpt.evaluation, "published": ckpt.published, "train": {k: config.get(k) for k in
                                                         ("mode", "staleness", "optimizer", "lr", "batch", "workers",
                                                          "servers", "seed", "eval_samples")}}
    manifest["files"] = {rel: layout.file_entry(os.path.join(root, rel)) for rel in _files(root)}
    layout.write_manifest(root, manifest)
    return manifest


def _write_dense(ckpt: Checkpoint, config: dict, model: dict, root: str) -> dict:
    """``dense.pt`` and, where torch.export captures the model, ``dense.pt2``."""
    module = dense_model.build(model)
    flat = None
    if config.get("mode") == "ps":  # the dense parameters lived on the PS, not in worker.pt
        flat = _dense_values(ckpt)
    dense_model.load_params(module, ckpt.model_state, flat)
    torch.save(module.state_dict(), os.path.join(root, dense_model.PARAMS))
    program, why = dense_model.capture(module, model["num_dense"], model["num_fields"], model["dim"])
    if program is not None:
        torch.export.save(program, os.path.join(root, dense_model.PROGRAM))
    return {"params": dense_model.PARAMS, "program": dense_model.PROGRAM if program is not None else None,
            "program_error": why, "parameters": sum(p.numel() for p in module.parameters())}


def _dense_values(ckpt: Checkpoint) -> torch.Tensor:
    """The PS's dense table (mode ps) as one flat vector, in key order."""
    keys, rows = zip(*ckpt.table_pieces(DENSE_TABLE))
    keys, rows = np.concatenate(keys), np.concatenate(rows)
    return torch.from_numpy(rows[np.argsort(keys)]).reshape(-1)


def _files(root: str) -> list[str]:
    out = []
    for dirpath, _, names in os.walk(root):
        out += [os.path.relpath(os.path.join(dirpath, n), root) for n in names]
    return sorted(out)


def _bar(total: int, progress: bool):
    if not progress:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit=" rows", desc="het export", mininterval=0.5)
