"""How a config field is declared: its default, help text and closed choices in one place
(:func:`setting`), from which the command-line flags are generated (:mod:`het.train.flags`); and
the checks every config shares."""

from __future__ import annotations

from dataclasses import field

from het.choices import Choice


def setting(default=None, help: str = "", *, choices: tuple = (), factory=None, aliases: tuple = (),
            kind: str | None = None):
    """A config field with its help text (and closed choices narrower than its type's, other
    flag names, a ``kind`` of parsing: ``"staleness"``, ``"size"``) in its metadata."""
    meta = {"help": help, "choices": tuple(choices), "aliases": tuple(aliases), "kind": kind}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def plain(d):
    """``d`` with every :class:`Choice` as its string, in nested dicts, lists and tuples too:
    what a config's ``to_dict`` gives (pickled in saves and checkpoints, read back anywhere).

    Example:
        >>> from het.choices import Optimizer, Policy
        >>> plain({"policy": Policy.LFU, "tables": [{"name": Optimizer.SGD}]})
        {'policy': 'lfu', 'tables': [{'name': 'sgd'}]}
        >>> type(plain(Policy.LFU))
        <class 'str'>
    """
    if isinstance(d, Choice):
        return d.value
    if isinstance(d, dict):
        return {k: plain(v) for k, v in d.items()}
    if isinstance(d, (list, tuple)):
        return type(d)(plain(v) for v in d)
    return d


def is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


FLOAT32_MAX = 3.4028234663852886e38


def require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
