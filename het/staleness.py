"""HET's consistency rules as pure functions over integer clocks (no sockets, no rows).

- ``c_g``: a row's server clock, the number of updates the server applied to it;
- ``c_s``: the server clock a worker's cached copy last synchronised with (``-1``: not cached);
- ``u``: updates the worker made to its copy and has not pushed (one per step that touched it);
- ``bound``: the staleness bound ``s`` (``math.inf``: fully asynchronous).

Read rule: a cached row may be used while ``c_g - c_s <= s``. Write rule: a row is pushed once
``u > s`` (and always when it is evicted). Together they keep any two replicas within ``2s``
updates of each other (HET, Lemma 1).
"""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the rules take and give tensors; the bound's parsing, which configs use, needs no torch
    import torch


def must_refresh(server_clocks: torch.Tensor, cached_clocks: torch.Tensor, bound: float) -> torch.Tensor:
    """Which copies the server must send: misses (``c_s < 0``), rows with ``c_g - c_s > s``, and
    rows whose server clock is *behind* the copy's (``c_g < c_s``): the server holds fewer updates
    than the worker counted, because it dropped them (a dynamic table's key not yet admitted) or
    lost the row (expired, evicted past its budget, or a load of an older save). Whatever the
    bound, such a copy is refreshed: the worker then reads the server's row plus its own
    unpushed updates.

    Example:
        >>> import torch
        >>> must_refresh(torch.tensor([5, 5, 5, 0]), torch.tensor([5, 2, -1, 3]), 2).tolist()
        [False, True, True, True]
    """
    missing = (cached_clocks < 0) | (server_clocks < cached_clocks)
    if bound == math.inf:
        return missing
    return missing | (server_clocks - cached_clocks > bound)


def must_push(updates: torch.Tensor, bound: float) -> torch.Tensor:
    """Which cached rows hold more unpushed updates than the bound allows.

    Example:
        >>> import torch
        >>> must_push(torch.tensor([0, 1, 3]), 0).tolist(), must_push(torch.tensor([0, 9]), math.inf).tolist()
        ([False, True, True], [False, False])
    """
    if bound == math.inf:
        return updates < 0  # none: a count of updates is never negative
    return updates > bound


INFINITE = ("inf", "infinity")
MAX_BOUND = 1 << 62  # a finite bound on the wire: clocks never pass it either  # how a text (a flag, a TOML string, JSON) spells s = inf


def check_staleness(value, what: str = "staleness") -> float:
    """``value`` as a bound: an ``int >= 0``, or ``math.inf``. Accepts an int, a float that is
    a whole number or inf, and the strings of :data:`INFINITE`; refuses bools, fractions,
    negative numbers and other text, naming ``what`` and the value.

    Example:
        >>> check_staleness(100), check_staleness("inf"), check_staleness(float("inf"))
        (100, inf, inf)
        >>> check_staleness(1.5)
        Traceback (most recent call last):
        ...
        ValueError: staleness: expected an integer >= 0 or 'inf', got 1.5 (float)
    """
    if isinstance(value, str) and value.strip().lower() in INFINITE:
        return math.inf
    if isinstance(value, float) and value == math.inf:
        return math.inf
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not whole or value < 0:
        raise ValueError(f"{what}: expected an integer >= 0 or 'inf', got {value!r} ({type(value).__name__})")
    return int(value)


def parse_staleness(text: str) -> float:
    """A bound from text (a flag): ``"100"`` -> 100, ``"inf"`` -> inf.

    Example:
        >>> parse_staleness("100"), parse_staleness("Inf")
        (100, inf)
    """
    text = str(text).strip()
    if text.lower() in INFINITE:
        return math.inf
    if not text.isdigit():
        raise ValueError(f"expected an integer >= 0 or 'inf', got {text!r}")
    return int(text)


def staleness_flag(text: str) -> float:
    """:func:`parse_staleness` as an argparse ``type``: a bad value's error says what was expected."""
    try:
        return parse_staleness(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parse_stalenesses(text: str) -> list[float]:
    """``"0,100,inf"`` -> ``[0, 100, inf]``: comma-separated bounds, at least one.

    Example:
        >>> parse_stalenesses("0,100,10000,inf")
        [0, 100, 10000, inf]
    """
    try:
        return [parse_staleness(part) for part in str(text).split(",")]
    except ValueError as e:
        raise ValueError(f"expected comma-separated staleness bounds, e.g. 0,100,inf: {e} in {text!r}") from None


def format_staleness(bound: float) -> int | str:
    """A bound as JSON and TOML hold it: the int, or ``"inf"``.

    Example:
        >>> format_staleness(100), format_staleness(math.inf)
        (100, 'inf')
    """
    return "inf" if bound == math.inf else int(bound)


def bound_to_wire(bound: float) -> int | None:
    """A bound as a request's meta carries it: the int, or None for inf.

    Example:
        >>> bound_to_wire(100), bound_to_wire(math.inf)
        (100, None)
    """
    bound = check_staleness(bound, "staleness bound")
    return None if bound == math.inf else bound


def bound_from_wire(value) -> float:
    """A request's bound: None is inf, else an int >= 0 (no bool, no float).

    Example:
        >>> bound_from_wire(None), bound_from_wire(3)
        (inf, 3)
    """
    if value is None:
        return math.inf
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_BOUND:
        raise ValueError(f"meta['bound'] must be an integer in [0, {MAX_BOUND}] or null (inf), got {value!r}")
    return value
