"""What a shard accepts in a request's meta, checked strictly before anything changes.

Every field has one parser here: the type is exact (no bool for an int, no float for an
int, no text for a number) and the value in range, or a ValueError names the field, what it
expected and what arrived. The shard parses every field of a request first and only then
applies it, so a refused request changes nothing.
"""

from __future__ import annotations

from het.ps.limits import MAX_STEP
from het.ps.wire.protocol import PUSH_DTYPES
from het.staleness import bound_from_wire


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
    grads = meta.get("grads", "f32")
    if grads not in PUSH_DTYPES:
        raise ValueError(f"meta['grads'] must be one of {PUSH_DTYPES}, got {grads!r}")
    return grads


def path(meta: dict) -> str:
    value = meta.get("path")
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a file path in meta['path'], got {value!r}")
    return value


def session(meta: dict) -> tuple[str, int] | None:
    """A request's session and sequence number (how a shard applies a re-sent push at most
    once), or None when it names none."""
    name = meta.get("session")
    if name is None and "seq" not in meta:
        return None
    if not isinstance(name, str) or not 16 <= len(name) <= 64:
        raise ValueError(f"meta['session'] must be a text of 16 to 64 characters, got {name!r}")
    return name, _int(meta, "seq", lo=1)


def deltas(meta: dict) -> dict[int, int]:
    """Which of a request's key arrays travel delta-coded, with their first keys
    (:func:`het.ps.wire.protocol.delta_keys`): ``meta["deltas"]`` maps an array's position, as text,
    to its first key (each checked by :func:`het.ps.wire.protocol.undelta_keys`).

    Example:
        >>> deltas({"deltas": {"0": 17}}), deltas({})
        ({0: 17}, {})
    """
    value = meta.get("deltas", {})
    if not isinstance(value, dict) or not all(isinstance(k, str) and k.isdigit() and len(k) <= 2 for k in value):
        raise ValueError(f"meta['deltas'] must map array positions to first keys, got {value!r}")
    return {int(k): v for k, v in value.items()}


def every_field(meta: dict) -> None:
    """Check each field the meta holds, whatever the op reads: a request with a malformed field
    is refused whole.

    Example:
        >>> every_field({"table": "t", "lazy": 1})
        Traceback (most recent call last):
        ...
        ValueError: meta['lazy'] must be true or false, got 1
    """
    for name, parse in (("table", table), ("step", step), ("lazy", lazy), ("grads", grads_as), ("path", path),
                        ("state", state), ("sq", sq), ("deltas", deltas)):
        if name in meta:
            parse(meta)
    if "bound" in meta:
        bound_from_wire(meta["bound"])
    session(meta)

