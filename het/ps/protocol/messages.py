"""The PS wire format: one small versioned header frame, then one raw frame per array.

Frame 0 is a fixed 20-byte header followed by a JSON object (``meta``)::

    magic b"HETP" | version u8 | op u8 | status u8 | flags u8 | request_id u64 | meta_len u32

``meta["arrays"]`` lists ``[dtype, shape]`` for each following frame; array frames are the raw
little-endian bytes of C-contiguous int64, int32, int16, float32 or uint8 arrays, sent and received without
copies (an array of the other byte order, or not contiguous, is copied into that form first).

Signed messages (``flags & SIGNED``): one more frame ends the message, a 32-byte HMAC-SHA256,
under the shared secret, of the header frame and every array frame, each preceded by its
length (:func:`het.ps.protocol.auth.mac`). ``encode(msg, secret)`` signs; ``decode(frames, secret)``
raises :class:`AuthError` when the message is not signed or the MAC does not match. An unsigned
message is the same message without the MAC frame and the flag. A shard with a secret
serves only signed requests and signs its replies; it answers a request it could not
authenticate with an unsigned error reply (the sender may not hold the secret).

Each op's fields and arrays, request and reply, are declared once, in
:mod:`het.ps.protocol.schema` (``describe(op)`` prints them); a shard refuses a field its op does
not declare. What they mean (``n`` keys, rows of width ``D``):

- PULL: rows (n, D) and clocks of ``keys``; with ``lazy``, of the touched rows only.
- PUSH: ``grads`` (n, D) and ``counts`` of ``keys`` at ``step``, applied; ``applied`` rows.
- SYNC: of ``keys`` with the client's ``clocks``, the ``index`` of those to refresh, their rows and clocks.
- PUSH_SYNC: a PUSH and then a SYNC in one message, SYNC's reply.
- SAVE / LOAD: a shard's save at ``path`` in its state directory; STATS, INFO: its figures, its config.
- CHANGED: a page of the rows of ``table`` changed since the last such request (``more``: another page).

A SYNC answers only the keys whose server clock ``c_g`` exceeds the sent clock ``c_s`` by
more than ``bound`` (``None`` = infinite), and every key sent with clock ``-1`` (a miss).
An Adagrad table's cache follows its optimizer (``CacheConfig.local_update``): a sync with
``state`` gets each row's accumulator beside it (its mean over the row, or all of it), and a
push with ``sq`` carries each row's sum of the squared gradients of the steps it sums, from
which Adagrad takes those steps' worth (:func:`het.adagrad.adagrad_factor`) instead of one
step of their sum. Both are optional: a message without them is as before. A push's ``sq``
holds only its rows of several steps (``counts > 1``, in order): Adagrad takes a row of one
step by its gradient's square, which the shard has (a shard also takes ``sq`` for every row).
Gradients travel as float32, or with ``grads: "bf16"`` in the meta as bfloat16 (the upper 16 bits
of each float32, rounded to nearest even; sent as int16 bits): half the bytes of a push, about
three significant digits per value. The rows of a table stored in half precision
(``TableConfig.row_dtype`` fp16 or bf16) travel in PULL and SYNC replies as their 16 bits (int16),
which the client widens to float32 exactly; CHANGED replies carry float32.

A table whose rows decay (``OptimizerConfig.l2`` outside FTRL: :mod:`het.decay`) answers a
PULL or SYNC with every row as float32 (half rows widened), brought to step ``as_of`` (an int >= 0;
default: the last step a push named), never lazily: a row no push touched has decayed too.

With ``lazy: true`` in a request's meta, a row no push ever touched is not sent: it still holds
its initial value, a pure function of the table's seed and the key
(:func:`het.ps.protocol.initial.initial_rows`), which the client builds itself, with its clock (0) and
its optimizer state (the initial one: :func:`het.ps.protocol.initial.initial_state`). The reply then
carries the rows, clocks and state of the touched rows only (``k`` of them, in order) and one
more array, ``built``: a bit a row (``np.packbits(..., bitorder="little")``), 1 where the row
was left for the client to build. Untouched rows are most first uses of a key, which every
cache and every mode must otherwise pull.
A row is marked ``touched`` by its first push of any count (mode ps installs its dense values
with pushes of count 0); the marks are saved with the shard, and a save without them loads as
all touched.

Keys are int64 in het, and travel as int32 when every key of the request fits (a fixed table
below 2^31 rows; :func:`het.ps.client.requests.keys_to_send`); a shard takes either and widens them.
Ascending keys (a step's unique keys, which come sorted) travel as the steps between them
instead, where that takes fewer bytes (:mod:`het.ps.protocol.integers`): ``meta["deltas"]`` maps
the array's position (as text) to its first key, and the array holds 0 and then each key's
step from the one before, in u1, i2 or i4; the shard adds them up again and refuses steps that
do not step up. ``int`` above is any of u1, i2, i4 and i8: clocks, counts and a SYNC's reply
index travel in the narrowest that holds every value of the array, and a shard widens them
back. A sync of a 10% cache's keys then costs about 4 bytes a key sent (a step of one or two
bytes and a clock of two while the clocks stay below 32,768), not 8, and a pushed row 5 bytes
besides its gradient (an int32 key, a count of one; a cache's pushes come in slot order, and
sorting them would copy every gradient to save 2 of a row's 517 bytes), not 12. bfloat16
gradients are opt-in (``het train --push-dtype bf16``).

Every request but INFO also names in its meta the shard's ``nonce``, the client's ``session``
and a ``seq`` (:class:`het.ps.client.client.PSClient` adds them): how a shard refuses stale and
replayed requests and applies a re-sent push once (see :mod:`het.ps.protocol.auth`).

A message of another version raises :class:`VersionError`, naming both versions; a shard answers
it, like any request it cannot decode, with an error reply and keeps serving.
An error reply has ``status = 1`` and ``meta = {"error": message, "kind": exception name}``.
"""

