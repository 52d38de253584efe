"""Belady's optimal replacement with lookahead over a whole trace: the floor no policy beats.

Batch semantics as the cache sees a step: a key is a hit if it is cached when its step starts;
the step's keys are used at once and are never victims. On a miss the cache may evict the cached
key used furthest in the future, or bypass the missed key when it is itself needed later than
every cached key (bypassing is allowed, so this is the optimal offline floor). "Furthest" compares
the steps of a key's next uses in order, not only its next one: with a step's keys unevictable, a
tie on the next use decides which key is still there for the use after it.

This is a reference for benchmarks (a heap over the trace, one Python step per access), not a
hot path.
"""

from __future__ import annotations

import heapq

import numpy as np
import torch

NEVER = np.iinfo(np.int64).max
DEPTH = 4  # next uses compared, soonest first (ties past them are rare and cost at most a miss)


def next_uses(steps: list[torch.Tensor]) -> list[np.ndarray]:
    """For every key of every step, the index of the next step that uses it (NEVER if none).

    Example:
        >>> [u.tolist() for u in next_uses([torch.tensor([1, 2]), torch.tensor([2]), torch.tensor([1])])]
        [[2, 1], [9223372036854775807], [9223372036854775807]]
    """
    keys = np.concatenate([s.cpu().numpy() for s in steps]) if steps else np.empty(0, np.int64)
    step_of = np.repeat(np.arange(len(steps)), [s.numel() for s in steps])
    order = np.lexsort((step_of, keys))                 # by key, then by step
    nxt = np.full(len(keys), NEVER, dtype=np.int64)
    same = keys[order][1:] == keys[order][:-1]
    nxt[order[:-1][same]] = step_of[order][1:][same]
    return np.split(nxt, np.cumsum([s.numel() for s in steps])[:-1]) if steps else []


def future_uses(steps: list[torch.Tensor], depth: int = DEPTH) -> list[list[tuple]]:
    """For every key of every step, the steps of its next ``depth`` uses (NEVER past the last):
    what orders keys by how soon they are needed, ties on one use decided by the next.

    Example:
        >>> future_uses([torch.tensor([1, 2]), torch.tensor([2]), torch.tensor([1, 2])], depth=2)[0]
        [(2, 9223372036854775807), (1, 2)]
    """
    if not steps:
        return []
    keys = np.concatenate([s.cpu().numpy() for s in steps])
    step_of = np.repeat(np.arange(len(steps)), [s.numel() for s in steps])
    order = np.lexsort((step_of, keys))                 # by key, then by step
    after = np.full(len(keys) + 1, len(keys), dtype=np.int64)  # each occurrence's next one; len: none
    same = keys[order][1:] == keys[order][:-1]
    after[order[:-1][same]] = order[1:][same]
    when = np.append(step_of, NEVER)                    # an occurrence's step; NEVER for none
    columns, at = [], np.arange(len(keys))
    for _ in range(depth):  # a loop over depth, not over the keys
        at = after[at]
        columns.append(when[at])
    rows = list(map(tuple, np.stack(columns, 1).tolist()))
    bounds = np.cumsum([0] + [s.numel() for s in steps])
    return [rows[bounds[t]:bounds[t + 1]] for t in range(len(steps))]


def belady_miss_rate(steps: list[torch.Tensor], capacity: int, depth: int = DEPTH) -> float:
    """Misses / lookups of the optimal offline cache of ``capacity`` keys over ``steps`` (each a
    tensor of one step's unique keys), comparing keys by their next ``depth`` uses. ``depth=1`` is
    the furthest-next-use rule alone: what the cache's lookahead runs when its window covers the
    whole trace.

    Example:
        >>> belady_miss_rate([torch.tensor([1, 2]), torch.tensor([3]), torch.tensor([1])], capacity=1)
        0.75
    """
    cached: dict[int, tuple] = {}   # key -> its next uses
    heap: list[tuple[tuple, int]] = []  # (next uses negated, key); stale entries skipped
    misses = lookups = 0
    for keys, uses in zip(steps, future_uses(steps, depth)):
        keys = keys.tolist()
        lookups += len(keys)
        missed = [(k, u) for k, u in zip(keys, uses) if k not in cached]
        misses += len(missed)
        for k, u in zip(keys, uses):
            if k in cached:  # hit: its next use moves on
                cached[k] = u
                heapq.heappush(heap, (_neg(u), k))
        in_step, held = set(keys), []  # this step's heap entries, set aside once for the step
        for k, u in sorted(missed, key=lambda x: x[1]):  # the soonest needed get the room first
            if u[0] == NEVER or capacity == 0:
                continue  # never needed again: bypass
            if len(cached) < capacity:
                cached[k] = u
                heapq.heappush(heap, (_neg(u), k))
                continue
            victim = _furthest(heap, cached, in_step, held)
            if victim is None or cached[victim] <= u:
                continue  # every evictable key is needed sooner: bypass
            del cached[victim]
            cached[k] = u
            held.append((_neg(u), k))  # a key of this step: never a victim in it
        for entry in held:
            heapq.heappush(heap, entry)
    return misses / lookups if lookups else 0.0


def _neg(uses: tuple) -> tuple:
    return tuple(-u for u in uses)


def _furthest(heap, cached, in_step, held):
    """The cached key used furthest ahead that is not of this step (left in the heap); the
    step's own entries met on the way move to ``held`` until the step ends."""
    while heap:
        neg, k = heap[0]
        if cached.get(k) != _neg(neg):
            heapq.heappop(heap)  # stale
            continue
        if k in in_step:
            held.append(heapq.heappop(heap))
            continue
        return k
    return None
