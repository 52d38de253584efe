"""The short path of a client's two hot requests: a PULL, and a PUSH of gradients and counts,
in one request to each shard it touches, unsigned, with no re-sending after a restart.

A dense table in mode ps sends one of each a step, a flush its pushes, ``het bench ps`` nothing
else; on their way the general path (handles, routing, the generic codec, the reply's checks and
merge, :mod:`het.ps.client.client`) costs a client more CPU than the checks of what it sends. This path
writes the requests the general path would, byte for byte, their meta written without json (the
header frame in one native call, ``native.ops.hot_head``), and reads each reply in one native call
where it is in the very text a shard writes (``native.ops.hot_reply``), else with a few exact
comparisons in Python: a PULL's rows (n, D) float32, its clocks and no row left to build, a PUSH's
rows applied; a reply of every key, from a one-shard PS, is the result as it is. Any other reply
(an error, a lazy reply of rows to build, one of half rows, of another request, anything
malformed) it leaves to the general path, which reads it as it reads any reply and raises what it
raises; replies of several shards are merged as the general path merges them. The tests hold the
two to the same frames and the same results (tests/unit/test_client_hot_path.py).
"""

from __future__ import annotations

import json
import time

import numpy as np
import torch

from het import native
from het.choices import RowDtype
from het.config import TableConfig
from het.ps.client.replies import merge
from het.ps.protocol import schema
from het.ps.protocol.integers import WIRE_INTS, delta_keys
from het.ps.protocol.messages import DTYPE_CODES, HEADER, MAGIC, OK, VERSION, Message, Op, specs_text

_INTS = {DTYPE_CODES[t]: t for t in WIRE_INTS}


def _tail(op: Op) -> str:
    """A hot request's meta after its first field (which the verb writes), in the schema's order
    (:data:`het.ps.protocol.schema.HOT`), as a format of its values' JSON text; ``{deltas}`` is
    the whole field where the keys travel as steps, else empty."""
    return "".join("{deltas}" if f == "deltas" else f'"{f}":{{{f}}},' for f in schema.HOT[op][1:]) + '"arrays":['


_TAIL = {op: _tail(op) for op in schema.HOT}
_JSON = json.JSONEncoder(separators=(",", ":"))  # as het.ps.protocol.messages writes meta
_F4 = np.dtype("<f4")
_U8 = np.dtype("u1")


