"""What a shard accepts in a request, its meta and its arrays, checked strictly before anything
changes.

Every field has one parser here: the type is exact (no bool for an int, no float for an
int, no text for a number) and the value in range, or a ValueError names the field, what it
expected and what arrived. The shard parses every field of a request and checks its arrays
first, and only then applies it, so a refused request changes nothing. (What a client checks
before a request leaves: :mod:`het.ps.client.requests`.)
"""

from __future__ import annotations

import math
import re
import secrets
import warnings

import numpy as np
import torch

from het.config import TableConfig
from het.ps.protocol import schema
from het.ps.protocol.integers import WIRE_INTS, undelta_keys
from het.ps.protocol.limits import MAX_CLOCK, MAX_COUNT, MAX_STEP, check_finite, check_squares
from het.ps.protocol.messages import PUSH_DTYPES, AuthError, Message, Op, ProtocolError, StaleError
from het.staleness import bound_from_wire

# A request's arrays are views of the frames ZeroMQ received (flagged read-only), made tensors
# here without a copy. The buffers are the request's own: nothing else reads them once it is
# handled (a push's gradients may be scaled in place there, after the log has its copy), so
# torch's warning that they are not writable says nothing in the shard.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning,
                        module=r"het\.ps\.")


class Freshness:
    """Which requests a shard reads: with a secret, a signed request must be fresh. It names
    this run's nonce (a capture from before a restart is stale), a session and a sequence number
    past its session's last."""

    def __init__(self, secret: bytes | None):
        self.secret = secret
        self.nonce = secrets.token_hex(16)  # random per run of the shard
        self.sessions: dict[str, int] = {}  # session -> the last sequence number served

    def refusal(self, msg: Message) -> ProtocolError | None:
        """Why a request is refused unread (None: it is not). A request naming another nonce
        was sent to an earlier run of this shard (or is a replay of one): StaleError, so its
        client re-sends what this run has not answered. With a secret, every request but INFO
        (it changes nothing, and tells the nonce) must name this run's nonce, a session and a
        sequence number past the session's last: else AuthError."""
        if msg.op is Op.INFO:
            return None
        nonce = msg.meta.get("nonce")
        if (nonce is not None or self.secret is not None) and nonce != self.nonce:
            return StaleError(f"request names nonce {nonce!r}, not this shard's: it was meant for an earlier run "
                              f"of this shard, or is a replay (INFO tells the nonce); refused, nothing changed")
        if self.secret is None:
            return None
        session, seq = msg.meta.get("session"), msg.meta.get("seq")
        if (not isinstance(session, str) or not 16 <= len(session) <= 64 or not isinstance(seq, int)
                or isinstance(seq, bool) or seq < 1):
            return AuthError(f"a signed request carries session (16-64 characters) and seq (an integer >= 1), "
                             f"got {session!r}, {seq!r}")
        last = self.sessions.get(session, 0)
        if seq <= last:
            return AuthError(f"replayed request: seq {seq} of its session, whose last was {last}; refused, "
                             f"nothing changed")
        self.sessions[session] = seq
        return None


def _int(meta: dict, name: str, default=None, lo: int = 0, hi: int = MAX_STEP) -> int:
    value = meta.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"meta[{name!r}] must be an integer in [{lo}, {hi}], got {value!r}")
    return value


def step(meta: dict) -> int:
    """A push's step number: an int >= 1 (default 1).

    Example:
        >>> step({"step": 3}), step({})
        (3, 1)
        >>> step({"step": 1.5})
        Traceback (most recent call last):
        ...
        ValueError: meta['step'] must be an integer in [1, 4611686018427387904], got 1.5
    """
    return _int(meta, "step", 1, lo=1)


def as_of(meta: dict) -> int | None:
    """The step a PULL or SYNC asks the rows of a table with a decay at (:mod:`het.decay`): an
    int >= 0, or None (not given: the last step a push named)."""
    return None if "as_of" not in meta else _int(meta, "as_of", lo=0)


def table(meta: dict) -> str:
    name = meta.get("table")
    if not isinstance(name, str):
        raise ValueError(f"meta['table'] must be a table's name, got {name!r}")
    return name


def _flag(meta: dict, name: str) -> bool:
    value = meta.get(name, False)
    if not isinstance(value, bool):
        raise ValueError(f"meta[{name!r}] must be true or false, got {value!r}")
    return value


