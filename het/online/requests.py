"""What ``POST /v1/predict`` takes, checked field by field before any row reaches the model.

A body is JSON ``{"instances": [{"column": value, ...}, ...]}``: every column the export's input
spec reads (its label may come too, and is ignored), each value a string, a number, ``null``
(missing) or, for a multi-hot field, a list of ids. Anything else is a :class:`BadRequest`
naming the instance, the field and what was expected; the server answers it with a 4xx.

Each instance is checked alone, before any batching, so whether it is accepted never depends on
the requests it is scored with: booleans are refused (neither an id nor a number), as are
``NaN`` and ``Infinity`` (not JSON) and, in a field the model reads as a number, a number past
float32's range (the model's inputs are float32).
"""

from __future__ import annotations

import json

from het.export.spec import Inputs

SCALARS = (str, int, float, type(None))
_INT64 = (-(1 << 63), (1 << 63) - 1)
FLOAT32_MAX = 3.4028234663852886e38


class BadRequest(ValueError):
    """A request refused: its HTTP status (400, 413, ...) and what was wrong."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def instances_of(body: bytes, inputs: Inputs, max_instances: int) -> list[dict]:
    """The instances of a request body, each checked: every field the model reads there, none
    it does not know, values of the right kind.

    Example (an input spec reading ``x`` and ``c``):
        >>> from het.export.spec import Inputs
        >>> spec = {"source": "table", "label": "y", "dense": ["x"], "sparse": ["c"], "bag_sizes": [1]}
        >>> instances_of(b'{"instances": [{"x": 1.5, "c": "a"}]}', Inputs(spec, "."), 8)
        [{'x': 1.5, 'c': 'a'}]
        >>> instances_of(b'{"instances": [{"x": 1.5}]}', Inputs(spec, "."), 8)
        Traceback (most recent call last):
        ...
        het.online.requests.BadRequest: instances[0]: missing field 'c' (this model reads ['x', 'c'])
    """
    try:
        doc = json.loads(body, parse_constant=_not_json)
    except RecursionError:
        raise BadRequest(400, "body: nested too deep: an instance's values are scalars or lists of ids") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(400, f"body: expected JSON, got {type(e).__name__}: {str(e)[:120]}") from None
    if not isinstance(doc, dict) or "instances" not in doc:
        got = f"an object with keys {sorted(doc)[:5]}" if isinstance(doc, dict) else _kind(doc)
        raise BadRequest(400, f"body: expected an object {{\"instances\": [...]}}, got {got}")
    extra = sorted(k for k in doc if k != "instances")
    if extra:
        raise BadRequest(400, f"body: unknown key(s) {extra[:5]}: expected only 'instances'")
    instances = doc["instances"]
    if not isinstance(instances, list) or not instances:
        raise BadRequest(400, f"instances: expected a non-empty list of objects, got {_kind(instances)}")
    if len(instances) > max_instances:
        raise BadRequest(413, f"instances: at most {max_instances} a request, got {len(instances)}")
    fields = inputs.columns[1:]
    known = set(inputs.columns)
    bags = {name: size for name, size in zip(inputs.sparse, inputs.bag_sizes) if name not in inputs.spec.get("multi", {})}
    lists = set(inputs.spec.get("multi", {}))
    numbers = set(inputs.dense) | set(inputs.buckets)  # fields read as numbers
    for i, instance in enumerate(instances):
        _check_instance(i, instance, fields, known, bags, lists, numbers)
    return instances


def _not_json(constant: str):
    raise ValueError(f"{constant} is not JSON (send null for a missing value)")


def _check_instance(i: int, instance, fields: list[str], known: set, bags: dict, lists: set = frozenset(),
                    numbers: set = frozenset()) -> None:
    if not isinstance(instance, dict):
        raise BadRequest(400, f"instances[{i}]: expected an object of fields, got {_kind(instance)}")
    for name in fields:
        if name not in instance:
            raise BadRequest(400, f"instances[{i}]: missing field {name!r} (this model reads {_few(fields)})")
    unknown = [k for k in instance if k not in known]
    if unknown:
        raise BadRequest(400, f"instances[{i}]: unknown field(s) {_few(unknown)} (this model reads {_few(fields)})")
    for name in fields:
        value = instance[name]
        if name in lists:  # a multi-hot column: a list of ids, or their separated text
            if not (isinstance(value, SCALARS) or (isinstance(value, list) and all(
                    isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value))):
                raise BadRequest(400, f"instances[{i}].{name}: expected a list of ids (strings or numbers) or their "
                                      f"separated text, got {_kind(value)}")
        elif bags.get(name, 1) > 1:
            if not (isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
                raise BadRequest(400, f"instances[{i}].{name}: expected a list of {bags[name]} integer ids, "
                                      f"got {_kind(value)}")
        elif not isinstance(value, SCALARS) or isinstance(value, bool):
            raise BadRequest(400, f"instances[{i}].{name}: expected a string, a number or null, got {_kind(value)}")
        elif name in numbers and isinstance(value, (int, float)) and not abs(value) <= FLOAT32_MAX:
            raise BadRequest(400, f"instances[{i}].{name}: {value!r} is past float32's range (+-3.4e38), expected a "
                                  f"finite number")


def columns_of(instances: list[dict], fields: list[str], multi: dict | None = None) -> dict:
    """Instances (checked) -> one list per field, as :meth:`het.export.ExportedModel.predict`
    takes columns. A column mixing numbers and text is made text (as a CSV reads it); a
    multi-hot column's lists become their text joined by its separator (``multi``: column ->
    separator), as a file holds them."""
    columns = {}
    for name in fields:
        values = [inst[name] for inst in instances]
        if name in (multi or {}):
            columns[name] = [None if v is None else multi[name].join(map(_text, v)) if isinstance(v, list)
                             else _text(v) for v in values]
            continue
        kinds = {type(v) for v in values if v is not None}
        if int in kinds and any(type(v) is int and not _INT64[0] <= v <= _INT64[1] for v in values):
            kinds.add(str)  # past int64: as text, what a CSV of the same value gives
        if len(kinds) > 1 and (str in kinds or bool in kinds):
            values = [None if v is None else str(v) for v in values]
        elif kinds == {int, float}:  # an int no float64 holds (past 2^53) stays one: refused as it is alone
            values = [v if v is None or (type(v) is int and float(v) != v) else float(v) for v in values]
        columns[name] = values
    return columns


def _text(value) -> str:
    """A value as a CSV spells it (an integral float without its ``.0`` is not what a CSV holds:
    kept as Python writes it)."""
    return value if isinstance(value, str) else repr(value) if isinstance(value, float) else str(value)


def _kind(value) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
             float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _few(names: list[str], shown: int = 5) -> str:
    return str(names) if len(names) <= shown else f"{names[:shown]}... ({len(names)} in all)"
