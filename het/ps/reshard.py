"""Resharding a saved PS: the shard files of ``S`` shards -> those of ``S'`` shards.

Keys are spread by ``key % S`` (``mix(key) % S`` for a dynamic table, :mod:`het.ps.protocol.partition`),
so a PS saved with one number of shards cannot be loaded by another. :func:`reshard` moves every row with its clock, its
``touched`` mark and its optimizer state to the shard and local row it has under ``S'``. It
works one new shard at a time, with the old files memory-mapped, so it needs about one new
shard's worth of memory, not the whole table's.

``het reshard SRC DST --shards N`` runs it on a PS save directory (``shard-<i>.pt``, as
``PSClient.save`` writes) or on a training checkpoint (``ps/`` and ``worker.pt``): then the
checkpoint is copied whole, with the job's ``servers`` set to ``N``, so ``het train --resume
DST --servers N`` continues it on ``N`` shards.
"""

from __future__ import annotations

import glob
import itertools
import os
import re
import shutil

import torch

from het import files
from het.config import TableConfig
from het.ps.protocol import partition
from het.ps.server.store import optim
from het.ps.server.store.disk import read_saved
from het.ps.server.store.saves import SAVE_FORMAT, check_format, check_shards_here, rows_dir

_FILE = re.compile(r"shard-(\d+)\.pt$")


def reshard(src: str, dst: str, num_shards: int) -> list[str]:
    """Write the shards of the PS saved in ``src`` as ``num_shards`` shard files in ``dst``
    (which must not exist or be empty); returns their paths. Every row, clock, ``touched``
    mark and optimizer state lands where ``key % num_shards`` puts it."""
    if not isinstance(num_shards, int) or num_shards < 1:
        raise ValueError(f"num_shards must be an int >= 1, got {num_shards!r}")
    old = _load_all(src)
    if os.path.isdir(dst) and os.listdir(dst):
        raise ValueError(f"{dst} is not empty: reshard writes into a new directory")
    os.makedirs(dst, exist_ok=True)
    paths = []
    for j in range(num_shards):
        state = {"format": SAVE_FORMAT, "index": j, "num_shards": num_shards,
                 "tables": {name: _table_slice(name, old, j, num_shards) for name in old[0]["tables"]}}
        path = os.path.join(dst, f"shard-{j}.pt")
        files.write_file(path, lambda f: torch.save(state, f))
        paths.append(path)
    return paths


def reshard_checkpoint(src: str, dst: str, num_shards: int) -> list[str]:
    """A training checkpoint (``src/ps/`` and ``src/worker.pt``) copied to ``dst`` with its PS
    resharded to ``num_shards`` and the job's ``servers`` set to match."""
    worker = os.path.join(src, "worker.pt")
    if not os.path.exists(worker):
        raise ValueError(f"no checkpoint at {src!r}: expected {worker}")
    if os.path.exists(dst) and os.listdir(dst):
        raise ValueError(f"{dst} is not empty: reshard writes into a new directory")
    files.check_zip(worker)
    state = torch.load(worker, weights_only=False, map_location="cpu")
    check_shards_here(src, state)
    paths = reshard(os.path.join(src, "ps"), os.path.join(dst, "ps"), num_shards)
    state["config"] = {**state["config"], "servers": num_shards}
    files.write_file(os.path.join(dst, "worker.pt"), lambda f: torch.save(state, f))
    for extra in os.listdir(src):  # anything else the checkpoint holds travels as is
        if extra not in ("ps", "worker.pt"):
            copy = shutil.copytree if os.path.isdir(os.path.join(src, extra)) else shutil.copy2
            copy(os.path.join(src, extra), os.path.join(dst, extra))
    return paths


def _load_all(src: str) -> list[dict]:
    """Every shard file of ``src``, memory-mapped, checked to be one whole PS."""
    found = {int(_FILE.search(p).group(1)): p for p in glob.glob(os.path.join(src, "shard-*.pt")) if _FILE.search(p)}
    if not found:
        raise ValueError(f"no shard files (shard-<i>.pt) in {src!r}")
    states = []
    for i in sorted(found):
        files.check_zip(found[i])  # in blocks: a table bigger than memory is checked too
        state = torch.load(found[i], mmap=True, weights_only=True)
        check_format(state, found[i])
        if state["index"] != i:
            raise ValueError(f"{found[i]} holds shard {state['index']}, not {i}")
        for name, t in state["tables"].items():  # a disk tier's rows stay in its files until read (checked then)
            if "disk" in t:
                t["rows_dir"] = rows_dir(found[i], state, name)
        states.append(state)
    total = states[0]["num_shards"]
    if sorted(found) != list(range(total)) or any(s["num_shards"] != total for s in states):
        raise ValueError(f"{src} holds shards {sorted(found)} of {[s['num_shards'] for s in states]}: "
                         f"expected shards 0..{total - 1} of {total}")
    for s in states[1:]:
        if {n: t["config"] for n, t in s["tables"].items()} != {n: t["config"] for n, t in states[0]["tables"].items()}:
            raise ValueError(f"the shards in {src} hold different tables")
    return states


