"""A base of ``het train --publish`` made from the base before it and the deltas since: the
export a follower would hold after applying them, written as an export of its own.

A publishing job makes every base after its first this way (:mod:`het.train.publish`), in a
process of its own at a lower priority, so a base costs training neither a save of the shards'
rows and optimizer state nor a pass over them: it reads the base before it and the deltas since
(:mod:`het.train.published`), and deltas go on being written while it works.

What it writes is what ``het export`` would write of the same rows: a fixed table's file is the
old one with the changed rows written over it; a dynamic table's keys (the old index's hashes
turned back into keys: splitmix64 is a bijection) and the changed ones are indexed again, old
rows copied as stored (an int8 row is not quantised twice). The dense weights are the newest
delta's. Every file of the base is checked against its manifest first.

Run as ``python -m het.export.compact BASE OUT DELTA... --published JSON``, or as a process
that serves a publishing job's every base (``--serve``: a JSON line in, a JSON line out), so
torch and the program capture load once.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import time
import zlib

import numpy as np
import torch

from het.data.hashing import unsplitmix64
from het.export import dense as dense_model
from het.export import index as key_index
from het.export import layout
from het.export import rows as row_codec
from het.files import atomic_directory
from het.train.published import read_delta


def compact(base: str, deltas: list[str], out: str, published: dict) -> dict:
    """Write the export ``out`` of ``base`` with ``deltas`` (paths, in version order) applied;
    a summary. ``published``: the new version's ``version``, ``trained_at`` and ``step`` (and a
    stream job's ``stream_rows``)."""
    start = time.process_time()
    if not deltas:
        raise ValueError(f"compacting {base}: no delta given, nothing to apply")
    manifest = layout.read_manifest(base)
    tables = manifest["tables"]
    rewritten = {dense_model.PARAMS, dense_model.PROGRAM} | {
        f"tables/{name}/{f}" for name, entry in tables.items() if entry["dynamic"]
        for f in ("rows.npy", "qparams.npy", "hashes.npy", "directory.npy")}
    with atomic_directory(out) as root:
        os.chmod(root, 0o755)
        for name in tables:
            os.makedirs(os.path.join(root, "tables", name))
        for rel, file in manifest["files"].items():  # every file checked as it is read
            if rel in rewritten:
                layout.verify(base, rel, file)
            else:
                _copy_checked(base, root, rel, file)
        written, dense, changed = _apply(base, root, tables, deltas)
        body = {**manifest, "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "step": int(published["step"]), "checkpoint": None, "evaluation": None,
                "published": {"version": int(published["version"]), "trained_at": float(published["trained_at"]),
                              **({"stream_rows": int(published["stream_rows"])} if "stream_rows" in published else {})},
                "compacted": {"base": os.path.basename(os.path.abspath(base)), "deltas": len(deltas),
                              "rows": changed},
                "tables": {name: {**entry, **written[name]} for name, entry in tables.items()},
                "dense": _dense(root, manifest, dense)}
        body["files"] = {rel: layout.file_entry(os.path.join(root, rel)) for rel in _files(root)}
        layout.write_manifest(root, body)
    return {"out": os.path.abspath(out), "rows_changed": changed, "rows": sum(w["rows"] for w in written.values()),
            "bytes": sum(e["bytes"] for e in body["files"].values()), "seconds": time.process_time() - start}  # of CPU


def _apply(base: str, root: str, tables: dict, deltas: list[str]) -> tuple[dict, dict, int]:
    """Each delta read once, in version order: a fixed table's rows written over its copied files
    as they come, a dynamic table's gathered and indexed again at the end; ``(each table's entry,
    the newest dense weights, rows changed)``."""
    fixed = {name: _Fixed(os.path.join(root, "tables", name), entry) for name, entry in tables.items()
             if not entry["dynamic"]}
    gathered = {name: ([], []) for name, entry in tables.items() if entry["dynamic"]}
    dense = None
    for path in deltas:
        _, got, dense = read_delta(path, _version_of(path))
        unknown = sorted(set(got) - set(tables))
        if unknown:
            raise ValueError(f"{path} holds rows of tables {unknown}, which the base lacks")
        for name, (keys, rows) in got.items():
            if name in fixed:
                fixed[name].write(path, keys, rows)
            else:
                gathered[name][0].append(keys)
                gathered[name][1].append(rows)
    written, changed = {}, 0
    for name, table in fixed.items():
        written[name], count = table.finish()
        changed += count
    for name, (keys, rows) in gathered.items():
        written[name], count = _dynamic(os.path.join(base, "tables", name), os.path.join(root, "tables", name),
                                        tables[name], *_newest(keys, rows, tables[name]["config"]["dim"]))
        changed += count
    return written, dense, changed


