"""Each PS message declared once: its meta's fields and its arrays, of the request and the reply.

What reads a message comes from here: the shard refuses a request field its op does not
declare (:func:`het.ps.protocol.checks.every_field`), counts its arrays by it
(:func:`check_arrays`) and finds its keys by it (:func:`key_positions`); the short paths write
and read their two requests' fields in :data:`HOT`'s order (:mod:`het.ps.client.hot`,
:mod:`het.ps.server.hot`, and the native reader through ``het/native/wire.h``, which
:func:`native_header` writes: ``python -m het.ps.protocol.schema``, run by make before the
native build). tests/unit/test_schema.py holds every side to it: the messages the client sends
and the shard answers, the fields the shard reads, the header the native core was built from.
What each field means: :mod:`het.ps.protocol.messages`.

An array is declared by the dtype codes it may travel as (:data:`het.ps.protocol.messages.DTYPE_CODES`)
and its rank; an array ``when`` a meta flag is true travels only then (a reply's, when the request
had it, and then may be left out: a lazy reply of no row to build).

Example:
    >>> [a.name for a in arrays_of(Op.PUSH_SYNC, {"sq": True})]
    ['keys', 'grads', 'counts', 'sq', 'sync_keys', 'clocks']
    >>> key_positions(Op.PUSH_SYNC, {})
    (0, 3)
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

from het.files import write_file
from het.ps.protocol.messages import DTYPE_CODES, HEADER, MAGIC, VERSION, Op

INTS = ("u1", "i2", "i4", "i8")  # clocks, counts, an index: the narrowest that holds every value
KEYS = ("i4", "i8")  # keys as they are
STEPS = ("u1", "i2", "i4")  # keys as the steps between them (``meta["deltas"]``)
ROWS = ("f4", "i2")  # float32, or a half-precision table's 16 bits
GRADS = ("f4", "i2")  # float32, or bfloat16's bits (``meta["grads"] == "bf16"``)


@dataclass(frozen=True)
class Array:
    """One array of a message: its name, the dtype codes it travels as, its rank, and the meta
    flag that brings it (None: every message of its op carries it)."""

    name: str
    codes: tuple[str, ...]
    dims: int
    when: str | None = None

    @property
    def keys(self) -> bool:
        """Whether it holds keys, which may travel as the steps between them."""
        return self.codes == KEYS


@dataclass(frozen=True)
class Schema:
    """One op: its request's meta fields and arrays, its reply's."""

    fields: tuple[str, ...]
    arrays: tuple[Array, ...]
    reply_fields: tuple[str, ...] = ()
    reply_arrays: tuple[Array, ...] = ()


FRESH = ("nonce", "session", "seq")  # every request but INFO (het.ps.client.connection.Connection.fresh)
PARTS = ("part", "parts")  # a push in parts (het.ps.server.parts)
READ = ("table", "lazy", "as_of", "deltas")
PUSHED = ("table", "step", "grads", "sq", "deltas", *PARTS)
SYNCED = ("bound", "state")

_KEYS = Array("keys", KEYS, 1)
_PUSH = (_KEYS, Array("grads", GRADS, 2), Array("counts", INTS, 1), Array("sq", ("f4",), 2, when="sq"))
_SYNC = (Array("sync_keys", KEYS, 1), Array("clocks", INTS, 1))
_READ_REPLY = (Array("rows", ROWS, 2), Array("clocks", INTS, 1))
_BUILT = Array("built", ("u1",), 1, when="lazy")
_SYNC_REPLY = (Array("index", INTS, 1), *_READ_REPLY, Array("state", ("f4",), 2, when="state"), _BUILT)

SCHEMAS: dict[Op, Schema] = {
    Op.PULL: Schema((*READ, *FRESH), (_KEYS,), (), (*_READ_REPLY, _BUILT)),
    Op.PUSH: Schema((*PUSHED, *FRESH), _PUSH, ("applied", "again", "staged")),
    Op.SYNC: Schema((*READ, *SYNCED, *FRESH), (Array("keys", KEYS, 1), _SYNC[1]), (), _SYNC_REPLY),
    Op.PUSH_SYNC: Schema((*PUSHED, "lazy", "as_of", *SYNCED, *FRESH), (*_PUSH, *_SYNC), ("staged",), _SYNC_REPLY),
    Op.SAVE: Schema(("path", "drop", "rows_only", *FRESH), (), ("path",)),
    Op.LOAD: Schema(("path", *FRESH), (), ("path",)),
    Op.STATS: Schema(("report", *FRESH), (), ("stats",)),
    Op.INFO: Schema((), (), ("shard",)),
    Op.STOP: Schema(FRESH, ()),
    Op.CHANGED: Schema(("table", "limit", *FRESH), (), ("more", "started"),
                       (Array("keys", ("i8",), 1, when="rows"), Array("rows", ("f4",), 2, when="rows"),
                        Array("clocks", INTS, 1, when="rows"))),
}
WIRE_H = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "native", "wire.h")
ERROR_FIELDS = ("error", "kind")  # an error reply's, of any op
FIELDS = frozenset(f for s in SCHEMAS.values() for f in s.fields)  # every request field of any op

# The two hot requests' fields in the order het's client writes them; "deltas" only where the
# keys travel as steps. The short paths read this text exactly (the shard's general path, any).
HOT: dict[Op, tuple[str, ...]] = {
    Op.PULL: ("lazy", "table", "session", "seq", "deltas", "nonce"),
    Op.PUSH: ("step", "table", "session", "seq", "deltas", "nonce"),
}


def describe(op: Op) -> str:
    """``op``'s request and reply in one line each: fields, then arrays as ``name code|code/rank``
    (``?flag``: only with that flag).

    Example:
        >>> print(describe(Op.PUSH))
        PUSH       table step grads sq deltas part parts nonce session seq | keys i4|i8/1 grads f4|i2/2 counts u1|i2|i4|i8/1 sq f4/2?sq
          reply    applied again staged |
    """
    s = SCHEMAS[op]

    def arrays(listed) -> str:
        return " ".join(f"{a.name} {'|'.join(a.codes)}/{a.dims}{'' if a.when is None else '?' + a.when}" for a in listed)

    return (f"{op.name:<10} {' '.join(s.fields)} | {arrays(s.arrays)}".rstrip() + "\n"
            + f"  reply    {' '.join(s.reply_fields)} | {arrays(s.reply_arrays)}".rstrip())


def arrays_of(op: Op, meta: dict, reply: bool = False) -> tuple[Array, ...]:
    """The arrays a request of ``op`` with ``meta`` carries (its reply's, with ``reply``, where
    ``meta`` is the request's), in order."""
    s = SCHEMAS[op]
    return tuple(a for a in (s.reply_arrays if reply else s.arrays) if a.when is None or meta.get(a.when))


def key_positions(op: Op, meta: dict) -> tuple[int, ...]:
    """Where a request's arrays of keys sit: the arrays that may travel delta-coded."""
    return tuple(i for i, a in enumerate(arrays_of(op, meta)) if a.keys)


def unknown_fields(op: Op, meta: dict, reply: bool = False) -> list[str]:
    """The fields of ``meta`` (a request's, or with ``reply`` a reply's) that ``op`` does not declare."""
    s = SCHEMAS[op]
    declared = (*s.reply_fields, *ERROR_FIELDS) if reply else s.fields
    return sorted(k for k in meta if k not in declared and k != "arrays")


def check_arrays(op: Op, meta: dict, got: list) -> None:
    """ValueError unless ``got`` holds as many arrays as ``op`` declares for ``meta`` (each one's
    dtype and shape :mod:`het.ps.protocol.checks` then checks, naming what it expected)."""
    want = arrays_of(op, meta)
    if len(got) != len(want):
        raise ValueError(f"{op.name} takes {len(want)} arrays ({', '.join(a.name for a in want) or 'none'}), "
                         f"got {len(got)}")


def request_drift(msg) -> list[str]:
    """What of a request ``msg`` its op's schema does not declare, in words (none: it follows
    it): fields, and arrays past those declared or of another dtype or rank."""
    coded = {int(k) for k in msg.meta.get("deltas", {})}
    out = [f"{msg.op.name} request field {k!r} is not declared" for k in unknown_fields(msg.op, msg.meta)]
    want = arrays_of(msg.op, msg.meta)
    if len(msg.arrays) != len(want):
        out.append(f"{msg.op.name} request has {len(msg.arrays)} arrays: declared {[a.name for a in want]}")
    return out + _array_drift(msg.op, "request", want, msg.arrays, coded)


def reply_drift(op: Op, request_meta: dict, msg) -> list[str]:
    """What of a reply ``msg`` to a request of ``op`` with ``request_meta`` its schema does not
    declare, in words: fields, arrays past those declared or of another dtype or rank. An array
    ``when`` a flag the request set may be left out; one it did not ask for may not be there."""
    out = [f"{op.name} reply field {k!r} is not declared" for k in unknown_fields(op, msg.meta, reply=True)]
    if "error" in msg.meta:
        return out
    if op is Op.CHANGED:  # a page of rows, or none
        request_meta = {"rows": bool(msg.arrays)}
    want = arrays_of(op, request_meta, reply=True)
    need = sum(a.when is None for a in want) if op is not Op.CHANGED else len(want)
    if not need <= len(msg.arrays) <= len(want):
        out.append(f"{op.name} reply has {len(msg.arrays)} arrays: declared {[a.name for a in want]}")
    return out + _array_drift(op, "reply", want, msg.arrays, ())


def _array_drift(op: Op, side: str, want, got, coded) -> list[str]:
    out = []
    for i, (a, g) in enumerate(zip(want, got)):
        codes = STEPS if i in coded else a.codes
        if DTYPE_CODES.get(g.dtype) not in codes or g.ndim != a.dims:
            out.append(f"{op.name} {side}'s {a.name} is {g.dtype} of shape {g.shape}: declared {a.dims}-D "
                       f"{'|'.join(codes)}")
    return out


def native_header() -> str:
    """``het/native/wire.h``: what the native short paths read and write of a message, from
    this schema (the header frame's layout, the ops, the hot requests' fields in order, each
    array's codes). The module is built from it: its source hash covers it (:mod:`het.native`)."""
    lines = [
        "// What the native short paths know of a PS message (het/native/hot.cpp): written by",
        "// het/ps/protocol/schema.py, its one declaration (`python -m het.ps.protocol.schema`). Do not edit.",
        "#pragma once", "", "#include <cstddef>", "#include <cstdint>", "#include <string_view>", "",
        "namespace wire {", "",
        f"constexpr size_t kHeader = {HEADER.size};  // {HEADER.format}: magic, version, op, status, flags, id, meta length",
        f'constexpr std::string_view kMagic = "{MAGIC.decode()}";',
        f"constexpr int kVersion = {VERSION};",
        f"constexpr int kPull = {int(Op.PULL)};",
        f"constexpr int kPush = {int(Op.PUSH)};", "",
        "struct Code {", "  std::string_view code;", "  int bytes;", "};", "",
    ]
    sizes = {"u1": 1, "i2": 2, "i4": 4, "i8": 8, "f4": 4}
    for name, codes in (("Ints", INTS), ("Keys", KEYS), ("Steps", STEPS), ("Floats", ("f4",))):
        listed = ", ".join(f'{{"{c}", {sizes[c]}}}' for c in codes)
        lines.append(f"constexpr Code k{name}[] = {{{listed}}};")
    lines.append("")
    for op, fields in HOT.items():
        listed = ", ".join(f'"{f}"' for f in fields)
        lines.append(f"constexpr std::string_view k{op.name.title()}Fields[] = {{{listed}}};  // {op.name}'s, in order")
    reply = SCHEMAS[Op.PUSH].reply_fields[0]
    lines += [f'constexpr std::string_view kApplied = "{reply}";  // a PUSH reply\'s field', ""]
    return "\n".join(lines) + "\n}  // namespace wire\n"


def write_native_header(path: str = WIRE_H) -> bool:
    """Write :func:`native_header` to ``path`` where it differs; whether it did."""
    text = native_header().encode()
    with contextlib.suppress(FileNotFoundError), open(path, "rb") as f:
        if f.read() == text:
            return False
    write_file(path, lambda f: f.write(text))
    return True


if __name__ == "__main__":  # make runs it before the native build: ``python -m het.ps.protocol.schema``
    if write_native_header():
        print(f"het: wrote {os.path.relpath(WIRE_H)} from het/ps/protocol/schema.py")
