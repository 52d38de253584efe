"""The PS wire format: one small versioned header frame, then one raw frame per array.

Frame 0 is a fixed 20-byte header followed by a JSON object (``meta``)::

    magic b"HETP" | version u8 | op u8 | status u8 | flags u8 | request_id u64 | meta_len u32

``meta["arrays"]`` lists ``[dtype, shape]`` for each following frame; array frames are the raw
little-endian bytes of C-contiguous int64, int32, int16, float32 or uint8 arrays, sent and received without
copies.

Signed messages (``flags & SIGNED``): one more frame ends the message, a 32-byte HMAC-SHA256,
under the shared secret, of the header frame and every array frame, each preceded by its
length (:func:`het.ps.wire.auth.mac`). ``encode(msg, secret)`` signs; ``decode(frames, secret)``
raises :class:`AuthError` when the message is not signed or the MAC does not match. Unsigned
messages are byte for byte those of before, so the version stays 1. A shard with a secret
serves only signed requests and signs its replies; it answers a request it could not
authenticate with an unsigned error reply (the sender may not hold the secret).

Requests and their arrays (``n`` keys, rows of width ``D``):

=========  ==================================================  =================================
op         request arrays (meta)                               reply arrays (meta)
=========  ==================================================  =================================
PULL       keys (n,) i4|i8|steps (table, lazy, [deltas])       rows (n, D) f4, clocks (n,) int
                                                               [lazy: rows (k, D), clocks (k,),
                                                               built (ceil(n/8),) u1 bits]
PUSH       keys (n,) i4|i8|steps, grads (n, D), counts (n,)    -- (applied)
           int (table, step, grads: "f32" | "bf16", [deltas])
           [sq: true: then sq (j, 1)|(j, D) f4, the j rows
           of counts > 1 (or all n)]
SYNC       keys (n,) i4|i8|steps, clocks (n,) int (table,      index (m,) int, rows (m, D), clocks (m,) int
           bound, lazy, [state: "row" | "full"])               [state: then state (m, 1)|(m, D) f4]
                                                               [lazy: rows, clocks, state of k rows,
                                                               then built (ceil(m/8),) u1 bits]
PUSH_SYNC  PUSH's three (four) arrays, then SYNC's two          SYNC's reply
SAVE/LOAD  -- (path)                                           -- (path)
STATS      --                                                  -- (stats)
INFO       --                                                  -- (shard)
STOP       --                                                  --
=========  ==================================================  =================================

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
three significant digits per value.

With ``lazy: true`` in a request's meta, a row no push ever touched is not sent: it still holds
its initial value, a pure function of the table's seed and the key
(:func:`het.ps.initial.initial_rows`), which the client builds itself, with its clock (0) and
its optimizer state (the initial one: :func:`het.ps.initial.initial_state`). The reply then
carries the rows, clocks and state of the touched rows only (``k`` of them, in order) and one
more array, ``built``: a bit a row (``np.packbits(..., bitorder="little")``), 1 where the row
was left for the client to build. Untouched rows are most first uses of a key, which every
cache and every mode must otherwise pull.
A row is marked ``touched`` by its first push of any count (mode ps installs its dense values
with pushes of count 0); the marks are saved with the shard, and a save without them loads as
all touched.

Keys are int64 in het, and travel as int32 when every key of the request fits (a fixed table
below 2^31 rows; :func:`het.ps.wire.requests.wire_keys`); a shard takes either and widens them.
Ascending keys (a step's unique keys, which come sorted) travel as the steps between them
instead, where that takes fewer bytes (:func:`delta_keys`): ``meta["deltas"]`` maps the
array's position (as text) to its first key, and the array holds 0 and then each key's step
from the one before, in u1, i2 or i4; the shard adds them up again (:func:`undelta_keys`) and
refuses steps that do not step up. ``int`` above is any of u1, i2, i4 and i8: clocks, counts
and a SYNC's reply index travel in the narrowest that holds every value of the array
(:func:`narrow`), and a shard widens them back (:func:`widen`). A sync of a 10% cache's keys
then costs about 4 bytes a key sent (a step of one or two bytes and a clock of two while the
clocks stay below 32,768), not 8, and a pushed row 5 bytes besides its gradient (an int32
key, a count of one; a cache's pushes come in slot order, and sorting them would copy every
gradient to save 2 of a row's 517 bytes), not 12. bfloat16 gradients are opt-in (``het train --push-dtype bf16``).

Every request but INFO also names in its meta the shard's ``nonce``, the client's ``session``
and a ``seq`` (:class:`het.ps.client.PSClient` adds them): how a shard refuses stale and
replayed requests and applies a re-sent push once (see :mod:`het.ps.wire.auth`).

A message of another version raises :class:`VersionError`, naming both versions; a shard answers
it, like any request it cannot decode, with an error reply and keeps serving.
An error reply has ``status = 1`` and ``meta = {"error": message, "kind": exception name}``.
"""

from __future__ import annotations