def lazy(meta: dict) -> bool:
    """Whether a pull or sync leaves untouched rows for the client to build."""
    return _flag(meta, "lazy")


def rows_only(meta: dict) -> bool:
    """Whether a save leaves out its fixed tables' optimizer state (a publication's snapshot,
    which no shard loads)."""
    return _flag(meta, "rows_only")


STATES = ("row", "full")  # what a sync may ask of the rows' optimizer state


def state(meta: dict) -> str | None:
    """The optimizer state a sync asks for beside its rows: ``"row"`` (a float a row),
    ``"full"`` (a float a coordinate) or None."""
    value = meta.get("state")
    if value is not None and value not in STATES:
        raise ValueError(f"meta['state'] must be one of {STATES} or absent, got {value!r}")
    return value


def sq(meta: dict) -> bool:
    """Whether a push carries one more array: its rows' sums of squared gradients."""
    return _flag(meta, "sq")


def grads_as(meta: dict) -> str:
    grads = meta.get("grads", "fp32")
    if grads not in PUSH_DTYPES:
        raise ValueError(f"meta['grads'] must be one of {PUSH_DTYPES}, got {grads!r}")
    return grads


def limit(meta: dict, max_keys: int) -> int:
    """How many keys a CHANGED request takes at most: an int in [1, max_keys]."""
    return _int(meta, "limit", max_keys, 1, max_keys)


def path(meta: dict, key: str = "path") -> str:
    value = meta.get(key)
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a file path in meta[{key!r}], got {value!r}")
    return value


def not_same(path: str, drop: str | None) -> str:
    """``path``, unless a SAVE would drop the very file it writes (ValueError)."""
    if drop is not None and path == drop:
        raise ValueError(f"a save cannot drop the file it writes ({path!r}): name an earlier one")
    return path


def session(meta: dict) -> tuple[str, int] | None:
    """A request's session and sequence number (how a shard applies a re-sent push at most
    once), or None when it names none."""
    name = meta.get("session")
    if name is None and "seq" not in meta:
        return None
    if not isinstance(name, str) or not 16 <= len(name) <= 64:
        raise ValueError(f"meta['session'] must be a text of 16 to 64 characters, got {name!r}")
    return name, _int(meta, "seq", lo=1)


MAX_REPORTED = 16  # figures a STATS request may report at most
_REPORTED_NAME = re.compile(r"[a-z][a-z0-9_]{0,47}")


def report(meta: dict) -> dict[str, float]:
    """What a STATS request reports of its job for the shard's metrics (``report``): at most
    :data:`MAX_REPORTED` names (lower-case, digits, underscores) to finite numbers.

    Example:
        >>> report({"report": {"stream_auc": 0.75}}), report({})
        ({'stream_auc': 0.75}, {})
        >>> report({"report": {"Stream AUC": 0.75}})
        Traceback (most recent call last):
        ...
        ValueError: meta['report'] must map at most 16 names ([a-z][a-z0-9_]*, 48 characters at most) to finite numbers, got {'Stream AUC': 0.75}
    """
    value = meta.get("report", {})
    if not (isinstance(value, dict) and len(value) <= MAX_REPORTED and all(
            isinstance(k, str) and _REPORTED_NAME.fullmatch(k) and isinstance(v, (int, float))
            and not isinstance(v, bool) and math.isfinite(v) for k, v in value.items())):
        raise ValueError(f"meta['report'] must map at most {MAX_REPORTED} names ([a-z][a-z0-9_]*, 48 characters "
                         f"at most) to finite numbers, got {str(value)[:200]}")
    return {k: float(v) for k, v in value.items()}


MAX_PARTS = 1 << 20  # parts of one push at most


def part(meta: dict) -> tuple[int, int] | None:
    """Which part of a push in parts a request carries (:mod:`het.ps.server.parts`): ``(part, parts)``
    with ``1 <= part <= parts``, or None for a push whole.

    Example:
        >>> part({"part": 2, "parts": 3}), part({})
        ((2, 3), None)
    """
    if "part" not in meta and "parts" not in meta:
        return None
    n = _int(meta, "parts", lo=1, hi=MAX_PARTS)
    return _int(meta, "part", lo=1, hi=n), n


