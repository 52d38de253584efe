"""The short path of a client's two hot requests: a PULL, and a PUSH of gradients and counts,
of every key in one request to a one-shard PS, unsigned, with no re-sending after a restart.

A training step sends one of each, and on their way the general path (handles, routing, the
generic codec, the reply's checks and merge, :mod:`het.ps.client`) costs a client more CPU than
the checks of what it sends. This path writes the request the general path would, byte for
byte, its meta written without json, and reads the reply to it with a few exact comparisons: a
PULL's rows (n, D) float32, its clocks and no row left to build, a PUSH's rows applied. Any other
reply (an error, a lazy reply of rows to build, one of half rows, of another request, anything
malformed) it leaves to the general path, which reads it as it reads any reply and raises what
it raises. The tests hold the two to the same frames and the same results
(tests/unit/test_client_hot_path.py).
"""

from __future__ import annotations

import json
import time

import numpy as np
import torch

from het.ps.wire.integers import WIRE_INTS, delta_keys
from het.ps.wire.protocol import HEADER, MAGIC, OK, VERSION, Op

_CODES = {np.dtype(t): code for code, t in (("i8", "<i8"), ("i4", "<i4"), ("i2", "<i2"), ("f4", "<f4"), ("u1", "u1"))}
_INTS = {_CODES[t]: t for t in WIRE_INTS}
_F4 = np.dtype("<f4")
_U8 = np.dtype("u1")
DECLINED = object()  # what :meth:`HotPath.wait` gives for a reply it leaves to the general path


class HotPath:
    """The short path of ``client`` (a :class:`het.ps.client.PSClient` of one shard, no secret,
    no ``reconnect_s``): :meth:`request` sends, :meth:`wait` reads."""

    def __init__(self, client):
        self.client, self.link, self._texts = client, client.link, {}

    def request(self, handle, fields: str, arrays: list) -> None:
        """Send ``handle``'s request: ``fields``, the meta's first fields as JSON text with a
        comma after each (``'"lazy":true,'``), then the fields every request names; ``arrays``
        numpy, of the wire's dtypes, their keys first."""
        link = self.link
        rid, seq = link.next_id(), link.next_seq(0)
        deltas = ""
        coded = delta_keys(arrays[0])
        if coded is not None:
            arrays = [coded[0], *arrays[1:]]
            deltas = f'"deltas":{{"0":{coded[1]}}},'
        arrays = [a if a.flags.c_contiguous else np.ascontiguousarray(a) for a in arrays]
        table, nonce = self._text(handle.table), self._text(link.nonces[0])
        specs = ",".join(f'["{_CODES[a.dtype]}",[{",".join(map(str, a.shape))}]]' for a in arrays)
        text = (f'{{{fields}"table":{table},"session":"{link.session}","seq":{seq},{deltas}"nonce":{nonce},'
                f'"arrays":[{specs}]}}').encode()
        frames = [HEADER.pack(MAGIC, VERSION, handle.op, OK, 0, rid, len(text)) + text, *arrays]
        sent = sum(a.nbytes for a in arrays)
        handle.request_bytes += sent
        if handle.op is Op.PUSH:
            handle.push_bytes += sent
        link.send_frames(0, rid, frames, len(frames[0]) + sent)
        handle.parts.append((0, rid, None))  # None: every key, in order (positions made if the general path reads)

    def _text(self, value) -> str:
        """``value`` (a table's name, the shard's nonce) as JSON, made once for a string."""
        if type(value) is not str:
            return json.dumps(value)
        text = self._texts.get(value)
        if text is None:
            text = self._texts[value] = json.dumps(value)
        return text

    def wait(self, handle):
        """``handle``'s result from its reply, or :data:`DECLINED`: the reply, when it came, is
        where the general path finds it (:meth:`het.ps.wire.connection.Connection.reply`)."""
        (_, rid, _), = handle.parts
        link = self.link
        if link.came_early(0, rid):
            return DECLINED
        frames = link.next_reply(0)
        result = self._read(handle, rid, frames)
        if result is DECLINED:
            link.keep(0, frames)
            return DECLINED
        link.read(0, rid, frames)
        handle.result, handle.done = result, True
        return result

    def _read(self, handle, rid: int, frames):
        """The result of ``handle`` from ``frames``, a hot reply to ``rid``; else DECLINED."""
        head = frames[0].buffer if hasattr(frames[0], "buffer") else memoryview(frames[0])
        if len(head) < HEADER.size:
            return DECLINED
        magic, version, op, status, flags, reply_id, meta_len = HEADER.unpack_from(head)
        if (magic != MAGIC or version != VERSION or op != handle.op or status != OK or flags or reply_id != rid
                or len(head) != HEADER.size + meta_len):
            return DECLINED
        try:
            meta = json.loads(bytes(head[HEADER.size:]))
        except ValueError:
            return DECLINED
        if type(meta) is not dict:
            return DECLINED
        if op == Op.PUSH:
            applied = meta.get("applied")
            if meta.keys() != {"applied", "arrays"} or meta["arrays"] != [] or type(applied) is not int or len(frames) != 1:
                return DECLINED
            handle.reply_bytes = 0
            return applied
        start = time.perf_counter()
        arrays = _pull_arrays(meta, frames, handle.n, self.client.tables[handle.table].dim)
        if arrays is None:
            return DECLINED
        rows, clocks = torch.from_numpy(arrays[0]), torch.from_numpy(arrays[1]).long()
        if handle.device.type != "cpu":
            rows, clocks = rows.to(handle.device), clocks.to(handle.device)
        handle.reply_bytes = sum(a.nbytes for a in arrays)
        handle.merge_s = time.perf_counter() - start
        return rows, clocks


def _pull_arrays(meta: dict, frames, n: int, dim: int) -> list | None:
    """A PULL reply's arrays where ``meta`` is exactly ``{"arrays": [rows, clocks(, marks)]}``,
    every one of the ``n`` rows sent, float32 of ``dim``, its clocks of a wire integer, its marks
    (a lazy reply's) all clear, and the frames hold exactly those bytes; else None."""
    specs = meta.get("arrays")
    if len(meta) != 1 or type(specs) is not list or len(specs) != len(frames) - 1 or len(specs) not in (2, 3):
        return None
    if specs[0] != ["f4", [n, dim]] or type(specs[1]) is not list or len(specs[1]) != 2 or specs[1][1] != [n]:
        return None
    clock_type = _INTS.get(specs[1][0]) if type(specs[1][0]) is str else None
    if clock_type is None or (len(specs) == 3 and specs[2] != ["u1", [(n + 7) // 8]]):
        return None
    out = []
    for frame, dtype, size in zip(frames[1:], (_F4, clock_type, _U8), (n * dim * 4, n * clock_type.itemsize, (n + 7) // 8)):
        buf = frame.buffer if hasattr(frame, "buffer") else memoryview(frame)
        if buf.nbytes != size:
            return None
        out.append(np.frombuffer(buf, dtype=dtype))
    if len(out) == 3 and out[2].any():
        return None
    return [out[0].reshape(n, dim), *out[1:]]