import enum
import functools
import hmac
import json
import math
import struct
from dataclasses import dataclass, field

import numpy as np

from het.ps.wire import auth

MAGIC = b"HETP"
VERSION = 1
_HEADER = struct.Struct("<4sBBBBQI")
_DTYPES = {"i8": np.dtype("<i8"), "i4": np.dtype("<i4"), "i2": np.dtype("<i2"), "f4": np.dtype("<f4"),
           "u1": np.dtype("u1")}
_DTYPE_CODES = {v: k for k, v in _DTYPES.items()}
_INT32_MAX = (1 << 31) - 1
# How pushed gradients travel, and their bytes per value: "f32", or "bf16" (the upper 16 bits
# of each float32, rounded to nearest even; int16 on the wire). The one list of push dtypes.
GRAD_BYTES = {"f32": 4, "bf16": 2}
PUSH_DTYPES = tuple(GRAD_BYTES)


# Integer arrays travel in the narrowest of these that holds every value (:func:`narrow`)
_NARROW = ((0, (1 << 8) - 1, "u1"), (-(1 << 15), (1 << 15) - 1, "i2"), (-(1 << 31), _INT32_MAX, "i4"))


def narrow(values):
    """Integers (a torch tensor or numpy array) as the narrowest of uint8, int16 and int32 that
    holds every one of them, else as int64: how clocks, counts and a sync reply's index
    travel. A hot row's clock passes 32,767 only after that many updates, and a push's count
    is the steps its gradient sums, so most of these take one or two bytes, not eight.

    Example:
        >>> [narrow(np.array(v)).dtype.name for v in ([0, 5], [-1, 5], [-1, 1 << 20], [1 << 40])]
        ['uint8', 'int16', 'int32', 'int64']
    """
    if isinstance(values, np.ndarray):
        lo, hi = (0, 0) if len(values) == 0 else (int(values.min()), int(values.max()))
        return values.astype(_DTYPES[_narrowest(lo, hi)], copy=False)
    lo, hi = (0, 0) if len(values) == 0 else map(int, values.aminmax())  # one pass, where numpy takes two
    return values.to(_torch_ints()[_narrowest(lo, hi)])


def _narrowest(lo: int, hi: int) -> str:
    """The code of the narrowest wire integer that holds ``lo .. hi``."""
    for a, b, code in _NARROW:
        if a <= lo and hi <= b:
            return code
    return "i8"


@functools.cache
def _torch_ints() -> dict:
    """The wire integers' codes -> torch dtypes (torch imported on first use: the protocol
    itself needs only numpy). A dict lookup: numpy's ``dtype.name`` costs microseconds a call."""
    import torch

    return {"u1": torch.uint8, "i2": torch.int16, "i4": torch.int32, "i8": torch.int64}


def widen(values: np.ndarray, what: str) -> np.ndarray:
    """A received integer array of any :data:`WIRE_INTS` type as int64; ValueError naming
    ``what`` for any other dtype.

    Example:
        >>> widen(np.array([3], dtype=np.uint8), "counts").dtype
        dtype('int64')
    """
    if values.dtype not in WIRE_INTS:
        raise ValueError(f"{what} must be integers ({', '.join(t.name for t in WIRE_INTS)}), got {values.dtype}")
    return values.astype(np.int64, copy=False)


WIRE_INTS = tuple(_DTYPES[c] for c in ("u1", "i2", "i4", "i8"))  # what integers travel as, and are widened from
_DELTA_INTS = WIRE_INTS[:3]  # the steps between ascending keys travel in at most 4 bytes


def delta_keys(keys: np.ndarray):
    """Strictly ascending keys (int32 or int64, as they would travel) as the steps between
    them, narrowed, and the first key: ``(steps (n,), first)`` with ``steps[0] = 0``, or None
    where that would not take fewer bytes (keys out of order, fewer than two, long steps). A
    step's unique keys come sorted, so a sync's keys mostly go as one or two bytes each.

    Example:
        >>> steps, first = delta_keys(np.array([1000, 1003, 1300], np.int32))
        >>> steps.tolist(), steps.dtype, first
        ([0, 3, 297], dtype('int16'), 1000)
        >>> delta_keys(np.array([5, 3], np.int32)) is None
        True
    """
    if len(keys) < 2 or not bool((keys[1:] > keys[:-1]).all()):  # compared as they are: no difference wraps
        return None
    steps = np.diff(keys.astype(np.int64, copy=False), prepend=keys[:1])
    if int(steps[1:].min()) < 1:  # a step past 2^63 wrapped: send the keys as they are
        return None
    steps = narrow(steps)
    return None if steps.itemsize >= keys.itemsize else (steps, int(keys[0]))