def _newest(keys: list, rows: list, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Every changed key once (ascending) with its newest row, of the deltas' keys and rows in
    version order."""
    keys = np.concatenate(keys).astype(np.int64) if keys else np.zeros(0, np.int64)
    rows = np.concatenate(rows) if rows else np.zeros((0, dim), np.float32)
    if not len(keys):
        return keys, rows.reshape(0, dim)
    if rows.shape[1:] != (dim,):
        raise ValueError(f"the deltas' rows are {rows.shape[1:]} wide, the base's table {dim}")
    # the newest of each key: sort stably by key, keep each run's last
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    last = np.append(keys[1:] != keys[:-1], True)
    return keys[last], rows[order[last]]


def _copy_checked(base: str, root: str, rel: str, entry: dict) -> None:
    """Copy ``base/rel`` to ``root/rel`` and check the copy, block by block, against the base's
    manifest: a damaged base is refused, never copied into a new one. The kernel copies
    (``copy_file_range``: a tenth of the CPU of a read and a write, measured on a base of the
    default table), then the copy is read back for its checksums."""
    src, dst = os.path.join(base, rel), os.path.join(root, rel)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    with open(src, "rb") as f, open(dst, "xb") as g:
        _copy_file(f, g)
    size = 0
    with open(dst, "rb") as g:
        for i, expected in enumerate(entry["crc32"]):
            block = g.read(entry["block"])
            if zlib.crc32(block) != expected:
                raise layout.ExportError(f"{src}: checksum mismatch in its block {i}: the base is damaged")
            size += len(block)
        if size != entry["bytes"] or g.read(1):
            raise layout.ExportError(f"{src}: not the {entry['bytes']} bytes its manifest lists: damaged or replaced")


def _copy_file(f, g) -> None:
    """Every byte of open file ``f`` into ``g``, in the kernel where it can (else read and written)."""
    try:
        while os.copy_file_range(f.fileno(), g.fileno(), 1 << 30):
            pass
    except OSError:  # a filesystem or kernel without it: from where it stopped, by hand
        f.seek(g.seek(0, os.SEEK_END))
        shutil.copyfileobj(f, g, 1 << 22)


def _version_of(path: str) -> int:
    return int(os.path.basename(path).split("-")[1].split(".")[0])


class _Fixed:
    """A fixed table's old files (copied already), each delta's rows written over them in version
    order (a row's newest last)."""

    def __init__(self, table: str, entry: dict):
        self.entry, self.n, self.dim = entry, entry["rows"], entry["config"]["dim"]
        names = ["rows.npy"] + (["qparams.npy"] if entry["dtype"] == "int8" else [])
        self.stored = [np.load(os.path.join(table, f), mmap_mode="r+") for f in names]  # copied, checked
        self.changed = np.zeros(self.n, bool)

    def write(self, path: str, keys: np.ndarray, rows: np.ndarray) -> None:
        if rows.shape != (len(keys), self.dim):
            raise ValueError(f"{path}: rows of shape {rows.shape} for {len(keys)} keys of a table {self.dim} wide")
        if len(keys) and (keys.min() < 0 or keys.max() >= self.n):
            raise ValueError(f"{path} holds key {int(keys.min() if keys.min() < 0 else keys.max())}, outside the "
                             f"table's {self.n} rows")
        for array, new in zip(self.stored, row_codec.encode(rows, self.entry["dtype"])):
            array[keys] = new
        self.changed[keys] = True

    def finish(self) -> tuple[dict, int]:
        """``(its entry, rows changed)``, its files flushed."""
        for array in self.stored:
            array.flush()
        return {"rows": self.n}, int(np.count_nonzero(self.changed))


def _dynamic(source: str, table: str, entry: dict, keys: np.ndarray, rows: np.ndarray) -> tuple[dict, int]:
    """A dynamic table: the old keys and the new ones (``keys``, ascending, with their newest
    ``rows``) indexed again; old rows copied as stored, changed ones encoded; ``(its entry, rows
    changed)``."""
    hashes = np.load(os.path.join(source, "hashes.npy"))
    old = key_index.HashIndex(hashes, np.load(os.path.join(source, "directory.npy")))
    at = old.lookup(keys)
    held = len(hashes)
    union = np.concatenate([unsplitmix64(hashes).view(np.int64), keys[at < 0]])  # row p of the old: its p-th
    new_hashes, directory, order = key_index.build(union)
    np.save(os.path.join(table, "hashes.npy"), new_hashes)
    np.save(os.path.join(table, "directory.npy"), directory)
    where = np.empty(len(order), np.int64)
    where[order] = np.arange(len(order))                 # the union's i-th key -> its row
    fresh = np.flatnonzero(at < 0)
    at[fresh] = held + np.arange(len(fresh))              # each changed key's place in the union
    names = ["rows.npy"] + (["qparams.npy"] if entry["dtype"] == "int8" else [])
    olds = [np.load(os.path.join(source, f), mmap_mode="r") for f in names]
    news = [np.lib.format.open_memmap(os.path.join(table, f), mode="w+", dtype=o.dtype,
                                      shape=(len(union), *o.shape[1:])) for f, o in zip(names, olds)]
    piece = max(1, (32 << 20) // max(1, olds[0].strides[0]))
    for lo in range(0, len(union), piece):
        src = order[lo:lo + piece]
        kept = src < held
        for o, n in zip(olds, news):
            n[lo:lo + piece][kept] = o[src[kept]]
    encoded = row_codec.encode(rows, entry["dtype"])
    for n, new in zip(news, encoded):
        n[where[at]] = new
        n.flush()
    return {"rows": len(union), "bytes": sum(n.nbytes for n in news)}, len(keys)


def _dense(root: str, manifest: dict, dense: dict) -> dict:
    """``dense.pt`` from the newest delta's weights, and its program where the base had one."""
    module = dense_model.load_params(dense_model.build(manifest["model"]),
                                     {k: torch.from_numpy(np.array(v)) for k, v in dense.items()})
    torch.save(module.state_dict(), os.path.join(root, dense_model.PARAMS))
    info = {**manifest["dense"], "program": None}
    if manifest["dense"].get("program"):
        model = manifest["model"]
        program, why = dense_model.capture(module, model["num_dense"], model["num_fields"], model["dim"])
        if program is not None:
            torch.export.save(program, os.path.join(root, dense_model.PROGRAM))
            info["program"] = dense_model.PROGRAM
        info["program_error"] = why
    return info


def _files(root: str) -> list[str]:
    out = []
    for dirpath, _, names in os.walk(root):
        out += [os.path.relpath(os.path.join(dirpath, n), root) for n in names]
    return sorted(out)


def serve(lines, out) -> None:
    """Compact a base for each JSON line of ``lines`` (``base``, ``out``, ``deltas``,
    ``published``), answering each with a JSON line on ``out``: the summary and ``"ok": true``,
    or ``"ok": false`` and the error. One process serves a publishing job's every base, so
    torch and the dense model's program capture are loaded once."""
    for line in lines:
        try:
            job = json.loads(line)
            answer = {"ok": True, **compact(job["base"], job["deltas"], job["out"], job["published"])}
        except (OSError, ValueError, KeyError, TypeError) as e:
            answer = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m het.export.compact", description=__doc__.split("\n\n")[0])
    p.add_argument("--serve", action="store_true", help="compact a base for each JSON line on stdin")
    p.add_argument("base", nargs="?")
    p.add_argument("out", nargs="?")
    p.add_argument("deltas", nargs="*")
    p.add_argument("--published", help='JSON: {"version": V, "trained_at": T, "step": S}')
    args = p.parse_args(argv)
    if args.serve:
        serve(sys.stdin, sys.stdout)
        return 0
    if not (args.base and args.out and args.published):
        p.error("BASE, OUT and --published are needed (or --serve)")
    try:
        summary = compact(args.base, args.deltas, args.out, json.loads(args.published))
    except (OSError, ValueError) as e:
        print(f"het compact: {e}", file=sys.stderr)
        return 1
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
