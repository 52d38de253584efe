"""A request's replies from its shards, merged into one result: rows and clocks in the order
of the keys asked, the rows a lazy reply left out built here from the table's seed."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from het import native
from het.choices import RowDtype
from het.config import TableConfig
from het.ps.protocol import halves
from het.ps.protocol.initial import initial_rows, initial_salt, initial_state
from het.ps.protocol.integers import WIRE_INTS
from het.ps.protocol.messages import Op, PSError, array_bytes


@dataclass
class Handle:
    """An operation in flight: one request per shard it touched."""

    op: Op
    table: str
    n: int
    device: torch.device
    parts: list = field(default_factory=list)  # (shard, request_id, positions (k,) int64; None: every key, in order)
    result: object = None
    done: bool = False
    request_bytes: int = 0  # every array sent
    sync_bytes: int = 0  # of which a sync's keys and clocks
    push_bytes: int = 0  # of which a push's keys, gradients, counts (and squares)
    reply_bytes: int = 0  # every array received, once waited for
    keys: torch.Tensor | None = None  # the keys pulled or synced (any device): to build untouched rows
    state: str | None = None  # a sync's optimizer state asked for ("row", "full"): one more reply array
    merge_s: float = 0.0  # seconds of merging the replies, once they were all in: work, not waiting
    keys_cpu: torch.Tensor | None = None  # ``keys`` on the CPU, copied once for every reply
    hot: bool = False  # sent by the short path (:mod:`het.ps.client.hot`), whose wait reads its reply first

    def count_request(self, arrays: list, pushed: int) -> None:
        """Count one request's arrays: all, those of a push (its first ``pushed``: keys,
        gradients, counts and squares) and those of a sync (the rest)."""
        pushed = pushed if self.op in (Op.PUSH, Op.PUSH_SYNC) else 0
        self.request_bytes += array_bytes(arrays)
        self.push_bytes += array_bytes(arrays[:pushed])
        if self.op in (Op.SYNC, Op.PUSH_SYNC):
            self.sync_bytes += array_bytes(arrays[pushed:])

    def cpu_keys(self) -> torch.Tensor:
        if self.keys_cpu is None:
            self.keys_cpu = self.keys.cpu()
        return self.keys_cpu


@dataclass
class SyncResult:
    """Rows the shards sent back for a sync: ``index`` into the keys synced, their rows and
    server clocks; the bytes the index, clocks and ``built`` marks took on the wire, and the
    bytes of the rows that travelled (rows no push touched are built here, not sent).
    Shape: index (m,), rows (m, D), clocks (m,)."""

    index: torch.Tensor
    rows: torch.Tensor
    clocks: torch.Tensor
    sync_bytes: int = 0
    row_bytes: int = 0
    state: torch.Tensor | None = None  # the rows' optimizer state when the sync asked for it


def merge(handle: Handle, replies: list, table: TableConfig):
    """The result of ``handle`` from ``replies`` ``[(positions, reply message), ...]``: rows and
    clocks (PULL), rows applied (PUSH), or a :class:`SyncResult` (SYNC, PUSH_SYNC)."""
    dim = table.dim
    dev = handle.device
    if handle.op is Op.PULL:
        if len(replies) == 1 and len(replies[0][0]) == handle.n:  # one shard had them all, in order
            p, m = replies[0]
            rows, clocks, _ = PARTS(handle, table, p, m.arrays[0], m.arrays[1], None, m.arrays[2:], None)
            return rows.to(dev), clocks.to(dev)
        rows = torch.empty(handle.n, dim)
        clocks = torch.empty(handle.n, dtype=torch.int64)
        for p, m in replies:
            part_rows, clocks[p.cpu()], _ = PARTS(handle, table, p, m.arrays[0], m.arrays[1], None, m.arrays[2:], None)
            _place(rows, p.cpu(), part_rows)
        return rows.to(dev), clocks.to(dev)
    if handle.op is Op.PUSH:
        return sum(m.meta["applied"] for _, m in replies)
    # SYNC, PUSH_SYNC: map each shard's indices back to positions in the keys, key order.
    index = [p.cpu()[_ints(m.arrays[0], "index")] for p, m in replies]
    width = None if handle.state is None else (1 if handle.state == "row" else dim)
    if not index:
        return SyncResult(torch.empty(0, dtype=torch.int64, device=dev), torch.empty(0, dim, device=dev),
                          torch.empty(0, dtype=torch.int64, device=dev),
                          state=None if width is None else torch.empty(0, width, device=dev))
    at = 3 if width is None else 4  # lazy's built marks come after the rows, clocks (and state)
    wire = sum(array_bytes([m.arrays[0], m.arrays[2], *m.arrays[at:]]) for _, m in replies)
    # the rows that travelled, and the state beside them: what a refreshed row costs
    row_bytes = sum(m.arrays[1].nbytes + (m.arrays[3].nbytes if width else 0) for _, m in replies)
    parts = [PARTS(handle, table, i, m.arrays[1], m.arrays[2], None if width is None else m.arrays[3], m.arrays[at:],
                   width) for i, (_, m) in zip(index, replies)]
    first = index[0]
    if len(parts) == 1 and (len(first) < 2 or bool((first[1:] > first[:-1]).all())):  # in key order: the result
        (rows, clocks, state), index = parts[0], first
    else:
        index, rows, clocks, state = _in_key_order(handle.n, index, parts)
    return SyncResult(index.to(dev), rows.to(dev), clocks.to(dev), wire, row_bytes,
                      None if state is None else state.to(dev))


def _in_key_order(n: int, index: list, parts: list) -> tuple:
    """Several replies' positions (among ``n`` keys), rows, clocks and state, laid out in the
    keys' order without a sort: each reply's put at its positions' ranks among all those
    answered. A shard answers only its own keys, so no position may come twice.
    Shape: -> (m,), (m, D), (m,), (m, width) or None."""
    answered = torch.zeros(n, dtype=torch.bool)
    for positions in index:
        answered[positions] = True
    order, m = answered.nonzero().flatten(), sum(len(positions) for positions in index)
    if len(order) != m:
        raise PSError(f"the replies name {m} rows for {len(order)} keys: a key answered twice")
    rank = torch.cumsum(answered, 0) - 1
    first_rows, _, first_state = parts[0]
    rows = torch.empty(m, first_rows.shape[1], dtype=first_rows.dtype)
    clocks = torch.empty(m, dtype=torch.int64)
    state = None if first_state is None else torch.empty(m, first_state.shape[1], dtype=first_state.dtype)
    for positions, (part_rows, part_clocks, part_state) in zip(index, parts):
        at = rank[positions]
        _place(rows, at, part_rows)
        clocks[at] = part_clocks
        if state is not None:
            _place(state, at, part_state)
    return order, rows, clocks, state


def _place(rows: torch.Tensor, positions: torch.Tensor, part: torch.Tensor) -> None:
    """``rows[positions] = part``: a shard's rows put at their keys' places in the result, in one
    native pass where they are float32 (torch's indexed assignment: the reference)."""
    if native.ops is not None and part.dtype == torch.float32 and positions.dtype == torch.int64:
        native.ops.scatter_rows(part.contiguous(), positions.contiguous(), rows)
    else:
        rows[positions] = part


def _ints(sent, what: str) -> torch.Tensor:
    """A reply's clocks or index, sent in the narrowest integers that held them, as int64."""
    if sent.dtype not in WIRE_INTS or sent.ndim != 1:
        raise PSError(f"a reply's {what}: expected a 1-D integer array, got {sent.dtype} of shape {sent.shape}")
    return torch.from_numpy(sent).long()


class TorchParts:
    """One shard's reply to a request, for the keys at ``positions``: their rows, clocks and
    (``width`` floats a row, when the request asked for it) optimizer state, each checked, and
    where a lazy reply marks a row built (``after``: its marks), that row's initial values made
    here, by torch's ops: the reference. Shape: positions (n,) -> (n, D), (n,), (n, width) or None."""

    def __call__(self, handle: Handle, table: TableConfig, positions: torch.Tensor, rows, clocks, state,
                 after: list, width: int | None):
        marks = _marks(after, len(positions))
        built_n = 0 if marks is None else _count_bits(marks)
        return self.parts(handle, table, positions, rows, clocks, state, marks, built_n, width)

    def parts(self, handle: Handle, table: TableConfig, positions: torch.Tensor, rows, clocks, state,
              marks: np.ndarray | None, built_n: int, width: int | None):
        """:meth:`__call__` of checked ``marks`` (None: none sent) of which ``built_n`` are set."""
        n = len(positions)
        built = None if not built_n else torch.from_numpy(np.unpackbits(marks, count=n, bitorder="little")).bool()
        return (_rows(handle, table, positions, rows, built), _clocks(clocks, built, n),
                None if width is None else _state(state, built, n, width, table))


class NativeParts(TorchParts):
    """:class:`TorchParts` in one native pass over the rows (het.native) where a lazy reply left
    rows to build, the same bits; the reference's checks alone where it left none (or where
    the state asked has another width than the table's initial state, which the shard refuses,
    or the rows are not float32, or the table's rows are stored in half precision: its initial
    rows are rounded to it, :func:`het.ps.protocol.initial.initial_rows`)."""

    def parts(self, handle: Handle, table: TableConfig, positions: torch.Tensor, rows, clocks, state,
              marks: np.ndarray | None, built_n: int, width: int | None):
        n = len(positions)
        if not built_n or rows.dtype != np.float32 or table.row_dtype != RowDtype.FP32:  # half: built rounded
            return super().parts(handle, table, positions, rows, clocks, state, marks, built_n, width)
        init = torch.empty(0) if width is None else initial_state(table, 1, width > 1)[0]
        if init.numel() != (width or 0):  # by the reference, which names what is wrong
            return super().parts(handle, table, positions, rows, clocks, state, marks, built_n, width)
        sent_rows = _check_rows(table, rows, n, built_n).contiguous()
        sent_clocks = _check_clocks(clocks, n - built_n)
        sent_state = torch.empty(0) if width is None else torch.from_numpy(_check_state(state, n - built_n, width))
        keys = handle.cpu_keys()[positions.cpu()]
        rows, clocks, state = native.ops.lazy_reply(sent_rows, torch.from_numpy(marks), keys, sent_clocks,
                                                    sent_state.contiguous(), init,
                                                    int(initial_salt(table).view(np.int64)), float(table.init_scale))
        return rows, clocks, None if width is None else state


_U8 = np.dtype("u1")
PARTS = NativeParts() if native.ops is not None else TorchParts()  # chosen once, as het.native loads


def _marks(after: list, n: int) -> np.ndarray | None:
    """A lazy reply's ``built`` marks for its ``n`` rows (the arrays after its rows, clocks and
    state: none, or the marks, a bit a row, little bit order), checked; None when there are none."""
    if not after:
        return None
    if len(after) != 1:
        raise PSError(f"a reply with {len(after)} arrays after its rows and clocks: expected at most one (built)")
    if after[0].dtype != _U8 or after[0].shape != ((n + 7) // 8,):
        raise PSError(f"a lazy reply's built marks: expected a bit for each of {n} rows, uint8 of shape "
                      f"({(n + 7) // 8},), got {after[0].dtype} {after[0].shape}")
    if n % 8 and int(after[0][-1]) >> (n % 8):
        raise PSError(f"a lazy reply's built marks: bits set past its {n} rows")
    return after[0]


def _count_bits(marks: np.ndarray) -> int:
    """The bits set in packed marks."""
    if not marks.any():  # every row sent: the common reply once a table is warm
        return 0
    if hasattr(np, "bitwise_count"):  # numpy >= 2.0
        return int(np.bitwise_count(marks).sum())
    return int(np.unpackbits(marks).sum())


def _check_rows(table: TableConfig, sent, n: int, built_n: int) -> torch.Tensor:
    """A reply's rows sent, for its ``n`` rows of which it marks ``built_n`` built: float32, or
    the bits of a half-precision table's rows (int16), widened; a table whose rows decay sends
    them float32 (brought to a step from its half rows, het.decay)."""
    half = table.row_dtype != RowDtype.FP32 and not table.optimizer.decays
    if sent.dtype != (np.int16 if half else np.float32):
        raise PSError(f"a reply's rows: expected {'int16 (the bits of ' + str(table.row_dtype) + ' rows)' if half else 'float32'} "
                      f"for table {table.name!r}, got {sent.dtype}")
    sent = torch.from_numpy(sent)
    if half:
        sent = halves.from_bits(sent, table.row_dtype)
    if sent.dim() != 2 or sent.shape[1] != table.dim:
        raise PSError(f"a reply's rows: expected (k, {table.dim}) for table {table.name!r}, got shape "
                      f"{tuple(sent.shape)}")
    if len(sent) != n - built_n:
        raise PSError(f"a reply marks {built_n} of {n} rows built and sends {len(sent)}: expected {n - built_n} sent")
    return sent


def _check_clocks(sent, k: int) -> torch.Tensor:
    """A reply's clocks of the ``k`` rows it sent, as int64."""
    sent = _ints(sent, "clocks")
    if len(sent) != k:
        raise PSError(f"a reply's clocks: expected one for each of the {k} rows sent, got {len(sent)}")
    return sent


def _check_state(sent, k: int, width: int) -> np.ndarray:
    """A reply's optimizer state of the ``k`` rows it sent."""
    if len(sent.shape) != 2 or sent.dtype.name != "float32" or tuple(sent.shape) != (k, width):
        raise PSError(f"a reply's optimizer state: expected float32 of shape ({k}, {width}), got "
                      f"{sent.dtype} {tuple(sent.shape)}")
    return sent


def _clocks(sent, built: torch.Tensor | None, n: int) -> torch.Tensor:
    """A reply's clocks of its ``n`` rows: those sent, and 0 for each row it left to be built
    (no push touched it). Shape: -> (n,)."""
    sent = _check_clocks(sent, n - (0 if built is None else int(built.sum())))
    if built is None:
        return sent
    clocks = torch.zeros(n, dtype=torch.int64)
    clocks[~built] = sent
    return clocks


def _state(sent, built: torch.Tensor | None, m: int, width: int, table: TableConfig) -> torch.Tensor:
    """A reply's optimizer state for its ``m`` rows: that of the rows sent, checked, and the
    initial state for each row it left to be built. Shape: -> (m, width)."""
    built_n = 0 if built is None else int(built.sum())
    sent = torch.from_numpy(_check_state(sent, m - built_n, width))
    if built is None:
        return sent
    state = torch.empty(m, width)
    state[~built] = sent
    state[built] = initial_state(table, built_n, full=width > 1)
    return state


def _rows(handle: Handle, table: TableConfig, positions: torch.Tensor, sent, built: torch.Tensor | None) -> torch.Tensor:
    """The rows of ``handle.keys[positions]`` from a reply: the rows ``sent``, and where a
    lazy reply marks one ``built`` (untouched on the shard), its initial value, made here.
    Shape: positions (n,), sent (k, D) -> (n, D)."""
    sent = _check_rows(table, sent, len(positions), 0 if built is None else int(built.sum()))
    if built is None:
        return sent
    keys = handle.cpu_keys()[positions.cpu()[built]]
    rows = torch.empty(len(built), table.dim)
    rows[~built] = sent
    rows[built] = torch.from_numpy(initial_rows(table, keys.numpy()))
    return rows
