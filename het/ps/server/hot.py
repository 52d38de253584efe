"""The short path of a shard's two hot requests: a PULL, and a PUSH of one whole part, unsigned.

A training step sends one of each to every shard it touches, and their rows are most of what
a shard moves: the general path (:meth:`het.ps.server.shard.Shard.handle_frames`: decode any message,
parse every field, dispatch) costs about as much CPU as the gather and the push themselves.
This path reads such a request in one native call where it is in the very text het's client
writes (``native.ops.hot_request``), else with a few exact comparisons in Python (any spelling of
the same fields). A fixed float32 table answers a lazy pull, and a push that is not logged, whose
table's changes no reader follows, on a shard without a memory budget, from the request's arrays
as they travel (:meth:`~het.ps.server.store.rowstore.RowStore.wire_pull`, ``wire_push``: its keys located
and its counts widened, each checked in one native pass). Any other such request, or one with a
value out of range, goes to the general path's verbs (:meth:`~het.ps.server.shard.Shard.pull`,
:meth:`~het.ps.server.shard.Shard.push`, which check keys, shapes, values and ranges and name what is
wrong). The reply is the general path's, byte for byte (keys sent delta-coded, as a client sends
ascending ones, decoded as the general path decodes them). It answers only what it has proved
well formed: a request with any other field, dtype, shape or size, a signed one, one of a session
the shard has not seen or whose idle look is due, a push sent again, goes to the general path,
which answers it or names what is wrong.
The tests hold the two to the same replies and the same tables (tests/unit/test_hot_path.py).
"""

from __future__ import annotations

import json

import numpy as np

from het import native
from het.ps.protocol import schema
from het.ps.protocol.integers import undelta_keys
from het.ps.protocol.limits import MAX_STEP, refused_push
from het.ps.protocol.messages import HEADER, MAGIC, VERSION, WIRE_DTYPES, Op, encode, error_reply, specs_text

_KEYS, _STEPS, _COUNTS = ({code: WIRE_DTYPES[code] for code in codes}
                          for codes in (schema.KEYS, schema.STEPS, schema.INTS))
# a hot request's fields (its keys' "deltas" apart), as the schema lists them for het's client
_PULL_FIELDS, _PUSH_FIELDS = (frozenset(schema.HOT[op]) - {"deltas"} | {"arrays"} for op in (Op.PULL, Op.PUSH))
# what the verbs raise for a request they refuse (nothing changed): an error reply, as the general path gives
REFUSED = (ValueError, KeyError, TypeError, OSError, RuntimeError, ArithmeticError)


def answer(shard, frames) -> list | None:
    """The reply frames to a hot request of ``shard``, or None: not one this path reads (the
    general path takes it, from the start: nothing was changed or counted)."""
    limit = shard.cfg.max_message_bytes
    read = read_natively(frames, shard.nonce, limit)
    if read is None:
        read = _read(shard, frames, limit)
    if read is None:
        return None
    op, rid, table, session, seq, value, arrays, first = read
    if first is not None:  # keys sent as the steps between them
        try:
            arrays = [undelta_keys(arrays[0], first, shard.cfg.max_keys), *arrays[1:]]
        except ValueError:
            return None
    if not shard.sessions.admit(session):
        return None
    try:
        if op == Op.PULL:
            reply = encode_reply(Op.PULL, rid, {}, _pull(shard, table, arrays[0], value))
        else:
            if not shard.sessions.new_push(session, seq):
                return None
            reply = encode_reply(Op.PUSH, rid, {"applied": _push(shard, table, arrays, value, (session, seq))}, [])
    except REFUSED as e:
        shard.stats["errors"] += 1
        reply = encode(error_reply(rid, op, e))
    name = "pull" if op == Op.PULL else "push"
    shard.last_op = name
    shard.stats["requests_" + name] += 1
    return reply


def _pull(shard, table: str, keys: np.ndarray, lazy: bool) -> list:
    """:meth:`~het.ps.server.shard.Shard.pull`'s reply, read by the store from the keys as they travel
    where it can (:meth:`~het.ps.server.store.rowstore.RowStore.wire_pull`)."""
    t = shard.tables.get(table)
    direct = t is not None and len(keys) <= shard.cfg.max_keys and not t.optimizer.decay.active
    read = t.wire_pull(keys, lazy) if direct else None
    if read is None:
        return shard.pull(table, keys, lazy=lazy)
    shard.count_rows(read[1], len(keys))
    return read[0]


def _push(shard, table: str, arrays: list, step: int, session: tuple[str, int]) -> int:
    """:meth:`~het.ps.server.shard.Shard.push` of a request's arrays, applied by the store from them as
    they travel where it can (:meth:`~het.ps.server.store.rowstore.RowStore.wire_push`): not where the
    push is logged, its table's changes followed or the shard's memory held to a budget."""
    t, applied = shard.tables.get(table), None
    if (t is not None and shard.wal is None and shard.budget is None and table not in shard.changes
            and len(arrays[0]) <= shard.cfg.max_keys):
        try:
            applied = t.wire_push(*arrays, step)
        except ValueError as e:
            raise refused_push(shard.stats, table, t.refuses_non_finite_grads, arrays[1], e) from None
    if applied is None:
        return shard.push(table, *arrays, step=step, session=session)
    shard.sessions.applied[session[0]] = session[1]
    shard.stats["rows_in"] += applied
    return applied