def deltas(meta: dict) -> dict[int, int]:
    """Which of a request's key arrays travel delta-coded, with their first keys
    (:func:`het.ps.protocol.integers.delta_keys`): ``meta["deltas"]`` maps an array's position, as text,
    to its first key (each checked by :func:`het.ps.protocol.integers.undelta_keys`).

    Example:
        >>> deltas({"deltas": {"0": 17}}), deltas({})
        ({0: 17}, {})
    """
    value = meta.get("deltas", {})
    if not isinstance(value, dict) or not all(isinstance(k, str) and k.isdigit() and len(k) <= 2 for k in value):
        raise ValueError(f"meta['deltas'] must map array positions to first keys, got {value!r}")
    return {int(k): v for k, v in value.items()}


def every_field(op: Op, meta: dict) -> None:
    """Check each field the meta holds, whatever the op reads: a request with a field its op
    does not declare (:mod:`het.ps.protocol.schema`), or with a malformed one, is refused whole.

    Example:
        >>> every_field(Op.PULL, {"table": "t", "lazy": 1})
        Traceback (most recent call last):
        ...
        ValueError: meta['lazy'] must be true or false, got 1
        >>> every_field(Op.PULL, {"table": "t", "step": 2})
        Traceback (most recent call last):
        ...
        ValueError: a PULL request has no field 'step' (its fields: table, lazy, as_of, deltas, nonce, session, seq)
    """
    unknown = schema.unknown_fields(op, meta)
    if unknown:
        raise ValueError(f"a {op.name} request has no field {unknown[0]!r} (its fields: "
                         f"{', '.join(schema.SCHEMAS[op].fields) or 'none'})")
    for name, parse in (("table", table), ("step", step), ("as_of", as_of), ("lazy", lazy), ("grads", grads_as),
                        ("path", path), ("rows_only", rows_only), ("state", state), ("sq", sq), ("deltas", deltas),
                        ("limit", lambda m: limit(m, MAX_STEP)), ("report", report)):
        if name in meta:
            parse(meta)
    if "bound" in meta:
        bound_from_wire(meta["bound"])
    session(meta)
    part(meta)



# -- a request's arrays --------------------------------------------------------------------
def undelta(op: str, got: list, coded: dict[int, int], key_arrays: tuple, max_keys: int) -> list:
    """A request's arrays with its delta-coded key arrays (``coded``: :func:`deltas`) decoded
    into int64 keys: only arrays of keys (``key_arrays``, by position) travel so."""
    if not set(coded) <= set(key_arrays):
        raise ValueError(f"meta['deltas'] names arrays {sorted(coded)}: {op}'s keys are arrays {list(key_arrays)}")
    out = list(got)
    for i, first in coded.items():
        out[i] = undelta_keys(out[i], first, max_keys)
    return out


def keys(got: np.ndarray, max_keys: int) -> torch.Tensor:
    """A request's keys, int64 or int32 (as they travel when every one fits) and at most
    ``max_keys``, as an int64 tensor. Shape: (n,)."""
    if got.dtype not in (np.int64, np.int32) or got.ndim != 1:
        raise ValueError(f"keys must be a 1-D int64 or int32 array, got {got.dtype} of shape {got.shape}")
    if len(got) > max_keys:
        raise ValueError(f"a request holds at most {max_keys} keys (the shard's max_keys), got {len(got)}")
    return torch.from_numpy(got).long()


def grads(got: np.ndarray, grads_as: str) -> np.ndarray:
    """A push's gradients as float32: as they came, or from bfloat16's bits (int16)."""
    if grads_as != "bf16":
        return got
    if got.dtype != np.int16:
        raise ValueError(f"bf16 grads travel as int16 bits, got {got.dtype}")
    return torch.from_numpy(got).view(torch.bfloat16).float().numpy()


