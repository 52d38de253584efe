"""Settings checked against their declared types, and nested tables built from plain dicts:
what turns a TOML file or JSON into :class:`het.train.config.TrainConfig` and its tables."""

from __future__ import annotations

import dataclasses
import math
import typing

from het.choices import Choice
from het.staleness import check_staleness


def check_fields(config, prefix: str = "") -> None:
    """Check every field of a config dataclass against its declared type, strictly (no bool
    for an int, no float for an int, no text for a number), and normalise in place: floats
    from ints, tuples from lists, ``staleness`` to an int or inf. Raises ValueError naming
    the key (``prefix`` + field), the type expected and the value found."""
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        value, key = getattr(config, f.name), prefix + f.name
        if f.metadata.get("kind") == "staleness":
            value = check_staleness(value, key)
        elif f.metadata.get("kind") == "width":
            value = check_width(value, key)
        elif f.metadata.get("kind") == "widths":
            value = check_widths(value, key)
        else:
            value = _check_type(hints[f.name], value, key)
        choices = f.metadata.get("choices")
        if choices and value is not None and value not in choices:
            raise ValueError(f"{key}: expected one of {choices}, got {value!r}")
        object.__setattr__(config, f.name, value)


def check_width(value, key: str):
    """An embedding width: an int >= 1, ``"auto"``, or None (the model's default)."""
    if value is None or value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise ValueError(f"{key}: expected an integer >= 1 or 'auto', got {value!r} ({type(value).__name__})")


def check_widths(value, key: str):
    """Widths of named fields: ``{name: int >= 1}`` (a TOML table), or ``"name=w,name=w"``.

    Example:
        >>> check_widths("user=64, ad=8", "widths")
        {'user': 64, 'ad': 8}
    """
    if value is None:
        return None
    if isinstance(value, str):
        value = dict(_pair(part, key) for part in value.split(",") if part.strip())
    if not isinstance(value, dict) or not value:
        raise ValueError(f"{key}: expected field names and widths (name=width,...; TOML: a table), got {value!r}")
    for name, width in value.items():
        if not isinstance(width, int) or isinstance(width, bool) or width < 1:
            raise ValueError(f"{key}: field {name!r}: expected a width >= 1, got {width!r}")
    return dict(value)


def _pair(text: str, key: str) -> tuple[str, int]:
    name, eq, width = text.partition("=")
    try:
        if eq and name.strip():
            return name.strip(), int(width)
    except ValueError:
        pass
    raise ValueError(f"{key}: expected name=width, got {text.strip()!r}")


_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}


def _check_type(hint, value, key: str):
    args = typing.get_args(hint)
    if type(None) in args:  # X | None
        if value is None:
            return None
        hint = next(a for a in args if a is not type(None))
    if dataclasses.is_dataclass(hint):
        if isinstance(value, hint):
            return value
        if isinstance(value, dict):
            return build(hint, value, key + ".")
        raise ValueError(f"{key}: expected a table of {sorted(f.name for f in dataclasses.fields(hint))}, "
                         f"got {value!r} ({type(value).__name__})")
    if isinstance(hint, type) and issubclass(hint, Choice):
        if isinstance(value, str):
            try:
                return hint(value)  # a member's value, or an old spelling of one (het.choices.SPELLED)
            except ValueError:
                raise ValueError(f"{key}: expected one of {hint.values()}, got {value!r}") from None
        raise ValueError(f"{key}: expected a string, got {value!r} ({type(value).__name__})")
    if typing.get_origin(hint) is tuple:
        if isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return tuple(value)
        raise ValueError(f"{key}: expected a list of integers, got {value!r} ({type(value).__name__})")
    ok = isinstance(value, hint) and not (isinstance(value, bool) and hint is not bool)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if ok and hint is float and not math.isfinite(value):
        raise ValueError(f"{key}: expected a finite number, got {value!r}")
    if not ok:
        raise ValueError(f"{key}: expected {_TYPE_NAMES.get(hint, hint)}, got {value!r} ({type(value).__name__})")
    return value


def build(cls, d: dict, prefix: str):
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise ValueError(f"unknown config keys {[prefix + k for k in unknown]}; known: {sorted(names)}")
    return cls(**d)


def set_dotted(d: dict, key: str, value) -> None:
    head, _, rest = key.partition(".")
    if rest:
        inner = d.setdefault(head, {})
        if not isinstance(inner, dict):
            raise ValueError(f"{head}: expected a table (for {key}), got {inner!r}")
        set_dotted(inner, rest, value)
    else:
        d[head] = value


def merge(into: dict, other: dict) -> None:
    for key, value in other.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge(into[key], value)
        else:
            into[key] = value


def require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