def read_natively(frames, nonce: str, limit: int) -> tuple | None:
    """A hot request read natively (``native.ops.hot_request``), in the very text het's client
    writes: ``(op, request id, table, session, seq, lazy or step, arrays, first key)``, the first
    key None unless the keys travel delta-coded (as their steps); None for any other
    (:func:`_read`'s then), or without the native core."""
    if native.ops is None or type(nonce) is not str:
        return None
    return native.ops.hot_request(frames, nonce, MAX_STEP, limit)


def _read(shard, frames, limit: int) -> tuple | None:
    """:func:`read_natively`'s reading of a hot request in any spelling of its meta; None where
    it is not a hot one."""
    n = len(frames)
    if n != 2 and n != 4:
        return None
    head = frames[0].buffer if hasattr(frames[0], "buffer") else memoryview(frames[0])
    if len(head) < HEADER.size:
        return None
    magic, version, op, status, flags, rid, meta_len = HEADER.unpack_from(head)
    if magic != MAGIC or version != VERSION or flags or status or len(head) != HEADER.size + meta_len:
        return None
    if not (op == Op.PULL and n == 2 or op == Op.PUSH and n == 4):
        return None
    try:
        meta = json.loads(bytes(head[HEADER.size:]))
    except ValueError:
        return None
    fields = _PULL_FIELDS if op == Op.PULL else _PUSH_FIELDS
    if type(meta) is not dict or (meta.keys() != fields and meta.keys() != fields | {"deltas"}):
        return None
    first = meta["deltas"].get("0") if type(meta.get("deltas")) is dict and len(meta["deltas"]) == 1 else None
    if "deltas" in meta and type(first) is not int:
        return None
    session, seq = meta["session"], meta["seq"]
    if (type(meta["table"]) is not str or type(session) is not str or not 16 <= len(session) <= 64
            or type(seq) is not int or not 1 <= seq <= MAX_STEP or meta["nonce"] != shard.nonce):
        return None
    value = meta["lazy"] if op == Op.PULL else meta["step"]
    if type(value) is not (bool if op == Op.PULL else int) or (op == Op.PUSH and not 1 <= value <= MAX_STEP):
        return None
    arrays = _arrays(meta["arrays"], frames, op, _STEPS if first is not None else _KEYS)
    if arrays is None or len(head) + sum(a.nbytes for a in arrays) > limit:
        return None
    return Op(op), rid, meta["table"], session, seq, value, arrays, first


def _arrays(specs, frames, op: int, keys: dict) -> list | None:
    """A hot request's arrays, views of its frames, where ``specs`` (its meta's ``arrays``) name
    exactly what the op carries and the frames hold exactly their bytes; else None. PULL: keys
    (n,) of a dtype of ``keys`` (i4|i8, or u1|i2|i4 for the steps of delta-coded keys); PUSH:
    keys as a PULL's, gradients (n, D) f4, counts (n,) u1|i2|i4|i8."""
    if type(specs) is not list or len(specs) != len(frames) - 1:
        return None
    out = []
    for i, spec in enumerate(specs):
        if type(spec) is not list or len(spec) != 2 or type(spec[1]) is not list:
            return None
        code, shape = spec
        dtype = (keys if i == 0 else _COUNTS).get(code) if i != 1 else (np.dtype("<f4") if code == "f4" else None)
        if dtype is None or len(shape) != (2 if i == 1 else 1) or not all(type(s) is int and s >= 0 for s in shape):
            return None
        buf = frames[i + 1].buffer if hasattr(frames[i + 1], "buffer") else memoryview(frames[i + 1])
        size = shape[0] * (shape[1] if i == 1 else 1) * dtype.itemsize
        if buf.nbytes != size:
            return None
        out.append(np.frombuffer(buf, dtype=dtype).reshape(shape))
    return out


def encode_reply(op: Op, rid: int, meta: dict, arrays: list) -> list:
    """:func:`het.ps.protocol.messages.encode` of an unsigned reply, the same bytes, its meta
    written without json (natively where it can be: ``native.ops.hot_head``): ``meta`` holds
    at most ``applied``, and the arrays are the verbs' own (C-contiguous, of the wire's dtypes)."""
    head = "{" + "".join(f'"{k}":{int(v)},' for k, v in meta.items()) + '"arrays":['
    written = None if native.ops is None else native.ops.hot_head(op, rid, head, arrays)
    if written is None:
        text = f"{head}{specs_text(arrays)}]}}".encode()
        return [HEADER.pack(MAGIC, VERSION, op, 0, 0, rid, len(text)) + text, *arrays]
    return [written[0], *arrays]
