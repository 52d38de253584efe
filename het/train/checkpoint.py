"""Checkpoints: caches flushed, then the shards (rows, clocks, optimizer state), the dense model
and its optimizer, and the data position, under one directory::

    DIR/ps/shard-<i>.pt   written by each shard
    DIR/worker.pt         dense model, dense optimizer, step, config (from rank 0)

With ``ps_saves_local``, or when rank 0 does not see the shards' state directories (machines
that share no storage), each shard keeps its save in its own state directory instead, as
``checkpoints/step-<N>-<id>/shard-<i>.pt``, and ``worker.pt`` names it (``ps_named``); a shard
keeps the saves of the last two checkpoints (each save removes the one before the previous).
Resuming then needs the shards on those state directories; ``het export`` and ``het reshard``
need the saves copied into ``DIR/ps/``.

written as ``DIR.tmp-STEP``, forced to disk whole, and swapped in; what an interrupted save
leaves goes at the next save or job start (:func:`remove_stale`). Every file in it carries
checksums (the saves and ``worker.pt`` are zip files with a CRC-32 a member,
``evaluation.json`` its own), read back before it is trusted: a damaged checkpoint is refused,
naming the file and the bytes.

Every rank's batches are a function of the step, so the step is the data position; a stream's
(whose steps differ in rows once training catches up with it) is written beside it: the
partitions taken and the rows trained, with its progressive metrics so far.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import zlib

import torch

from het import files

from het.dist.collectives import barrier
from het.train.config import TrainConfig

FORMAT = 1
EVALUATION = "evaluation.json"  # the held-out metrics of the model saved, when it was evaluated


def save(worker, directory: str, step: int) -> None:
    """Flush every cache (no update left behind), then write the checkpoint (all ranks call this)."""
    worker.embedding.flush()
    barrier(worker.world)
    task, extra = getattr(worker, "task", None), {}
    if getattr(task, "progressive", None) is not None:  # a stream's scores so far, for the runs resumed from it
        rows = task.data.position(step, worker.cfg.batch)["rows"]
        extra["progressive"] = task.progressive.carry(worker.world, rows, task.data.ends())
    if worker.rank == 0:
        # written whole under a temporary name, then swapped in: a crash leaves the old one intact
        final = os.path.abspath(directory)
        tmp, old = f"{final}.tmp-{step}", f"{final}.old-{step}"
        remove_stale(final)
        shutil.rmtree(tmp, ignore_errors=True)
        write(worker, tmp, step, replaces=final, **extra)
        files.fsync_tree(tmp)  # every file of it on disk before it takes the name
        if os.path.exists(final):
            os.replace(final, old)
        os.replace(tmp, final)
        files.fsync_directory(os.path.dirname(final))
        shutil.rmtree(old, ignore_errors=True)
    barrier(worker.world)


def write(worker, directory: str, step: int, replaces: str | None = None, rows_only: bool = False,
          **extra) -> None:
    """Write the shards' saves and the dense model into the new directory ``directory`` as
    they are now (rank 0; :func:`save` flushes the caches first, a publication of the PS's rows
    does not). ``replaces``: the checkpoint this one takes the place of, when it is one (then
    the shards may keep their saves: module docs). ``rows_only``: the shards leave their fixed
    tables' optimizer state out (a snapshot to export, not to resume: the shards refuse to
    load it). ``extra``: more entries of ``worker.pt`` (a publication's version and time)."""
    os.makedirs(directory)
    if replaces is not None and (worker.cfg.ps_saves_local or not worker.client.sees_state_dirs()):
        extra = {**extra, **_save_named(worker, replaces, step)}
    else:
        worker.client.save(os.path.join(directory, "ps"), rows_only=rows_only)
    state = {"format": FORMAT, "step": step, "config": worker.cfg.to_dict(),
             "model": {k: v for k, v in worker.model.state_dict().items() if not k.startswith("embedding.")},
             "optimizer": worker.dense.state_dict(), **extra}
    groups = getattr(getattr(worker, "task", None), "groups", None)
    if groups:  # fields of several widths: which table holds which field's rows
        state["fields"] = [g.as_dict() for g in groups]
    if getattr(getattr(worker, "task", None), "progressive", None) is not None:  # a stream's partitions and rows
        state["stream"] = worker.task.data.position(step, worker.cfg.batch)
    files.write_file(os.path.join(directory, "worker.pt"), lambda f: torch.save(state, f))


def _save_named(worker, replaces: str, step: int) -> dict:
    """The shards save into their own state directories; what ``worker.pt`` records of it. The
    checkpoint this one ``replaces`` keeps its saves; the one before it goes."""
    current = _read_worker(replaces).get("ps_named") if os.path.isfile(os.path.join(replaces, "worker.pt")) else None
    name = f"checkpoints/step-{step}-{worker.client.link.session[:8]}"
    worker.client.save_named(name, drop=current and current.get("previous"))
    return {"ps_named": {"name": name, "num_shards": worker.client.num_shards,
                         "previous": current and current["name"]}}


def _read_worker(directory: str) -> dict:
    path = os.path.join(directory, "worker.pt")
    files.check_zip(path)
    return torch.load(path, weights_only=False, map_location="cpu")


def record_evaluation(directory: str, step: int, metrics: dict) -> None:
    """Write the held-out metrics of the model saved in ``directory`` at ``step`` beside it
    (``evaluation.json``: what ``het export`` carries into its manifest); nothing when there are
    none, or when the checkpoint there is of another step."""
    if not metrics or saved_step(directory) != step:
        return
    doc = {"step": step, **{k: v for k, v in metrics.items() if isinstance(v, (int, float, str))}}
    files.write_file(os.path.join(directory, EVALUATION), lambda f: f.write(json.dumps(with_crc(doc)).encode()))


def with_crc(doc: dict) -> dict:
    """``doc`` with ``crc32``: the CRC-32 of its canonical JSON (sorted keys), which
    :func:`read_checked_json` checks.

    Example:
        >>> read_checked_json(json.dumps(with_crc({"auc": 0.78})), "e.json")
        {'auc': 0.78}
    """
    return {**doc, "crc32": zlib.crc32(json.dumps(doc, sort_keys=True).encode())}


def read_checked_json(text: str, path: str) -> dict:
    """A JSON object :func:`with_crc` wrote, without its ``crc32``; DamagedFile (naming
    ``path``) when it is not JSON or does not match its checksum. One without a checksum (an
    older het's) is taken as it is."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise files.DamagedFile(f"{path}: not JSON ({e}): damaged") from None
    if not isinstance(doc, dict):
        raise files.DamagedFile(f"{path}: expected a JSON object, got {type(doc).__name__}: damaged")
    crc = doc.pop("crc32", None)
    if crc is not None and crc != zlib.crc32(json.dumps(doc, sort_keys=True).encode()):
        raise files.DamagedFile(f"{path}: does not match its checksum: damaged")
    return doc


def remove_stale(directory: str) -> list[str]:
    """Remove what interrupted saves left beside ``directory``; the paths removed.

    A save writes ``DIR.tmp-STEP`` whole, renames ``DIR`` to ``DIR.old-STEP``, renames the
    temporary one to ``DIR`` and removes the old one. With ``DIR`` there, every leftover is
    stale. Without it, a ``DIR.old-*`` means a save was cut between its renames: the old one
    and the temporary one may each be the checkpoint to resume from, so both stay (the next
    save, which makes ``DIR``, removes them); otherwise a ``DIR.tmp-*`` is a first save cut
    short, and goes.
    """
    final = os.path.abspath(directory)
    parent, base = os.path.split(final)
    pattern = re.compile(re.escape(base) + r"\.(tmp|old)-\d+")
    left = sorted(n for n in (os.listdir(parent) if os.path.isdir(parent) else []) if pattern.fullmatch(n))
    if not os.path.isdir(final) and any(n.startswith(base + ".old-") for n in left):
        return []
    stale = [os.path.join(parent, n) for n in left]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


def restore(worker, directory: str) -> int:
    """Load a checkpoint written by :func:`save`; returns the step to continue from."""
    check_resumable(directory, worker.client.num_shards if worker.rank == 0 else None)
    path = os.path.join(directory, "worker.pt")
    state = _read_worker(directory)  # the shards check their own saves as they load them
    if state.get("format") != FORMAT:
        raise ValueError(f"{path}: checkpoint format {state.get('format')}, expected {FORMAT}")
    groups = getattr(getattr(worker, "task", None), "groups", None)
    fields = [g.as_dict() for g in groups] if groups else None
    if state.get("fields") != fields:  # the same tables' names could hold other fields' rows
        raise ValueError(f"{path} holds fields in tables {_tables_of(state.get('fields'))}, this job puts them in "
                         f"{_tables_of(fields)}: resume with the widths it was trained with (--dim, --widths)")
    if worker.rank == 0 and state.get("ps_named"):
        worker.client.load_named(state["ps_named"]["name"])  # a shard without it refuses, naming it
    elif worker.rank == 0:
        worker.client.load(os.path.abspath(os.path.join(directory, "ps")))
    missing, unexpected = worker.model.load_state_dict(state["model"], strict=False)
    if unexpected or any(not k.startswith("embedding.") for k in missing):
        raise ValueError(f"{path} does not fit this model: missing {missing}, unexpected {unexpected}")
    worker.dense.load_state_dict(state["optimizer"])
    worker.embedding.resume_at(int(state["step"]))  # the PS's Adam corrects its bias by the step number
    if state.get("stream") and getattr(worker.task, "progressive", None) is not None:
        worker.task.data.resume(state["stream"], int(state["step"]))  # every row once, in the order first taken
        if state.get("progressive"):
            worker.task.progressive.resume_from(state["progressive"], worker.rank)
    barrier(worker.world)
    return int(state["step"])


def _tables_of(fields: list | None) -> str:
    """Which fields each table holds, as a checkpoint records them (None: one table for all)."""
    if not fields:
        return "one table, 'embedding'"
    return ", ".join(f"{g['table']} (fields {g['fields']})" for g in fields)


def saver(worker, cfg: TrainConfig):
    """The per-step hook that saves every ``checkpoint_every`` steps (and None without one)."""
    if not cfg.checkpoint or not cfg.checkpoint_every:
        return None

    def on_step(step: int) -> None:
        if step % cfg.checkpoint_every == 0:
            save(worker, cfg.checkpoint, step)

    return on_step


def saved_step(directory: str | None) -> int | None:
    """The step of the checkpoint in ``directory``, or None when there is none (yet)."""
    path = os.path.join(directory, "worker.pt") if directory else None
    if path is None or not os.path.exists(path):
        return None
    return int(torch.load(path, weights_only=False, map_location="cpu")["step"])


def check_resumable(directory: str, shards: int | None = None) -> None:
    """ValueError unless ``directory`` holds a checkpoint that :func:`restore` can load onto a PS
    of ``shards`` shards (None: any number): its ``worker.pt`` and one file per shard."""
    path = os.path.join(directory, "worker.pt")
    if not os.path.isfile(path):
        raise ValueError(f"no checkpoint at {directory!r}: expected {path}")
    named = _read_worker(directory).get("ps_named")
    if named:
        if shards is not None and named["num_shards"] != shards:
            raise ValueError(f"{directory!r} was saved by {named['num_shards']} shards in their own state "
                             f"directories ({named['name']}), and this job has {shards} servers: resume on "
                             f"those shards, or copy their saves into {directory}/ps/ and `het reshard`")
        return
    ps = os.path.join(directory, "ps")
    saved = sorted(int(m.group(1)) for m in map(re.compile(r"shard-(\d+)\.pt").fullmatch,
                                                 os.listdir(ps) if os.path.isdir(ps) else []) if m)
    if shards is not None and saved != list(range(shards)):
        raise ValueError(f"{directory!r} holds a PS of {len(saved)} shard file(s) in {ps}, and this job has "
                         f"{shards} servers: `het reshard {directory} NEW --shards {shards}` writes it for "
                         f"{shards}, to resume from NEW")


def check_writable(directory: str) -> None:
    """ValueError unless a checkpoint can be written at ``directory``: :func:`save` makes it (and
    ``DIR.tmp-STEP`` beside it) under its nearest existing ancestor, which must be a writable
    directory."""
    ancestor = os.path.dirname(os.path.abspath(directory))
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise ValueError(f"cannot write {directory!r}: {ancestor} is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(f"cannot write {directory!r}: the directory {ancestor} is not writable")
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise ValueError(f"cannot write {directory!r}: it is a file, not a checkpoint directory")
