"""Belady's optimal replacement with lookahead over a whole trace: the floor no policy beats.

Batch semantics as the cache sees a step: a key is a hit if it is cached when its step starts;
the step's keys are used at once and are never victims. On a miss the cache may evict the cached
key used furthest in the future, or bypass the missed key when it is itself needed later than
every cached key (bypassing is allowed, so this is the optimal offline floor).

This is a reference for benchmarks (a heap over the trace, one Python step per access), not a
hot path.
"""

from __future__ import annotations

import heapq

import numpy as np
import torch

NEVER = np.iinfo(np.int64).max


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


def belady_miss_rate(steps: list[torch.Tensor], capacity: int) -> float:
    """Misses / lookups of the optimal offline cache of ``capacity`` keys over ``steps`` (each a
    tensor of one step's unique keys).

    Example:
        >>> belady_miss_rate([torch.tensor([1, 2]), torch.tensor([3]), torch.tensor([1])], capacity=1)
        0.75
    """
    cached: dict[int, int] = {}   # key -> its next use
    heap: list[tuple[int, int]] = []  # (-next use, key); stale entries skipped
    misses = lookups = 0
    for keys, uses in zip(steps, next_uses(steps)):
        keys = keys.tolist()
        lookups += len(keys)
        missed = [(k, u) for k, u in zip(keys, uses.tolist()) if k not in cached]
        misses += len(missed)
        for k, u in zip(keys, uses.tolist()):
            if k in cached:  # hit: its next use moves on
                cached[k] = u
                heapq.heappush(heap, (-u, k))
        in_step, held = set(keys), []  # this step's heap entries, set aside once for the step
        for k, u in sorted(missed, key=lambda x: x[1]):  # the soonest needed get the room first
            if u == NEVER or capacity == 0:
                continue  # never needed again: bypass
            if len(cached) < capacity:
                cached[k] = u
                heapq.heappush(heap, (-u, k))
                continue
            victim = _furthest(heap, cached, in_step, held)
            if victim is None or cached[victim] <= u:
                continue  # every evictable key is needed sooner: bypass
            del cached[victim]
            cached[k] = u
            held.append((-u, k))  # a key of this step: never a victim in it
        for entry in held:
            heapq.heappush(heap, entry)
    return misses / lookups if lookups else 0.0


def _furthest(heap, cached, in_step, held):
    """The cached key used furthest ahead that is not of this step (left in the heap); the
    step's own entries met on the way move to ``held`` until the step ends."""
    while heap:
        neg, k = heap[0]
        if cached.get(k) != -neg:
            heapq.heappop(heap)  # stale
            continue
        if k in in_step:
            held.append(heapq.heappop(heap))
            continue
        return k
    return None