class HotPath:
    """The short path of ``client`` (a :class:`het.ps.client.client.PSClient`, no secret, no
    ``reconnect_s``): :meth:`request` sends a request to a shard, :meth:`wait` reads a handle's
    replies, each by the short path where it can and by the general path where it cannot."""

    def __init__(self, client):
        self.client, self.link, self._texts = client, client.link, {}

    def request(self, handle, shard: int, fields: str, arrays: list, positions) -> None:
        """Send ``shard`` the request of ``handle`` for its keys at ``positions`` (None: every
        key, in order): ``fields``, the meta's first fields as JSON text with a comma after each
        (``'"lazy":true,'``), then the fields every request names; ``arrays`` numpy, of the
        wire's dtypes, their keys first."""
        link = self.link
        rid, seq = link.next_id(), link.next_seq(shard)
        deltas = ""
        coded = delta_keys(arrays[0])
        if coded is not None:
            arrays = [coded[0], *arrays[1:]]
            deltas = f'"deltas":{{"0":{coded[1]}}},'
        head = "{" + fields + _TAIL[handle.op].format(table=self._text(handle.table), session=f'"{link.session}"',
                                                      seq=seq, deltas=deltas, nonce=self._text(link.nonces[shard]))
        written = write_natively(handle.op, rid, head, arrays)
        if written is None:
            arrays = [a if a.flags.c_contiguous else np.ascontiguousarray(a) for a in arrays]
            text = f"{head}{specs_text(arrays)}]}}".encode()
            head_frame = HEADER.pack(MAGIC, VERSION, handle.op, OK, 0, rid, len(text)) + text
            written = head_frame, sum(a.nbytes for a in arrays)
        frames, sent = [written[0], *arrays], written[1]
        handle.request_bytes += sent
        if handle.op is Op.PUSH:
            handle.push_bytes += sent
        link.send_frames(shard, rid, frames, len(frames[0]) + sent)
        handle.parts.append((shard, rid, positions))

    def _text(self, value) -> str:
        """``value`` (a table's name, a shard's nonce) as the general path's JSON writes it,
        made once for a string."""
        if type(value) is not str:
            return _JSON.encode(value)
        text = self._texts.get(value)
        if text is None:
            text = self._texts[value] = _JSON.encode(value)
        return text

    def wait(self, handle):
        """``handle``'s result: one reply of every key read straight into it; else each reply
        read (by the short path, or by :meth:`het.ps.client.connection.Connection.reply`, which
        raises what a refusal or a malformed reply raises) and merged
        (:func:`het.ps.client.replies.merge`)."""
        table = self.client.tables[handle.table]
        replies, nbytes = [], 0
        for shard, rid, positions in handle.parts:
            msg = self._reply(handle, table, shard, rid, handle.n if positions is None else len(positions))
            if positions is None:
                if type(msg) is tuple:  # read natively: the result, and the bytes of the reply's arrays
                    result, handle.reply_bytes = msg
                    if handle.op is Op.PULL and handle.device.type != "cpu":
                        result = result[0].to(handle.device), result[1].to(handle.device)
                    handle.result, handle.done = result, True
                    return result
                if msg is not None:  # every key, in order: the reply's arrays are the result
                    start = time.perf_counter()
                    handle.result, handle.done = self._result(handle, msg), True
                    handle.merge_s = time.perf_counter() - start
                    return handle.result
                positions = torch.arange(handle.n, device=handle.device)
            if type(msg) is tuple:  # its arrays' bytes as they travelled, before the clocks were widened
                nbytes += msg[1]
                msg = _message(handle.op, rid, msg[0])
            else:
                msg = msg if msg is not None else self.link.reply(shard, rid)
                nbytes += sum(a.nbytes for a in msg.arrays)
            replies.append((positions, msg))
        handle.reply_bytes = nbytes
        start = time.perf_counter()
        handle.result, handle.done = merge(handle, replies, table), True
        handle.merge_s = time.perf_counter() - start
        return handle.result

    def _result(self, handle, msg: Message):
        handle.reply_bytes = sum(a.nbytes for a in msg.arrays)
        if handle.op is Op.PUSH:
            return msg.meta["applied"]
        rows, clocks = torch.from_numpy(msg.arrays[0]), torch.from_numpy(msg.arrays[1]).long()
        if handle.device.type != "cpu":
            rows, clocks = rows.to(handle.device), clocks.to(handle.device)
        return rows, clocks

    def _reply(self, handle, table: TableConfig, shard: int, rid: int, n: int) -> Message | tuple | None:
        """The reply to ``rid`` from ``shard``, for ``n`` keys, where it is the next off the wire
        and a hot one: read natively (:func:`read_natively`), ``(result, bytes of its arrays)``
        on the CPU; else as a Message (:meth:`_read`); else None, the frames (if any were read)
        kept where :meth:`~het.ps.client.connection.Connection.reply` finds them."""
        link = self.link
        if link.came_early(shard, rid) or not link.awaits(shard, rid):  # not awaited: a wait after a timeout
            return None
        frames = link.next_reply(shard)
        if handle.op is Op.PUSH or table.row_dtype == RowDtype.FP32:
            got = read_natively(frames, handle.op, rid, n, table.dim)
            if got is not None:
                link.read(shard, rid, frames)
                if handle.op is Op.PUSH:
                    return got[0], 0
                return got[:2], got[2]
        msg = self._read(handle.op, rid, frames, n, table)
        if msg is None:
            link.keep(shard, frames)
        else:
            link.read(shard, rid, frames)
        return msg

    @staticmethod
    def _read(op: Op, rid: int, frames, n: int, table: TableConfig) -> Message | None:
        """``frames`` as a hot reply to request ``rid`` (``op``, ``n`` keys of ``table``); else None."""
        if not frames:
            return None
        head = frames[0].buffer if hasattr(frames[0], "buffer") else memoryview(frames[0])
        if len(head) < HEADER.size:
            return None
        magic, version, got_op, status, flags, reply_id, meta_len = HEADER.unpack_from(head)
        if (magic != MAGIC or version != VERSION or got_op != op or status != OK or flags or reply_id != rid
                or len(head) != HEADER.size + meta_len):
            return None
        try:
            meta = json.loads(bytes(head[HEADER.size:]))
        except ValueError:
            return None
        if type(meta) is not dict:
            return None
        if op == Op.PUSH:
            applied = meta.get("applied")
            if (meta.keys() != {"applied", "arrays"} or meta["arrays"] != [] or type(applied) is not int
                    or len(frames) != 1):
                return None
            return Message(op, rid, {"applied": applied}, [])
        if table.row_dtype != RowDtype.FP32:  # its rows travel as the bits of half floats
            return None
        arrays = _pull_arrays(meta, frames, n, table.dim)
        return None if arrays is None else Message(op, rid, {}, arrays)