from __future__ import annotations

import enum
import hmac
import json
import math
import struct
from dataclasses import dataclass, field

import numpy as np

from het.choices import PUSH_DTYPES
from het.ps.protocol import auth

MAGIC = b"HETP"
VERSION = 1
HEADER = struct.Struct("<4sBBBBQI")  # magic, version, op, status, flags, request id, meta length
WIRE_DTYPES = {"i8": np.dtype("<i8"), "i4": np.dtype("<i4"), "i2": np.dtype("<i2"), "f4": np.dtype("<f4"),
               "u1": np.dtype("u1")}  # an array's code in the meta -> its dtype
DTYPE_CODES = {v: k for k, v in WIRE_DTYPES.items()}  # an array's dtype -> its code in the meta


_JSON = json.JSONEncoder(separators=(",", ":"))  # made once: json.dumps with separators makes one a call

MAX_ARRAYS = 16
MAX_FRAMES = MAX_ARRAYS + 2  # a message's frames at most: the header, its arrays, the MAC
SIGNED = 0x01  # header flag: the last frame is the MAC


class Op(enum.IntEnum):
    PULL = 1
    PUSH = 2
    SYNC = 3
    PUSH_SYNC = 4
    SAVE = 5
    LOAD = 6
    STATS = 7
    INFO = 8
    STOP = 9
    CHANGED = 10


OK, ERROR = 0, 1
_OPS = {o.value: o for o in Op}  # a dict lookup: Op(value) costs a microsecond


class ProtocolError(ValueError):
    """A message that does not follow the wire format."""


class VersionError(ProtocolError):
    """A message of another protocol version."""


class AuthError(ProtocolError):
    """A message that is not signed with the shared secret this side holds."""


class MessageTooLarge(ProtocolError):
    """A message past the limits of one (:data:`MAX_FRAMES`, a shard's ``max_message_bytes``),
    refused unread. ``peer`` and ``first`` (its first frame, for the request id): who sent it,
    where a transport refuses it before a shard sees it."""

    def __init__(self, text: str, peer=None, first=b""):
        super().__init__(text)
        self.peer, self.first = peer, first


class StaleError(ProtocolError):
    """A request for an earlier run of a shard (it names another nonce): refused unread."""


class PSError(RuntimeError):
    """An error reply from a PS shard: the shard refused the request and kept serving."""


@dataclass
class Message:
    """One request or reply: an op, a JSON-able ``meta`` dict and a list of arrays."""

    op: Op
    request_id: int = 0
    meta: dict = field(default_factory=dict)
    arrays: list = field(default_factory=list)
    status: int = OK