def _table_slice(name: str, old: list[dict], index: int, num_shards: int) -> dict:
    """Table ``name``'s rows of new shard ``index`` of ``num_shards``, gathered from ``old``."""
    tables = [s["tables"][name] for s in old]
    rows = tables[0]["config"]["rows"]
    if rows is None:
        return _dynamic_slice(tables, index, num_shards)
    keys = partition.global_keys(torch.arange(partition.rows_on_shard(rows, index, num_shards)), index, num_shards)
    src_shard, src_row = partition.shard_of(keys, len(old)), partition.local_rows(keys, len(old))
    where = [(src_shard == i).nonzero().flatten() for i in range(len(old))]

    def gather(get) -> torch.Tensor:
        first = get(tables[0])
        out = torch.empty((len(keys), *first.shape[1:]), dtype=first.dtype)
        for i, pos in enumerate(where):
            out[pos] = get(tables[i]).index_select(0, src_row[pos])
        return out

    out = {"config": tables[0]["config"], "weight": gather(lambda t: t["weight"]),
           "clocks": gather(lambda t: t["clocks"]),
           "optimizer": {k: gather(lambda t, k=k: t["optimizer"][k]) for k in tables[0].get("optimizer", {})}}
    if all("touched" in t for t in tables):
        out["touched"] = gather(lambda t: t["touched"])
    return out


def _dynamic_slice(tables: list[dict], index: int, num_shards: int) -> dict:
    """A dynamic table's stored rows whose keys ``mix(key) % num_shards`` puts on ``index``.
    Its admission sketch is the saturating sum of the old ones (a key's count stays an upper
    bound); the counters of the past go to new shard 0."""
    mine = [(partition.shard_of(t["keys"], num_shards, hashed=True) == index).nonzero().flatten() for t in tables]

    def cat(get) -> torch.Tensor:
        return torch.cat([get(t).index_select(0, pos) for t, pos in zip(tables, mine)])

    cfg = TableConfig.from_dict(tables[0]["config"])
    opt, d = optim.make(cfg.optimizer, 0, cfg.dim), cfg.dim
    names, widths = opt.state_names, opt.state_widths(d)
    # rows as [weight | state...]: read from a disk tier's files, or from the save itself
    records = torch.cat([torch.from_numpy(read_saved(t["rows_dir"], t["disk"], t["disk"]["records"][pos]))
                         if "disk" in t else torch.cat([t["weight"][pos], *(t["optimizer"][n][pos] for n in names)], 1)
                         for t, pos in zip(tables, mine)])
    out = {"config": tables[0]["config"], "keys": cat(lambda t: t["keys"]), "weight": records[:, :d].clone(),
           "clocks": cat(lambda t: t["clocks"]), "last_step": cat(lambda t: t["last_step"]),
           "optimizer": {n: records[:, d + lo:d + lo + widths[n]].clone()
                         for n, lo in zip(names, itertools.accumulate([0] + [widths[n] for n in names]))},
           "step": max(int(t.get("step", 0)) for t in tables), "sketch": None,
           "counters": {k: sum(t["counters"].get(k, 0) for t in tables) if index == 0 else 0
                        for k in tables[0].get("counters", {})}}
    if tables[0].get("sketch") is not None:
        counts = sum(t["sketch"]["counts"].to(torch.int32) for t in tables)
        out["sketch"] = {"counts": counts.clamp_(max=255).to(torch.uint8)}
    return out


def add_parser(sub) -> None:
    """Register ``het reshard`` on the ``het`` command's subparsers."""
    r = sub.add_parser("reshard", help="a saved PS or a training checkpoint, moved to another number of shards")
    r.add_argument("src", help="a PS save directory (shard-<i>.pt) or a checkpoint directory (ps/, worker.pt)")
    r.add_argument("dst", help="a new (or empty) directory")
    r.add_argument("--shards", type=int, required=True, help="the number of shards to write")
    r.set_defaults(func=_main)


def _main(args) -> None:
    checkpoint = os.path.exists(os.path.join(args.src, "worker.pt"))
    paths = (reshard_checkpoint if checkpoint else reshard)(args.src, args.dst, args.shards)
    what = "checkpoint" if checkpoint else "PS save"
    print(f"het reshard: {what} {args.src} -> {args.dst}: {len(paths)} shard files"
          + (f"; continue it with het train --resume {args.dst} --servers {args.shards}" if checkpoint else ""))