def push(table: TableConfig, n: int, grads: np.ndarray, counts: np.ndarray, sq: np.ndarray | None,
         finite: bool = True) -> None:
    """A push's ``n`` rows: float32 gradients of the table's width, int64 counts (widened from
    the wire) in ``[0, MAX_COUNT]``, and ``sq`` (every row's, :func:`squares`) float32 of
    width 1 or the table's, all finite (``sq`` >= 0; the gradients checked with ``finite``)."""
    d = table.dim
    if grads.dtype != np.float32 or grads.shape != (n, d):
        raise ValueError(f"grads must be float32 of shape ({n}, {d}), got {grads.dtype} {grads.shape}")
    if counts.dtype != np.int64 or counts.shape != (n,):
        raise ValueError(f"counts must be int64 of shape ({n},), got {counts.dtype} {counts.shape}")
    if sq is not None and (sq.dtype != np.float32 or sq.shape not in ((n, 1), (n, d))):
        raise ValueError(f"sq must be float32 of shape ({n}, 1) or ({n}, {d}), got {sq.dtype} {sq.shape}")
    if n:  # the counts before any value: a shard that spares the gradients' pass names the same first
        lo, hi = (int(c) for c in torch.aminmax(torch.from_numpy(counts)))  # one pass, where numpy takes two
        if lo < 0 or hi > MAX_COUNT:
            raise ValueError(f"counts must lie in [0, {MAX_COUNT}], got {lo if lo < 0 else hi}")
    if n and sq is not None:
        check_squares(torch.from_numpy(sq), table.name)
    if n and finite:
        check_finite(torch.from_numpy(grads), "grads", table.name)


def sync(table: TableConfig, followed: bool, n: int, clocks: np.ndarray, asked: str | None) -> None:
    """A sync's clocks, one per key, in ``[-1, MAX_CLOCK]`` (-1: not cached), and the optimizer
    state it ``asked`` for: only a ``followed`` optimizer's, one float a row of row-wise Adagrad."""
    if asked is not None and not followed:
        raise ValueError(f"table {table.name!r}'s optimizer {table.optimizer.name} has no state a cache follows: "
                         f"a sync may ask for state only of an Adagrad or row-wise Adagrad table, got state {asked!r}")
    if asked == "full" and table.optimizer.name == "rowwise_adagrad":
        raise ValueError(f"table {table.name!r}'s row-wise Adagrad keeps one float a row: expected state 'row', "
                         f"got {asked!r}")
    if clocks.dtype not in WIRE_INTS or clocks.shape != (n,):
        raise ValueError(f"clocks must be integers ({', '.join(t.name for t in WIRE_INTS)}) of shape ({n},), "
                         f"got {clocks.dtype} {clocks.shape}")
    if n and (clocks.min() < -1 or clocks.max() > MAX_CLOCK):
        raise ValueError(f"clocks must lie in [-1, {MAX_CLOCK}] (-1: not cached), "
                         f"got {clocks.min() if clocks.min() < -1 else clocks.max()}")


def squares(sq: np.ndarray | None, keys: np.ndarray, grads: np.ndarray, counts: np.ndarray) -> np.ndarray | None:
    """A push's squares for every row, from those it carried: all of them (n rows), or only
    the rows of several steps (``counts > 1``, k rows, as a client sends them:
    :func:`het.ps.client.requests.squares_to_send`; ``k == n`` reads the same either way).
    Adagrad takes a row of one step by its gradient's square and ignores its ``sq``, unless its
    key repeats in the push (the steps of a repeated key add up): those rows get their
    gradients' squares (the mean over the row for a width of 1), the others 0.
    Shape: sq (n, w) or (k, w), keys (n,), grads (n, D), counts (n,) -> (n, w)."""
    n = len(grads)
    if sq is None or len(sq) == n or grads.ndim != 2 or counts.shape != (n,) or keys.shape != (n,):
        return sq  # as it came: :func:`push` names what is wrong
    several = counts > 1
    k = int(several.sum())
    if sq.ndim != 2 or len(sq) != k or sq.dtype != np.float32 or sq.shape[1] not in (1, grads.shape[1]):
        raise ValueError(f"sq must be float32 of shape ({n}, 1|{grads.shape[1]}), or of ({k}, 1|"
                         f"{grads.shape[1]}) for the {k} rows of several steps, got {sq.dtype} {sq.shape}")
    full = np.zeros((n, sq.shape[1]), np.float32)
    full[several] = sq
    if n > 1 and not bool((keys[1:] > keys[:-1]).all()):  # not ascending: a key may repeat
        _, inverse, times = np.unique(keys, return_inverse=True, return_counts=True)
        one = ~several & (times[inverse] > 1)
        if one.any():
            g = torch.from_numpy(grads[one])
            full[one] = (g * g if sq.shape[1] > 1 else (g * g).mean(1, keepdim=True)).numpy()
    return full