def write_natively(op: Op, rid: int, head: str, arrays: list):
    """A hot request's header frame written natively (``native.ops.hot_head``): the header, and
    the meta ``head`` (its text up to the arrays' specs) with the specs of ``arrays``; and the
    bytes of the arrays. None where an array is not C-contiguous, or without the native core:
    the Python writer's then, the same bytes."""
    return None if native.ops is None else native.ops.hot_head(op, rid, head, arrays)


def read_natively(frames, op: Op, rid: int, n: int, dim: int):
    """``frames`` read by the native reader (``native.ops.hot_reply``) as a hot reply to request
    ``rid`` (``op``, ``n`` keys of a float32 table of width ``dim``): a PULL's ``(rows, clocks
    int64, bytes of its arrays)``, a PUSH's ``(rows applied, 0)``; None where it is not one in
    the very text a shard writes (:meth:`HotPath._read` reads any spelling), or without the
    native core."""
    return None if native.ops is None else native.ops.hot_reply(frames, op, rid, n, dim)


def _message(op: Op, rid: int, result) -> Message:
    """A natively read reply as the Message :func:`het.ps.client.replies.merge` reads: a PULL's
    rows and clocks (int64) as numpy, a PUSH's rows applied."""
    if op is Op.PUSH:
        return Message(op, rid, {"applied": result}, [])
    return Message(op, rid, {}, [result[0].numpy(), result[1].numpy()])


def _pull_arrays(meta: dict, frames, n: int, dim: int) -> list | None:
    """A PULL reply's arrays where ``meta`` is exactly ``{"arrays": [rows, clocks(, marks)]}``,
    every one of the ``n`` rows sent, float32 of ``dim``, its clocks of a wire integer, its marks
    (a lazy reply's) all clear, and the frames hold exactly those bytes; else None."""
    specs = meta.get("arrays")
    if len(meta) != 1 or type(specs) is not list or len(specs) != len(frames) - 1 or len(specs) not in (2, 3):
        return None
    clock_code = specs[1][0] if type(specs[1]) is list and len(specs[1]) == 2 and type(specs[1][0]) is str else None
    clock_type = _INTS.get(clock_code)
    if (clock_type is None or not _spec_is(specs[0], "f4", (n, dim)) or not _spec_is(specs[1], clock_code, (n,))
            or (len(specs) == 3 and not _spec_is(specs[2], "u1", ((n + 7) // 8,)))):
        return None
    out = []
    sizes = (n * dim * 4, n * clock_type.itemsize, (n + 7) // 8)
    for frame, dtype, size in zip(frames[1:], (_F4, clock_type, _U8), sizes):
        buf = frame.buffer if hasattr(frame, "buffer") else memoryview(frame)
        if buf.nbytes != size:
            return None
        out.append(np.frombuffer(buf, dtype=dtype))
    if len(out) == 3 and out[2].any():
        return None
    return [out[0].reshape(n, dim), *out[1:]]


def _spec_is(spec, code: str, shape: tuple) -> bool:
    """Whether an array's spec is exactly ``[code, shape]``: its sizes ints, not floats or bools
    that compare equal (as the general decoder holds them)."""
    return (type(spec) is list and len(spec) == 2 and spec[0] == code and type(spec[1]) is list
            and len(spec[1]) == len(shape) and all(type(a) is int and a == b for a, b in zip(spec[1], shape)))
