"""A training checkpoint read offline, in pieces: what ``het export`` reads.

A checkpoint (``het train --checkpoint DIR``, :mod:`het.train.checkpoint`) is ``DIR/worker.pt``
(the job's config, the dense model, the step) and ``DIR/ps/shard-<i>.pt``, one save per PS shard
(:mod:`het.ps.server.shard`). A fixed table's rows sit in each shard's save, key ``k`` on shard
``k % S`` at local row ``k // S``; a dynamic table's stored keys and rows sit beside each other,
its rows either in the save or, for a shard with a disk tier, in the segment files linked beside
it. :class:`Checkpoint` reads every file back against its checksums first, in blocks
(:func:`het.files.check_zip`; a disk tier's records as they are read), and refuses a damaged
checkpoint naming the file and the bytes; it opens them without loading them
(:mod:`het.export.lazy`) and hands a table's rows out a piece at a time.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

import numpy as np
import torch

from het import files
from het.config import TableConfig
from het.decay import DECAYED, RowDecay, steps_of
from het.export.lazy import LazyTensor, TorchFile
from het.ps.server.store import optim
from het.ps.server.store.disk import read_saved
from het.ps.server.store.saves import check_format, check_shards_here, table_dir
from het.train.checkpoint import FORMAT as WORKER_FORMAT, read_checked_json

PIECE_BYTES = 32 << 20  # rows read at once from a save
_SHARD = re.compile(r"shard-(\d+)\.pt")


class Checkpoint:
    """A checkpoint directory, opened for reading in pieces.

    Args:
        path: the directory ``het train --checkpoint`` wrote.

    Attributes:
        config: the job's config as a dict (:meth:`het.train.config.TrainConfig.to_dict`).
        step: the steps trained.
        model_state: the dense model's parameters (the embedding's excluded).
        tables: every PS table's config, by name.
        num_shards: the shards it was saved from.
        evaluation: the held-out metrics recorded with it (``evaluation.json``), or None.

    Raises:
        ValueError: ``path`` is not a checkpoint, or one of another format; the message says
            what was expected and what is there.
        DamagedFile: a file of it does not read back as written (its name and bytes said).
    """

    def __init__(self, path: str):
        self.path = path
        worker = os.path.join(path, "worker.pt")
        if not os.path.isdir(path):
            raise ValueError(f"expected a checkpoint directory (worker.pt and ps/shard-<i>.pt, as het train "
                             f"--checkpoint writes), got {_what(path)} at {path!r}")
        if not os.path.isfile(worker):
            raise ValueError(f"expected a checkpoint directory holding worker.pt and ps/shard-<i>.pt, got a directory "
                             f"holding {sorted(os.listdir(path))[:8]} at {path!r}")
        try:
            files.check_zip(worker)  # its bytes as written first: a damaged one is named as such
            state = torch.load(worker, weights_only=True, map_location="cpu")
        except Exception as e:  # noqa: BLE001 - torch raises many kinds for a file that is not its own
            raise ValueError(f"{worker}: not a checkpoint's worker.pt ({type(e).__name__}: "
                             f"{str(e).splitlines()[0][:200] if str(e) else ''})") from None
        if not isinstance(state, dict) or state.get("format") != WORKER_FORMAT:
            got = state.get("format") if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"{worker}: checkpoint format {got!r}, expected {WORKER_FORMAT}")
        self.config, self.step, self.model_state = state["config"], int(state["step"]), state["model"]
        self.evaluation = _read_json(os.path.join(path, "evaluation.json"))
        self.published = state.get("published")  # a base of het train --publish: its version and time
        self.fields = state.get("fields")  # fields of several widths: their tables (het.nn.fields.FieldGroup)
        check_shards_here(path, state)
        self.shards = self._open_shards(os.path.join(path, "ps"))
        self.num_shards = len(self.shards)
        first = self.shards[0].obj["tables"]
        self.tables = {name: TableConfig.from_dict(t["config"]) for name, t in first.items()}

    def _open_shards(self, ps: str) -> list[TorchFile]:
        names = sorted(os.listdir(ps)) if os.path.isdir(ps) else []
        found = sorted(int(m.group(1)) for m in map(_SHARD.fullmatch, names) if m)
        if not found:
            raise ValueError(f"{self.path}: expected the PS's saves ps/shard-<i>.pt, found none in {ps}")
        shards = []
        for i in found:
            files.check_zip(os.path.join(ps, f"shard-{i}.pt"))
            f = TorchFile(os.path.join(ps, f"shard-{i}.pt"))
            check_format(f.obj, f.path)
            shards.append(f)
        total = shards[0].obj["num_shards"]
        if found != list(range(total)) or any((f.obj["index"], f.obj["num_shards"]) != (i, total)
                                               for i, f in enumerate(shards)):
            raise ValueError(f"{ps} holds shard files {found}; expected shards 0..{total - 1} of {total}")
        return shards

    def table_pieces(self, name: str, piece_bytes: int = PIECE_BYTES) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Table ``name``'s rows as pieces ``(keys (n,) int64, rows (n, dim) float32)``: every row of
        a fixed table, every stored row of a dynamic one, each exactly once, shard by shard; the
        rows of a table that decays (:mod:`het.decay`) brought to the checkpoint's step.
        Memory: one piece (``piece_bytes`` of rows) at a time."""
        cfg = self.tables[name]
        decay = RowDecay(cfg.optimizer)
        per = max(1, piece_bytes // (4 * cfg.dim))
        for i, shard in enumerate(self.shards):
            saved = shard.obj["tables"][name]
            pieces = (self._dynamic_pieces(shard, saved, cfg, per) if cfg.dynamic
                      else self._fixed_pieces(shard, saved, i, per))
            for keys, rows, decayed in pieces:
                if decay.active:
                    rows = decay.bring(torch.from_numpy(rows), decayed(), self.step).numpy()
                yield keys, rows
                shard.drop_pages()

    def _fixed_pieces(self, shard: TorchFile, saved: dict, i: int, per: int):
        """``(keys, rows, the step each was brought to)`` pieces of a fixed table's save, the
        last a function (read only for a table that decays)."""
        weight = _tensor(saved, "weight", shard.path)
        for lo in range(0, len(weight), per):
            hi = min(len(weight), lo + per)
            yield (np.arange(lo, hi, dtype=np.int64) * self.num_shards + i, weight.float_rows(lo, hi),
                   lambda lo=lo, hi=hi: _decayed(saved, shard.path, lo, hi))

    def _dynamic_pieces(self, shard: TorchFile, saved: dict, cfg: TableConfig, per: int):
        keys = _tensor(saved, "keys", shard.path)
        if "disk" in saved:  # a disk tier's rows, with their state after them: in the segment files beside the save
            disk = {k: (v.numpy() if isinstance(v, LazyTensor) else v) for k, v in saved["disk"].items()}
            records = torch.from_numpy(disk["records"])
            rows_dir = os.path.join(shard.path + shard.obj["rows"], table_dir(cfg.name))
            column = cfg.dim + sum(optim.make(cfg.optimizer, 0, cfg.dim).widths(cfg.dim).values())  # the decay's step
            for lo in range(0, len(keys), per):
                hi = min(len(keys), lo + per)
                read = read_saved(rows_dir, disk, records[lo:hi])
                yield keys.rows(lo, hi), read[:, :cfg.dim].copy(), lambda read=read: steps_of(read[:, column:column + 2])
            return
        weight = _tensor(saved, "weight", shard.path)
        for lo in range(0, len(keys), per):
            hi = min(len(keys), lo + per)
            yield keys.rows(lo, hi), weight.float_rows(lo, hi), lambda lo=lo, hi=hi: _decayed(saved, shard.path, lo, hi)

    def stored_keys(self, name: str) -> np.ndarray:
        """Every stored key of dynamic table ``name``, shard by shard. Shape: (n,) int64."""
        parts = [_tensor(s.obj["tables"][name], "keys", s.path).numpy() for s in self.shards]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def stored_rows(self, name: str) -> int:
        """Rows of table ``name`` in the checkpoint (every row of a fixed table)."""
        cfg = self.tables[name]
        if not cfg.dynamic:
            return cfg.rows
        return sum(len(_tensor(s.obj["tables"][name], "keys", s.path)) for s in self.shards)

    def close(self) -> None:
        for s in self.shards:
            s.close()


def _decayed(saved: dict, path: str, lo: int, hi: int) -> torch.Tensor:
    """The step rows ``lo .. hi - 1`` of a saved table that decays were last brought to (its
    optimizer state ``decayed``). Shape: (hi - lo,) int64."""
    state = saved.get("optimizer")
    if not isinstance(state, dict) or not isinstance(state.get(DECAYED), LazyTensor):
        raise ValueError(f"{path}: table {saved.get('config', {}).get('name')!r} decays its rows (l2), and its save "
                         f"holds no optimizer state {DECAYED!r} to bring them to the checkpoint's step")
    return steps_of(np.array(state[DECAYED].array()[lo:hi]))


def _tensor(saved: dict, key: str, path: str) -> LazyTensor:
    value = saved.get(key)
    if not isinstance(value, LazyTensor):
        raise ValueError(f"{path}: expected a tensor {key!r} in table {saved.get('config', {}).get('name')!r}, "
                         f"got {type(value).__name__}")
    return value


def _read_json(path: str) -> dict | None:
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return read_checked_json(f.read(), path)


def _what(path: str) -> str:
    if not os.path.exists(path):
        return "nothing"
    return "a file" if os.path.isfile(path) else "something else"

