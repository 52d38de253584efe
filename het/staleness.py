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

import math

import torch


def must_refresh(server_clocks: torch.Tensor, cached_clocks: torch.Tensor, bound: float) -> torch.Tensor:
    """Which copies the server must send: misses (``c_s < 0``) and rows with ``c_g - c_s > s``.

    Example:
        >>> must_refresh(torch.tensor([5, 5, 5]), torch.tensor([5, 2, -1]), 2).tolist()
        [False, True, True]
    """
    missing = cached_clocks < 0
    if bound == math.inf:
        return missing
    return missing | (server_clocks - cached_clocks > bound)


def must_push(updates: torch.Tensor, bound: float) -> torch.Tensor:
    """Which cached rows hold more unpushed updates than the bound allows.

    Example:
        >>> must_push(torch.tensor([0, 1, 3]), 0).tolist()
        [False, True, True]
    """
    if bound == math.inf:
        return torch.zeros_like(updates, dtype=torch.bool)
    return updates > bound