def encode(msg: Message, secret: bytes | None = None) -> list:
    """Message -> frames (bytes header, then the arrays' own buffers: no copies), and the MAC
    frame when a shared ``secret`` is given.

    Example:
        >>> frames = encode(Message(Op.PULL, 7, {"table": "t"}, [np.arange(3)]))
        >>> m = decode(frames)
        >>> m.op.name, m.request_id, m.arrays[0].tolist()
        ('PULL', 7, [0, 1, 2])
        >>> signed = encode(Message(Op.PULL, 7, {"table": "t"}, [np.arange(3)]), secret=b"k")
        >>> len(signed), decode(signed, secret=b"k").arrays[0].tolist()
        (3, [0, 1, 2])
    """
    # the wire is little-endian: an array of the other order travels as a copy with its bytes swapped
    arrays = [np.ascontiguousarray(a if a.dtype == a.dtype.newbyteorder("<") else a.astype(a.dtype.newbyteorder("<")))
              for a in map(np.asarray, msg.arrays)]
    specs = []
    for a in arrays:
        code = DTYPE_CODES.get(a.dtype)
        if code is None:
            raise ProtocolError(f"arrays must be int64, int32, int16, float32 or uint8, got {a.dtype}")
        specs.append([code, list(a.shape)])
    meta = dict(msg.meta, arrays=specs)
    meta_bytes = _JSON.encode(meta).encode()
    flags = 0 if secret is None else SIGNED
    header = HEADER.pack(MAGIC, VERSION, int(msg.op), msg.status, flags, msg.request_id, len(meta_bytes))
    frames = [header + meta_bytes, *arrays]
    if secret is not None:
        frames.append(auth.mac(secret, frames))
    return frames


def specs_text(arrays) -> str:
    """The meta's ``arrays`` field of ``arrays`` (numpy, C-contiguous, of the wire's dtypes) as
    :func:`encode` writes it, without its brackets: how the short paths (:mod:`het.ps.server.hot`,
    :mod:`het.ps.client.hot`) write their messages' meta as text.

    Example:
        >>> specs_text([np.zeros((2, 3), np.float32), np.zeros(4, np.uint8)])
        '["f4",[2,3]],["u1",[4]]'
    """
    return ",".join(f'["{DTYPE_CODES[a.dtype]}",[{",".join(map(str, a.shape))}]]' for a in arrays)


def check_size(frames, max_bytes: int | None) -> None:
    """MessageTooLarge unless ``frames`` are at most :data:`MAX_FRAMES` frames of at most
    ``max_bytes`` bytes together (None: any number), checked before any is read.

    Example:
        >>> check_size([b"x"] * 40, None)
        Traceback (most recent call last):
        ...
        het.ps.protocol.messages.MessageTooLarge: a message of 40 frames and 40 bytes: a request holds at most 18 frames; refused unread
    """
    n, size = len(frames), frame_bytes(frames)
    if n > MAX_FRAMES or (max_bytes is not None and size > max_bytes):
        raise MessageTooLarge(too_large(n, size, max_bytes))


def too_large(frames: int, size: int, max_bytes: int | None) -> str:
    """The refusal of a message of ``frames`` frames and ``size`` bytes, in words."""
    limit = "" if max_bytes is None else f" and {max_bytes} bytes"
    return f"a message of {frames} frames and {size} bytes: a request holds at most {MAX_FRAMES} frames{limit}; refused unread"


def frame_bytes(frames) -> int:
    """The bytes of a message's frames (ZeroMQ frames or buffers): what it took on the wire."""
    try:
        return sum([memoryview(f).nbytes for f in frames])  # every frame a buffer: one call each
    except TypeError:
        return sum(f.nbytes if hasattr(f, "nbytes") else memoryview(_buffer(f)).nbytes for f in frames)


def pack_marks(marks: list) -> list:
    """A lazy reply's ``built`` marks (uint8, one a row) as they travel: a bit a row, the first
    row's in the lowest bit of the first byte (``np.packbits(..., bitorder="little")``)."""
    return [np.packbits(b, bitorder="little") for b in marks]


def array_bytes(arrays) -> int:
    """The bytes of a message's arrays: its payload, without header, meta or MAC."""
    return sum(a.nbytes for a in arrays)


def peek_request_id(frame0) -> int:
    """The request id of a header frame, or 0 when it is too short to hold one."""
    buf = memoryview(_buffer(frame0))
    if len(buf) < HEADER.size:
        return 0
    return HEADER.unpack_from(buf)[5]


