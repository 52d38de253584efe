"""A push in parts: one a client split (at the shards' ``max_keys``, or into pieces that travel
while the shard works) is held by the shard until its last part has come, then applied whole,
or refused whole: no refusal leaves some of its parts applied.

A part names itself in its request's meta, ``part`` of ``parts`` (1-based). A session's parts
come in order, as its client sends them; a part out of order, or that does not match the parts
before it (another table or step), drops the push held so far, and is refused. A shard holds
the pushes of at most :data:`MAX_HELD` sessions at once (a client that died mid-push leaves
one): past that, the oldest goes, and its next part is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

MAX_HELD = 64


@dataclass
class Checked:
    """A push's arrays as the shard checked them: keys (n,) int64, grads (n, D) float32,
    counts (n,) int64, sq (n, w) float32 or None; its table and step."""

    table: str
    step: int
    keys: torch.Tensor
    grads: np.ndarray
    counts: np.ndarray
    sq: np.ndarray | None


@dataclass
class _Held:
    parts: int
    got: list = field(default_factory=list)  # Checked, in order


class Parts:
    """The pushes in parts a shard holds, one per session at most.

    Example:
        >>> def part(keys):
        ...     return Checked("t", 1, torch.tensor(keys), np.ones((len(keys), 2), np.float32),
        ...                    np.ones(len(keys), np.int64), None)
        >>> held = Parts()
        >>> held.add("s", (1, 2), part([1, 2])) is None
        True
        >>> held.add("s", (2, 2), part([7])).keys.tolist()
        [1, 2, 7]
    """

    def __init__(self):
        self._held: dict[str | None, _Held] = {}

    def add(self, session: str | None, part: tuple[int, int], checked: Checked) -> Checked | None:
        """Hold part ``part = (i, n)`` of ``session``'s push; the whole push, its parts joined in
        order, once part ``n`` has come (None before). ValueError for a part out of order or
        unlike those before it: the push held so far is dropped, nothing of it applied."""
        i, n = part
        held = self._held.pop(session, None) if i == 1 else self._held.get(session)
        if i == 1:
            held = _Held(n)
        problem = _mismatch(held, i, n, checked)
        if problem:
            self._held.pop(session, None)
            raise ValueError(f"part {i} of {n} of a push {problem}: the push is refused whole, none of it applied")
        held.got.append(checked)
        if i < n:
            self._held[session] = held
            if len(self._held) > MAX_HELD:
                self._held.pop(next(iter(self._held)))
            return None
        self._held.pop(session, None)
        return _joined(held.got)

    @property
    def held(self) -> int:
        """Pushes held, waiting for parts."""
        return len(self._held)


def _mismatch(held: _Held | None, i: int, n: int, checked: Checked) -> str:
    """Why part ``i`` of ``n`` does not continue ``held`` ('' when it does)."""
    if held is None:
        return f"came without part {i - 1} before it"
    if held.parts != n or len(held.got) != i - 1:
        return f"came after part {len(held.got)} of {held.parts}"
    first = held.got[0] if held.got else checked
    if (checked.table, checked.step, checked.sq is None) != (first.table, first.step, first.sq is None):
        return (f"is for table {checked.table!r}, step {checked.step}, squares {checked.sq is not None}, "
                f"and part 1 for {first.table!r}, step {first.step}, squares {first.sq is not None}")
    return ""


def _joined(got: list[Checked]) -> Checked:
    if len(got) == 1:
        return got[0]
    sq = None if got[0].sq is None else np.concatenate([c.sq for c in got])
    return Checked(got[0].table, got[0].step, torch.cat([c.keys for c in got]),
                   np.concatenate([c.grads for c in got]), np.concatenate([c.counts for c in got]), sq)