def undelta_keys(steps: np.ndarray, first, max_keys: int) -> np.ndarray:
    """The int64 keys that :func:`delta_keys` sent as ``steps`` from ``first``; ValueError when
    they are not such steps (integers of at most 4 bytes, 0 first, then each >= 1) or the
    keys would leave int64."""
    if steps.dtype not in _DELTA_INTS or steps.ndim != 1 or not 1 <= len(steps) <= min(max_keys, (1 << 32) - 1):
        raise ValueError(f"delta-coded keys travel as a 1-D array of 1 to {max_keys} integers of at most 4 bytes, "
                         f"got {steps.dtype} of shape {steps.shape}")
    if not isinstance(first, int) or isinstance(first, bool) or not -(1 << 63) <= first < (1 << 63):
        raise ValueError(f"the first of delta-coded keys must be an int64, got {first!r}")
    wide = steps.astype(np.int64)
    if wide[0] != 0 or (len(wide) > 1 and int(wide[1:].min()) < 1):
        raise ValueError("delta-coded keys must step up: 0 first, then steps of at least 1")
    if first + int(wide.sum()) >= (1 << 63):  # under 2^31 a step and 2^32 steps: the sum fits int64
        raise ValueError(f"delta-coded keys from {first} pass the largest int64")
    return np.cumsum(wide, out=wide) + np.int64(first)


MAX_ARRAYS = 16
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


OK, ERROR = 0, 1


class ProtocolError(ValueError):
    """A message that does not follow the wire format."""


class VersionError(ProtocolError):
    """A message of another protocol version."""


class AuthError(ProtocolError):
    """A message that is not signed with the shared secret this side holds."""


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
    arrays = [np.ascontiguousarray(a) for a in msg.arrays]
    specs = []
    for a in arrays:
        code = _DTYPE_CODES.get(a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype)
        if code is None:
            raise ProtocolError(f"arrays must be int64, int32, int16, float32 or uint8, got {a.dtype}")
        specs.append([code, list(a.shape)])
    meta = dict(msg.meta, arrays=specs)
    meta_bytes = json.dumps(meta, separators=(",", ":")).encode()
    flags = 0 if secret is None else SIGNED
    header = _HEADER.pack(MAGIC, VERSION, int(msg.op), msg.status, flags, msg.request_id, len(meta_bytes))
    frames = [header + meta_bytes, *arrays]
    if secret is not None:
        frames.append(auth.mac(secret, frames))
    return frames


def frame_bytes(frames) -> int:
    """The bytes of a message's frames (ZeroMQ frames or buffers): what it took on the wire."""
    return sum(memoryview(_buffer(f)).nbytes for f in frames)


def array_bytes(arrays) -> int:
    """The bytes of a message's arrays: its payload, without header, meta or MAC."""
    return sum(a.nbytes for a in arrays)


def peek_request_id(frame0) -> int:
    """The request id of a header frame, or 0 when it is too short to hold one."""
    buf = memoryview(_buffer(frame0))
    if len(buf) < _HEADER.size:
        return 0
    return _HEADER.unpack_from(buf)[5]


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
        het.ps.wire.protocol.AuthError: bad signature: wrong shared secret?
    """
    if not frames:
        raise ProtocolError("empty message: expected a header frame")
    head = memoryview(_buffer(frames[0]))
    if len(head) < _HEADER.size:
        raise ProtocolError(f"header frame of {len(head)} bytes: expected at least {_HEADER.size}")
    magic, version, op, status, flags, request_id, meta_len = _HEADER.unpack_from(head)
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {bytes(magic)!r}: expected {MAGIC!r}")
    if version != VERSION:
        raise VersionError(f"protocol version {version}: this side speaks version {VERSION}")
    if flags & ~SIGNED:
        raise ProtocolError(f"unknown header flags {flags:#04x}: expected 0 or {SIGNED:#04x} (signed)")
    frames = _authenticate(frames, bool(flags & SIGNED), secret, what)  # before reading anything else
    try:
        op = Op(op)
    except ValueError:
        raise ProtocolError(f"unknown op {op}: expected one of {[o.value for o in Op]}") from None
    if len(head) != _HEADER.size + meta_len:
        raise ProtocolError(f"header says {meta_len} meta bytes, frame holds {len(head) - _HEADER.size}")
    try:
        meta = json.loads(bytes(head[_HEADER.size:]))
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
    signed with it. Freshness (replays) is the shard's to check: see ``Shard._refusal``."""
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
    try:
        code, shape = spec
        dtype = _DTYPES[code]
        if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in shape):
            raise TypeError
        shape = tuple(shape)
    except (KeyError, TypeError, ValueError):
        raise ProtocolError(f"array {i}: spec {spec!r} is not [\"i8\"|\"i4\"|\"i2\"|\"f4\"|\"u1\", "
                            f"[integer, ...]]") from None
    if any(s < 0 for s in shape):
        raise ProtocolError(f"array {i}: negative shape {shape}")
    buf = _buffer(frame)
    expected = math.prod(shape) * dtype.itemsize
    if memoryview(buf).nbytes != expected:
        raise ProtocolError(f"array {i}: {memoryview(buf).nbytes} bytes, shape {shape} of {code} needs {expected}")
    return np.frombuffer(buf, dtype=dtype).reshape(shape)