def decode(frames, secret: bytes | None = None, *, what: str = "request") -> Message:
    """Frames -> Message. Raises ProtocolError (VersionError) on anything malformed, and
    AuthError when ``secret`` is given and the frames are not signed with it. Without a
    secret, a MAC frame is dropped unchecked. ``what`` ("request" or "reply") names the
    message in errors.

    Array frames may be bytes, memoryviews or zmq Frames; the arrays are views on them.

    Example:
        >>> frames = encode(Message(Op.INFO, 1), secret=b"right")
        >>> decode(frames, secret=b"wrong")
        Traceback (most recent call last):
        ...
        het.ps.protocol.messages.AuthError: bad signature: wrong shared secret?
    """
    if not frames:
        raise ProtocolError("empty message: expected a header frame")
    head = memoryview(_buffer(frames[0]))
    if len(head) < HEADER.size:
        raise ProtocolError(f"header frame of {len(head)} bytes: expected at least {HEADER.size}")
    magic, version, op, status, flags, request_id, meta_len = HEADER.unpack_from(head)
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {bytes(magic)!r}: expected {MAGIC!r}")
    if version != VERSION:
        raise VersionError(f"protocol version {version}: this side speaks version {VERSION}")
    if flags & ~SIGNED:
        raise ProtocolError(f"unknown header flags {flags:#04x}: expected 0 or {SIGNED:#04x} (signed)")
    if flags or secret is not None:
        frames = _authenticate(frames, bool(flags & SIGNED), secret, what)  # before reading anything else
    if op not in _OPS:
        raise ProtocolError(f"unknown op {op}: expected one of {[o.value for o in Op]}")
    op = _OPS[op]
    if len(head) != HEADER.size + meta_len:
        raise ProtocolError(f"header says {meta_len} meta bytes, frame holds {len(head) - HEADER.size}")
    try:
        meta = json.loads(bytes(head[HEADER.size:]))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ProtocolError(f"meta is not JSON: {e}") from None
    if not isinstance(meta, dict):
        raise ProtocolError(f"meta must be a JSON object, got {type(meta).__name__}")
    specs = meta.pop("arrays", [])
    if not isinstance(specs, list) or len(specs) != len(frames) - 1 or len(specs) > MAX_ARRAYS:
        raise ProtocolError(f"meta describes {specs!r} arrays, message carries {len(frames) - 1}")
    arrays = [_array(spec, frame, i) for i, (spec, frame) in enumerate(zip(specs, frames[1:]))]
    return Message(op, request_id, meta, arrays, status)


def _authenticate(frames, signed: bool, secret: bytes | None, what: str) -> list:
    """The frames without their MAC frame; AuthError if ``secret`` is set and they are not
    signed with it. Freshness (replays) is the shard's to check: see :class:`het.ps.protocol.checks.Freshness`."""
    if signed:
        if len(frames) < 2:
            raise ProtocolError("header says signed, but the message has no MAC frame")
        frames, tag = frames[:-1], _buffer(frames[-1])
    if secret is None:
        return frames
    if not signed:
        side = "shard" if what == "request" else "client"
        raise AuthError(f"{what} is not signed: this {side} requires a shared secret")
    if not hmac.compare_digest(auth.mac(secret, [_buffer(f) for f in frames]), tag):
        raise AuthError("bad signature: wrong shared secret?")
    return frames


def error_reply(request_id: int, op: int, err: Exception) -> Message:
    op = Op(op) if op in Op._value2member_map_ else Op.INFO
    return Message(op, request_id, {"error": str(err), "kind": type(err).__name__}, [], ERROR)


def _buffer(frame):
    return frame.buffer if hasattr(frame, "buffer") else frame


def _array(spec, frame, i: int) -> np.ndarray:
    dtype = WIRE_DTYPES.get(spec[0]) if type(spec) is list and len(spec) == 2 and type(spec[0]) is str else None
    shape = spec[1] if dtype is not None else None
    if type(shape) is not list or any(type(s) is not int for s in shape):  # exactly int: not bool
        raise ProtocolError(f"array {i}: spec {spec!r} is not [\"i8\"|\"i4\"|\"i2\"|\"f4\"|\"u1\", "
                            f"[integer, ...]]")
    shape = tuple(shape)
    if any(s < 0 for s in shape):
        raise ProtocolError(f"array {i}: negative shape {shape}")
    code = spec[0]
    buf = _buffer(frame)
    expected = math.prod(shape) * dtype.itemsize
    if memoryview(buf).nbytes != expected:
        raise ProtocolError(f"array {i}: {memoryview(buf).nbytes} bytes, shape {shape} of {code} needs {expected}")
    return np.frombuffer(buf, dtype=dtype).reshape(shape)
